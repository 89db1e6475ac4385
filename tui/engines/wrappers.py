"""What a command line runs, under whatever runs it. The masking (tui.engines.argv) reads each command found
inside a wrapper with its own engine's table; an engine's test of a process (tui.engines.knowledge.
program_name) names the module a Python runs.

A shell's command string (`sh -c`, `bash -lc`, `/bin/sh -c`, `env -S`) is split the way the shell splits it
(its `;`, `&&`, `|`, newlines between commands), with its positional parameters ("$@", "$1") taken from the
words after it; `env`'s, `exec`'s, `nohup`'s and a shell's `NAME=VALUE` prefixes are passed over; a Python
interpreter's options are passed over to its `-m MODULE` or script. Nothing here knows an engine or a
secret: it only says where the command is and what its words are.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash"})
# Commands that run the rest of their words as a command: `exec llama-server ...` in a shell string
_PREFIXES = frozenset({"exec", "command", "nohup", "time"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# A shell's operators: what separates one command of a string from the next (newline included)
_OPERATORS = ";&|()<>\n"
# A shell string that reads its positional parameters ($1, ${2}, "$@") gets them from the words after it
POSITIONAL = re.compile(r"\$(?:\{?[1-9]|[@*])")


@dataclass(frozen=True)
class Wrapped:
    """The command a wrapper runs: from argv[at] on, or in the string argv[at] after `prefix`."""

    at: int
    string: bool  # argv[at] is a command line in one string (a shell's -c, env's -S)
    name: str  # the wrapper as a user writes it ("sh -c"), for the words of a finding
    prefix: str = ""  # what precedes the string in its argument (`--split-string=`)
    positional: bool = False  # the words after the string are its $0, $1...


def _exe(arg: str) -> str:
    return arg.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".exe")


def _shell(argv: Sequence[str], exe: str) -> Wrapped | None:
    """`sh [options] -c STRING [$0 [$1...]]`: -c among the options (`-lc`, `-ec`, `-o pipefail -c`), the
    string the first word after them."""
    command, i = "", 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("--", "-"):  # the end of the options
            i += 1
            break
        if arg.startswith("--"):  # --login, --norc, --posix; --rcfile/--init-file take a file
            i += 2 if arg in ("--rcfile", "--init-file") else 1
            continue
        if len(arg) > 1 and arg[0] in "-+":
            if arg[0] == "-" and "c" in arg:
                command = arg
            i += 2 if "o" in arg[1:] or "O" in arg[1:] else 1  # -o OPTION, bash's -O SHOPT
            continue
        break
    return Wrapped(i, True, f"{exe} {command}", positional=True) if command and i < len(argv) else None


def _env(argv: Sequence[str]) -> Wrapped | None:
    """`env [options] [NAME=VALUE...] COMMAND...`, or the command line in one string of `env -S STRING`."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-S", "--split-string"):
            return Wrapped(i + 1, True, "env -S") if i + 1 < len(argv) else None
        for joined in ("-S", "--split-string="):  # -SSTRING, --split-string=STRING
            if arg.startswith(joined):
                return Wrapped(i, True, "env -S", prefix=joined)
        if arg in ("-u", "--unset", "-C", "--chdir"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        break
    while i < len(argv) and _ENV_NAME.match(argv[i]):
        i += 1
    return Wrapped(i, False, "env") if i < len(argv) else None


def unwrap(argv: Sequence[str]) -> Wrapped | None:
    """The command this command line runs in its stead, or None when it runs none (it is the program)."""
    if not argv:
        return None
    exe = _exe(argv[0])
    if exe in _SHELLS:
        return _shell(argv, exe)
    if exe == "env":
        return _env(argv)
    i = 0
    if exe in _PREFIXES:
        i = 1
        while i < len(argv) and argv[i].startswith("-"):
            i += 2 if argv[i] == "-a" else 1  # exec -a NAME
    while i < len(argv) and _ENV_NAME.match(argv[i]):  # a shell's `HF_TOKEN=... llama-server ...`
        i += 1
    return Wrapped(i, False, exe) if 0 < i < len(argv) else None


def shell_words(text: str) -> list[str]:
    """`text` split the way a shell splits it, its operators (`;`, `&&`, `|`, a newline) words of their own;
    split at whitespace where it cannot be (an unbalanced quote)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=_OPERATORS)
    lexer.whitespace = " \t\r"  # a newline ends a command: an operator, not a space
    lexer.whitespace_split = True
    lexer.commenters = ""  # a secret in a comment is still in the text
    try:
        return list(lexer)
    except ValueError:
        return text.split()


def is_operator(word: str) -> bool:
    return bool(word) and all(ch in _OPERATORS for ch in word)


def shell_commands(words: list[str]) -> list[list[str]]:
    """The words of each command of a shell string, and each run of operators, in order."""
    runs: list[list[str]] = []
    for word in words:
        if runs and is_operator(word) == is_operator(runs[-1][0]):
            runs[-1].append(word)
        else:
            runs.append([word])
    return runs


_WHOLE_POSITIONAL = re.compile(r"^\$(?:\{([1-9])\}|([1-9])|\{?([@*])\}?)$")


def expanded(argv: Sequence[str], wrapped: Wrapped) -> list[list[tuple[str, int | None]]]:
    """The commands a shell string runs, its positional parameters put in ("$@", "$1" as whole words: `sh -c
    'exec llama-server "$@"' sh -m M --api-key K`), each word with the index of the argv element it came
    from (None: the string's own), so a secret among the words after the string is found where it is."""
    words = shell_words(argv[wrapped.at][len(wrapped.prefix):])
    after = list(range(wrapped.at + 2, len(argv)))  # $1... (argv[at + 1] is $0)
    pairs: list[tuple[str, int | None]] = []
    for word in words:
        m = _WHOLE_POSITIONAL.match(word) if wrapped.positional else None
        if m is None:
            pairs.append((word, None))
        elif m.group(3):  # $@, $*: every one
            pairs += [(argv[k], k) for k in after]
        elif (n := int(m.group(1) or m.group(2))) <= len(after):
            pairs.append((argv[after[n - 1]], after[n - 1]))
    runs: list[list[tuple[str, int | None]]] = []
    for pair in pairs:
        if runs and is_operator(pair[0]) == is_operator(runs[-1][0][0]):
            runs[-1].append(pair)
        else:
            runs.append([pair])
    return [run for run in runs if not is_operator(run[0][0])]


# ---------------------------------------------------------------- a Python's program


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
