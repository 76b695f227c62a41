"""LoRA adapters trained with PEFT, and the tqdm progress bars.

A PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) loads on
llama.cpp and Transformers (``model.load_lora(folder)``, ``extract(..., adapter=folder)``,
``Agent(..., adapter=folder)``), converts to a GGUF LoRA (``peft_lora_to_gguf``) and merges
into a checkpoint (``merge_lora``). Measured on this machine:

- tiny Qwen3 fixture (f16 GGUF on llama.cpp against transformers+PEFT in float32), adapters
  trained here for 4 steps (plain alpha; rslora with alpha_pattern and rank_pattern): the logit
  change agrees to 6.5e-4 / 3.8e-4 of its size (asserted 1e-2), the logits to 4e-4 (asserted
  5e-3); the Transformers backend to 2e-7 of it (asserted 1e-4); the merged checkpoint
  (stored back as float16) to 3.5e-4 (asserted 5e-3).
- SmolLM2-135M (llama: q/k rows permuted in the GGUF), a random PEFT LoRA on q/k of every
  block, llama.cpp on its BF16 copy: the logit changes correlate at 0.998 with PEFT's
  (asserted 0.98), the Transformers backend equals PEFT exactly; with ``lora_b``'s q/k rows
  left in Hugging Face order the correlation falls to 0.27 and the Transformers backend is
  off by 7.6.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import THREADS, TINY_GGUF
from pydantic import BaseModel
from safetensors.numpy import save_file

from pocket_agent.errors import AdapterError
from pocket_agent.runtime import Model, load_model
from pocket_agent.runtime._hf_lora import reverse_permute_rows
from pocket_agent.runtime.peft_lora import (
    gguf_tensors,
    is_peft_adapter,
    permute_rows,
    read_peft_lora,
)

TINY_HF = TINY_GGUF.parent / "hf"
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_peft_folder(folder: Path, tensors: dict[str, np.ndarray], **config: Any) -> Path:
    """A PEFT adapter folder as ``save_pretrained`` writes it (without peft itself)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": False, "use_dora": False, **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    save_file(
        {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
        str(folder / "adapter_model.safetensors"),
    )
    return folder


def _factors(layer: int, module: str, rank: int, n_in: int, n_out: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    prefix = f"base_model.model.model.layers.{layer}.{module}"
    return {
        f"{prefix}.lora_A.weight": rng.standard_normal((rank, n_in)).astype(np.float32),
        f"{prefix}.lora_B.weight": rng.standard_normal((n_out, rank)).astype(np.float32),
    }


# -- conversion, no model ------------------------------------------------------------------


def test_the_q_k_permutation_is_the_inverse_of_the_one_transformers_undoes() -> None:
    rows = np.arange(96 * 3, dtype=np.float32).reshape(96, 3)
    for n_head, n_head_kv in ((6, 6), (6, 2), (4, 4)):
        np.testing.assert_array_equal(
            reverse_permute_rows(permute_rows(rows, n_head, n_head_kv), n_head, n_head_kv), rows
        )
    assert not np.array_equal(permute_rows(rows, 6, 6), rows)
    with pytest.raises(AdapterError, match="permute"):
        permute_rows(rows[:10], 4, 4)


def test_peft_scaling_becomes_the_gguf_alpha_or_is_folded_into_b(tmp_path: Path) -> None:
    tensors = {**_factors(0, "self_attn.v_proj", 4, 8, 6), **_factors(1, "mlp.down_proj", 4, 8, 6, seed=1)}
    plain = read_peft_lora(write_peft_folder(tmp_path / "plain", tensors, lora_alpha=8))
    out, alpha = gguf_tensors(plain, architecture="qwen3")
    assert alpha == 8.0  # alpha / r * r: llama.cpp's own arithmetic gives PEFT's scaling
    np.testing.assert_array_equal(out["blk.0.attn_v.weight.lora_b"], plain.factors[0].lora_b)
    assert sorted(out) == [
        "blk.0.attn_v.weight.lora_a",
        "blk.0.attn_v.weight.lora_b",
        "blk.1.ffn_down.weight.lora_a",
        "blk.1.ffn_down.weight.lora_b",
    ]
    rs = read_peft_lora(write_peft_folder(tmp_path / "rs", tensors, lora_alpha=8, use_rslora=True))
    assert [f.scaling for f in rs.factors] == [4.0, 4.0]  # alpha / sqrt(r)
    assert gguf_tensors(rs, architecture="qwen3")[1] == 16.0
    mixed = read_peft_lora(write_peft_folder(tmp_path / "mixed", tensors, lora_alpha=8, alpha_pattern={"down_proj": 2}))
    assert [f.scaling for f in mixed.factors] == [2.0, 0.5]
    out, alpha = gguf_tensors(mixed, architecture="qwen3")
    assert alpha == 0.0  # llama.cpp then scales by 1: each scaling sits in its lora_b
    np.testing.assert_allclose(out["blk.1.ffn_down.weight.lora_b"], 0.5 * mixed.factors[1].lora_b)


def test_the_written_gguf_lora_reads_back_with_the_gguf_package(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    from pocket_agent.convert import peft_lora_to_gguf

    tensors = {**_factors(0, "self_attn.q_proj", 4, 64, 64), **_factors(1, "self_attn.k_proj", 4, 64, 32, seed=2)}
    folder = write_peft_folder(tmp_path / "a", tensors, base_model_name_or_path="tiny")
    path = peft_lora_to_gguf(folder, TINY_GGUF, tmp_path / "a.gguf")
    reader = gguf.GGUFReader(str(path))
    assert reader.get_field("general.architecture").contents() == "qwen3"
    assert reader.get_field("adapter.type").contents() == "lora"
    assert reader.get_field("adapter.lora.alpha").contents() == 8.0
    assert reader.get_field("pocket_agent.peft_base_model").contents() == "tiny"
    got = {t.name: np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)]) for t in reader.tensors}
    np.testing.assert_array_equal(
        got["blk.1.attn_k.weight.lora_b"], tensors[next(k for k in tensors if "k_proj.lora_B" in k)]
    )
    np.testing.assert_array_equal(
        got["blk.0.attn_q.weight.lora_a"], tensors[next(k for k in tensors if "q_proj.lora_A" in k)]
    )


def test_llama_q_and_k_lora_b_are_permuted_with_the_model_heads(tmp_path: Path) -> None:
    tensors = {**_factors(0, "self_attn.q_proj", 2, 16, 16), **_factors(0, "self_attn.k_proj", 2, 16, 8, seed=3)}
    tensors.update(_factors(0, "self_attn.v_proj", 2, 16, 8, seed=4))
    lora = read_peft_lora(write_peft_folder(tmp_path / "a", tensors, r=2, lora_alpha=2))
    out, _ = gguf_tensors(lora, architecture="llama", n_head=4, n_head_kv=2)
    by_module = {f.module: f for f in lora.factors}
    np.testing.assert_array_equal(
        out["blk.0.attn_q.weight.lora_b"], permute_rows(by_module["self_attn.q_proj"].lora_b, 4)
    )
    np.testing.assert_array_equal(
        out["blk.0.attn_k.weight.lora_b"], permute_rows(by_module["self_attn.k_proj"].lora_b, 4, 2)
    )
    np.testing.assert_array_equal(out["blk.0.attn_v.weight.lora_b"], by_module["self_attn.v_proj"].lora_b)
    np.testing.assert_array_equal(out["blk.0.attn_q.weight.lora_a"], by_module["self_attn.q_proj"].lora_a)


def test_peft_adapters_llama_cpp_cannot_apply_are_typed_errors(tmp_path: Path) -> None:
    good = _factors(0, "self_attn.v_proj", 4, 8, 6)
    assert is_peft_adapter(write_peft_folder(tmp_path / "ok", good))
    assert not is_peft_adapter(tmp_path / "ok" / "adapter_model.safetensors")
    cases: list[tuple[Path, str]] = [
        (write_peft_folder(tmp_path / "dora", good, use_dora=True), "DoRA"),
        (write_peft_folder(tmp_path / "ia3", good, peft_type="IA3"), "only LoRA"),
        (
            write_peft_folder(
                tmp_path / "emb", {**good, "base_model.model.model.embed_tokens.lora_embedding_A": np.ones((4, 9))}
            ),
            "embed_tokens",
        ),
        (
            write_peft_folder(
                tmp_path / "bias", {**good, "base_model.model.model.layers.0.self_attn.v_proj.lora_B.bias": np.ones(6)}
            ),
            "cannot apply",
        ),
        (write_peft_folder(tmp_path / "half", {k: v for k, v in good.items() if "lora_A" in k}), "mismatched"),
    ]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}), encoding="utf-8")
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"pickle")
    cases.append((tmp_path / "bin", "safe_serialization"))
    for folder, message in cases:
        with pytest.raises(AdapterError, match=message):
            read_peft_lora(folder)


# -- progress bars ---------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_training_progress_draws_tqdm_bars_on_a_terminal_and_lines_elsewhere() -> None:
    from pocket_agent.training._progress import ProgressBar

    def run(stream: io.StringIO, enabled: bool = True) -> str:
        bar = ProgressBar(stream, enabled=enabled)
        for g in range(1, 5):
            bar("epoch 1/1", g, 4, {"loss": 1.0 / g})
            if g == 2:
                bar("validation", 1, 1, {"val_loss": 0.5})
        return stream.getvalue()

    live = run(_Terminal())
    assert "\r" in live and "epoch 1/1: 100%" in live and "loss=0.25" in live and "val_loss=0.5" in live
    logged = run(io.StringIO())
    assert "\r" not in logged  # a log gets whole lines: stage changes and finished stages
    assert logged.splitlines()[0].startswith("epoch 1/1:  25%") and logged.splitlines()[-1].startswith(
        "epoch 1/1: 100%"
    )
    assert run(_Terminal(), enabled=False) == ""


def test_the_extraction_counter_writes_nothing_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    from pocket_agent.progress import DocumentProgress

    quiet = DocumentProgress(3, False)
    quiet.update(True)
    quiet.close()
    assert capsys.readouterr().err == ""
    shown = DocumentProgress(3, True, "on 2 actor(s)")
    for ok in (True, False, True):
        shown.update(ok)
    shown.close()
    assert (shown.done, shown.failed) == (3, 1)
    err = capsys.readouterr().err
    assert "3/3" in err and "1 failed, on 2 actor(s)" in err and "doc" in err


# -- a PEFT adapter trained here, on the runtime ------------------------------------------------


def _peft_model(hf_folder: Path, targets: list[str], **config: Any) -> Any:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(str(hf_folder), dtype=torch.float32)
    return peft.get_peft_model(hf, peft.LoraConfig(target_modules=targets, lora_dropout=0.0, **config))


def _train_a_few_steps(pm: Any, vocab: int, steps: int = 4) -> None:
    """A few AdamW steps on random tokens: B leaves zero, as in any trained adapter."""
    import torch

    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=2e-2)
    pm.train()
    for _ in range(steps):
        ids = torch.randint(0, vocab, (2, 24), generator=gen)
        loss = pm(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    pm.eval()


def _peft_logits(pm: Any, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(with the adapter, without it) for every position of ``ids``."""
    import torch

    with torch.no_grad():
        on = pm(torch.tensor([ids])).logits[0].numpy()
        with pm.disable_adapter():
            off = pm(torch.tensor([ids])).logits[0].numpy()
    return on, off


def _runtime_logits(m: Model, ids: list[int], adapter: Path) -> tuple[np.ndarray, np.ndarray]:
    m.reset()
    off = m.eval(ids, logits="all").logits
    lora = m.load_lora(adapter)
    try:
        m.reset()
        on = m.eval(ids, logits="all").logits
    finally:
        m.remove_lora(lora)
    m.reset()
    return on, off


@pytest.fixture(scope="module", params=["alpha", "rslora-and-pattern"])
def tiny_peft(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """A PEFT LoRA on every projection of the tiny fixture, trained a few steps and saved."""
    extra: dict[str, Any] = {"r": 4, "lora_alpha": 8}
    if request.param != "alpha":  # one scaling per module: folded into lora_b
        extra.update(use_rslora=True, alpha_pattern={"down_proj": 3}, rank_pattern={"q_proj": 2})
    pm = _peft_model(TINY_HF, ALL_TARGETS, **extra)
    _train_a_few_steps(pm, int(pm.config.vocab_size))
    folder = tmp_path_factory.mktemp("peft") / "adapter"
    pm.save_pretrained(str(folder))
    yield folder, pm


@pytest.mark.slow
def test_a_peft_lora_changes_llamacpp_logits_as_peft_does(tiny_gguf: Model, tiny_peft: tuple[Path, Any]) -> None:
    folder, pm = tiny_peft
    ids = tiny_gguf.tokenize("The quick brown fox jumps over the lazy dog. 12 + 30 = 42")
    peft_on, peft_off = _peft_logits(pm, ids)
    ours_on, ours_off = _runtime_logits(tiny_gguf, ids, folder)
    size = float(np.abs(peft_on - peft_off).max())
    assert size > 0.1  # the trained adapter changes the logits
    assert float(np.abs((ours_on - ours_off) - (peft_on - peft_off)).max()) < 1e-2 * size
    assert float(np.abs(ours_on - peft_on).max()) < 5e-3  # f16 weights on llama.cpp, float32 in torch


@pytest.mark.slow
def test_a_peft_lora_on_the_transformers_backend_and_merged(
    tiny_peft: tuple[Path, Any], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from pocket_agent.convert import merge_lora

    folder, pm = tiny_peft
    tf = load_model(TINY_HF, backend="transformers", threads=THREADS)
    try:
        ids = tf.tokenize("The quick brown fox jumps over the lazy dog. 12 + 30 = 42")
        peft_on, peft_off = _peft_logits(pm, ids)
        ours_on, _ = _runtime_logits(tf, ids, folder)
    finally:
        tf.close()
    size = float(np.abs(peft_on - peft_off).max())
    assert float(np.abs(ours_on - peft_on).max()) < 1e-4 * size
    merged = load_model(merge_lora(TINY_HF, folder, tmp_path / "merged"), backend="transformers", threads=THREADS)
    try:
        merged.reset()
        got = merged.eval(ids, logits="all").logits
    finally:
        merged.close()
    assert float(np.abs(got - peft_on).max()) < 5e-3 * size  # weights stored back as float16


@pytest.mark.slow
def test_extract_and_agent_take_a_peft_folder(tiny_gguf: Model, tiny_peft: tuple[Path, Any]) -> None:
    from pocket_agent import Agent, Limits, extract, tool
    from pocket_agent.errors import AgentError, GenerationError

    folder, _ = tiny_peft

    class Note(BaseModel):
        title: str

    with contextlib.suppress(GenerationError):  # a tiny random model may not finish the object
        extract("Title: hello", Note, model=tiny_gguf, adapter=folder, max_tokens=12, retries=0, grounded=False)
    assert [a.path for a in tiny_gguf.loras if a.path == folder] == [folder]  # loaded once, switched off after
    assert all(a.scale == 0.0 for a in tiny_gguf.loras)

    @tool
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    for a in list(tiny_gguf.loras):
        tiny_gguf.remove_lora(a)
    agent = Agent([echo], model=tiny_gguf, adapter=str(folder), limits=Limits(max_steps=1), max_tokens=8)
    with contextlib.suppress(AgentError, GenerationError):  # a tiny random model rarely finishes
        agent.run("Echo hi")
    try:
        assert [a.path for a in tiny_gguf.loras] == [folder]
    finally:
        for a in list(tiny_gguf.loras):
            tiny_gguf.remove_lora(a)


# -- llama: q/k rows permuted ------------------------------------------------------------------


@pytest.mark.slow
def test_a_peft_lora_on_q_and_k_of_a_llama_model_matches_peft(default_gguf: Path, tmp_path: Path) -> None:
    """SmolLM2 stores q/k rows permuted for llama.cpp's rope: lora_b must be permuted too."""
    from pocket_agent.convert import hf_checkpoint

    pm = _peft_model(hf_checkpoint(default_gguf), ["q_proj", "k_proj"], r=4, lora_alpha=8, init_lora_weights=False)
    folder = tmp_path / "qk"
    pm.save_pretrained(str(folder))
    lc = load_model(default_gguf, threads=THREADS, layout="bf16")  # near float: no 8-bit activations
    tf = load_model(default_gguf, backend="transformers", threads=THREADS)
    try:
        ids = lc.tokenize("<|im_start|>user\nSay hello, and count to five.<|im_end|>\n<|im_start|>assistant\n")
        peft_on, peft_off = _peft_logits(pm, ids)
        lc_on, lc_off = _runtime_logits(lc, ids, folder)
        tf_on, _ = _runtime_logits(tf, ids, folder)
    finally:
        lc.close()
        tf.close()
    d_peft, d_lc = (peft_on - peft_off).ravel(), (lc_on - lc_off).ravel()
    assert float(np.abs(d_peft).max()) > 1.0
    assert float(np.corrcoef(d_peft, d_lc)[0, 1]) > 0.98
    assert float(np.abs(tf_on - peft_on).max()) < 1e-3
    assert math.isfinite(float(np.abs(lc_on).max()))
