"""Fit the routing constant ``CALL_BIAS`` (pocket_agent/tools/routing.py) on the BFCL dev split.

For rows ``--start``..``--stop`` (default 15-29) of every category, disjoint from the rows
``bench/bfcl.py`` scores (0-9), the default agent's router scores answering and each tool
after the question and after the neutral question. A turn should call a tool on the call
categories and answer on ``irrelevance``; the constant is the bias that maximises the
balanced accuracy of that decision (mean of the share of call rows routed to a call and
the share of irrelevance rows routed to an answer), the midpoint of the best interval.
Printed for the calibrated scores and, for comparison, for the raw (uncalibrated) ones.

    python bench/bfcl_calibrate.py [--start 15] [--stop 30] [--out runs_calib.json]
    python bench/bfcl_calibrate.py --adapter tools.gguf --write   # the constant for a tools LoRA,
                                                                 # recorded in it (pocket_agent.call_bias)
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bfcl import CATEGORIES, DATA


def rows(category: str, start: int, stop: int) -> list[dict[str, Any]]:
    with (DATA / f"{category}.jsonl").open(encoding="utf-8") as f:
        out = [json.loads(line) for i, line in enumerate(f) if start <= i < stop]
    return out


def margins(records: list[dict[str, Any]], calibrated: bool) -> list[tuple[float, bool]]:
    """(best tool score - answer score, should call) per row."""
    out = []
    for r in records:
        q, n = r["question"], r["neutral"]
        if calibrated:
            s = {k: q[k] - n[k] for k in q}
        else:
            s = dict(q)
        ans = s.pop("answer")
        out.append((max(s.values()) - ans, r["category"] != "irrelevance"))
    return out


def best_bias(ms: list[tuple[float, bool]]) -> tuple[float, float]:
    vals = sorted({m for m, _ in ms})
    cands = [vals[0] - 1.0] + [(a + b) / 2 for a, b in itertools.pairwise(vals)] + [vals[-1] + 1.0]
    n_call = sum(1 for _, c in ms if c) or 1
    n_irr = sum(1 for _, c in ms if not c) or 1

    def bal(bias: float) -> float:
        call_ok = sum(1 for m, c in ms if c and m + bias > 0) / n_call
        irr_ok = sum(1 for m, c in ms if not c and m + bias <= 0) / n_irr
        return (call_ok + irr_ok) / 2

    scores = [(bal(-c), -c) for c in cands]
    top = max(s for s, _ in scores)
    best = [b for s, b in scores if s == top]
    return (min(best) + max(best)) / 2, top


def score_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Route every calibration row: the raw scores after the question and the neutral one."""
    import shutil
    import tempfile

    from pocket_agent.runtime import load_model
    from pocket_agent.tools import Agent, Tool
    from pocket_agent.tools.format import as_messages
    from pocket_agent.training._lora import update_gguf_lora_metadata

    model = load_model(threads=args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        scored_with = args.adapter
        if args.adapter is not None:
            # an Agent routes on a LoRA's weights only when it records a constant (else on the
            # base weights): score a copy recording 0, so the margins are the LoRA's own
            scored_with = Path(tmp) / args.adapter.name
            shutil.copyfile(args.adapter, scored_with)
            update_gguf_lora_metadata(scored_with, {"call_bias": "0"})
        records = []
        for cat in CATEGORIES:
            for row in rows(cat, args.start, args.stop):
                agent = Agent([Tool.from_openai(f) for f in row["function"]], model=model, adapter=scored_with)
                msgs = as_messages(row["question"][0])
                r = agent.route(msgs)
                neutral = {k: r.raw[k] - r.logits[k] + (0 if k == "answer" else agent._router.bias) for k in r.raw}
                records.append({"category": cat, "id": row["id"], "question": r.raw, "neutral": neutral})
                print(".", end="", flush=True)
            print(" " + cat, flush=True)
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", type=int, default=15)
    ap.add_argument("--stop", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--from-json", type=Path, default=None)
    ap.add_argument("--adapter", type=Path, default=None, help="a tools LoRA: score with it on (default: base)")
    ap.add_argument("--write", action="store_true", help="record the calibrated constant in --adapter")
    args = ap.parse_args()
    if args.from_json:
        records = json.loads(args.from_json.read_text())
    else:
        records = score_rows(args)
        if args.out:
            args.out.write_text(json.dumps(records))
    for calibrated in (True, False):
        ms = margins(records, calibrated)
        bias, bal = best_bias(ms)
        name = "calibrated" if calibrated else "raw"
        per = {}
        for cat in CATEGORIES:
            sub = [(m, c) for (m, c), r in zip(ms, records, strict=True) if r["category"] == cat]
            if sub:
                per[cat] = float(np.mean([(m + bias > 0) == c for m, c in sub]))
        print(f"{name}: bias {bias:.3f} balanced accuracy {bal:.3f}; per category {per}")
        if calibrated and args.write and args.adapter is not None:
            from pocket_agent.training._lora import update_gguf_lora_metadata

            update_gguf_lora_metadata(
                args.adapter,
                {"call_bias": f"{bias:.4f}", "call_bias_fit": f"bfcl rows {args.start}-{args.stop - 1}, bal {bal:.3f}"},
            )
            print(f"recorded call_bias {bias:.4f} in {args.adapter}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
