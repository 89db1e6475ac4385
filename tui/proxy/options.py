"""What a run's proxy is made of (`enginetop proxy`, or the dashboard's --proxy-listen): a listen address per
engine, the trace, the limits. `parse_listens` reads the NAME=HOST:PORT flags; `build_proxy` makes the proxy
(not yet listening: TrafficProxy.start does that)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tui.base.defaults import BLOCK_SIZE, CONNECT_TIMEOUT_S, MAX_BODY_BYTES
from tui.base.paths import config_dir
from tui.model.targets import EngineTarget
from tui.net.listen import Listen, ListenError, parse_listen
from tui.proxy.headroom import capacity_file
from tui.proxy.server import Route, TrafficProxy
from tui.proxy.trace import KEY_FILE_NAME, TraceWriter, load_key


@dataclass
class ProxyOptions:
    listens: dict[str, Listen]  # engine name -> where its proxy listens
    trace: Path | None = None
    block_size: int = BLOCK_SIZE
    capture_content: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    key_file: Path = field(default_factory=lambda: config_dir() / KEY_FILE_NAME)
    capacity_file: Path = field(default_factory=capacity_file)  # what `enginetop capacity` measured


def parse_listens(specs: list[str], names: list[str], allow_remote: bool,
                  flag: str = "--listen") -> dict[str, Listen]:
    """NAME=HOST:PORT per engine; with one engine, NAME= may be left out. Every engine needs one, and no
    two share an address."""
    out: dict[str, Listen] = {}
    for spec in specs:
        name, sep, address = spec.partition("=")
        if not sep:
            if len(names) != 1:
                raise ListenError(f"{flag} {spec!r}: with several engines, say which: {flag} NAME=HOST:PORT")
            name, address = names[0], spec
        if name not in names:
            raise ListenError(f"{flag} {spec!r}: no engine is named {name!r} (engines: {', '.join(names)})")
        if name in out:
            raise ListenError(f"{flag}: engine {name!r} is given two addresses")
        out[name] = parse_listen(address, allow_remote, flag)
    missing = [n for n in names if n not in out]
    if missing:
        raise ListenError(f"{flag}: no address for {', '.join(missing)}: give {flag} NAME=HOST:PORT for each "
                          "engine")
    seen: dict[Listen, str] = {}
    for name, listen in out.items():
        if (other := seen.setdefault(listen, name)) != name:
            raise ListenError(f"{flag}: {other} and {name} both listen on {listen.display}")
    return out


def build_proxy(options: ProxyOptions, targets: list[EngineTarget]) -> TrafficProxy:
    by_name = {t.name: t for t in targets}
    routes = [Route(name, by_name[name].base, listen) for name, listen in options.listens.items()]
    trace = None
    if options.trace is not None:
        if options.block_size < 1:
            raise ValueError(f"--block-size must be at least 1, got {options.block_size}")
        trace = TraceWriter(options.trace, load_key(options.key_file), {r.engine: r.upstream for r in routes},
                            options.block_size, options.capture_content)
    proxy = TrafficProxy(routes, max_body_bytes=options.max_body_bytes,
                         connect_timeout_s=options.connect_timeout_s, trace=trace)
    proxy.weigh(options.capacity_file)
    return proxy
