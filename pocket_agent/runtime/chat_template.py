"""Chat templates rendered from a model's own metadata in a sandboxed Jinja environment."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidInputError, ModelLoadError

# ChatML as the MNN-Pocket model card describes it (the same shape as Qwen's template,
# including its tool-calling convention). Used only when a model ships no template.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and (loop.first and tools) %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- if message.get('tool_calls') %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set fn = tc['function'] if tc.get('function') else tc %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + "
    "(fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_environment()


def check_messages(messages: Sequence[Any]) -> Sequence[Mapping[str, Any]]:
    """``messages`` checked as chat messages: dicts whose ``role`` is a non-empty string and
    whose ``content``, when present, is a string or None.

    Raises:
        InvalidInputError: naming the first message that is not one.
    """
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise InvalidInputError(f"messages[{i}] must be a dict with a 'role' key, got {m!r}.")
        role = m["role"]
        if not isinstance(role, str) or not role.strip():
            raise InvalidInputError(f"messages[{i}]['role'] must be a non-empty string such as 'user', got {role!r}.")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise InvalidInputError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}.")
    return messages


class ChatTemplate:
    """A model's chat template: turns messages into the prompt text the model was tuned on.

    ``source`` says where the template came from (e.g. ``"gguf:tokenizer.chat_template"``).
    """

    def __init__(self, template: str, *, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.template_text = template
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _ENV.from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ModelLoadError(f"The chat template from {source} does not parse: {exc}") from exc

    @property
    def supports_tools(self) -> bool:
        """Whether the template renders a ``tools`` variable."""
        return "tools" in self.template_text

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render ``messages`` (``{"role", "content"}`` dicts) into prompt text."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidInputError("messages must be a list of {'role': ..., 'content': ...} dicts.")
        checked = [dict(m) for m in check_messages(messages)]
        if not checked:
            raise InvalidInputError("messages is empty; give at least one message.")
        try:
            return self._template.render(
                messages=checked,
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except jinja2.exceptions.SecurityError as exc:
            raise ModelLoadError(f"The chat template from {self.source} tried an unsafe operation: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise InvalidInputError(f"The chat template from {self.source} rejected the messages: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            # Templates do arithmetic on message fields (``'<|im_start|>' + message.role``); a
            # field of the wrong type fails there, inside the template, not in our code.
            raise InvalidInputError(
                f"The chat template from {self.source} could not render the messages "
                f"({type(exc).__name__}: {exc}); check each message's 'role' and 'content'."
            ) from exc

    def __repr__(self) -> str:
        return f"<ChatTemplate source={self.source!r}>"


def chatml_template(bos_token: str = "", eos_token: str = "<|im_end|>") -> ChatTemplate:  # noqa: S107
    """The built-in ChatML template used by the MNN-Pocket family (model card)."""
    return ChatTemplate(CHATML_TEMPLATE, source="builtin:chatml", bos_token=bos_token, eos_token=eos_token)
