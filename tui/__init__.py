"""enginetop: watch and measure LLM inference engines and the GPU under them."""

__version__ = "0.1.0"
