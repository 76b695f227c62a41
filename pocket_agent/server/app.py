"""The HTTP face: a FastAPI app speaking OpenAI's chat completions API, its Responses API
(``/v1/responses``, translated to a chat turn in :mod:`.responses`) and two calls of our own
(``/v1/extract`` and ``/v1/decide``) over one loaded model.

- One model per process. Its work runs on one thread (the event loop stays free), one
  request at a time; at most ``max_queue`` more wait, further requests get 429 with
  ``Retry-After``.
- Each request has a deadline (``timeout_s``, queue time included); past it the work stops
  at the next token and the client gets 504.
- A client that disconnects stops its generation at the next token (streaming or not);
  a request whose client left while it waited never starts.
- Every error is OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``) and
  bad input is always a 4xx, answered as a handled error: the log gets its access line, no
  traceback (tracebacks are for 500s, which are bugs).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    AdapterError,
    ContextOverflowError,
    ExtractionError,
    InvalidInputError,
    OutputBudgetExceeded,
    PocketAgentError,
    SchemaError,
    ToolArgumentError,
    UnsupportedSchemaError,
)
from ..runtime import Model
from .engine import ChatTurn, Check, Event, decide_events, extract_events
from .protocol import (
    APIError,
    ChatCompletionRequest,
    DecideRequest,
    ExtractRequest,
    Reply,
    chat_job,
    chunk_body,
    completion_body,
    new_id,
    parse_request,
    sse,
)

log = logging.getLogger("pocket_agent.server")

DISCONNECT_POLL_S = 0.25
"""How often a request that is not streaming checks whether its client is still there."""

DRAIN_LIMIT = 64 << 20
"""An oversized body is read (and dropped) up to this many bytes before the 413, so that
clients still sending get the answer instead of a reset connection."""


@dataclass(frozen=True)
class ServerConfig:
    """How the server behaves.

    Args:
        model_name: the id ``/v1/models`` lists and responses carry. Requests may name any
            model; this one answers.
        api_key: when set, every ``/v1`` request needs ``Authorization: Bearer <key>``.
        max_queue: requests that may wait while one runs; more get 429.
        timeout_s: deadline of one request, queue time included.
        max_body_bytes: largest request body; larger ones get 413.
        call_threshold: :class:`pocket_agent.Agent`'s ``call_threshold`` for
            ``tool_choice="auto"`` (``None``: the model's own sampled choice).
    """

    model_name: str
    api_key: str | None = None
    max_queue: int = 8
    timeout_s: float = 300.0
    max_body_bytes: int = 1 << 20
    call_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise InvalidInputError(f"max_queue must be >= 0, got {self.max_queue}.")
        if not self.timeout_s > 0:
            raise InvalidInputError(f"timeout_s must be positive, got {self.timeout_s}.")
        if self.max_body_bytes < 1024:
            raise InvalidInputError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}.")
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidInputError("api_key is empty; give a real key or none.")


class _StoppedError(Exception):
    """The work was stopped between two tokens: ``reason`` is ``timeout`` or ``disconnect``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_END = object()


class Job:
    """One request's work on the model thread and the queue its events come back on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        self.loop = loop
        self.deadline = deadline
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self._stop = threading.Event()
        self._reason = ""
        self._polled = time.monotonic()

    def cancel(self, reason: str) -> None:
        """Stop the work at its next check (no effect once it has finished)."""
        if not self._stop.is_set():
            self._reason = reason
            self._stop.set()

    def check(self) -> None:
        """Raise :class:`_StoppedError` if the job was cancelled or its deadline passed."""
        if self._stop.is_set():
            raise _StoppedError(self._reason)
        if time.monotonic() > self.deadline:
            raise _StoppedError("timeout")

    def post(self, item: Any) -> None:
        """Hand an event (or an exception, or the end marker) to the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shutting down)
            pass

    async def next(self, request: Request | None) -> Event:
        """The next event. Whatever stops the work is raised as the :class:`APIError` the
        client gets (the work's error, 504 at the deadline, 499 when the client left), so
        that FastAPI answers it as a handled error, never as an unhandled exception. With
        ``request``, a client that disconnected cancels the work."""
        try:
            return await self._next(request)
        except APIError:
            raise
        except Exception as exc:
            raise api_error(exc) from exc

    async def _next(self, request: Request | None) -> Event:
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.cancel("timeout")
                raise _StoppedError("timeout")
            if request is not None and time.monotonic() - self._polled > DISCONNECT_POLL_S:
                self._polled = time.monotonic()
                if await request.is_disconnected():
                    self.cancel("disconnect")
                    raise _StoppedError("disconnect")
            try:
                item = await asyncio.wait_for(self.events.get(), timeout=min(DISCONNECT_POLL_S, remaining))
            except TimeoutError:
                continue
            if item is _END:
                raise APIError(500, "The work ended without a result.", type="server_error")
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Event)
            return item


Work = Callable[[Check], Iterator[Event]]


class Runner:
    """The model thread and its bounded queue. Admission is counted on the event loop."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pocket-agent-model")
        self._pending = 0
        self._avg_s = 2.0
        self._jobs: set[Job] = set()
        self.outcomes: Counter[str] = Counter()
        """How finished work ended: ``ok``, ``error``, ``timeout``, ``disconnect`` (stopped
        because the client went away), ``finished`` (the answer was complete before the
        last check)."""

    @property
    def pending(self) -> int:
        """Requests running or waiting."""
        return self._pending

    def submit(self, work: Work, timeout_s: float) -> Job:
        """Queue ``work``; 429 with ``Retry-After`` when the queue is full."""
        if self._pending >= 1 + self.max_queue:
            retry = max(1, round(self._avg_s * self._pending))
            raise APIError(
                429,
                f"The server is busy ({self._pending} requests running or queued, --max-queue {self.max_queue}). "
                f"Retry after {retry} s.",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(retry)},
            )
        loop = asyncio.get_running_loop()
        job = Job(loop, time.monotonic() + timeout_s)
        self._pending += 1
        self._jobs.add(job)

        def run() -> None:
            t0 = time.monotonic()
            outcome = "ok"
            try:
                job.check()  # the client may have left, or the deadline passed, while it waited
                for ev in work(job.check):
                    job.post(ev)
                    if ev.kind == "done":
                        break
                    job.check()
            except BaseException as exc:
                outcome = exc.reason if isinstance(exc, _StoppedError) else "error"
                job.post(exc)
            finally:
                job.post(_END)
                elapsed = time.monotonic() - t0
                try:
                    loop.call_soon_threadsafe(self._done, job, elapsed, outcome)
                except RuntimeError:  # the loop is gone (server shutting down)
                    pass

        self._pool.submit(run)
        return job

    def _done(self, job: Job, elapsed: float, outcome: str) -> None:
        self._pending -= 1
        self._jobs.discard(job)
        self.outcomes[outcome] += 1
        self._avg_s = 0.8 * self._avg_s + 0.2 * elapsed

    def shutdown(self) -> None:
        """Stop running work at its next token and drop what waits."""
        for job in list(self._jobs):
            job.cancel("shutdown")
        self._pool.shutdown(wait=False, cancel_futures=True)


def api_error(exc: BaseException) -> APIError:
    """The OpenAI-shaped error for anything a request raised."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, _StoppedError):
        if exc.reason == "timeout":
            return APIError(504, "The request ran past the server's timeout.", type="timeout_error", code="timeout")
        return APIError(499, "The client closed the request.", type="invalid_request_error", code="client_closed")
    if isinstance(exc, ContextOverflowError):
        return APIError(
            400,
            f"{exc} (needed {exc.needed} tokens, context {exc.n_ctx}).",
            param="messages",
            code="context_length_exceeded",
        )
    if isinstance(exc, UnsupportedSchemaError):
        return APIError(
            400,
            f"Unsupported schema feature {exc.feature or 'unknown'} at {exc.path or '#'}: {exc}",
            code="unsupported_schema",
        )
    if isinstance(exc, SchemaError):
        return APIError(400, f"Invalid schema: {exc}", code="invalid_schema")
    if isinstance(exc, (InvalidInputError, ToolArgumentError, AdapterError)):
        return APIError(400, str(exc), code="invalid_value")
    if isinstance(exc, OutputBudgetExceeded):
        return APIError(422, f"{exc} Partial output: {exc.partial[:200]!r}", type="invalid_output", code="max_tokens")
    if isinstance(exc, ExtractionError):
        return APIError(422, str(exc), type="invalid_output", code="validation_failed")
    if isinstance(exc, PocketAgentError):
        return APIError(500, f"{type(exc).__name__}: {exc}", type="server_error")
    log.exception("unexpected error", exc_info=exc)
    return APIError(500, f"Internal error ({type(exc).__name__}).", type="server_error")


def error_response(exc: BaseException) -> JSONResponse:
    err = api_error(exc)
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 when it is larger than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    body = bytearray()
    over = declared is not None and declared.isdigit() and int(declared) > limit
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            over = True
        if over:
            if seen > DRAIN_LIMIT:
                break
            continue
        body += chunk
    if over:
        raise APIError(
            413,
            f"The request body is {seen if seen else declared} bytes; this server takes at most {limit} "
            f"(--max-body-bytes).",
            code="request_too_large",
        )
    return bytes(body)


@dataclass
class Routes:
    """What the routes share: the model, the configuration, the model thread, and the steps
    every request goes through (key, body, queue, result)."""

    model: Model
    config: ServerConfig
    runner: Runner
    created: int = field(default_factory=lambda: int(time.time()))

    def authorize(self, request: Request) -> None:
        """401 unless the request carries the server's API key (when it has one)."""
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(
                401,
                "Missing or incorrect API key: send 'Authorization: Bearer <key>' with the server's --api-key.",
                code="invalid_api_key",
            )

    async def read(self, request: Request) -> bytes:
        """The request body (413 past ``max_body_bytes``)."""
        return await read_body(request, self.config.max_body_bytes)

    async def start(self, request: Request, work: Work) -> Job:
        """Queue ``work`` and wait until it has started (errors about the request come here)."""
        job = self.runner.submit(work, self.config.timeout_s)
        try:
            first = await job.next(request)
        except BaseException:
            job.cancel("error")
            raise
        assert first.kind == "started"
        return job

    async def result(self, job: Job, request: Request) -> Any:
        """The value of the work's ``done`` event."""
        try:
            while True:
                ev = await job.next(request)
                if ev.kind == "done":
                    return ev.value
        finally:
            job.cancel("finished")

    def model_card(self) -> dict[str, Any]:
        """The served model as ``/v1/models`` lists it."""
        return {"id": self.config.model_name, "object": "model", "created": self.created, "owned_by": "pocket-agent"}


def create_app(model: Model, config: ServerConfig) -> FastAPI:
    """The FastAPI app serving ``model``."""
    runner = Runner(config.max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            runner.shutdown()

    app = FastAPI(title="pocket-agent", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.runner = runner
    routes = Routes(model, config, runner)
    _add_error_handlers(app)
    _add_model_routes(app, routes)
    _add_work_routes(app, routes)
    from .responses import add_responses_route  # it builds on this module

    add_responses_route(app, routes)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        err = APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", code=code)
        return error_response(err)

    @app.exception_handler(PocketAgentError)
    async def _library_error(request: Request, exc: PocketAgentError) -> JSONResponse:
        return error_response(exc)

    # Starlette runs a handler of ``Exception`` in its outermost middleware, which answers and
    # then re-raises for the server to log with its traceback: only bugs may get there, so the
    # handled errors above (every 4xx) are registered by their own types.
    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> JSONResponse:
        err = APIError(500, f"Internal error ({type(exc).__name__}).", type="server_error")
        return JSONResponse(err.body(), status_code=err.status)


def _add_model_routes(app: FastAPI, routes: Routes) -> None:
    config, runner = routes.config, routes.runner

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": config.model_name,
            "pending": runner.pending,
            "outcomes": dict(runner.outcomes),
        }

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        routes.authorize(request)
        return {"object": "list", "data": [routes.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        routes.authorize(request)
        if model_id != config.model_name:
            raise APIError(
                404, f"No model {model_id!r}; this server has {config.model_name!r}.", code="model_not_found"
            )
        return routes.model_card()


def _add_work_routes(app: FastAPI, routes: Routes) -> None:
    model, config = routes.model, routes.config

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        routes.authorize(request)
        req = parse_request(ChatCompletionRequest, await routes.read(request))
        turn = ChatTurn(model, chat_job(req), call_threshold=config.call_threshold)
        cid = new_id("chatcmpl-")
        job = await routes.start(request, turn.events)
        if not req.stream:
            reply: Reply = await routes.result(job, request)
            return JSONResponse(completion_body(reply, id=cid, model=config.model_name))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            _chunks(job, cid, config.model_name, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/extract")
    async def extract_route(request: Request) -> dict[str, Any]:
        routes.authorize(request)
        req = parse_request(ExtractRequest, await routes.read(request))

        def work(check: Check) -> Iterator[Event]:
            return extract_events(model, req.text, req.schema_, req.instructions, req.max_tokens, check)

        job = await routes.start(request, work)
        value = await routes.result(job, request)
        return {"object": "extraction", "model": config.model_name, "value": value}

    @app.post("/v1/decide")
    async def decide_route(request: Request) -> dict[str, Any]:
        routes.authorize(request)
        req = parse_request(DecideRequest, await routes.read(request))

        def work(check: Check) -> Iterator[Event]:
            return decide_events(model, req.question, req.options, req.context, req.method, check)

        job = await routes.start(request, work)
        value = await routes.result(job, request)
        return {"object": "decision", "model": config.model_name, **value}


async def _chunks(job: Job, cid: str, model_name: str, include_usage: bool) -> AsyncIterator[str]:
    """The SSE stream of a chat completion. Starlette cancels it when the client
    disconnects; ``finally`` then stops the generation at the next token."""
    created = int(time.time())

    def chunk(**kw: Any) -> str:
        return sse(chunk_body(id=cid, model=model_name, created=created, **kw))

    try:
        yield chunk(delta={"role": "assistant", "content": ""})
        while True:
            ev = await job.next(None)
            if ev.kind == "content":
                yield chunk(delta={"content": ev.text})
            elif ev.kind == "done":
                reply: Reply = ev.value
                for i, c in enumerate(reply.tool_calls):
                    head = {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
                    yield chunk(delta={"tool_calls": [head]})
                    yield chunk(delta={"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]})
                yield chunk(delta={}, finish_reason=reply.finish_reason)
                if include_usage:
                    yield chunk(empty_choices=True, usage=reply.usage())
                yield "data: [DONE]\n\n"
                return
    except Exception as exc:
        yield sse(api_error(exc).body())
    finally:
        job.cancel("disconnect")
