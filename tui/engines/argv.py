"""A command line read the way an engine's own parser reads it, and masked before anything keeps it.

Each engine module (tui.engines.llamacpp, .vllm, .sglang) gives its option table (`Options`): every spelling
of every option and how many values it takes, which options hold secrets, and how its parser matches names
(llama.cpp: exact names, `_` read as `-`; vLLM and SGLang: argparse, which also takes any unambiguous prefix
of a long option and `--opt=value`). `mask_argv` is the project's one masking function: the config reader,
the launcher's log line and every result that keeps an argv use it; `secrets_on_argv`, the profiles' check,
reads a command line the same way.

A command line is read as what it runs (tui.engines.wrappers: a shell's command string split the way the
shell splits it, `env`'s, `exec`'s, `nohup`'s and a shell's `NAME=VALUE` prefixes passed over); each command
is then read with its own engine's table (recognized by its program, whatever table the caller gave), else
with the caller's.

What is masked, for any program (an engine, or whatever else listens on a port):
- the value of an option the table marks secret, in every spelling (short, long, alias, prefix, `=value`,
  `_` for `-`), every value of an option that takes several (vLLM's `--api-key a b`), and none when the
  option was given without one (the next option is left alone); an option the table knows and does not mark
  secret keeps its value whatever its name reads like (vLLM's `--long-prefill-token-threshold 512`);
- the value of an option the table does not know whose name says key, token, secret, password or
  credential (a generic rule, for programs with no table and options an engine added after its table was
  read), except a path (`...-file`) or a number (`...-threshold`); with no table, also an option any
  engine's table marks secret (`-hft`);
- every value after an option the table does not know: how many it takes cannot be known, so nothing is
  guessed;
- `NAME=VALUE` where NAME says key, token, secret, password or credential (`-e HF_TOKEN=...`);
- a URL's credentials (tui.base.secrets.mask_urls: `user:password@`, a token as the user, `?token=`,
  `X-Amz-Signature`...), and every occurrence of a secret the caller knows (the target's own API key),
  wherever it appears.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tui.base.secrets import REDACTED, mask_urls, says_secret
from tui.engines.wrappers import (
    POSITIONAL,
    expanded,
    is_operator,
    program_start,
    shell_commands,
    shell_words,
    unwrap,
)

# nargs of an option: a switch, one value, an optional value, one or more values
SWITCH, ONE, OPTIONAL, MANY = 0, 1, "?", "+"
Nargs = int | str

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.+)$", re.DOTALL)


@dataclass(frozen=True)
class Options:
    """One engine's command line: every spelling -> nargs, the canonical names of its secret options, and
    how its parser matches a name."""

    engine: str
    nargs: Mapping[str, Nargs]
    secret: frozenset[str] = frozenset()  # spellings whose values are secret (every alias listed)
    prefixes: bool = False  # argparse: an unambiguous prefix of a long option is that option
    dash_values: bool = False  # llama.cpp: an option's value is the next argument, even one starting with '-'
    aliases: Mapping[str, str] = field(default_factory=dict)  # spelling -> the name a reader asks for

    def resolve(self, name: str) -> str | None:
        """The spelling of the table `name` means to this engine's parser, or None if it knows none."""
        if name in self.nargs:
            return name
        if name.startswith("--"):
            dashed = name.replace("_", "-")
            if dashed in self.nargs:
                return dashed
            if self.prefixes:
                hits = [known for known in self.nargs if known.startswith("--") and known.startswith(dashed)]
                if len(hits) == 1:
                    return hits[0]
        return None

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)


IsEngine = Callable[[Sequence[str]], bool]
# Each engine's test of a command line and its table, as each engine's knowledge is made
# (tui.engines.knowledge registers them: this module is below the engines' and cannot import them), so a
# command found inside a shell string or behind `env` is read with its own engine's table. Every module that
# masks imports the engines first (tui.engines.known, or all three engine modules).
_ENGINE_TABLES: list[tuple[IsEngine, Options]] = []


def register_engine(is_engine: IsEngine, options: Options) -> None:
    if all(known is not options for _, known in _ENGINE_TABLES):
        _ENGINE_TABLES.append((is_engine, options))


def _own_table(argv: Sequence[str]) -> Options | None:
    return next((options for is_engine, options in _ENGINE_TABLES if is_engine(argv)), None)


def _any_engine_secret(name: str) -> bool:
    """`name` is a secret option's spelling in some engine's table (`-hft`, or `-hftTOKEN` joined to its
    value): for a program with no table, which may be an engine under another name."""
    return any(name in options.secret or name.lower() in options.secret
               or any(not s.startswith("--") and name.startswith(s) for s in options.secret)
               for _, options in _ENGINE_TABLES)


def _is_option(arg: str) -> bool:
    arg = arg.lstrip()  # " --api-key=x" is no option to a parser, but is masked as one all the same
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False  # a negative number is a value


def _mask_json(value: object) -> tuple[object, bool]:
    """A JSON value with every member whose name says secret masked (vLLM's --model-loader-extra-config,
    --kv-transfer-config...); whether any was."""
    if isinstance(value, dict):
        out: dict[object, object] = {}
        hit = False
        for key, item in value.items():
            if isinstance(key, str) and says_secret(key) and not isinstance(item, dict | list):
                out[key], hit = REDACTED, True
            else:
                out[key], sub = _mask_json(item)
                hit = hit or sub
        return out, hit
    if isinstance(value, list):
        items = [_mask_json(item) for item in value]
        return [item for item, _ in items], any(sub for _, sub in items)
    return value, False


def _mask_text(arg: str, secrets: Sequence[str]) -> str:
    """One argument: the known secrets, a URL's credentials, `NAME=VALUE` (also after an option's `=`), secret
    members of a JSON value, and a command line given as one string (`ssh host "vllm serve --api-key K"`)."""
    for secret in secrets:
        arg = arg.replace(secret, REDACTED)
    arg = mask_urls(arg)
    head, eq, rest = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    match = _ASSIGNMENT.match(rest)
    if match and says_secret(match.group(1)):
        rest = f"{match.group(1)}={REDACTED}"
    if rest.lstrip().startswith(("{", "[")):
        try:
            masked, hit = _mask_json(json.loads(rest))
        except ValueError:
            hit = False
        if hit:
            rest = json.dumps(masked)
    elif " " in rest.strip() and ("-" in rest or "=" in rest):
        rest = _mask_command(rest, None, secrets)
    return head + eq + rest


def _mask_command(text: str, table: Options | None, secrets: Sequence[str]) -> str:
    """A command line in one string, each of its commands masked as its own argv; `text` itself when
    nothing in it was."""
    words = shell_words(text)
    if len(words) < 2:
        return text
    out: list[str] = []
    for run in shell_commands(words):
        out += run if is_operator(run[0]) else _mask(run, table, secrets, inner=True)
    if out == words:
        return text
    return " ".join(word if is_operator(word) else shlex.quote(word) for word in out)


@dataclass(frozen=True)
class Parsed:
    """A command line as its engine reads it: each option's canonical spelling -> its last value ('' for a
    switch), the options it did not know, and the positionals."""

    options: dict[str, str]
    unknown: tuple[str, ...]
    positionals: tuple[str, ...]

    def pick(self, *names: str) -> str | None:
        for name in names:
            if name in self.options:
                return self.options[name]
        return None

    def has(self, *names: str) -> bool:
        return any(name in self.options for name in names)


def _split(arg: str, table: Options | None) -> tuple[str, str | None, Nargs | None]:
    """(the name as the table knows it, or as written; a value given with `=`; nargs, None if unknown)."""
    name, eq, value = arg.strip().partition("=")
    known = table.resolve(name) if table is not None else None
    if known is None:
        return name, value if eq else None, None
    return known, value if eq else None, table.nargs[known]  # type: ignore[union-attr]


@dataclass(frozen=True)
class _Option:
    at: int  # its index in argv
    name: str  # as the table knows it, or as written
    nargs: Nargs | None  # None: no table knows it
    inline: str | None  # the value given as `--name=value`
    values: tuple[int, ...]  # the indices of the values that follow it


def _walk(argv: Sequence[str], table: Options | None) -> Iterable[_Option]:
    """Each option of the program's arguments with the indices of its values, as the engine's parser takes
    them. A value starting with '-' is taken only by a parser that takes the next argument whatever it is
    (llama.cpp)."""
    i = program_start(argv)
    while i < len(argv):
        arg = argv[i]
        if not _is_option(arg):
            i += 1
            continue
        name, inline, nargs = _split(arg, table)
        at, i = i, i + 1
        values: list[int] = []
        if inline is None and nargs != SWITCH:
            if nargs == ONE and table is not None and table.dash_values and i < len(argv):
                values.append(i)
            else:
                while i + len(values) < len(argv) and not _is_option(argv[i + len(values)]):
                    values.append(i + len(values))
                    if nargs in (ONE, OPTIONAL) or (nargs is None and table is None):
                        break  # one value at most; with no table the rest are positionals
        i += len(values)
        yield _Option(at, name, nargs, inline, tuple(values))


def parse(argv: Sequence[str], table: Options) -> Parsed:
    """argv read as `table`'s engine reads it (the last value of an option wins, as in its parser)."""
    options: dict[str, str] = {}
    unknown: list[str] = []
    taken: set[int] = set()
    for opt in _walk(argv, table):
        taken.update((opt.at, *opt.values))
        if opt.nargs is None:
            unknown.append(opt.name)
            continue
        value = opt.inline if opt.inline is not None else " ".join(argv[k] for k in opt.values)
        canonical = table.canonical(opt.name)
        # a switch and its negation (-kvu / -no-kvu, --cache-prompt / --no-cache-prompt): the last one wins
        options.pop(canonical[:2] + canonical[5:] if canonical.startswith("--no-") else
                    canonical[:2] + "no-" + canonical[2:], None)
        options[canonical] = value
    start = program_start(argv)
    positionals = tuple(arg for k, arg in enumerate(argv) if k >= start and k not in taken)
    return Parsed(options, tuple(unknown), positionals)


def _secret_option(opt: _Option, table: Options | None) -> bool:
    if table is not None and opt.nargs is not None:
        # the engine's own parser knows it: its table says whether it holds a secret, whatever its name
        # reads like (vLLM's --long-prefill-token-threshold holds a number)
        return table.canonical(opt.name) in table.secret
    if says_secret(opt.name):
        return True
    if table is None:
        return _any_engine_secret(opt.name)
    # case-insensitively too: "--API_KEY" is no key to a parser, but it says what it holds
    resolved = table.resolve(opt.name.lower())
    return resolved is not None and table.canonical(resolved) in table.secret


def _short_secrets(table: Options | None) -> set[str]:
    """The short spellings of secret options (`-hft`): the table's, and any engine's (the caller's table may
    not be the engine's)."""
    tables = [options for _, options in _ENGINE_TABLES] + ([table] if table is not None else [])
    return {s for options in tables for s in options.secret if not s.startswith("--")}


def secrets_on_argv(argv: Sequence[str], table: Options | None = None, secrets: Iterable[str | None] = ()
                    ) -> list[tuple[int, str]]:
    """(index, why) for every argv element that puts a secret on the command line, where every user of the
    machine can read it: an option that holds one (in any spelling `table`'s engine accepts, or whose name
    says so), a `NAME=VALUE` whose name says so, a URL's credentials, or an element containing one of
    `secrets`; in a shell's command string, the same read in each of its commands, each with its own
    engine's table (the string is the element named). The words never quote the value."""
    return sorted(_found(argv, table, [s for s in secrets if s]).items())


def _element(arg: str, values: Sequence[str]) -> str | None:
    """Why one element holds a secret by itself, or None."""
    if any(value in arg for value in values):
        return "it contains the API key itself"
    if _mask_text(arg, ()) != arg:  # NAME=VALUE, a URL's credentials, a JSON member, a command in a string
        return "it holds a secret (a key, token or password within it)"
    return None


def _found(argv: Sequence[str], table: Options | None, values: Sequence[str], inner: bool = False
           ) -> dict[int, str]:
    """secrets_on_argv's findings by index; `inner`: argv is a command another runs (see _mask)."""
    found: dict[int, str] = {}
    wrapped = unwrap(argv)
    if wrapped is not None and not wrapped.string:  # env's or a shell's NAME=VALUE, then the command
        found = {i: why for i, arg in enumerate(argv[:wrapped.at]) if (why := _element(arg, values))}
        found.update({wrapped.at + i: why
                      for i, why in _found(argv[wrapped.at:], table, values, inner=True).items()})
        return found
    if wrapped is not None:
        for i, arg in enumerate(argv):
            if i != wrapped.at and (why := _element(arg, values)):
                found[i] = why
        whys = []
        for run in expanded(argv, wrapped):
            for k, why in sorted(_found([w for w, _ in run], table, values, inner=True).items()):
                if (src := run[k][1]) is None:
                    whys.append(why)
                else:  # a word after the string, which the string runs as one of its command's words
                    found.setdefault(src, f"{why}, in the command line {wrapped.name} runs")
        if whys:
            found[wrapped.at] = f"{whys[0]}, in the command line {wrapped.name} runs"
        return dict(sorted(found.items()))
    table = (_own_table(argv) if inner else None) or table
    for opt in _walk(argv, table):
        if _secret_option(opt, table):
            name = argv[opt.at].strip().partition("=")[0]
            found[opt.at] = f"{name!r} holds a secret (an API key, token or password)"
    for i, arg in enumerate(argv):
        if i not in found and (why := _element(arg, values)):
            found[i] = why
    return found


def mask_argv(argv: Sequence[str], table: Options | None = None, secrets: Iterable[str | None] = ()
              ) -> tuple[str, ...]:
    """argv with every secret value replaced by ***: see the module's docstring for what counts as one.
    `table`: the engine's options (None for a program enginetop has no table for); `secrets`: values that
    are secret wherever they appear (the target's API key)."""
    return _mask(argv, table, sorted({s for s in secrets if s}, key=len, reverse=True))


def _mask(argv: Sequence[str], table: Options | None, known: Sequence[str], inner: bool = False
          ) -> tuple[str, ...]:
    """mask_argv's work. `inner`: argv is a command another runs (in a shell string, after `env`), which is
    read with the table of the engine it runs, if it runs one; the caller's table is the one for its own
    command line."""
    wrapped = unwrap(argv)
    if wrapped is not None:
        head = tuple(_mask_text(arg, known) for arg in argv[:wrapped.at])
        if not wrapped.string:
            return head + _mask(argv[wrapped.at:], table, known, inner=True)
        text = argv[wrapped.at][len(wrapped.prefix):]
        masked = _mask_command(text, table, known)
        rest = [_mask_text(arg, known) for arg in argv[wrapped.at + 1:]]
        for run in expanded(argv, wrapped):  # the words after the string that its commands run
            masked_run = _mask([w for w, _ in run], table, known, inner=True)
            for (word, src), shown in zip(run, masked_run, strict=True):
                if src is not None and shown != word:
                    rest[src - wrapped.at - 1] = shown
        if wrapped.positional and masked != text and POSITIONAL.search(text):
            # `sh -c 'llama-server --hf-token=$1' sh hf_...` (within a word): every word after the string
            rest = rest[:1] + [REDACTED] * len(rest[1:])
        return (*head, wrapped.prefix + masked, *rest)
    table = (_own_table(argv) if inner else None) or table
    out = [_mask_text(arg, known) for arg in argv]
    for opt in _walk(argv, table):
        if not (_secret_option(opt, table) or (opt.nargs is None and table is not None)):
            continue
        if opt.inline is not None:
            out[opt.at] = f"{argv[opt.at].partition('=')[0]}={REDACTED}"
        elif opt.nargs is None:  # "-hftTOKEN": a secret's short spelling and value
            joined = next((s for s in _short_secrets(table) if opt.name.startswith(s) and opt.name != s),
                          None)
            if joined is not None:
                out[opt.at] = joined + REDACTED
        for k in opt.values:
            out[k] = REDACTED
    return tuple(out)
