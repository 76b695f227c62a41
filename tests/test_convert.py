"""Model conversion (pocket_agent.convert) and the committed tiny-qwen3 fixtures.

Tests marked ``convert`` need the ``convert`` extra (torch, transformers, llmexport, ...):
CI installs it, so they fail rather than skip when it is missing. MNN allows one model per
process, so every MNN load happens in a subprocess.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pocket_agent.convert import (
    DEFAULT_MODEL_NAME,
    convert_to_mnn,
    ensure_default_mnn,
    is_gguf_file,
    read_gguf_metadata,
    sha256_file,
)
from pocket_agent.errors import ConversionError, InvalidInputError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
TINY_GGUF = TINY / "tiny-qwen3-f16.gguf"
BUILD_KEYS = {"llm_model", "llm_weight", "tokenizer_file"}

_MNN_LOGITS_CHILD = """
import json, sys
import numpy as np
import MNN.llm as llm
m = llm.create(sys.argv[1])
m.set_config({"thread_num": 1})
if not m._c_obj.load():
    sys.exit("MNN load failed")
out = []
for ids in json.loads(sys.argv[2]):
    m.reset()
    logits = np.array(m.forward(ids).read(), dtype=np.float32, copy=True).reshape(-1)
    out.append({"argmax": int(logits.argmax()), "vocab": int(logits.shape[0])})
print(json.dumps(out))
"""

_MNN_RANK_CHILD = """
import json
import sys
import numpy as np
import MNN.llm as llm
m = llm.create(sys.argv[1])
m.set_config({"thread_num": 2})
if not m._c_obj.load():
    sys.exit("MNN load failed")
logits = np.array(m.forward(m.tokenizer_encode(sys.argv[2])).read(), copy=True).reshape(-1)
print(json.dumps({w: float(logits[m.tokenizer_encode(w)[0]]) for w in json.loads(sys.argv[3])}))
"""


def _gguf_bytes(metadata: dict[str, str]) -> bytes:
    """A header-only GGUF v3 file with string metadata and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    for key, value in metadata.items():
        k, v = key.encode(), value.encode()
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v
    return out


def _mnn_logits(config: Path, cases: list[list[int]]) -> list[dict[str, int]]:
    proc = subprocess.run(
        [sys.executable, "-c", _MNN_LOGITS_CHILD, str(config), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: list[dict[str, int]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --- errors raised before any heavy work (no convert extra needed) ----------------------


def test_missing_source_raises(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="does not exist"):
        convert_to_mnn(tmp_path / "nope.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_text_file_is_not_a_model(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("definitely not a model\n", encoding="utf-8")
    with pytest.raises(ConversionError, match="not a model"):
        convert_to_mnn(bogus, tmp_path / "out")
    readme = tmp_path / "README.md"
    readme.write_text("# hi\n", encoding="utf-8")
    with pytest.raises(ConversionError, match="not a model"):
        convert_to_mnn(readme, tmp_path / "out")


def test_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ConversionError, match=r"config\.json"):
        convert_to_mnn(tmp_path, tmp_path / "out")


def test_unsupported_hf_architecture(tmp_path: Path) -> None:
    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ConversionError, match="unsupported architecture"):
        convert_to_mnn(model, tmp_path / "out")


def test_hf_folder_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    with pytest.raises(ConversionError, match="no weights"):
        convert_to_mnn(tmp_path, tmp_path / "out")


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    gguf = tmp_path / "enc.gguf"
    gguf.write_bytes(_gguf_bytes({"general.architecture": "bert", "general.name": "x"}))
    assert is_gguf_file(gguf)
    assert read_gguf_metadata(gguf) == {"general.architecture": "bert", "general.name": "x"}
    with pytest.raises(ConversionError, match="unsupported architecture"):
        convert_to_mnn(gguf, tmp_path / "out")


def test_truncated_gguf(tmp_path: Path) -> None:
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(_gguf_bytes({"general.architecture": "llama"})[:30])
    with pytest.raises(ConversionError, match="GGUF"):
        convert_to_mnn(gguf, tmp_path / "out")


def test_non_empty_output_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ConversionError, match="overwrite"):
        convert_to_mnn(TINY_GGUF, out)


@pytest.mark.parametrize(
    "kwargs",
    [{"quant_bit": 3}, {"quant_block": 48}, {"quant_block": True}, {"lm_quant_bit": 2}, {"lora_quant_bit": 8}],
)
def test_invalid_quant_settings(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidInputError):
        convert_to_mnn(TINY_GGUF, tmp_path / "out", **kwargs)  # type: ignore[arg-type]


def test_missing_lora_is_refused_before_converting(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="LoRA file not found"):
        convert_to_mnn(TINY_GGUF, tmp_path / "out", lora=tmp_path / "missing.gguf")
    assert not (tmp_path / "out").exists()


def test_the_adapted_layers_get_their_own_quantisation(tmp_path: Path) -> None:
    """llmexport's per-layer file names each linear layer as its exporter does."""
    from pocket_agent.convert._mnn import _write_quant_config

    path = tmp_path / "quant.json"
    _write_quant_config(path, ["20.self_attn.v_proj", "29.mlp.down_proj"], 8, 32)
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "/layers.20/self_attn/v_proj/Linear": {"bits": 8, "block_size": 32},
        "/layers.29/mlp/down_proj/Linear": {"bits": 8, "block_size": 32},
    }


def test_import_is_light() -> None:
    heavy = "{'torch', 'transformers', 'llmexport', 'MNN'}"
    code = f"import sys, pocket_agent.convert; print(sorted({heavy} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_gguf_metadata_of_fixture() -> None:
    meta = read_gguf_metadata(TINY_GGUF, ["general.architecture", "tokenizer.chat_template"])
    assert meta["general.architecture"] == "qwen3"
    assert "<|im_start|>" in meta["tokenizer.chat_template"]


# --- the committed fixtures ------------------------------------------------------------


def test_fixture_manifest_matches_files() -> None:
    manifest = json.loads((TINY / "MANIFEST.json").read_text(encoding="utf-8"))
    files = manifest["files"]
    on_disk = {p.relative_to(TINY).as_posix() for p in TINY.rglob("*") if p.is_file()} - {"MANIFEST.json"}
    assert set(files) == on_disk, "fixture files differ from MANIFEST.json; rerun scripts/build_fixtures.py"
    for rel, info in files.items():
        path = TINY / rel
        assert path.stat().st_size == info["bytes"], rel
        assert sha256_file(path) == info["sha256"], rel


def test_fixture_mnn_build_layout() -> None:
    cfg = json.loads((TINY / "mnn" / "config.json").read_text(encoding="utf-8"))
    for key in BUILD_KEYS:
        assert not Path(cfg[key]).is_absolute()
        assert (TINY / "mnn" / cfg[key]).is_file()
    llm_cfg = json.loads((TINY / "mnn" / "llm_config.json").read_text(encoding="utf-8"))
    template = (TINY / "mnn" / "chat_template.jinja").read_text(encoding="utf-8")
    assert llm_cfg["jinja"]["chat_template"] == template
    assert llm_cfg["model_type"] == "qwen3"


@pytest.mark.mnn
@pytest.mark.slow
def test_fixture_mnn_agrees_with_reference() -> None:
    ref = json.loads((TINY / "reference.json").read_text(encoding="utf-8"))
    cases = [c["ids"] for c in ref["cases"]]
    got = _mnn_logits(TINY / "mnn" / "config.json", cases)
    assert [g["vocab"] for g in got] == [49152] * len(cases)
    assert [g["argmax"] for g in got] == [c["top_ids"][0] for c in ref["cases"]]


# --- conversions (need the convert extra) ------------------------------------------------


@pytest.mark.convert
@pytest.mark.slow
def test_convert_hf_fixture_reproduces_committed_build(tmp_path: Path) -> None:
    config = convert_to_mnn(TINY / "hf", tmp_path / "mnn")
    assert config == tmp_path / "mnn" / "config.json"
    committed = json.loads((TINY / "MANIFEST.json").read_text(encoding="utf-8"))["files"]
    produced = sorted(p.name for p in (tmp_path / "mnn").iterdir())
    assert produced == sorted(rel.split("/", 1)[1] for rel in committed if rel.startswith("mnn/"))
    for name in produced:
        assert sha256_file(tmp_path / "mnn" / name) == committed[f"mnn/{name}"]["sha256"], name


@pytest.mark.convert
@pytest.mark.mnn
@pytest.mark.slow
def test_convert_gguf_fixture(tmp_path: Path) -> None:
    out = tmp_path / "from-gguf"
    out.mkdir()
    (out / "unrelated.txt").write_text("kept", encoding="utf-8")
    (out / "tokenizer.txt").write_text("stale build file", encoding="utf-8")
    config = convert_to_mnn(TINY_GGUF, out, overwrite=True)
    assert (out / "unrelated.txt").read_text(encoding="utf-8") == "kept"
    # from a GGUF the default block is 32, the block of GGUF's quantised types (bench/mnn_settings.md);
    # llmexport records it last in the tied head's entry
    assert json.loads((out / "llm_config.json").read_text(encoding="utf-8"))["tie_embeddings"][-1] == 32
    assert not (out / "tokenizer.txt").exists()
    meta = read_gguf_metadata(TINY_GGUF, ["tokenizer.chat_template"])
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == meta["tokenizer.chat_template"]
    assert not (out / "export_args.json").exists()
    ref = json.loads((TINY / "reference.json").read_text(encoding="utf-8"))
    got = _mnn_logits(config, [c["ids"] for c in ref["cases"]])
    assert [g["argmax"] for g in got] == [c["top_ids"][0] for c in ref["cases"]]


@pytest.mark.convert
@pytest.mark.mnn
@pytest.mark.slow
def test_default_model_build_answers_paris() -> None:
    config = ensure_default_mnn()
    assert config.parent.name == DEFAULT_MODEL_NAME
    stamp = json.loads((config.parent / "pocket_agent_stamp.json").read_text(encoding="utf-8"))
    assert len(stamp["source_sha256"]) == 64
    started = time.monotonic()
    assert ensure_default_mnn() == config
    assert time.monotonic() - started < 5, "a current build must not be rebuilt"
    prompt = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    # the next word's ranking, not one greedy sentence: greedy text of a 135M model changes with
    # the build (the GGUF itself answers "L'Étoile, la Cité..." to this prompt)
    capitals = [" Paris", " London", " Berlin", " Rome", " Madrid", " Lyon"]
    proc = subprocess.run(
        [sys.executable, "-c", _MNN_RANK_CHILD, str(config), prompt + "The capital of France is", json.dumps(capitals)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(scores, key=scores.__getitem__) == " Paris", scores


_MNN_ALL_LOGITS_CHILD = """
import json
import sys
from pocket_agent.runtime import load_model
m = load_model(sys.argv[1], threads=1)
ids, k = json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps(m.eval(ids, logits="all").logits[-k:].tolist()))
"""


@pytest.mark.convert
@pytest.mark.mnn
@pytest.mark.slow
def test_default_extract_build_runs_the_extraction_adapter() -> None:
    """The MNN task build's logits follow llama.cpp with the extraction LoRA, not the base.

    Measured on this receipt's 38 answer positions: mean |logit difference| to llama.cpp with
    the adapter 0.67 and to the base weights 9.0 (the default q4 build: 9.2 and 0.59; an
    all-8-bit per-channel body: 0.96 and 8.8).
    """
    import numpy as np

    from pocket_agent.extraction import build_messages
    from pocket_agent.runtime import load_model
    from pocket_agent.runtime.task_adapters import task_adapter

    config = ensure_default_mnn(task="extract")
    stamp = json.loads((config.parent / "pocket_agent_stamp.json").read_text(encoding="utf-8"))
    assert stamp["task"] == "extract" and len(stamp["adapter_sha256"]) == 64
    assert (stamp["quant_bit"], stamp["lora_quant_bit"]) == (4, 8)
    # the adapted layers really are 8-bit: llmexport took the per-layer file
    base_weights = (ensure_default_mnn().parent / "llm.mnn.weight").stat().st_size
    assert (config.parent / "llm.mnn.weight").stat().st_size > 1.1 * base_weights
    text = "SANYU STATIONERY SHOP\nNO. 31G&33G, JALAN SETIA INDAH\nDate: 27/03/2018\nTotal Sales (Inclusive GST) 5.30"
    schema = {
        "type": "object",
        "properties": {"company": {"type": "string"}, "date": {"type": "string"}, "total": {"type": "number"}},
        "required": ["company", "date", "total"],
    }
    model = load_model(threads=1)
    try:
        ids = model.tokenize(model.chat_template.render(build_messages(text, schema)), special=True)
        answer = model.tokenize('{"company": "SANYU STATIONERY SHOP", "date": "27/03/2018", "total": 5.30}')
        ids += answer

        def llama_logits(choice: str | None) -> np.ndarray:
            with task_adapter(model, choice, "extract") as adapter:
                assert (adapter is None) == (choice is None)
                model.reset()
                return model.eval(ids, logits="all").logits[-len(answer) :]

        adapted, base = llama_logits("auto"), llama_logits(None)
    finally:
        model.close()
    proc = subprocess.run(
        [sys.executable, "-c", _MNN_ALL_LOGITS_CHILD, str(config), json.dumps(ids), str(len(answer))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    mnn = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    to_adapted, to_base = float(np.abs(mnn - adapted).mean()), float(np.abs(mnn - base).mean())
    print(f"mean |logit difference| to llama.cpp with the adapter {to_adapted:.2f}, to the base {to_base:.2f}")
    assert to_adapted < 0.3 * to_base, (to_adapted, to_base)


def test_conversion_does_not_see_a_runtime_only_pymnn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scripts/build_pymnn.sh build on PYTHONPATH (MNN.expr and MNN.llm only) would hide the
    wheel's converter from llmexport: the export subprocesses run without it, other entries kept."""
    from pocket_agent.convert import _mnn

    runtime = tmp_path / "pymnn-avx512"
    (runtime / "MNN").mkdir(parents=True)
    (runtime / "MNN" / "__init__.py").write_text('POCKET_AGENT_BUILD = "MNN 3.6.1 built by ..."\n', encoding="utf-8")
    other = tmp_path / "site"
    other.mkdir()
    monkeypatch.setattr(_mnn, "_llmexport_dir", lambda: tmp_path / "llmexport")
    monkeypatch.setenv("PYTHONPATH", f"{runtime}:{other}")
    work = tmp_path / "work"
    work.mkdir()
    env, _ = _mnn._sandbox(work)
    entries = env["PYTHONPATH"].split(":")
    assert str(other) in entries
    assert str(runtime) not in entries
