"""The server's request handling without a model: OpenAI messages -> Agent messages, what is
refused, and the bind-address rule. (The end-to-end tests are in test_server.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

try:
    from pocket_agent.server.cli import check_bind, is_loopback
    from pocket_agent.server.protocol import APIError, ChatCompletionRequest, chat_job, parse_request
except ImportError as exc:  # pragma: no cover - a missing extra must fail, not skip
    pytest.fail(f"the server package does not import ({exc}); pip install -e '.[dev,server]'", pytrace=False)

from pocket_agent.errors import InvalidInputError


def _job(**body: Any) -> Any:
    body.setdefault("model", "m")
    return chat_job(parse_request(ChatCompletionRequest, json.dumps(body).encode()))


def test_openai_history_becomes_agent_messages() -> None:
    job = _job(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "cold"},
        ],
        tools=[{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
    )
    assert job.messages[0] == {"role": "system", "content": "Be brief."}
    assert job.messages[1]["content"] == "Weather in Oslo?"
    call = job.messages[2]["tool_calls"][0]
    assert call == {"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}
    assert job.messages[3] == {"role": "tool", "content": "cold", "tool_call_id": "c1", "name": "w"}
    assert job.tool_choice == "auto"
    assert job.temperature == 0.0
    assert job.max_tokens == 512
    assert not job.max_tokens_given


def test_options_map_to_the_job() -> None:
    job = _job(
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=7,
        temperature=0.5,
        seed=3,
        stop="END",
        response_format={"type": "json_object"},
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        parallel_tool_calls=False,
    )
    assert (job.max_tokens, job.max_tokens_given, job.temperature, job.seed) == (7, True, 0.5, 3)
    assert job.stop == ["END"]
    assert job.response_schema == {"type": "object"}
    assert job.tool_choice == "f"
    assert job.parallel_tool_calls is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
        ({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": [{"role": "system", "content": "only me"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "  "}]}, "messages.0.content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "function", "function": {"name": "f"}},
                ],
            },
            "tools",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {}}]}, None),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_requests_the_model_cannot_honour_are_400(body: dict[str, Any], param: str | None) -> None:
    with pytest.raises(APIError) as info:
        _job(**body)
    assert info.value.status == 400
    err = info.value.body()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param


def test_only_loopback_without_flags() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.com")
    check_bind("127.0.0.1", allow_remote=False, api_key=None)
    with pytest.raises(InvalidInputError, match="--allow-remote"):
        check_bind("0.0.0.0", allow_remote=False, api_key="k")
    with pytest.raises(InvalidInputError, match="API key"):
        check_bind("0.0.0.0", allow_remote=True, api_key=None)
    check_bind("0.0.0.0", allow_remote=True, api_key="k")
