"""`enginetop web`: the dashboard in a browser, through textual-serve.

textual-serve starts one dashboard process per browser tab (`python -m tui ARGS`, through a shell) and has
no authentication: it listens on loopback unless --allow-remote, and the way in from elsewhere is an SSH
tunnel. The tab's command line is rebuilt from the dashboard options given here; it never carries a
secret, because the options themselves never do: keys come as --api-key-file/--api-key-env (a path or a
variable name; the tab's process reads the key itself), and an engine URL with user:password@ in it is
refused here, since it would sit in every tab's command line for any `ps` to show.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING, Any

from tui.cli.dashboard import add_dashboard_args
from tui.cli.options import EXIT_BAD_INPUT

if TYPE_CHECKING:
    from tui.net.listen import Listen

DEFAULT_LISTEN = "127.0.0.1:8765"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "web", help="serve the dashboard to a browser (textual-serve; loopback, no authentication)",
        description="Serve the dashboard at http://LISTEN/: every browser tab gets its own dashboard "
                    "process, run with the dashboard options given here. No authentication: it listens on "
                    "loopback; from another machine use an SSH tunnel (ssh -L 8765:127.0.0.1:8765 HOST, "
                    "then open http://127.0.0.1:8765).")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help="where to serve (default %(default)s; loopback unless --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen: whoever reaches it gets a dashboard, keys included")
    p.add_argument("--public-url", default=None, metavar="URL",
                   help="the URL browsers use to reach this server, when it is not http://LISTEN (e.g. "
                        "behind a proxy); the page connects its websocket there")
    add_dashboard_args(p)
    p.set_defaults(func=cmd_web)


def dashboard_argv(args: argparse.Namespace) -> list[str]:
    """The dashboard options in `args` as argv, for each tab's `python -m tui` (defaults left out). Every
    dashboard option is a long flag named after its dest (tests/test_web.py holds them to it), so the
    options come from a reference parser's defaults, whatever is added to them later."""
    reference = argparse.ArgumentParser(add_help=False)
    add_dashboard_args(reference)
    argv: list[str] = []
    for dest, default in vars(reference.parse_args([])).items():
        value = getattr(args, dest, default)
        if value is None or value == default:
            continue
        flag = "--" + dest.replace("_", "-")
        if value is True:  # a switch such as --keep-engines
            argv.append(flag)
        elif isinstance(value, list):
            argv += [f"{flag}={item}" for item in value]
        else:
            argv.append(f"{flag}={value}")
    return argv


def _check(args: argparse.Namespace) -> Listen:
    """Everything a tab's dashboard would refuse, refused once here, before anything is served."""
    # imported when the command runs, so --help and the other commands never pay for it
    from tui.base import install
    from tui.net.listen import check_free, parse_listen
    from tui.run.targets import build_targets, parse_engine_spec

    listen = parse_listen(args.listen, args.allow_remote)
    for spec in args.engine or []:
        parsed = parse_engine_spec(spec)
        if parsed.basic_auth is not None:
            raise ValueError(f"--engine {parsed.name}: user:password@ in the URL would be on every browser "
                             "tab's command line; put a key in a file and give --api-key-file NAME=PATH")
    # a missing key file: said once, here; with no --engine or --profile, a key names a discovered engine,
    # which each tab's dashboard finds and checks
    build_targets(args.engine, args.api_key_file, args.api_key_env,
                  discovering=not (args.engine or args.profile))
    # with nothing to watch, each tab's dashboard finds the engines running here: it starts none
    if getattr(args, "demo", None):
        enginetop = install.command()
        raise ValueError("--demo would start the demo engines once per browser tab: start them once with "
                         f"`{enginetop} up demo-cpu-threads2` (and demo-vllm-gemma), then "
                         f"`{enginetop} web --profile demo-cpu-threads2 ...`")
    if args.profile:
        from tui.base.process import pid_alive
        from tui.lifecycle.profile_files import load_profiles
        from tui.lifecycle.state import read_state

        loaded = load_profiles()
        for name in args.profile:
            loaded.get(name)
            record = read_state(name)
            # Every tab's dashboard attaches to the engine `enginetop up` started; with none running, each
            # tab would start its own on the same port.
            if record is None or not pid_alive(record["pid"], record.get("create_time")):
                raise ValueError(f"--profile {name}: no engine of this profile is running; start it once "
                                 f"with `{install.command()} up {name}` and every browser tab attaches to it")
    check_free(listen)
    return listen


def public_url(listen: Listen, given: str | None) -> str:
    import socket

    if given:
        return given.rstrip("/")
    host = listen.host
    if host in ("0.0.0.0", "::", ""):
        # The page tells the browser where to open its websocket: a wildcard address is nowhere to go.
        host = socket.getfqdn()
    return f"http://[{host}]:{listen.port}" if ":" in host else f"http://{host}:{listen.port}"


def tab_command(args: argparse.Namespace) -> str:
    return shlex.join([sys.executable, "-m", "tui", *dashboard_argv(args)])


def cmd_web(args: argparse.Namespace) -> int:
    from tui.net.listen import ListenError, bind_message

    try:
        listen = _check(args)
    except (ListenError, ValueError) as exc:  # TargetError, SecretError, ProfileError are ValueErrors
        print(f"enginetop web: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from textual_serve.server import Server

    url = public_url(listen, args.public_url)
    server = Server(tab_command(args), host=listen.host, port=listen.port, title="enginetop", public_url=url)
    print(f"enginetop web: open {url}/ (each browser tab runs its own dashboard)", file=sys.stderr,
          flush=True)
    try:
        server.serve()
    except OSError as exc:  # lost a race for the port since the check
        print(f"enginetop web: {bind_message(listen, exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
