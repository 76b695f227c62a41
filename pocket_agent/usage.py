"""Token and time counters, one type for every level: a generation, an agent step, a run.

``Usage`` values add up (``a + b``, ``total += step.usage``), so a run's usage is the sum of
its steps' and a step's is the sum of its generations'.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Usage:
    """What model calls cost.

    Attributes:
        requests: generations (model turns) counted.
        prompt_tokens: prompt tokens sent, cached or not.
        prompt_tokens_evaluated: prompt tokens the model actually evaluated (the rest
            came from the KV cache).
        completion_tokens: output tokens, sampled and forced.
        forced_tokens: output tokens the grammar forced (evaluated as batches).
        decode_calls: model evaluations after the prompt.
        draft_tokens: draft tokens of copy speculation: tokens copied from the context
            and evaluated together with a sampled token, before the model chose them.
        draft_accepted: draft tokens that became output; the rest were rolled back.
        prefill_s: seconds evaluating prompts.
        decode_s: seconds evaluating output tokens.
        mask_s: seconds computing and applying grammar masks.
        tool_calls: tool calls run (agents only).
        tools_s: seconds spent inside tools.
        mask_times: each mask's seconds (for benchmarks; not shown in the repr).
    """

    requests: int = 0
    prompt_tokens: int = 0
    prompt_tokens_evaluated: int = 0
    completion_tokens: int = 0
    forced_tokens: int = 0
    decode_calls: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    mask_s: float = 0.0
    tool_calls: int = 0
    tools_s: float = 0.0
    mask_times: list[float] = field(default_factory=list, repr=False)

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens reused from the KV cache."""
        return self.prompt_tokens - self.prompt_tokens_evaluated

    @property
    def generation_s(self) -> float:
        """Seconds in the model (prompt and output)."""
        return self.prefill_s + self.decode_s

    @property
    def total_s(self) -> float:
        """Seconds in the model and in tools."""
        return self.prefill_s + self.decode_s + self.tools_s

    @property
    def forced_share(self) -> float:
        """Share of output tokens the grammar forced."""
        return self.forced_tokens / self.completion_tokens if self.completion_tokens else 0.0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        out = Usage()
        out += self
        out += other
        return out

    def __iadd__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        for f in fields(self):
            if f.name == "mask_times":
                self.mask_times = [*self.mask_times, *other.mask_times]
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


__all__ = ["Usage"]
