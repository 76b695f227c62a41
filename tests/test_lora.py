"""LoRA adapters on the llama.cpp backend: load, rescale, remove at run time."""

from __future__ import annotations

from pathlib import Path

import gguf  # the convert extra, which the test command installs
import numpy as np
import pytest
from conftest import chat_ids

from pocket_agent.errors import AdapterError
from pocket_agent.runtime import Model

N_EMBD = 576  # SmolLM2-135M


def write_lora(path: Path, arch: str, layers: int = 2, rank: int = 4, seed: int = 0) -> Path:
    """A random rank-``rank`` LoRA on the q and v projections of the first ``layers`` blocks."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    kv_dim = 192  # 3 KV heads x 64
    for blk in range(layers):
        for name, out_dim in (("attn_q", N_EMBD), ("attn_v", kv_dim)):
            a = (rng.standard_normal((rank, N_EMBD)) * 0.5).astype(np.float32)
            b = (rng.standard_normal((out_dim, rank)) * 0.5).astype(np.float32)
            w.add_tensor(f"blk.{blk}.{name}.weight.lora_a", a)
            w.add_tensor(f"blk.{blk}.{name}.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def last_logits(m: Model, ids: list[int]) -> np.ndarray:
    m.reset()
    return m.eval(ids).logits[-1]


def test_lora_scale_and_remove(fresh_smollm: Model, tmp_path: Path) -> None:
    m = fresh_smollm
    before = m.loras  # the shipped extraction LoRA, switched off, once an extract test has run
    ids = chat_ids(m, "Say hello.")
    base = last_logits(m, ids)
    adapter = m.load_lora(write_lora(tmp_path / "lora.gguf", "llama"), scale=1.0)
    try:
        assert m.n_cached == 0  # applying an adapter invalidates cached keys/values
        with_lora = last_logits(m, ids)
        assert np.abs(with_lora - base).max() > 1e-3
        m.set_lora_scale(adapter, 0.0)
        np.testing.assert_array_equal(last_logits(m, ids), base)
        m.set_lora_scale(adapter, 1.0)
        np.testing.assert_allclose(last_logits(m, ids), with_lora, atol=1e-4)
    finally:
        m.remove_lora(adapter)
    np.testing.assert_array_equal(last_logits(m, ids), base)
    assert m.loras == before
    with pytest.raises(AdapterError, match="not loaded"):
        m.remove_lora(adapter)


def test_bad_lora_files(fresh_smollm: Model, tmp_path: Path) -> None:
    m = fresh_smollm
    before = m.loras
    with pytest.raises(AdapterError, match="not found"):
        m.load_lora(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(AdapterError):
        m.load_lora(junk)
    other_arch = write_lora(tmp_path / "qwen.gguf", "qwen3")
    with pytest.raises(AdapterError):
        m.load_lora(other_arch)
    assert m.loras == before


def test_switching_an_adapter_off_and_on_again_keeps_the_cache(fresh_smollm: Model, tmp_path: Path) -> None:
    m = fresh_smollm
    ids = chat_ids(m, "Say hello.")
    base = last_logits(m, ids)
    adapter = m.load_lora(write_lora(tmp_path / "lora.gguf", "llama"), scale=1.0)
    try:
        m.reset()
        with_lora = m.prefill(ids).logits[-1].copy()
        m.set_lora_scale(adapter, 0.0)
        m.set_lora_scale(adapter, 1.0)  # back to the weights the cache was computed with
        assert m.n_cached == len(ids)
        np.testing.assert_array_equal(m.prefill(ids).logits[-1], with_lora)
        m.set_lora_scale(adapter, 0.0)
        # other weights: the cached keys are forgotten before anything is evaluated
        np.testing.assert_array_equal(m.prefill(ids).logits[-1], base)
        assert m.n_cached == len(ids)
        m.set_lora_scale(adapter, 1.0)
        assert m.n_cached == 0
        np.testing.assert_allclose(m.prefill(ids).logits[-1], with_lora, atol=1e-4)
    finally:
        m.remove_lora(adapter)
    np.testing.assert_array_equal(last_logits(m, ids), base)
