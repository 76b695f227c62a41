"""Split weights (``layout="split"``): prompts on one copy with flash attention, generation on
another without, the prompt's keys and values carried between them; and the re-layout of
llama.cpp's sequence state that carrying needs."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS, TINY_GGUF
from pydantic import BaseModel

from pocket_agent import extract, extract_many
from pocket_agent.errors import AdapterError, ModelLoadError
from pocket_agent.runtime import load_model
from pocket_agent.runtime._llamacpp_kvstate import relayout_values, value_blocks
from pocket_agent.runtime.llamacpp import LlamaCppModel
from pocket_agent.runtime.merged import merged_task

PROMPT = list(range(40, 100))


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pocket_agent.runtime.llamacpp import quantize_gguf

    target = tmp_path_factory.mktemp("split") / "tiny-q4_1.gguf"
    quantize_gguf(TINY_GGUF, target, file_type=3)
    return target


def state_of(model: LlamaCppModel) -> bytes:
    """Sequence 0's state in the context prompts run on (llama.cpp's own bytes)."""
    ctx = model._contexts()[0].ctx
    lc = model._lc
    size = int(lc.llama_state_seq_get_size(ctx, 0))
    buf = (ctypes.c_uint8 * size)()
    return bytes(buf[: int(lc.llama_state_seq_get_data(ctx, buf, size, 0))])


@pytest.mark.slow
def test_values_are_re_laid_out_as_llama_cpp_lays_them_out() -> None:
    with_fa = LlamaCppModel(TINY_GGUF, threads=THREADS, flash_attn=True)
    plain = LlamaCppModel(TINY_GGUF, threads=THREADS, flash_attn=False)
    try:
        for m in (with_fa, plain):
            m.eval(PROMPT)
        rows, transposed = state_of(with_fa), state_of(plain)
        assert rows != transposed  # the layouts differ (as llama.cpp's refusal says)
        moved = relayout_values(rows, transposed=True)
        assert len(moved) == len(rows)
        assert relayout_values(moved, transposed=False) == rows  # and back, byte for byte
        assert relayout_values(rows, transposed=False) == rows  # already laid out so: unchanged
        mine, theirs = value_blocks(moved), value_blocks(transposed)
        assert [v.shape for v in mine] == [v.shape for v in theirs] == [v.shape for v in value_blocks(rows)]
        # the first layer's values do not depend on attention: bit for bit what llama.cpp wrote
        assert np.array_equal(mine[0], theirs[0])
        for a, b in zip(mine[1:], theirs[1:], strict=True):  # later layers: within attention's rounding
            a, b = a.view(np.float16).astype(np.float32), b.view(np.float16).astype(np.float32)
            assert np.abs(a - b).max() <= 0.02 * max(1.0, float(np.abs(b).max()))
        # llama.cpp takes it where it refuses the original, and writes the same bytes back
        ctx = plain._contexts()[0]
        with pytest.raises(Exception, match="could not move"):
            ctx.import_seq((ctypes.c_uint8 * len(rows)).from_buffer_copy(rows), len(rows))
        ctx.import_seq((ctypes.c_uint8 * len(moved)).from_buffer(moved), len(moved))
        assert state_of(plain) == bytes(moved)
    finally:
        with_fa.close()
        plain.close()


def test_a_state_of_an_unknown_layout_is_a_typed_error() -> None:
    from pocket_agent.errors import BackendError

    with pytest.raises(BackendError, match="cannot read"):
        relayout_values(b"\0" * 8 + (2).to_bytes(4, "little") + b"\0" * 20, transposed=True)
    with pytest.raises(BackendError, match="cannot read"):
        relayout_values(b"\0" * 10, transposed=True)


@pytest.fixture(scope="module")
def split(tiny_q4_1: Path) -> LlamaCppModel:
    model = load_model(tiny_q4_1, threads=THREADS, layout="split")
    assert isinstance(model, LlamaCppModel)
    yield model
    model.close()


def test_layout_split_writes_both_copies_and_says_so(split: LlamaCppModel) -> None:
    extra = split.info.extra
    assert extra["layout"] == "split: BF16 copy for prompts, Q8_0 copy for generation"
    assert extra["weights"].endswith(".bf16.gguf") and extra["generation weights"].endswith(".q8_0.gguf")
    assert split.split


def test_prompts_run_on_the_prompt_copy_and_generation_on_the_other(split: LlamaCppModel) -> None:
    prompt_copy = LlamaCppModel(split.info.extra["weights"], threads=THREADS, flash_attn=True)
    generation_copy = LlamaCppModel(split.info.extra["generation weights"], threads=THREADS)
    try:
        split.reset()
        first = split.prefill(PROMPT).logits
        assert np.array_equal(first, prompt_copy.prefill(PROMPT).logits)  # the prompt: BF16, flash attention
        step = split.eval([int(first[-1].argmax())]).logits
        generation_copy.prefill(PROMPT)
        alone = generation_copy.eval([int(first[-1].argmax())]).logits
        # the step runs on the Q8_0 weights over the BF16 prompt's keys and values: near the
        # Q8_0 model's own step, not equal to it
        assert np.abs(step - alone).max() < 0.5 * np.abs(alone).max()
        assert split.cached_tokens == [*PROMPT, int(first[-1].argmax())]
    finally:
        prompt_copy.close()
        generation_copy.close()


def generate(model: LlamaCppModel, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    out = model.prefill(prompt).logits[-1]
    tokens, rows = [], [out]
    for _ in range(n):
        tokens.append(int(rows[-1].argmax()))
        rows.append(model.eval(tokens[-1:]).logits[-1])
    return tokens, rows


def test_results_depend_only_on_the_tokens_not_on_what_was_cached(split: LlamaCppModel, tiny_q4_1: Path) -> None:
    other = [*PROMPT[:30], *range(200, 230)]
    split.reset()
    generate(split, PROMPT, 5)  # the cache now holds PROMPT and 5 generated tokens
    split.rollback(len(PROMPT) + 2)
    reused = generate(split, other, 5)  # shares 30 tokens with what the prompt context holds
    fresh_model = load_model(tiny_q4_1, threads=THREADS, layout="split")
    try:
        fresh = generate(fresh_model, other, 5)  # type: ignore[arg-type]
    finally:
        fresh_model.close()
    assert reused[0] == fresh[0]
    for a, b in zip(reused[1], fresh[1], strict=True):
        assert np.array_equal(a, b)
    # branches evaluate on the generation context, after the prompt
    outs = split.eval_branches(other, [[5, 6], [7]])
    assert np.array_equal(outs[0].logits[0], fresh[1][0]) and outs[1].logits.shape[0] == 2
    assert split.cached_tokens == other


def test_split_logits_are_the_same_on_any_thread_count(tiny_q4_1: Path) -> None:
    one = load_model(tiny_q4_1, threads=1, layout="split")
    two = load_model(tiny_q4_1, threads=2, layout="split", adaptive_threads=False)
    try:
        a, b = generate(one, PROMPT, 4), generate(two, PROMPT, 4)  # type: ignore[arg-type]
        assert a[0] == b[0]
        for x, y in zip(a[1], b[1], strict=True):
            assert np.array_equal(x, y)
    finally:
        one.close()
        two.close()


def test_split_weights_refuse_loras_and_another_model(split: LlamaCppModel, default_gguf: Path) -> None:
    with pytest.raises(AdapterError, match="layout='split'"):
        split.load_lora(TINY_GGUF)
    with pytest.raises(ModelLoadError, match="not the same model"):
        LlamaCppModel(split.info.extra["weights"], threads=THREADS, generation_weights=default_gguf)


class Invoice(BaseModel):
    invoice_number: str
    seller: str
    total: float


INVOICES = [
    "Invoice INV-2041 from ACME Tools Ltd, 12 Harbour Road. Total due 44.30 EUR by 15 March 2024.",
    "Bill no. B-77 issued by Northwind Traders. Amount payable: 1,250.00 USD.",
    "Receipt R-9 from Corner Cafe. Two coffees, total 7.20 GBP.",
]


def test_the_merged_extraction_model_runs_split(smollm: object) -> None:
    model = load_model(threads=THREADS, merge_adapter="extract", layout="split")
    try:
        assert merged_task(model) == "extract" and model.split  # type: ignore[attr-defined]
        assert model.info.extra["generation weights"].endswith(".q8_0.gguf")
        assert "extract-" in model.info.extra["generation weights"]  # the adapter is merged into both copies
        one_by_one = [extract(text, Invoice, model=model) for text in INVOICES]
        assert all(isinstance(v, Invoice) for v in one_by_one)
        many = [o.value for o in extract_many(INVOICES, Invoice, model=model)]
        assert many == one_by_one
        batched = list(extract_many(INVOICES, Invoice, model=model, batch=2))  # lanes, then adopted back
        assert all(o.ok for o in batched)
        assert extract(INVOICES[0], Invoice, model=model) == one_by_one[0]
    finally:
        model.close()


@pytest.mark.slow
def test_one_set_of_weights_in_two_contexts_takes_loras(default_gguf: Path, tmp_path: Path) -> None:
    from test_lora import write_lora

    two = LlamaCppModel(default_gguf, threads=THREADS, generation_weights=default_gguf)
    flash = LlamaCppModel(default_gguf, threads=THREADS, flash_attn=True)
    try:
        assert two.split and two._gen_model is None  # one set of weights, two contexts
        ids = two.tokenize("The quick brown fox jumps over the lazy dog. " * 4)

        def prompt_and_step(m: LlamaCppModel) -> tuple[np.ndarray, np.ndarray]:
            m.reset()
            return m.prefill(ids).logits[-1], m.eval(ids[1:2]).logits[-1]

        base = prompt_and_step(two)
        assert np.array_equal(base[0], flash.prefill(ids).logits[-1])  # the prompt: flash attention
        lora = write_lora(tmp_path / "lora.gguf", "llama")
        adapter = two.load_lora(lora)
        adapted = prompt_and_step(two)
        assert all(np.abs(a - b).max() > 1e-3 for a, b in zip(adapted, base, strict=True))  # both contexts
        flash.load_lora(lora)
        flash.reset()
        assert np.array_equal(adapted[0], flash.prefill(ids).logits[-1])
        two.remove_lora(adapter)
        assert all(np.array_equal(a, b) for a, b in zip(prompt_and_step(two), base, strict=True))
    finally:
        two.close()
        flash.close()


def test_which_layouts_generate_in_a_context_of_their_own() -> None:
    from pocket_agent.runtime.layout import describe_copy, generation_copy

    assert generation_copy("split", "bf16", merged=False) == "q8_0"
    assert generation_copy("speed", "bf16", merged=True) == "q8_0"  # the merged extraction model, BF16 native
    assert generation_copy("speed", "q8_0", merged=True) == "q8_0"  # elsewhere: its own copy, a second context
    for layout, kind, merged in (
        ("auto", "bf16", False),
        ("auto", "bf16", True),  # "auto" keeps one copy and one context, merged or not
        ("bf16", "bf16", True),
        ("q8_0", "q8_0", True),
    ):
        assert generation_copy(layout, kind, merged=merged) is None  # type: ignore[arg-type]
    assert generation_copy("speed", None, merged=True) is None
    assert describe_copy("auto", "q8_0", "q8_0").endswith("prompts in a flash-attention context")
