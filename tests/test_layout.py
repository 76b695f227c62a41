"""Weight layout: the embedded default model (Q4_1) runs from a cached BF16 or Q8_0 copy of itself."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS, TINY_GGUF

from pocket_agent.errors import InvalidInputError
from pocket_agent.runtime import Model, default_model_path, load_model
from pocket_agent.runtime.layout import (
    LAYOUT_ENV,
    copy_type,
    gguf_file_type,
    layout_setting,
    native_bf16,
    q8_0_copy,
    runtime_gguf,
)

Q4_1, Q8_0, F16, BF16 = 3, 7, 1, 32
TEXT = (
    "Invoice INV-2041 from ACME Tools Ltd, 12 Harbour Road. Three boxes of screws at 4.10 each and "
    "a hammer at 32.00; total due 44.30 EUR by 15 March 2024. Thank you for your business."
)


def token_logprobs(model: Model, ids: list[int]) -> np.ndarray:
    logits = model.eval(ids, logits="all").logits.astype(np.float64)
    model.reset()
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return np.asarray(logp[np.arange(len(ids) - 1), ids[1:]])


def test_the_default_model_runs_from_a_bf16_copy_where_bf16_is_native_else_q8_0(smollm: Model) -> None:
    assert gguf_file_type(default_model_path()) == Q4_1
    assert smollm.info.path == default_model_path()  # still the model the caller named
    kind = "BF16" if native_bf16() else "Q8_0"
    assert kind in smollm.info.extra["quantization"]
    assert smollm.info.extra["layout"].startswith(f"auto: {kind} copy")
    copy = Path(smollm.info.extra["weights"])
    assert gguf_file_type(copy) == (BF16 if kind == "BF16" else Q8_0)


def test_auto_follows_the_cpu(tiny_q4_1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pocket_agent.runtime.llamacpp as llamacpp

    monkeypatch.setattr(llamacpp, "system_info", lambda: "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 |")
    assert copy_type(tiny_q4_1, "auto", is_default_model=True) == "bf16"
    monkeypatch.setattr(llamacpp, "system_info", lambda: "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 0 |")
    assert copy_type(tiny_q4_1, "auto", is_default_model=True) == "q8_0"
    assert copy_type(tiny_q4_1, "bf16", is_default_model=False) == "bf16"  # asked for: whatever the CPU
    assert copy_type(TINY_GGUF, "bf16", is_default_model=True) is None  # F16 stays


def test_the_copy_is_the_same_model_within_rounding(smollm: Model) -> None:
    original = load_model(default_model_path(), threads=THREADS, layout="original")
    try:
        assert "Q4_1" in original.info.extra["quantization"] and "weights" not in original.info.extra
        ids = original.tokenize(TEXT)
        smollm.reset()
        copy_lp, original_lp = token_logprobs(smollm, ids), token_logprobs(original, ids)
    finally:
        original.close()
    # Measured: per token 0.09 nats apart on average (at most 0.42), the text's mean 0.04;
    # on 418 tokens of README text 0.003. A wrong copy would be nats away on every token.
    diff = np.abs(copy_lp - original_lp)
    assert diff.mean() < 0.2 and diff.max() < 1.0
    assert abs(copy_lp.mean() - original_lp.mean()) < 0.1


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny fixture quantised to Q4_1: a GGUF that is not the default model."""
    from pocket_agent.runtime.llamacpp import quantize_gguf

    target = tmp_path_factory.mktemp("q41") / "tiny-q4_1.gguf"
    quantize_gguf(TINY_GGUF, target, file_type=Q4_1)
    assert gguf_file_type(target) == Q4_1
    return target


def test_auto_leaves_other_files_as_they_are(tiny_q4_1: Path, tmp_path: Path) -> None:
    assert runtime_gguf(tiny_q4_1, "auto", is_default_model=False, cache_dir=tmp_path) == tiny_q4_1
    assert runtime_gguf(tiny_q4_1, "original", is_default_model=True, cache_dir=tmp_path) == tiny_q4_1
    assert runtime_gguf(TINY_GGUF, "q8_0", is_default_model=False, cache_dir=tmp_path) == TINY_GGUF  # F16 stays
    assert not any(tmp_path.iterdir())


def test_a_copy_is_written_once_and_rewritten_when_the_source_changes(tiny_q4_1: Path, tmp_path: Path) -> None:
    first = runtime_gguf(tiny_q4_1, "q8_0", is_default_model=False, cache_dir=tmp_path)
    assert first.parent == tmp_path / "gguf" and gguf_file_type(first) == Q8_0
    written = first.stat().st_mtime_ns
    assert q8_0_copy(tiny_q4_1, cache_dir=tmp_path).stat().st_mtime_ns == written  # reused
    st = tiny_q4_1.stat()
    os.utime(tiny_q4_1, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert q8_0_copy(tiny_q4_1, cache_dir=tmp_path).stat().st_mtime_ns != written  # stale: rewritten
    assert not list((tmp_path / "gguf").glob("*.partial"))


@pytest.mark.parametrize(("layout", "kind"), [("q8_0", "Q8_0"), ("bf16", "BF16")])
def test_load_model_runs_a_copy_when_asked(
    tiny_q4_1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, kind: str
) -> None:
    monkeypatch.setenv("POCKET_AGENT_CACHE", str(tmp_path))
    model = load_model(tiny_q4_1, threads=THREADS, layout=layout)
    original = load_model(tiny_q4_1, threads=THREADS, layout="original")
    try:
        assert model.info.path == tiny_q4_1 and kind in model.info.extra["quantization"]
        assert Path(model.info.extra["weights"]).name.endswith(f".{layout}.gguf")
        ids = model.tokenize("Hello there, how are you today?")
        copy_lp, original_lp = token_logprobs(model, ids), token_logprobs(original, ids)
        assert np.isfinite(copy_lp).all() and np.abs(copy_lp - original_lp).max() < 0.5
    finally:
        model.close()
        original.close()


def test_an_unwritable_cache_loads_the_source(
    tiny_q4_1: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="pocket_agent.layout"):
        assert runtime_gguf(tiny_q4_1, "q8_0", is_default_model=False, cache_dir=blocker) == tiny_q4_1
    assert "could not be written" in caplog.text


def test_layout_setting(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    assert layout_setting(None) == "auto"
    assert layout_setting("original") == "original"
    with pytest.raises(InvalidInputError, match="layout must be one of"):
        layout_setting("q4_0")
    with pytest.raises(InvalidInputError):
        load_model(TINY_GGUF, layout="fast")
    monkeypatch.setenv(LAYOUT_ENV, "Q8_0")
    assert layout_setting(None) == "q8_0"
    monkeypatch.setenv(LAYOUT_ENV, "bf16")
    assert layout_setting(None) == "bf16"
    monkeypatch.setenv(LAYOUT_ENV, "fastest")
    with caplog.at_level(logging.WARNING, logger="pocket_agent.layout"):
        assert layout_setting(None) == "auto"
    assert "Ignoring" in caplog.text
