"""Task adapters merged into the weights (``load_model(merge_adapter=...)``): the same model as the
LoRA applied at run time, within rounding, and refused by the tasks that need the base weights."""

from __future__ import annotations

import os
from pathlib import Path

import gguf  # the convert extra, which the test command installs
import numpy as np
import pytest
from conftest import THREADS, TINY_GGUF, TINY_MNN, chat_ids
from pydantic import BaseModel

from pocket_agent import Agent, extract
from pocket_agent.decision import decide
from pocket_agent.errors import AdapterError, InvalidInputError
from pocket_agent.runtime import Model, get_default_model, load_model, set_default_model
from pocket_agent.runtime._gguf_merge import dequantize, lora_deltas, write_merged_gguf
from pocket_agent.runtime.gguf_meta import read_gguf_layout
from pocket_agent.runtime.layout import weights_copy
from pocket_agent.runtime.merged import merged_task
from pocket_agent.runtime.task_adapters import find_shipped_adapter, task_adapter

INVOICE = (
    "Invoice INV-2041 from ACME Tools Ltd, 12 Harbour Road. Three boxes of screws at 4.10 each and "
    "a hammer at 32.00; total due 44.30 EUR by 15 March 2024."
)


class Invoice(BaseModel):
    invoice_number: str
    seller: str
    total: float


def token_logprobs(model: Model, ids: list[int]) -> np.ndarray:
    model.reset()
    logits = model.eval(ids, logits="all").logits.astype(np.float64)
    model.reset()
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return np.asarray(logp[np.arange(len(ids) - 1), ids[1:]])


def write_random_lora(path: Path, model_file: Path, targets: list[str], *, task: str = "extract", **meta: str) -> Path:
    """A rank-4 LoRA on ``targets`` (tensor names of ``model_file``), shaped from the model's own table."""
    shapes = {t.name: t.shape for t in read_gguf_layout(model_file).tensors}
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), str(gguf.GGUFReader(str(model_file)).fields["general.architecture"].contents()))
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_string("pocket_agent.task", task)
    for key, value in meta.items():
        w.add_string(f"pocket_agent.{key}", value)
    for name in targets:
        n_out, n_in = shapes[name]
        w.add_tensor(f"{name}.lora_a", (rng.standard_normal((4, n_in)) * 0.3).astype(np.float32))
        w.add_tensor(f"{name}.lora_b", (rng.standard_normal((n_out, 4)) * 0.3).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pocket_agent.runtime.llamacpp import quantize_gguf

    target = tmp_path_factory.mktemp("merge") / "tiny-q4_1.gguf"
    quantize_gguf(TINY_GGUF, target, file_type=3)
    return target


@pytest.fixture(scope="module")
def tiny_lora(tiny_q4_1: Path) -> Path:
    targets = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"]
    return write_random_lora(tiny_q4_1.with_name("tiny-lora.gguf"), tiny_q4_1, targets)


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_reads_every_type_it_merges_into_as_gguf_py_does(type_name: str) -> None:
    qtype = gguf.GGMLQuantizationType[type_name]
    values = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    raw = gguf.quants.quantize(values, qtype)
    expected = gguf.quants.dequantize(raw, qtype).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw.tobytes(), int(qtype), values.size), expected)


def test_the_merged_file_holds_base_plus_delta_and_every_other_tensor_unchanged(
    tiny_q4_1: Path, tiny_lora: Path, tmp_path: Path
) -> None:
    target = tmp_path / "merged.gguf"
    write_merged_gguf(tiny_q4_1, tiny_lora, target)
    merged, source = gguf.GGUFReader(str(target)), gguf.GGUFReader(str(tiny_q4_1))
    deltas = lora_deltas(tiny_lora)
    assert set(deltas) == {"blk.0.attn_q.weight", "blk.1.ffn_down.weight"}
    by_name = {t.name: t for t in source.tensors}
    assert [t.name for t in merged.tensors] == [t.name for t in source.tensors]
    for t in merged.tensors:
        s = by_name[t.name]
        if t.name in deltas:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            base = gguf.quants.dequantize(s.data, s.tensor_type).reshape(deltas[t.name].shape)
            np.testing.assert_allclose(np.asarray(t.data), base + deltas[t.name], rtol=0, atol=1e-5)
        else:
            assert t.tensor_type == s.tensor_type and bytes(t.data) == bytes(s.data)
    for key in ("general.architecture", "tokenizer.ggml.tokens", "general.name"):
        assert merged.fields[key].contents() == source.fields[key].contents()


def test_a_merged_copy_is_the_lora_applied_at_run_time_within_rounding(
    tiny_q4_1: Path, tiny_lora: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POCKET_AGENT_CACHE", str(tmp_path))
    merged = load_model(tiny_q4_1, threads=THREADS, layout="q8_0", merge_adapter=tiny_lora)
    base = load_model(tiny_q4_1, threads=THREADS, layout="q8_0")
    try:
        assert merged_task(merged) == "extract" and merged_task(base) is None
        assert merged.info.extra["layout"] == "q8_0: Q8_0 copy, extract adapter merged"
        ids = merged.tokenize("Hello there, how are you today? Fine, thanks.")
        plain = token_logprobs(base, ids)
        base.load_lora(tiny_lora)
        at_run_time, merged_lp = token_logprobs(base, ids), token_logprobs(merged, ids)
    finally:
        merged.close()
        base.close()
    # the LoRA moves the model far more than merging it into Q8_0 rounds it
    assert np.abs(at_run_time - plain).mean() > 5 * np.abs(merged_lp - at_run_time).mean()
    assert np.abs(merged_lp - at_run_time).max() < 0.5


def test_a_merged_copy_is_written_once_and_rewritten_when_the_lora_changes(
    tiny_q4_1: Path, tiny_lora: Path, tmp_path: Path
) -> None:
    plain = weights_copy(tiny_q4_1, "q8_0", cache_dir=tmp_path)
    first = weights_copy(tiny_q4_1, "q8_0", cache_dir=tmp_path, merge=tiny_lora)
    assert first != plain and tiny_lora.stem in first.name
    written = first.stat().st_mtime_ns
    assert weights_copy(tiny_q4_1, "q8_0", cache_dir=tmp_path, merge=tiny_lora).stat().st_mtime_ns == written
    st = tiny_lora.stat()
    os.utime(tiny_lora, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert weights_copy(tiny_q4_1, "q8_0", cache_dir=tmp_path, merge=tiny_lora).stat().st_mtime_ns != written
    assert sorted(p.suffix for p in (tmp_path / "gguf").iterdir() if not p.name.startswith(".")) == [
        ".gguf",
        ".gguf",
        ".json",
        ".json",
    ]  # no partial or intermediate file left behind


def test_bad_merges_are_typed_errors(tiny_q4_1: Path, tiny_lora: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="merge_adapter"):
        load_model(tiny_q4_1, merge_adapter=5)  # type: ignore[arg-type]
    with pytest.raises(AdapterError, match="not found"):
        load_model(tiny_q4_1, merge_adapter=tmp_path / "missing.gguf")
    tools = write_random_lora(tmp_path / "tools.gguf", tiny_q4_1, ["blk.0.attn_q.weight"], task="tools")
    with pytest.raises(AdapterError, match="extraction LoRA"):
        load_model(tiny_q4_1, merge_adapter=tools)
    other = write_random_lora(tmp_path / "other.gguf", tiny_q4_1, ["blk.0.attn_q.weight"], base_model_id="0" * 64)
    with pytest.raises(AdapterError, match="another base model"):
        load_model(tiny_q4_1, merge_adapter=other)
    with pytest.raises(AdapterError, match="layout='original'"):
        load_model(tiny_q4_1, merge_adapter=tiny_lora, layout="original")
    with pytest.raises(AdapterError, match="not 4/5-bit"):
        load_model(TINY_GGUF, merge_adapter=tiny_lora)
    with pytest.raises(InvalidInputError, match="needs a GGUF model on llama"):
        load_model(TINY_MNN, merge_adapter=tiny_lora)
    missing = write_random_lora(tmp_path / "m.gguf", tiny_q4_1, ["blk.0.attn_q.weight"])
    reader = gguf.GGUFReader(str(missing))
    renamed = tmp_path / "renamed.gguf"
    w = gguf.GGUFWriter(str(renamed), "qwen3")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_string("pocket_agent.task", "extract")
    for t in reader.tensors:
        w.add_tensor(t.name.replace("blk.0.", "blk.99."), np.asarray(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(AdapterError, match="does not have"):
        write_merged_gguf(tiny_q4_1, renamed, tmp_path / "x.gguf")


def test_the_default_model_with_the_extraction_adapter_merged(smollm: Model) -> None:
    shipped = find_shipped_adapter(smollm, "extract")
    assert shipped is not None
    # one BF16 copy ("speed" splits it where BF16 is native: tests/test_split_weights.py)
    merged = load_model(threads=THREADS, merge_adapter="extract", layout="bf16")
    try:
        assert merged_task(merged) == "extract" and merged.info.extra["merged_adapter"] == str(shipped.resolve())
        assert merged.info.extra["layout"].endswith("extract adapter merged")
        ids = chat_ids(smollm, "Extract the invoice number from: " + INVOICE)
        with smollm.lock, task_adapter(smollm, "auto", "extract"):
            at_run_time = token_logprobs(smollm, ids)
        plain = token_logprobs(smollm, ids)
        merged_lp = token_logprobs(merged, ids)
        # measured (BF16, AMD EPYC): the merged copy 0.014 nats per token from the LoRA at run time
        # (at most 0.09), the LoRA itself 0.50 from the base weights
        assert np.abs(merged_lp - at_run_time).mean() < 0.05
        assert np.abs(at_run_time - plain).mean() > 3 * np.abs(merged_lp - at_run_time).mean()

        value = extract(INVOICE, Invoice, model=merged)
        assert isinstance(value, Invoice)
        assert extract(INVOICE, Invoice, model=merged, adapter=shipped) == value  # its own adapter, by path
        with pytest.raises(AdapterError, match="merged into its weights"):
            extract(INVOICE, Invoice, model=merged, adapter=None)
        with pytest.raises(AdapterError, match="decide needs the base weights"):
            decide("Is this an invoice?", ["yes", "no"], context=INVOICE, model=merged)
        with pytest.raises(AdapterError, match="'tools'"):
            Agent(tools=[add], model=merged).run("What is 2 plus 3?")
    finally:
        merged.close()


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def test_extract_without_a_model_runs_the_shared_model_and_under_speed_a_merged_one(
    smollm: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_default_model(None)
    monkeypatch.delenv("POCKET_AGENT_LAYOUT", raising=False)
    try:
        assert get_default_model("extract") is get_default_model()  # one model serves every task
    finally:
        get_default_model().close()
        set_default_model(None)
    monkeypatch.setenv("POCKET_AGENT_LAYOUT", "speed")
    try:
        model = get_default_model("extract")
        shared = get_default_model()
        assert merged_task(model) == "extract"
        assert get_default_model("extract") is model  # loaded once
        assert merged_task(shared) is None  # the shared model, for everything else
        assert isinstance(extract(INVOICE, Invoice), Invoice)
        set_default_model(smollm)  # a model the user sets serves every task
        assert get_default_model("extract") is smollm
    finally:
        set_default_model(smollm)
        model.close()
        shared.close()


def test_extract_keeps_the_adapter_at_run_time_where_nothing_is_merged(
    tiny_q4_1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = load_model(tiny_q4_1, threads=THREADS, layout="original", merge_adapter="extract")
    try:
        assert merged_task(m) is None  # the task's adapter, if any, is applied at run time
    finally:
        m.close()
    monkeypatch.setenv("POCKET_AGENT_NO_DEFAULT_ADAPTER", "1")
    m = load_model(threads=THREADS, merge_adapter="extract")
    try:
        assert merged_task(m) is None
    finally:
        m.close()


def test_an_unwritable_cache_applies_the_adapter_at_run_time_or_says_why(
    tiny_q4_1: Path, tiny_lora: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("POCKET_AGENT_CACHE", str(blocker))
    m = load_model(threads=THREADS, merge_adapter="extract")  # the task's adapter: loads, unmerged
    try:
        assert merged_task(m) is None and "weights" not in m.info.extra
    finally:
        m.close()
    with pytest.raises(AdapterError, match="Cannot write"):  # a LoRA asked for by path: say why not
        load_model(tiny_q4_1, threads=THREADS, merge_adapter=tiny_lora, layout="q8_0")
