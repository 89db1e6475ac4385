"""enginetop: watch and measure LLM inference engines and the GPU under them."""

import sys

__version__ = "0.1.0"

# httpx imports its own command-line client on import when click and pygments are installed (they are, for
# other packages): 3.4 MB of a dashboard that runs for days, for a command enginetop never runs. A None entry
# is how Python says "not importable", which httpx's __init__ already expects (its `main` then says to
# install httpx[cli]).
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
