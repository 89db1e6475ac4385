"""Read each engine's option table from the engine itself and write it as data enginetop ships
(tui/engines/options_llamacpp.py, tui/engines/options_vllm.py).

    .venv/bin/python scripts/engine_options.py            # both, from `make engine` and `make vllm`
    .venv/bin/python scripts/engine_options.py --check    # exit 1 if a shipped table differs from its engine

llama-server: its `--help` (every spelling of every option, and whether it takes a value). vLLM: the argparse
parser of `vllm serve` itself (make_arg_parser), run with the vLLM venv's Python: every option string and
its nargs. tests/test_engine_options.py runs --check against the real engines, so a table that went stale
with an engine upgrade fails the suite.
"""

from __future__ import annotations

import argparse
import json
import pprint
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_HELP_LINE = re.compile(r"^(-\S.*?)(?:\s{2,}|$)")

# Run with the vLLM venv's Python: prints {spelling: nargs} and {spelling: canonical} as JSON.
_VLLM_DUMP = r"""
import json
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
nargs, aliases = {}, {}
for action in parser._actions:
    if not action.option_strings:
        continue
    n = action.nargs
    if n is None:
        n = 0 if action.const is not None and action.type is None and not action.choices else 1
    if isinstance(n, int) and n == 0 or type(action).__name__ in (
            "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "_HelpAction", "_VersionAction",
            "BooleanOptionalAction", "_CountAction", "_AppendConstAction"):
        n = 0
    elif n in ("*", "+") or isinstance(n, int) and n > 1:
        n = "+"
    elif n == "?":
        n = "?"
    else:
        n = 1
    # BooleanOptionalAction's "--no-enable-prefix-caching": the negation is its own canonical name
    for group in ([o for o in action.option_strings if not o.startswith("--no-")],
                  [o for o in action.option_strings if o.startswith("--no-")]):
        longs = [o for o in group if o.startswith("--")]
        for spelling in group:
            nargs[spelling] = n
            aliases[spelling] = longs[0] if longs else group[0]
print(json.dumps({"nargs": nargs, "aliases": aliases}))
"""


def llama_table(binary: str) -> dict:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60, check=False)
    nargs: dict[str, object] = {}
    aliases: dict[str, str] = {}
    env: dict[str, str] = {}
    last: list[str] = []  # the canonical names of the option being described
    for line in (out.stdout + out.stderr).splitlines():
        for name in re.findall(r"\(env: (LLAMA_[A-Z0-9_]+)\)", line):
            if last:
                env[name] = last[0]  # the option's first group: the switch, not its negation
        match = _HELP_LINE.match(re.sub(r",\s+", ", ", line))  # "-c,    --ctx-size N": one column
        if not match:
            continue
        words = [w for w in re.split(r"[,\s]+", match.group(1).strip()) if w]
        spellings = [w for w in words if re.match(r"--?[A-Za-z]", w)]
        if not spellings:
            continue
        takes = 1 if any(not w.startswith("-") for w in words) else 0
        # "--cache-prompt, --no-cache-prompt": a switch and its negation, each its own canonical name
        last = []
        for group in ([s for s in spellings if not s.lstrip("-").startswith("no-")],
                      [s for s in spellings if s.lstrip("-").startswith("no-")]):
            longs = [s for s in group if s.startswith("--")]
            for spelling in group:
                nargs[spelling] = takes
                aliases[spelling] = longs[0] if longs else group[0]
            if group:
                last.append(longs[0] if longs else group[0])
    if len(nargs) < 50:
        raise SystemExit(f"llama-server --help gave only {len(nargs)} options: is {binary} llama-server?")
    return {"nargs": nargs, "aliases": aliases, "env": env}


def vllm_table(python: str) -> dict:
    out = subprocess.run([python, "-c", _VLLM_DUMP], capture_output=True, text=True, timeout=600,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"vLLM's parser could not be read:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _module(engine: str, source: str, table: dict) -> str:
    return (f'"""{engine}\'s options as {source} gives them: spelling -> nargs (0 a switch, 1 a value,\n'
            f'"?" an optional value, "+" one or more) and spelling -> the canonical spelling. Written by\n'
            f'scripts/engine_options.py; checked against the real engine by tests/test_engine_options.py.'
            '"""\n\n'
            f"NARGS: dict[str, int | str] = {pprint.pformat(table['nargs'], width=110, sort_dicts=True)}\n\n"
            f"ALIASES: dict[str, str] = {pprint.pformat(table['aliases'], width=110, sort_dicts=True)}\n"
            + (f"\n# its environment twins (LLAMA_ARG_*), read as the option they stand for\n"
               f"ENV: dict[str, str] = {pprint.pformat(table['env'], width=110, sort_dicts=True)}\n"
               if "env" in table else ""))


def table(dialect: str) -> tuple[str, str, dict]:
    """(the engine, where its table was read, the table) for one dialect, read from the installed engine."""
    if dialect == "llamacpp":
        from tui.engines.install_llamacpp import llama_server_binary
        return "llama-server", "its --help", llama_table(str(llama_server_binary()))
    from tui.engines.install_vllm import vllm_python
    return "vLLM", "`vllm serve`'s argparse parser", vllm_table(str(vllm_python()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped tables, write nothing")
    ap.add_argument("--only", choices=("llamacpp", "vllm"))
    args = ap.parse_args()
    stale = []
    for dialect in [args.only] if args.only else ["llamacpp", "vllm"]:
        engine, source, read = table(dialect)
        path = ROOT / "tui" / "engines" / f"options_{dialect}.py"
        text = _module(engine, source, read)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(f"{path.relative_to(ROOT)} differs from {engine}: run scripts/engine_options.py")
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}: {len(read['nargs'])} spellings")
    if args.check:
        print("\n".join(stale) or "the shipped option tables match the engines")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
