"""``pocket-agent serve``: arguments, the bind-address rule, and starting uvicorn.

This module imports neither FastAPI nor uvicorn at import time, so the ``pocket-agent``
command line works without the ``server`` extra until ``serve`` is run.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError, PocketAgentError

if TYPE_CHECKING:
    from ..runtime import Model
    from .app import ServerConfig

API_KEY_ENV = "POCKET_AGENT_API_KEY"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, allow_remote: bool, api_key: str | None) -> None:
    """Refuse to listen beyond loopback unless asked to explicitly, and then only with a key."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise InvalidInputError(
            f"--host {host} is not a loopback address. To listen on the network pass --allow-remote "
            f"together with --api-key (or ${API_KEY_ENV})."
        )
    if not api_key:
        raise InvalidInputError(
            f"--allow-remote needs an API key: pass --api-key or set ${API_KEY_ENV}, so that only clients "
            f"holding it can use the model."
        )


def _require_extra() -> None:
    missing = []
    for mod in ("fastapi", "uvicorn"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise PocketAgentError(
            f"pocket-agent serve needs {', '.join(missing)}: pip install 'pocket-agent-mnn[server]'."
        )


class PortInUseError(InvalidInputError):
    """The port ``serve`` was asked to listen on is taken by another process."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, as uvicorn binds it (``SO_REUSEADDR``), not yet
    listening. Binding before the model loads makes a taken port the first thing reported,
    and serving on this very socket leaves no moment for another process to take it.

    Raises:
        PortInUseError: another process holds the port.
        InvalidInputError: the address cannot be bound for another reason (no such
            address, a privileged port).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {host} is in use; choose another with --port") from None
        raise InvalidInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(
    model: Model,
    config: ServerConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    access_log: bool = True,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``model`` over HTTP until interrupted (blocks).

    Args:
        model: the loaded model.
        config: how the server behaves.
        host, port: where to listen (ignored when ``sock`` is given).
        log_level: uvicorn's log level; the access log writes at ``info``.
        access_log: log one line per request (method, path, status).
        sock: an already bound socket (:func:`bind_socket`) to serve on; it is closed on exit.

    Raises:
        PortInUseError: ``port`` is taken (only without ``sock``).
    """
    _require_extra()
    import uvicorn

    from .app import create_app

    if sock is None:
        sock = bind_socket(host, port)
    app = create_app(model, config)
    uv_config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, access_log=access_log
    )
    try:
        uvicorn.Server(uv_config).run(sockets=[sock])
    finally:
        sock.close()


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``pocket-agent serve``; 2 when the port cannot be bound (one line on stderr)."""
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, allow_remote=args.allow_remote, api_key=api_key)
    if not 0 <= args.port <= 65535:
        raise InvalidInputError(f"--port must be in 0..65535, got {args.port}.")
    _require_extra()
    try:  # before the model loads: a taken port is reported at once, and before any banner
        sock = bind_socket(args.host, args.port)
    except InvalidInputError as exc:
        print(f"pocket-agent serve: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        from ..runtime import load_model
        from .app import ServerConfig

        model = load_model(args.model, threads=args.threads, n_ctx=args.n_ctx)
    except BaseException:
        sock.close()
        raise
    try:
        name = args.model_name or model.info.path.stem
        config = ServerConfig(
            model_name=name,
            api_key=api_key,
            max_queue=args.max_queue,
            timeout_s=args.timeout,
            max_body_bytes=args.max_body_bytes,
            call_threshold=args.call_threshold,
        )
        port = sock.getsockname()[1]
        url_host = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
        print(f"pocket-agent serve: {name} on http://{url_host}:{port}/v1", flush=True)
        serve(
            model,
            config,
            host=args.host,
            port=port,
            log_level=args.log_level,
            access_log=args.access_log,
            sock=sock,
        )
    finally:
        sock.close()
        model.close()
    return 0


def add_serve_parser(sub: Any) -> None:
    """Add the ``serve`` command to the ``pocket-agent`` subparsers."""
    p = sub.add_parser("serve", help="OpenAI-compatible local server with enforced response_format and tools")
    p.add_argument("--model", "-m", default=None, help="model path (default: $POCKET_AGENT_MODEL or embedded)")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--n-ctx", type=int, default=None, help="context window in tokens (default: the model's, max 4096)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (then an API key is required)",
    )
    p.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    p.add_argument("--max-queue", type=int, default=8, help="requests that may wait while one runs; more get 429")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request, queue time included")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    p.add_argument("--model-name", default=None, help="model id to report (default: the model file's name)")
    p.add_argument(
        "--call-threshold",
        type=float,
        default=None,
        help="tool_choice=auto: call when the model puts at least this probability on a call (e.g. 0.005)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="server log level (default info: one access-log line per request)",
    )
    p.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="do not log a line per request (the access log writes at info level)",
    )
    p.set_defaults(func=cmd_serve)
