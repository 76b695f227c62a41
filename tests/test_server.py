"""`pocket-agent serve`: the real server in a subprocess on 127.0.0.1, the embedded default
model on one thread, spoken to with the official ``openai`` client (and httpx for raw HTTP).

Needs the ``server`` and ``dev`` extras (fastapi, uvicorn, openai, httpx, pydantic-ai-slim).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

try:
    import fastapi  # noqa: F401 - the server's own dependencies, checked here to fail early
    import httpx
    import openai
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - a missing extra must fail, not skip
    pytest.fail(
        f"tests/test_server.py needs the server and dev extras ({exc.name} is missing): pip install -e '.[dev,server]'",
        pytrace=False,
    )

ROOT = Path(__file__).resolve().parents[1]
THREADS = int(os.environ.get("POCKET_AGENT_TEST_THREADS", "1"))
START_TIMEOUT_S = 120.0
API_KEY = "test-key-0123"


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    @property
    def v1(self) -> str:
        return self.base + "/v1"

    def client(self, api_key: str = "unused", **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.v1, api_key=api_key, max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def health(self) -> dict[str, Any]:
        r = httpx.get(self.base + "/health", timeout=10)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(tmp: Path, *extra: str) -> Iterator[Server]:
    port = _free_port()
    log = tmp / f"server-{port}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("POCKET_AGENT_API_KEY", None)
    cmd = [sys.executable, "-m", "pocket_agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--threads", str(THREADS), "--n-ctx", "1024", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
            try:
                if httpx.get(server.base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer within {START_TIMEOUT_S} s:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An open server: queue of 1, 64 KiB bodies."""
    yield from _start(tmp_path_factory.mktemp("serve"), "--max-queue", "1", "--max-body-bytes", "65536")


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that wants an API key and gives each request 2 seconds."""
    yield from _start(tmp_path_factory.mktemp("serve-key"), "--api-key", API_KEY, "--timeout", "2")


class Invoice(BaseModel):
    invoice_number: str
    total: float


INVOICE_TEXT = "Invoice INV-2041 from ACME Ltd. Total due: 31.50 EUR."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "the city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CONVERT = {
    "type": "function",
    "function": {
        "name": "convert",
        "description": "Convert money between currencies.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "minimum": 0},
                "src": {"type": "string", "enum": ["CNY", "EUR", "GBP", "USD"]},
                "dst": {"type": "string", "enum": ["CNY", "EUR", "GBP", "USD"]},
            },
            "required": ["amount", "src", "dst"],
            "additionalProperties": False,
        },
    },
}
TOOLS: list[Any] = [WEATHER, CONVERT]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# Output that cannot end soon: 60 strings of 40+ characters, 700+ tokens (many seconds even on a fast CPU).
# A top-level array: generated token by token as a chat answer (an object schema's values are extracted
# from the message and arrive whole, see pocket_agent/server/structured.py).
LONG_SCHEMA = {"type": "array", "items": {"type": "string", "minLength": 40}, "minItems": 60, "maxItems": 60}


def _user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


# --- the OpenAI surface ------------------------------------------------------------------------


def test_models_lists_the_served_model(server: Server) -> None:
    models = server.client().models.list().data
    assert len(models) == 1
    assert models[0].id.startswith("SmolLM2")
    assert server.client().models.retrieve(models[0].id).id == models[0].id


def test_parse_returns_a_valid_pydantic_object(server: Server) -> None:
    completion = server.client().chat.completions.parse(
        model="local",
        messages=_user(f"Extract the invoice.\n\n{INVOICE_TEXT}"),
        response_format=Invoice,
        max_tokens=80,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Invoice)
    assert Invoice.model_validate_json(choice.message.content or "") == choice.message.parsed
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 10
    assert completion.usage.completion_tokens > 3
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


class Receipt(BaseModel):
    company: str
    date: str
    total: float


OPEN_RECEIPT = {  # as a user writes JSON Schema: objects open
    "type": "object",
    "properties": {"company": {"type": "string"}, "date": {"type": "string"}, "total": {"type": "number"}},
    "required": ["company", "date", "total"],
}


def _short_receipts(model: Any, n: int) -> list[str]:
    from conftest import dev_data

    rows = [json.loads(x) for x in (dev_data("sroie") / "receipts.jsonl").read_text(encoding="utf-8").splitlines()]
    texts = [r["text"] for r in rows if len(model.tokenize(r["text"])) < 560]  # fits the server's n_ctx 1024
    assert len(texts) >= n
    return texts[:n]


@pytest.mark.slow
def test_structured_routes_give_what_extract_gives(server: Server, smollm: Any) -> None:
    """response_format (strict and open) and a forced tool call are extraction: the user's message is
    the document, and the values are extract()'s on the same model, for 10 receipts."""
    from pocket_agent import extract

    client = server.client()
    tool = {"type": "function", "function": {"name": "record_receipt", "parameters": OPEN_RECEIPT}}
    for text in _short_receipts(smollm, 10):
        want = extract(text, Receipt, model=smollm).model_dump()
        want_open = extract(text, OPEN_RECEIPT, model=smollm)
        parsed = client.chat.completions.parse(model="local", messages=_user(text), response_format=Receipt)
        assert parsed.choices[0].message.parsed is not None
        assert parsed.choices[0].message.parsed.model_dump() == want
        fmt = {"type": "json_schema", "json_schema": {"name": "receipt", "schema": OPEN_RECEIPT, "strict": False}}
        opened = client.chat.completions.create(model="local", messages=_user(text), response_format=fmt)  # type: ignore[arg-type]
        got_open = json.loads(opened.choices[0].message.content or "")
        assert got_open == want_open and set(got_open) == {"company", "date", "total"}  # declared keys only
        for choice in ({"type": "function", "function": {"name": "record_receipt"}}, "required"):
            called = client.chat.completions.create(
                model="local",
                messages=_user(text),
                tools=[tool],
                tool_choice=choice,  # type: ignore[arg-type,list-item]
            )
            calls = called.choices[0].message.tool_calls or []
            assert called.choices[0].finish_reason == "tool_calls" and len(calls) == 1
            assert json.loads(calls[0].function.arguments) == want_open  # type: ignore[union-attr]


def test_json_object_mode_returns_a_json_object(server: Server) -> None:
    completion = server.client().chat.completions.create(
        model="local",
        messages=_user(f"Give the invoice number and total as JSON.\n\n{INVOICE_TEXT}"),
        response_format={"type": "json_object"},
        max_tokens=60,
    )
    choice = completion.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:  # an open object may run to the budget; then it is cut, and said so
        assert choice.finish_reason == "length"


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "convert"}}],
    ids=["required", "named"],
)
def test_tool_calls_validate_against_the_tool_schema(server: Server, tool_choice: Any) -> None:
    completion = server.client().chat.completions.create(
        model="local",
        messages=_user("How much is 12 EUR in CNY?"),
        tools=TOOLS,
        tool_choice=tool_choice,
        max_tokens=120,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.type == "function"
        assert call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, PARAMS[call.function.name])
    if isinstance(tool_choice, dict):
        assert {c.function.name for c in calls} == {"convert"}


def test_tool_choice_none_never_calls(server: Server) -> None:
    client = server.client()
    prompts = [
        "What's the weather in Paris? Use the get_weather tool.",
        "Convert 100 USD to EUR with the convert tool.",
    ]
    for prompt in prompts:
        for stream in (False, True):
            kwargs: dict[str, Any] = {"model": "local", "messages": _user(prompt), "tools": TOOLS}
            kwargs.update(tool_choice="none", max_tokens=24)
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **kwargs))
                assert all(not (c.choices and c.choices[0].delta.tool_calls) for c in chunks)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                assert finish and finish[-1] in ("stop", "length")
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                choice = client.chat.completions.create(**kwargs).choices[0]
                assert not choice.message.tool_calls
                assert choice.finish_reason in ("stop", "length")
                text = choice.message.content or ""
            assert text.strip()
            assert "<tool_call>" not in text


def test_tool_results_in_the_history_are_read(server: Server) -> None:
    """An OpenAI conversation with an assistant tool call and its tool result."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    choice = (
        server.client()
        .chat.completions.create(model="local", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=30)
        .choices[0]
    )
    assert not choice.message.tool_calls
    assert (choice.message.content or "").strip()


def test_stream_concatenates_to_the_non_streamed_answer(server: Server) -> None:
    client = server.client()
    kwargs: dict[str, Any] = {
        "model": "local",
        "messages": _user("Write two sentences about the sea."),
        "max_tokens": 40,
        "temperature": 0.9,
        "seed": 1234,
    }
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 3  # streamed in pieces, not one block
    assert "".join(pieces) == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]


def test_stream_with_a_schema_matches_too(server: Server) -> None:
    client = server.client()
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "Invoice", "schema": Invoice.model_json_schema(), "strict": True},
    }
    kwargs: dict[str, Any] = {"model": "local", "messages": _user(INVOICE_TEXT), "max_tokens": 80}
    kwargs.update(response_format=fmt, temperature=0.5, seed=7)
    full = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.finish_reason]
    if full.finish_reason == "stop":
        Invoice.model_validate_json(streamed)
    else:  # cut by max_tokens: said so, never passed off as complete
        assert full.finish_reason == "length"


def test_streamed_tool_calls(server: Server) -> None:
    stream = server.client().chat.completions.create(
        model="local",
        messages=_user("What's the weather in Rome?"),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += d.id or ""
            if d.function is not None:
                slot["name"] += d.function.name or ""
                slot["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls
    for call in calls.values():
        assert call["id"].startswith("call_")
        assert call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), PARAMS["get_weather"])


def test_stop_sequences_end_free_text(server: Server) -> None:
    client = server.client()
    base: dict[str, Any] = {
        "model": "local",
        "messages": _user("Count from 1 to 20, comma separated."),
        "max_tokens": 60,
    }
    free = client.chat.completions.create(**base).choices[0].message.content or ""
    assert "5" in free
    stop = "5"
    cut = client.chat.completions.create(stop=[stop], **base).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == free[: free.index(stop)]
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(stop=[stop], stream=True, **base)
        if c.choices
    )
    assert streamed == cut.message.content


# --- bad requests ------------------------------------------------------------------------------


def _error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict), body
    assert set(body) == {"message", "type", "param", "code"}, body
    assert isinstance(body["message"], str) and body["message"]
    return body


BAD_REQUESTS: list[tuple[str, dict[str, Any], str | None]] = [
    ("empty messages", {"messages": []}, "messages"),
    ("messages not a list", {"messages": "hello"}, "messages"),
    ("max_tokens a string", {"messages": _user("hi"), "max_tokens": "ten"}, "max_tokens"),
    ("temperature a string", {"messages": _user("hi"), "temperature": "hot"}, "temperature"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    (
        "unknown tool in tool_choice",
        {"messages": _user("hi"), "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    ("required without tools", {"messages": _user("hi"), "tool_choice": "required"}, "tool_choice"),
    (
        "invalid schema",
        {
            "messages": _user("hi"),
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}},
        },
        "response_format.json_schema.schema",
    ),
    (
        "invalid tool parameters",
        {
            "messages": _user("hi"),
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}],
        },
        "tools.0.function.parameters",
    ),
    ("n > 1", {"messages": _user("hi"), "n": 2}, "n"),
]


@pytest.mark.parametrize(("why", "body", "param"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_openai_shaped_400(server: Server, why: str, body: dict[str, Any], param: str | None) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model="local", **body)
    err = _error_of(info.value)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_unsupported_schema_feature_names_feature_and_path(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "(?<=x)y"}},
        "required": ["code"],
    }
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(
            model="local",
            messages=_user("hi"),
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    err = _error_of(info.value)
    assert err["code"] == "unsupported_schema"
    assert "pattern" in err["message"]
    assert "#/properties/code" in err["message"]


def test_too_long_prompt_is_400_with_token_counts(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model="local", messages=_user("word " * 1500), max_tokens=16)
    err = _error_of(info.value)
    assert err["code"] == "context_length_exceeded"
    assert "1024" in err["message"]  # the context size
    assert "needed" in err["message"]


def test_oversized_body_is_413(server: Server) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        server.client().chat.completions.create(model="local", messages=_user("x" * 70_000), max_tokens=4)
    assert info.value.status_code == 413
    assert _error_of(info.value)["code"] == "request_too_large"


def test_raw_http_errors_are_openai_shaped(server: Server) -> None:
    bad_json = httpx.post(
        server.v1 + "/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["code"] == "invalid_json"
    missing = httpx.post(server.v1 + "/nowhere", json={})
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    wrong_method = httpx.get(server.v1 + "/chat/completions")
    assert wrong_method.status_code == 405
    assert "error" in wrong_method.json()


# --- our own calls -----------------------------------------------------------------------------


def test_extract_and_decide_over_http(server: Server) -> None:
    schema = Invoice.model_json_schema()
    r = httpx.post(server.v1 + "/extract", json={"text": INVOICE_TEXT, "schema": schema}, timeout=120)
    assert r.status_code == 200, r.text
    Invoice.model_validate(r.json()["value"])
    r = httpx.post(
        server.v1 + "/decide",
        json={"question": "Is this review positive?", "options": ["no", "yes"], "context": "A wonderful film."},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["choice"] in ("no", "yes")
    assert d["index"] == ["no", "yes"].index(d["choice"])
    assert abs(sum(d["scores"]) - 1) < 1e-6
    bad = httpx.post(server.v1 + "/extract", json={"text": "x", "schema": {"type": "frob"}}, timeout=60)
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_schema"
    bad = httpx.post(server.v1 + "/decide", json={"question": "q", "options": ["only one"]}, timeout=60)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "options"


# --- the queue, disconnects, keys, timeouts ------------------------------------------------------


def _post_async(url: str, body: dict[str, Any], out: list[httpx.Response], timeout: float = 120) -> threading.Thread:
    def run() -> None:
        out.append(httpx.post(url, json=body, timeout=timeout))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_full_queue_answers_429_with_retry_after(server: Server) -> None:
    body = {
        "model": "local",
        "messages": _user("List fruits."),
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": LONG_SCHEMA}},
        "max_tokens": 120,
    }
    out: list[httpx.Response] = []
    threads = [_post_async(server.v1 + "/chat/completions", body, out) for _ in range(4)]
    for th in threads:
        th.join(timeout=300)
    assert len(out) == 4
    codes = sorted(r.status_code for r in out)
    assert 200 in codes
    refused = [r for r in out if r.status_code == 429]
    assert refused, codes  # queue of 1: one runs, one waits, the rest are refused
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    assert set(codes) <= {200, 429}


def _wait_for_outcome(server: Server, key: str, count: int, limit_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while True:
        h = server.health()
        if h["outcomes"].get(key, 0) >= count and h["pending"] == 0:
            return h
        if time.monotonic() > deadline:
            return h
        time.sleep(0.2)


def test_client_disconnect_stops_the_generation(server: Server) -> None:
    before = server.health()["outcomes"].get("disconnect", 0)
    body = {
        "model": "local",
        "messages": _user("List fruits."),
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": LONG_SCHEMA}},
        "max_tokens": 900,
        "stream": True,
    }
    # Streaming: read the first content chunk, then hang up.
    with httpx.Client(timeout=120) as http, http.stream("POST", server.v1 + "/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break
    h = _wait_for_outcome(server, "disconnect", before + 1)
    assert h["outcomes"].get("disconnect", 0) == before + 1, h
    # Not streaming: the client gives up after 2 s.
    body["stream"] = False
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.v1 + "/chat/completions", json=body, timeout=2)
    h = _wait_for_outcome(server, "disconnect", before + 2)
    assert h["outcomes"].get("disconnect", 0) == before + 2, h
    assert h["pending"] == 0


def test_api_key_is_enforced(keyed_server: Server) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        keyed_server.client("wrong-key").models.list()
    assert _error_of(info.value)["code"] == "invalid_api_key"
    r = httpx.post(keyed_server.v1 + "/chat/completions", json={"messages": _user("hi")})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(keyed_server.v1 + "/extract", json={"text": "x", "schema": {}})
    assert r.status_code == 401
    assert keyed_server.client(API_KEY).models.list().data
    reply = keyed_server.client(API_KEY).chat.completions.create(model="local", messages=_user("Say hi."), max_tokens=4)
    assert reply.choices[0].message.content


def test_request_past_its_deadline_gets_504(keyed_server: Server) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        keyed_server.client(API_KEY).chat.completions.create(
            model="local",
            messages=_user("List fruits."),
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": LONG_SCHEMA}},
            max_tokens=900,
        )
    assert info.value.status_code == 504
    assert _error_of(info.value)["type"] == "timeout_error"
    h = _wait_for_outcome(keyed_server, "timeout", 1)
    assert h["outcomes"].get("timeout", 0) >= 1, h


# --- a framework that speaks OpenAI --------------------------------------------------------------


def test_pydantic_ai_example_from_the_readme(server: Server) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("local", provider=OpenAIProvider(base_url=server.v1, api_key="unused"))
    agent = Agent(model, output_type=NativeOutput(Invoice))
    result = agent.run_sync(INVOICE_TEXT)
    assert isinstance(result.output, Invoice)
    assert result.output.invoice_number == "INV-2041"
    assert result.output.total == 31.5


def test_pydantic_ai_default_output_is_a_forced_tool_call(server: Server) -> None:
    """pydantic-ai's default ``output_type`` sends the schema as an output tool it requires; the
    server answers it as an extraction, so the values are grounded in the prompt."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("local", provider=OpenAIProvider(base_url=server.v1, api_key="unused"))
    result = Agent(model, output_type=Invoice).run_sync(INVOICE_TEXT)
    assert result.output == Invoice(invoice_number="INV-2041", total=31.5)


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_structured_output(server: Server, method: str) -> None:
    """langchain-openai's ``with_structured_output``: a forced tool call or a json_schema response_format."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="local", base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
    structured = llm.with_structured_output(Invoice, method=method)
    value = structured.invoke(INVOICE_TEXT)
    assert value == Invoice(invoice_number="INV-2041", total=31.5)


# --- the command line ----------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("POCKET_AGENT_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "pocket_agent", "serve", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def test_non_loopback_host_needs_a_flag_and_a_key() -> None:
    r = _cli("--host", "0.0.0.0", "--port", "1")
    assert r.returncode == 2
    assert "--allow-remote" in r.stderr
    r = _cli("--host", "0.0.0.0", "--port", "1", "--allow-remote")
    assert r.returncode == 2
    assert "--api-key" in r.stderr


def test_importing_pocket_agent_does_not_import_fastapi() -> None:
    code = "import sys, pocket_agent, pocket_agent.cli, pocket_agent.server; print('fastapi' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "False"
