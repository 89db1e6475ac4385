"""A command line read the way an engine's own parser reads it, and masked before anything keeps it.

Each engine module (tui.engines.llamacpp, .vllm, .sglang) gives its option table (`Options`): every spelling
of every option and how many values it takes, which options hold secrets, and how its parser matches names
(llama.cpp: exact names, `_` read as `-`; vLLM and SGLang: argparse, which also takes any unambiguous prefix
of a long option and `--opt=value`). `mask_argv` is the project's one masking function: the config reader,
the launcher's log line and every result that keeps an argv use it.

What is masked, for any program (an engine, or whatever else listens on a port):
- the value of an option the table marks secret, in every spelling (short, long, alias, prefix, `=value`,
  `_` for `-`), every value of an option that takes several (vLLM's `--api-key a b`), and none when the
  option was given without one (the next option is left alone);
- the value of any option whose name says key, token, secret, password or credential (a generic rule, for
  programs with no table and options an engine added after its table was read), except a path (`...-file`);
- every value after an option the table does not know: how many it takes cannot be known, so nothing is
  guessed;
- `NAME=VALUE` where NAME says key, token, secret, password or credential (`-e HF_TOKEN=...`);
- the password of a URL's `user:password@`, and every occurrence of a secret the caller knows (the target's
  own API key), wherever it appears.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tui.base.secrets import REDACTED

# nargs of an option: a switch, one value, an optional value, one or more values
SWITCH, ONE, OPTIONAL, MANY = 0, 1, "?", "+"
Nargs = int | str

_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential",
                           "credentials", "pass", "auth"})
_PATH_WORDS = frozenset({"file", "path", "dir"})
_WORD = re.compile(r"[a-z0-9]+")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.+)$", re.DOTALL)
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)([^/\s@]+)(@)")


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


# A word that ends so is a secret's name run together ("hftoken", "secretkey", "accesstoken")
_SECRET_ENDS = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials", "secretkey",
                "accesskey")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def says_secret(name: str) -> bool:
    """An option or variable name that says it holds a key, token, secret, password or credential (and is
    not a path to one): in any case, `-`, `_`, `.` or camelCase between its words, or run together."""
    words = _WORD.findall(_CAMEL.sub("-", name).lower())
    return bool(words) and words[-1] not in _PATH_WORDS and any(
        w in _SECRET_WORDS or w.endswith(_SECRET_ENDS) or w.startswith(("secret", "passw")) for w in words)


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
    """One argument: the known secrets, a URL's password, `NAME=VALUE` (also after an option's `=`), secret
    members of a JSON value, and a command line given as one string (`sh -c "vllm serve --api-key K"`)."""
    for secret in secrets:
        arg = arg.replace(secret, REDACTED)
    arg = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), arg)
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
        try:
            words = shlex.split(rest)
        except ValueError:
            words = []
        if len(words) > 1:
            masked_words = mask_argv(words, None, secrets)
            if list(masked_words) != words:
                rest = shlex.join(masked_words)
    return head + eq + rest


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


def program_start(argv: Sequence[str]) -> int:
    """Where the program's own arguments start: after a Python interpreter's options and `-m MODULE` or its
    script (`python -u -m vllm.entrypoints.openai.api_server --port 8000`: at --port), else at argv[1]."""
    if not argv or not argv[0].replace("\\", "/").rsplit("/", 1)[-1].startswith("python"):
        return 1
    return _python_program(argv)[1]


def _python_program(argv: Sequence[str]) -> tuple[str | None, int]:
    """A Python command line's program (`-m MODULE`, `-mMODULE`, the script, or None for `-c`) and where its
    own arguments start, after the interpreter's options (`-u`, `-X dev`, `-Xdev`, `-W ignore`...)."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c"):  # the module or the command; what follows is the program's
            return (argv[i + 1] if arg == "-m" and i + 1 < len(argv) else None), min(i + 2, len(argv))
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:], i + 1
        if arg.startswith("-c") and not arg.startswith("--"):
            return None, i + 1
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if not arg.startswith("-"):
            return arg, i + 1  # the script
        i += 1
    return None, len(argv)


def python_program(argv: Sequence[str]) -> str | None:
    """The program a Python interpreter runs on this command line (see _python_program)."""
    return _python_program(argv)[0]


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
    if says_secret(opt.name):
        return True
    # case-insensitively too: "--API_KEY" is no key to a parser, but it says what it holds
    return table is not None and any(name is not None and table.canonical(name) in table.secret
                                     for name in (opt.name, table.resolve(opt.name.lower())))


def secrets_on_argv(argv: Sequence[str], table: Options | None = None, secrets: Iterable[str | None] = ()
                    ) -> list[tuple[int, str]]:
    """(index, why) for every argv element that puts a secret on the command line, where every user of the
    machine can read it: an option that holds one (in any spelling `table`'s engine accepts, or whose name
    says so), a `NAME=VALUE` whose name says so, or an element containing one of `secrets`. The words
    never quote the value."""
    values = [s for s in secrets if s]
    found: dict[int, str] = {}
    for opt in _walk(argv, table):
        if _secret_option(opt, table):
            name = argv[opt.at].strip().partition("=")[0]
            found[opt.at] = f"{name!r} holds a secret (an API key, token or password)"
    for i, arg in enumerate(argv):
        if i in found:
            continue
        if any(value in arg for value in values):
            found[i] = "it contains the API key itself"
        elif _mask_text(arg, ()) != arg:  # NAME=VALUE, a URL's password, a JSON member, a command in a string
            found[i] = "it holds a secret (a key, token or password within it)"
    return sorted(found.items())


def mask_argv(argv: Sequence[str], table: Options | None = None, secrets: Iterable[str | None] = ()
              ) -> tuple[str, ...]:
    """argv with every secret value replaced by ***: see the module's docstring for what counts as one.
    `table`: the engine's options (None for a program enginetop has no table for); `secrets`: values that
    are secret wherever they appear (the target's API key)."""
    known = sorted({s for s in secrets if s}, key=len, reverse=True)
    out = [_mask_text(arg, known) for arg in argv]
    for opt in _walk(argv, table):
        if not (_secret_option(opt, table) or (opt.nargs is None and table is not None)):
            continue
        if opt.inline is not None:
            out[opt.at] = f"{argv[opt.at].partition('=')[0]}={REDACTED}"
        elif opt.nargs is None and table is not None:  # "-hftTOKEN": a secret's short spelling and value
            joined = next((s for s in table.secret if not s.startswith("--") and opt.name.startswith(s)),
                          None)
            if joined is not None:
                out[opt.at] = joined + REDACTED
        for k in opt.values:
            out[k] = REDACTED
    return tuple(out)
