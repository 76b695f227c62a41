"""MNN's run-time options against issue #15's 3x target: does any of them make prompts faster?

``bench/extract.md`` puts our extraction on MNN at 2.2-2.6x llama-cpp-python's JSON-schema
mode, against 3x asked; most of an MNN receipt is its prompt, evaluated at ~20% of the
machine's limit. This script loads the MNN extraction build (what ``extract`` runs on MNN)
once per run-time option of pymnn's ``set_config`` (each in a child process: pymnn allows one
model per process) and measures, on the first SROIE receipt's extraction prompt:

- plain ``Model.prefill`` tok/s and one-token ``Model.eval`` tok/s (``bench/limit.py:
  model_speed``, median of 3);
- whether the prompt's next-token choice (argmax) is the default option's, and the largest
  logit difference from it;
- the prompt seconds of an average receipt at that prefill rate (the receipts' mean prompt
  tokens that a shared cached prefix does not cover), as a share of the per-receipt budget
  that 3x llama-cpp-python would leave (``--peer-s-doc``, from the latest ``bench/extract.md``).

    python bench/mnn_options.py [--threads 1] [--peer-s-doc 4.60] [--out bench/mnn_options.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _env import cpu_model, package_versions  # noqa: E402

PACKAGES = ("pocket-agent-mnn", "MNN", "llama-cpp-python")
# (label, set_config options); the first is what MnnModel sets by default
OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("default (memory low, precision low)", {}),
    ("dynamic_option 1", {"dynamic_option": 1}),
    ("dynamic_option 2", {"dynamic_option": 2}),
    ("dynamic_option 8", {"dynamic_option": 8}),
    ("precision normal", {"precision": "normal"}),
    ("precision high", {"precision": "high"}),
    ("power high", {"power": "high"}),
    ("attention_mode 0", {"attention_mode": 0}),
    ("attention_mode 8", {"attention_mode": 8}),
    ("quant_qkv 1 (8-bit keys)", {"quant_qkv": 1}),
    ("quant_qkv 4 (int8 Q*K)", {"quant_qkv": 4}),
    ("memory normal (weights expanded to float)", {"memory": "normal"}),
)


def measure(options: dict[str, Any], threads: int) -> dict[str, Any]:
    """One option set, in this process: speeds and the prompt's last-position logits."""
    from limit import model_speed, receipt_prompt

    from pocket_agent.convert import ensure_default_mnn
    from pocket_agent.runtime.mnn import MnnModel

    model = MnnModel(ensure_default_mnn(task="extract"), threads=threads, config=options)
    prompt = receipt_prompt(model)
    prefill, decode = model_speed(model, prompt)
    logits = model.prefill(prompt).logits[-1].astype(np.float32)
    return {"prefill": prefill, "decode": decode, "prompt_tokens": len(prompt), "logits": logits.tolist()}


def in_child(options: dict[str, Any], threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--threads", str(threads), "--worker", json.dumps(options), str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.is_file():
            return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def uncached_prompt_tokens(n_docs: int) -> float:
    """Mean prompt tokens per receipt that the previous receipt's cached prefix does not cover."""
    from extract import closed_schema, load_docs

    from pocket_agent.extraction import build_messages
    from pocket_agent.generate import render_prompt
    from pocket_agent.runtime import load_model
    from pocket_agent.runtime.base import common_prefix_length

    model = load_model(threads=1, layout="original")
    try:
        prompts = [render_prompt(model, build_messages(d["text"], closed_schema())) for d in load_docs(n_docs)]
    finally:
        model.close()
    new = [len(prompts[0])] + [len(p) - common_prefix_length(q, p) for q, p in itertools.pairwise(prompts)]
    return float(np.mean(new))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--docs", type=int, default=40, help="receipts whose mean uncached prompt is counted")
    ap.add_argument("--peer-s-doc", type=float, default=4.60, help="llama-cpp-python s/doc of bench/extract.md")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        options, out = json.loads(args.worker[0]), Path(args.worker[1])
        out.write_text(json.dumps(measure(options, args.threads)))
        return 0

    t0, load0 = time.time(), os.getloadavg()
    new_tokens = uncached_prompt_tokens(args.docs)
    budget = args.peer_s_doc / 3
    results = []
    for label, options in OPTIONS:
        results.append((label, options, in_child(options, args.threads)))
        print(label, {k: v for k, v in results[-1][2].items() if k != "logits"}, flush=True)
    if "error" in results[0][2]:
        raise SystemExit(f"the default options failed, so nothing can be compared: {results[0][2]['error']}")
    ref = np.asarray(results[0][2]["logits"], dtype=np.float32)
    lines = [
        "# MNN run-time options and prompt speed (`bench/mnn_options.py`)",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python bench/mnn_options.py "
        f"--threads {args.threads} --peer-s-doc {args.peer_s_doc}` in {time.time() - t0:.0f} s.",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores visible, {platform.system()} {platform.machine()}; "
        f"{args.threads} thread(s); load average at start / end: "
        f"{' '.join(f'{x:.2f}' for x in load0)} / {' '.join(f'{x:.2f}' for x in os.getloadavg())} (shared cores).",
        f"- Versions: python {platform.python_version()}, {package_versions(PACKAGES)}",
        "- Build: the MNN extraction build of the default model (`ensure_default_mnn(task='extract')`); each option "
        "set is passed to pymnn's `set_config` before loading, in a child process of its own.",
        f"- Prompt: the first SROIE receipt's extraction prompt ({results[0][2].get('prompt_tokens', '?')} tokens). "
        f"Mean uncached prompt tokens per receipt over {args.docs} receipts (the shared prefix of consecutive "
        f"prompts is reused): {new_tokens:.0f}.",
        f"- 3x budget: llama-cpp-python {args.peer_s_doc:.2f} s/doc / 3 = **{budget:.2f} s per receipt**; "
        "`prompt s/doc` = uncached prompt tokens / prefill tok/s.",
        "",
        "| option | prefill tok/s | decode tok/s | prompt s/doc | of the 3x budget | argmax = default "
        "| max abs logit diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, _, r in results:
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error']} | | | | | |")
            continue
        logits = np.asarray(r["logits"], dtype=np.float32)
        prompt_s = new_tokens / r["prefill"]
        same = "yes" if int(logits.argmax()) == int(ref.argmax()) else "no"
        lines.append(
            f"| {label} | {r['prefill']:.0f} | {r['decode']:.1f} | {prompt_s:.2f} | {prompt_s / budget:.0%} | "
            f"{same} | {float(np.abs(logits - ref).max()):.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
