"""MNN build settings at equal extraction quality: which quantization of the default model
matches the GGUF model's SROIE accuracy and finish rate on the MNN backend, and how fast it is.

Every row runs ``extract()``'s pipeline (``bench/extract.py: run_ours``) on the same receipts,
schema and prompt with the base weights (``adapter=None``: MNN takes no LoRA, so the GGUF
row to match is the same weights without the shipped adapter; the shipped-adapter GGUF row is
there for reference). Each MNN build is converted from the embedded Q4_1 GGUF by
``pocket_agent.convert.convert_to_mnn`` with the settings the row names:

  q{bits}b{block}/lm{head bits}   body weight bits, quantisation block along the input
                                  dimension (0: one scale per output channel), bits of the
                                  output head (tied to the token embedding)

Per row: conversion seconds, build size, s/doc, plain prefill and one-token decode tok/s on
the first receipt's prompt and each as a fraction of the machine's limit (``bench/limit.py``;
the decode limit counts the build's own weight bytes), parse+valid and per-field exact match.

    python bench/mnn_settings.py [--docs 40] [--threads 1] [--out bench/mnn_settings.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _env import cpu_model, package_versions  # noqa: E402
from extract import FIELDS, Result, load_docs, run_ours  # noqa: E402
from limit import machine_limit, model_speed, receipt_prompt  # noqa: E402

OUT_DIR = BENCH / "out" / "mnn"
PACKAGES = ("pocket-agent-mnn", "llama-cpp-python", "llguidance")
# (weight bits, block, head bits); the first is the shipped default (pocket_agent.convert._default)
RECIPES: tuple[tuple[int, int, int], ...] = (
    (4, 64, 8),
    (4, 32, 8),
    (4, 128, 8),
    (4, 0, 8),
    (4, 32, 4),
    (8, 0, 8),
)


@dataclass
class Row:
    label: str
    result: Result
    prefill_tok_s: float
    decode_tok_s: float
    weight_bytes: int
    build_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def tag(bits: int, block: int, head: int) -> str:
    return f"q{bits}b{block}/lm{head}"


AGREEMENT_DOCS = 6


def top1(model: Any, docs: list[dict[str, Any]]) -> list[list[int]]:
    """The model's most likely next token at every position of the first receipts' extraction
    prompts (teacher-forced), to compare builds with the GGUF token by token."""
    from extract import closed_schema

    from pocket_agent.extraction import build_messages
    from pocket_agent.generate import render_prompt

    tops = []
    for doc in docs[:AGREEMENT_DOCS]:
        model.reset()
        ids = render_prompt(model, build_messages(doc["text"], closed_schema()))
        tops.append(np.argmax(np.asarray(model.prefill(ids, logits="all").logits), axis=-1).tolist())
    model.reset()
    return tops


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def build(bits: int, block: int, head: int) -> tuple[Path, float]:
    """The MNN build for one recipe (converted afresh) and the seconds it took."""
    from pocket_agent.convert import convert_to_mnn
    from pocket_agent.convert._default import default_gguf_path

    out = OUT_DIR / f"q{bits}b{block}lm{head}"
    t0 = time.perf_counter()
    config = convert_to_mnn(
        default_gguf_path(), out, quant_bit=bits, quant_block=block, lm_quant_bit=head, overwrite=True
    )
    return config, time.perf_counter() - t0


def run_child(name: str, docs: list[dict[str, Any]], threads: int, out: Path) -> int:
    """Build one recipe (``q4b32lm8``), run it and write its row as JSON to ``out``."""
    from pocket_agent.runtime import load_model

    recipe = next(r for r in RECIPES if "q{}b{}lm{}".format(*r) == name)
    config, secs = build(*recipe)
    model = load_model(config, threads=threads)
    try:
        res = run_ours(docs, model, f"MNN {tag(*recipe)}", adapter=None)
        pre, dec = model_speed(model, receipt_prompt(model), n_decode=48)
        tops = top1(model, docs)
    finally:
        model.close()
    size = sum(p.stat().st_size for p in config.parent.glob("llm.mnn*"))
    row = {"seconds": res.seconds, "valid": res.valid, "matches": res.matches, "errors": res.errors, "top1": tops}
    out.write_text(json.dumps({**row, "prefill": pre, "decode": dec, "size": size, "build_s": secs}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--recipes", nargs="*", default=None, help="e.g. q4b32lm8 (default: all of RECIPES)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one MNN recipe, in its own process
    ap.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    from pocket_agent.runtime import load_model

    docs = load_docs(args.docs)
    if args.child:
        return run_child(args.child, docs, args.threads, args.child_out)
    recipes = [r for r in RECIPES if args.recipes is None or f"q{r[0]}b{r[1]}lm{r[2]}" in args.recipes]
    rows: list[Row] = []

    gguf = load_model(threads=args.threads)
    prompt = receipt_prompt(gguf)
    weights = Path(gguf.info.extra.get("weights", gguf.path))
    print("running gguf rows...", file=sys.stderr, flush=True)
    base = run_ours(docs, gguf, "GGUF, base weights (adapter=None)", adapter=None)
    pre, dec = model_speed(gguf, prompt, n_decode=48)
    copy = weights.suffixes[-2].lstrip(".").upper() if len(weights.suffixes) > 1 else "Q4_1"
    rows.append(Row(f"GGUF ({copy} copy of the Q4_1 file), base weights", base, pre, dec, weights.stat().st_size))
    gguf_top1 = top1(gguf, docs)
    rows[-1].extra["agreement"] = 1.0
    shipped = run_ours(docs, gguf, "GGUF, shipped extraction LoRA")
    rows.append(Row("GGUF, shipped extraction LoRA (reference)", shipped, float("nan"), float("nan"), 0))
    gguf.close()

    for recipe in recipes:
        name = tag(*recipe)
        print(f"building and running MNN {name}...", file=sys.stderr, flush=True)
        # pymnn crashes when a second model is created in one process (FACTS.md): one child each
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            cmd = [sys.executable, __file__, "--docs", str(args.docs), "--threads", str(args.threads)]
            subprocess.run([*cmd, "--child", "q{}b{}lm{}".format(*recipe), "--child-out", str(out)], check=True)
            got = json.loads(out.read_text())
        res = Result(f"MNN {name}")
        res.seconds, res.valid, res.matches, res.errors = got["seconds"], got["valid"], got["matches"], got["errors"]
        label = f"MNN {name}" + (" (shipped default)" if recipe == RECIPES[0] else "")
        rows.append(Row(label, res, got["prefill"], got["decode"], got["size"], got["build_s"]))
        rows[-1].extra["agreement"] = agreement(gguf_top1, got["top1"])

    # the machine last: torch's OpenMP threads, once started, would compete with the models'
    lim = machine_limit(None, threads=args.threads, context=len(prompt))
    kv_bytes = 2 * 2 * lim.cost.n_layer * lim.cost.n_kv_dim * len(prompt)
    table = [
        "| build | size MB | convert s | s/doc | prefill tok/s (of limit) | decode tok/s (of limit) | "
        "parse+valid | errors | company | date | address | total | exact fields | top-1 = GGUF |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        r = row.result
        exact = sum(sum(m.values()) for m in r.matches)
        if row.weight_bytes:
            dec_limit = lim.machine.read_gbs * 1e9 / (row.weight_bytes + kv_bytes)
            pre_s = f"{row.prefill_tok_s:.0f} ({row.prefill_tok_s / lim.prefill_tok_s:.0%})"
            dec_s = f"{row.decode_tok_s:.1f} ({row.decode_tok_s / dec_limit:.0%} of {dec_limit:.0f})"
            size = f"{row.weight_bytes / 1e6:.0f}"
        else:
            pre_s = dec_s = size = "-"
        table.append(
            f"| {row.label} | {size} | {f'{row.build_s:.0f}' if row.build_s is not None else '-'} | "
            f"{statistics.mean(r.seconds):.2f} | {pre_s} | {dec_s} | {sum(r.valid)}/{len(r.valid)} | "
            f"{len(r.errors)} | "
            + " | ".join(f"{r.field_acc(f):.2f}" for f in FIELDS)
            + f" | {exact} | "
            + (f"{row.extra['agreement']:.1%}" if "agreement" in row.extra else "-")
            + " |"
        )
    text = "\n".join(
        [
            "# MNN build settings at equal extraction quality",
            "",
            f"Generated by `python bench/mnn_settings.py --docs {args.docs} --threads {args.threads}"
            f"{' --out ' + str(args.out) if args.out else ''}` on "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
            "",
            f"- Machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}; "
            "shared and noisy, so compare rows of one run.",
            f"- Versions: python {platform.python_version()}, {package_versions(PACKAGES)}",
            f"- Data: first {len(docs)} SROIE receipts (../shared/data/sroie), the schema and prompt of "
            f"bench/extract.py, {args.threads} thread(s), greedy, extract()'s pipeline with adapter=None.",
            f"- top-1 = GGUF: share of positions of the first {AGREEMENT_DOCS} receipts' prompts (teacher-forced) "
            "where the build's most likely next token is the GGUF base weights' (how closely it reproduces them).",
            f"- Limit (bench/limit.py at {len(prompt)} tokens): prefill {lim.prefill_tok_s:.0f} tok/s; decode = "
            f"read bandwidth {lim.machine.read_gbs:.1f} GB/s / (the build's weight bytes + the F16 K/V cache).",
            "",
            *table,
            "",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
