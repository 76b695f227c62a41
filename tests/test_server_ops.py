"""`pocket-agent serve` in operation: handled errors log one line, the access log and its flag,
a port already in use, the Responses API (``/v1/responses``) through the official ``openai``
client, and JSON objects that never repeat a key.

The real server runs in a subprocess on 127.0.0.1 (started as tests/test_server.py starts it),
with the embedded default model on one thread.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from test_server import INVOICE_TEXT, ROOT, Invoice, Server, _start, _user

from pocket_agent.grammars import compile_grammar, is_allowed
from pocket_agent.server.protocol import APIError
from pocket_agent.server.responses import ResponsesRequest, renamed, translate
from pocket_agent.server.unique_keys import KeyTracker, unique_keys

WEATHER_TOOL: dict[str, Any] = {  # a Responses API function tool (flat, unlike chat's)
    "type": "function",
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
    "strict": True,
}


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with the default logging (the access log on)."""
    yield from _start(tmp_path_factory.mktemp("serve-ops"))


@pytest.fixture(scope="module")
def quiet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server started with --no-access-log."""
    yield from _start(tmp_path_factory.mktemp("serve-quiet"), "--no-access-log")


def _log_lines(server: Server) -> list[str]:
    return server.log.read_text(errors="replace").splitlines()


def _new_lines(server: Server, before: int, want: int, limit_s: float = 30) -> list[str]:
    """The log lines after the first ``before``, once there are ``want`` of them (or the limit passed)."""
    deadline = time.monotonic() + limit_s
    while True:
        lines = _log_lines(server)[before:]
        if len(lines) >= want or time.monotonic() > deadline:
            time.sleep(0.3)  # a line more than expected would show here
            return _log_lines(server)[before:]
        time.sleep(0.1)


def _unique_keys(text: str) -> Any:
    """``json.loads`` that fails on an object with a repeated key."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"repeated key in {text!r}"
        return dict(pairs)

    return json.loads(text, object_pairs_hook=hook)


# --- handled errors and the access log ------------------------------------------------------------


@pytest.mark.slow
def test_a_handled_400_logs_one_line_and_no_traceback(ops_server: Server) -> None:
    """A prompt too long for the context is a 400 the client gets as JSON, streaming or not, on
    both APIs; the log gets the access line and nothing else (no 'Exception in ASGI application')."""
    client = ops_server.client()
    calls = [
        lambda: client.chat.completions.create(model="local", messages=_user("word " * 1500), max_tokens=16),
        lambda: client.chat.completions.create(
            model="local", messages=_user("word " * 1500), max_tokens=16, stream=True
        ),
        lambda: client.responses.create(model="local", input="word " * 1500, max_output_tokens=16),
        lambda: client.responses.create(model="local", input="word " * 1500, max_output_tokens=16, stream=True),
    ]
    for call in calls:
        before = len(_log_lines(ops_server))
        with pytest.raises(openai.BadRequestError) as info:
            call()
        assert info.value.status_code == 400
        body = info.value.body
        assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
        lines = _new_lines(ops_server, before, 1)
        assert len(lines) == 1, lines
        assert "POST /v1/" in lines[0] and " 400" in lines[0]
    log = ops_server.log.read_text(errors="replace")
    assert "Traceback" not in log
    assert "Exception in ASGI application" not in log


@pytest.mark.slow
def test_access_log_is_on_by_default_and_off_with_the_flag(ops_server: Server, quiet_server: Server) -> None:
    for server, want in ((ops_server, 1), (quiet_server, 0)):
        before = len(_log_lines(server))
        assert server.client().models.list().data
        lines = _new_lines(server, before, 1, limit_s=5 if want == 0 else 30)
        hits = [line for line in lines if '"GET /v1/models HTTP/1.1" 200' in line]
        assert len(hits) == want, lines


def _serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("POCKET_AGENT_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "pocket_agent", "serve", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_a_port_in_use_is_one_error_line_and_exit_2() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = _serve_cli("--host", "127.0.0.1", "--port", str(port), "--threads", "1")
    assert r.returncode == 2
    assert r.stdout == ""  # no "listening" banner
    assert r.stderr.splitlines() == [
        f"pocket-agent serve: error: port {port} on 127.0.0.1 is in use; choose another with --port"
    ]


# --- /v1/responses -------------------------------------------------------------------------------


@pytest.mark.slow
def test_responses_text_is_the_chat_completion_text(ops_server: Server) -> None:
    """A string input is one user message: the same answer, token for token, as the chat API's."""
    client = ops_server.client()
    prompt = "Write two sentences about the sea."
    chat = client.chat.completions.create(model="local", messages=_user(prompt), max_tokens=40)
    resp = client.responses.create(model="local", input=prompt, max_output_tokens=40)
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == chat.choices[0].message.content
    assert resp.output_text.strip()
    assert resp.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert resp.usage is not None and chat.usage is not None
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    message = resp.output[0]
    assert message.type == "message" and message.role == "assistant"


@pytest.mark.slow
def test_responses_instructions_and_input_messages(ops_server: Server) -> None:
    client = ops_server.client()
    messages: Any = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name one colour of the sky."},
    ]
    chat = client.chat.completions.create(model="local", messages=messages, max_tokens=24)
    resp = client.responses.create(
        model="local",
        instructions="You are a helpful assistant.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Name one colour of the sky."}]}],
        max_output_tokens=24,
    )
    assert resp.output_text == chat.choices[0].message.content
    assert resp.instructions == "You are a helpful assistant."


@pytest.mark.slow
def test_responses_parse_gives_the_chat_parse_object(ops_server: Server) -> None:
    """text.format json_schema is grounded extraction, as the chat API's json_schema response_format."""
    client = ops_server.client()
    want = client.chat.completions.parse(model="local", messages=_user(INVOICE_TEXT), response_format=Invoice)
    got = client.responses.parse(model="local", input=INVOICE_TEXT, text_format=Invoice)
    assert isinstance(got.output_parsed, Invoice)
    assert got.output_parsed == want.choices[0].message.parsed
    assert Invoice.model_validate_json(got.output_text) == got.output_parsed
    assert got.status == "completed"


@pytest.mark.slow
def test_responses_function_call_and_its_output(ops_server: Server) -> None:
    client = ops_server.client()
    resp = client.responses.create(
        model="local", input="What's the weather in Rome?", tools=[WEATHER_TOOL], tool_choice="required"
    )
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls and resp.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])
    follow = client.responses.create(
        model="local",
        input=[
            {"role": "user", "content": "What's the weather in Rome?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21, "sky": "sunny"}'},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_output_tokens=40,
    )
    assert not [item for item in follow.output if item.type == "function_call"]
    assert follow.output_text.strip()


@pytest.mark.slow
def test_responses_stream_matches_the_response(ops_server: Server) -> None:
    client = ops_server.client()
    kwargs: dict[str, Any] = {"model": "local", "input": "Count from one to five.", "max_output_tokens": 30}
    full = client.responses.create(**kwargs)
    deltas: list[str] = []
    types: list[str] = []
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response() if full.status == "completed" else None
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == ("response.completed" if full.status == "completed" else "response.incomplete")
    assert len([d for d in deltas if d]) > 3  # streamed in pieces
    assert "".join(deltas) == full.output_text
    if final is not None:
        assert final.output_text == full.output_text


@pytest.mark.slow
def test_responses_stream_a_function_call_and_a_parsed_object(ops_server: Server) -> None:
    client = ops_server.client()
    events = list(
        client.responses.create(
            model="local",
            input="What's the weather in Rome?",
            tools=[WEATHER_TOOL],
            tool_choice="required",
            stream=True,
        )
    )
    assert events[-1].type == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done
    jsonschema.validate(json.loads(done[0].arguments), WEATHER_TOOL["parameters"])
    calls = [item for item in events[-1].response.output if item.type == "function_call"]
    assert [c.arguments for c in calls] == [e.arguments for e in done]
    with client.responses.stream(model="local", input=INVOICE_TEXT, text_format=Invoice) as stream:
        for _ in stream:
            pass
        parsed = stream.get_final_response().output_parsed
    assert isinstance(parsed, Invoice)


@pytest.mark.slow
def test_responses_out_of_budget_is_incomplete(ops_server: Server) -> None:
    resp = ops_server.client().responses.create(
        model="local", input="Write a long story about a dragon.", max_output_tokens=5
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text


BAD_RESPONSES: list[tuple[str, dict[str, Any], str, str]] = [
    ("hosted tool", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type", "unsupported_value"),
    ("stored response", {"input": "hi", "previous_response_id": "resp_x"}, "previous_response_id", "unsupported"),
    (
        "invalid schema",
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "frob"}}}},
        "text.format.schema",
        "invalid_schema",
    ),
    ("image input", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0.type", ""),
    ("empty input", {"input": []}, "input", ""),
    ("max_output_tokens 0", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("why", "body", "param", "code"), BAD_RESPONSES, ids=[b[0] for b in BAD_RESPONSES])
def test_bad_responses_requests_get_400_naming_the_field(
    ops_server: Server, why: str, body: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        ops_server.client().responses.create(model="local", **body)
    err = info.value.body
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    if code:
        assert err["code"] == code


def test_a_responses_request_is_translated_to_a_chat_request() -> None:
    req = ResponsesRequest.model_validate(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather in Oslo and Rome?"},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Oslo"}'},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city": "Rome"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "cold"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "warm"}]},
            ],
            "text": {"format": {"type": "json_object"}},
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "w"},
            "max_output_tokens": 50,
        },
        strict=True,
    )
    tr = translate(req)
    roles = [m["role"] for m in tr.chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"]  # the two calls are one assistant turn
    assert [c["id"] for c in tr.chat["messages"][2]["tool_calls"]] == ["c1", "c2"]
    assert tr.chat["messages"][4]["content"] == "warm"
    assert tr.origins == ["instructions", "input.0", "input.1", "input.3", "input.4"]
    assert tr.chat["response_format"] == {"type": "json_object"}
    assert tr.chat["tools"] == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    assert tr.chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert tr.chat["max_completion_tokens"] == 50
    err = renamed(APIError(400, "messages.3.content is bad", param="messages.3.content"), tr.origins)
    assert (err.param, err.message) == ("input.3.content", "input.3.content is bad")
    err = renamed(APIError(400, "x", param="tools.0.function.parameters"), tr.origins)
    assert err.param == "tools.0.parameters"


# --- json_object: no repeated key --------------------------------------------------------------------

# Prompts after which SmolLM2-135M, greedy and unguarded, repeats a key: {"pet": "dog", "pet": "cat"},
# {"ingredient": ..., "ingredientKey": ..., "ingredientKey": ...}, a nested object's "friends" twice.
REPEATING_PROMPTS = [
    'Describe my three pets as JSON, like {"pet": "dog", "pet": "cat"}: I have a dog, a cat and a fish.',
    'Give the ingredients as JSON, one "ingredient" key per ingredient: flour, sugar, eggs.',
    'Write each friend as "friend": "<name>". My friends are Ann, Bob and Carl. Answer in JSON.',
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", REPEATING_PROMPTS, ids=["pets", "ingredients", "friends"])
def test_json_object_mode_never_repeats_a_key(ops_server: Server, prompt: str) -> None:
    client = ops_server.client()
    kwargs: dict[str, Any] = {"model": "local", "messages": _user(prompt), "response_format": {"type": "json_object"}}
    full = client.chat.completions.create(max_tokens=200, **kwargs).choices[0]
    chunks = list(client.chat.completions.create(max_tokens=200, stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.message.content
    assert _repeated_keys(full.message.content or "") == []
    if full.finish_reason == "stop":
        assert isinstance(_unique_keys(full.message.content or ""), dict)
    else:  # cut by max_tokens, and said so
        assert full.finish_reason == "length"
    resp = client.responses.create(
        model="local", input=prompt, text={"format": {"type": "json_object"}}, max_output_tokens=200
    )
    assert resp.output_text == full.message.content  # the same request, the same decoding
    if resp.status == "completed":
        _unique_keys(resp.output_text)


def _repeated_keys(text: str) -> list[bytes]:
    """The keys ``text`` writes a second time in the same object (also in text cut short)."""
    t = KeyTracker()
    repeats = []
    for b in text.encode():
        key = bytes(t.key) if t.key is not None else None
        had = len(t.taken())
        t.feed(bytes([b]))
        if key is not None and not t.in_key and len(t.taken()) == had:
            repeats.append(key)
    return repeats


def test_key_tracker_follows_objects_arrays_and_strings() -> None:
    t = KeyTracker()
    t.feed(b'<tool_call>\n{"a": "x{\\"y", "b": [{"a": 1}, "s"], "c')
    assert t.in_key and bytes(t.key or b"") == b"c"
    assert t.taken() == [b"a", b"b"]  # the inner object's "a" is its own
    t.feed(b'": {"d')
    assert t.taken() == [] and bytes(t.key or b"") == b"d"
    t.feed(b'": 1}, "e\\')
    assert t.escaped and t.taken() == [b"a", b"b", b"c"]
    t.feed(b'n": 2}')
    assert not t.stack and not t.in_key


@pytest.mark.slow
def test_the_mask_closes_no_key_the_object_has(smollm: Any) -> None:
    """After '{"pet":"dog","pet' no token may close the key (a bare quote, '":'), where the plain
    json_object grammar allows both; a key of another object, or a longer key, stays allowed."""
    plain = compile_grammar({"type": "object"}, smollm)
    guarded = unique_keys(plain, smollm)
    quote, quote_colon, s = (smollm.tokenize(x)[0] for x in ('"', '":', "s"))
    assert smollm.tokenize('":') == [quote_colon]

    def mask_after(grammar: Any, text: str) -> np.ndarray:
        m = grammar.matcher()
        m.consume_many(smollm.tokenize(text))
        return m.compute_mask().copy()

    for prefix in ('{"pet":"dog","pet', '{"a":{"pet":1},"pet":2,"pet'):
        assert is_allowed(mask_after(plain, prefix), quote) and is_allowed(mask_after(plain, prefix), quote_colon)
        mask = mask_after(guarded, prefix)
        assert not is_allowed(mask, quote) and not is_allowed(mask, quote_colon), prefix
        assert is_allowed(mask, s)
    nested = mask_after(guarded, '{"pet":{"pet')  # the inner object has no key yet
    assert is_allowed(nested, quote) and is_allowed(nested, quote_colon)
    longer = mask_after(guarded, '{"pets":1,"pet')  # "pet" is a new key next to "pets"
    assert is_allowed(longer, quote_colon)
    escape = mask_after(guarded, '{"a/b":1,"a\\')  # no second spelling of "/" (\\/) in a key
    assert not is_allowed(escape, smollm.tokenize("/")[0])


@pytest.mark.slow
def test_the_readme_example_runs(ops_server: Server, tmp_path: Path) -> None:
    """The README's /v1/responses example, as written, against this server."""
    script = tmp_path / "example.py"
    script.write_text(README_EXAMPLE.replace("http://127.0.0.1:8000/v1", ops_server.v1), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "INV-2041" in r.stdout


README_EXAMPLE = """\
from openai import OpenAI
from pydantic import BaseModel

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")

reply = client.responses.create(model="local", input="Say hello in French.", max_output_tokens=20)
print(reply.output_text)


class Invoice(BaseModel):
    invoice_number: str
    total: float


parsed = client.responses.parse(
    model="local",
    input="Invoice INV-2041 from ACME Ltd. Total due: 31.50 EUR.",
    text_format=Invoice,
)
print(parsed.output_parsed)  # invoice_number='INV-2041' total=31.5
"""
