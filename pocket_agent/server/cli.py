"""``pocket-agent serve``: arguments, the bind-address rule, and starting uvicorn.

This module imports neither FastAPI nor uvicorn at import time, so the ``pocket-agent``
command line works without the ``server`` extra until ``serve`` is run.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
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


def serve(
    model: Model, config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
) -> None:
    """Serve ``model`` over HTTP until interrupted (blocks)."""
    _require_extra()
    import uvicorn

    from .app import create_app

    app = create_app(model, config)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, access_log=False)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``pocket-agent serve``."""
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, allow_remote=args.allow_remote, api_key=api_key)
    if not 0 <= args.port <= 65535:
        raise InvalidInputError(f"--port must be in 0..65535, got {args.port}.")
    _require_extra()
    from ..runtime import load_model
    from .app import ServerConfig

    model = load_model(args.model, threads=args.threads, n_ctx=args.n_ctx)
    name = args.model_name or model.info.path.stem
    config = ServerConfig(
        model_name=name,
        api_key=api_key,
        max_queue=args.max_queue,
        timeout_s=args.timeout,
        max_body_bytes=args.max_body_bytes,
        call_threshold=args.call_threshold,
    )
    print(f"pocket-agent serve: {name} on http://{args.host}:{args.port}/v1", flush=True)
    try:
        serve(model, config, host=args.host, port=args.port, log_level=args.log_level)
    finally:
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
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
