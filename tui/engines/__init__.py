"""The engines enginetop knows: each one's knowledge in its own module (tui.engines.llamacpp, .vllm,
.sglang), found here by the dialect /metrics names or by the name a configuration gives."""

from __future__ import annotations
