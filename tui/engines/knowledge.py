"""What enginetop knows of each engine, in one value per engine (defined in that engine's own module):
its command line (tui.engines.argv.Options), how to tell its process from another that listens on a port,
its words when it refuses a prompt for its length, and the options a suggestion names.

The config reader, the findings and the masking all read it here, so an engine's flags are written once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from tui.engines.argv import Options, register_engine
from tui.engines.wrappers import python_program

DraftKind = Literal["draft model", "model heads", "n-gram", "unknown"]


@dataclass(frozen=True)
class EngineKnowledge:
    dialect: str  # as /metrics names it: "llamacpp", "vllm", "sglang"
    name: str  # as EngineConfig.engine says it: "llama.cpp", "vLLM", "SGLang"
    program: str  # what a user calls it: "llama-server", "vLLM", "SGLang"
    options: Options
    # argv -> True when the process is this engine (its executable or module), not a proxy, tunnel or
    # container port-forward in front of it
    is_engine: Callable[[Sequence[str]], bool]
    refusal_words: re.Pattern[str]  # its answer to a prompt longer than a request may hold
    prefix_cache_on: str  # what to try when its prefix cache is off
    # (depth, depth now, speculative type) -> the option that sets that depth
    spec_depth: Callable[[int, int | None, str | None], str]
    spec_off: str  # how to turn speculative decoding off
    context_option: str  # the option that sets the context one request may use
    slots_option: str  # the option that sets how many requests run at once
    memory_options: str  # what lowers what its start and its KV cache take
    draft_kind: Callable[[str | None], DraftKind]  # the speculative type -> what drafts the tokens

    def __post_init__(self) -> None:
        # the masking reads a command found inside a shell string (`sh -c "exec llama-server -hft ..."`)
        # with the table of the engine it runs, whatever table its caller had
        register_engine(self.is_engine, self.options)


def program_name(argv: Sequence[str]) -> str:
    """The program a command line runs, as a user would name it: its executable, or `python -m MODULE`'s
    module, or the script a Python runs."""
    words = [a for a in argv if a]
    if len(words) == 1 and len(words[0].split()) > 1:
        # a process that rewrote its title (setproctitle) shows its whole command line as one string (the
        # rest of its argv area NULs: empty entries), a key among its words maybe: its first word names it
        argv = words[0].split()
    if not argv:
        return "an unknown process"
    exe = argv[0].replace("\\", "/").rsplit("/", 1)[-1]
    if exe.startswith("python") and len(argv) > 1:
        program = python_program(argv)
        return program.replace("\\", "/").rsplit("/", 1)[-1] if program else exe
    return exe
