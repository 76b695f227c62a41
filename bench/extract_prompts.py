"""Which prompt layout lets a small model extract best? Measured on SROIE receipts.

Runs pocket_agent's constrained extraction with each layout of
``pocket_agent.extraction.build_messages`` on the same documents and reports per-field
exact match (the default layout is the winner of this comparison).

    python bench/extract_prompts.py [--docs 24] [--threads 2] [--out bench/extract_prompts.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import get_args

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract import FIELDS, MAX_TOKENS, Receipt, closed_schema, field_matches, load_docs, parse_valid

from pocket_agent import Limits
from pocket_agent.errors import OutputBudgetExceeded
from pocket_agent.extraction import PromptLayout, _prepare, build_messages
from pocket_agent.generate import render_prompt, run_generation
from pocket_agent.runtime import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = load_model(threads=args.threads)
    docs = load_docs(args.docs)
    grammar = _prepare(
        Receipt, model, sampling=None, limits=Limits(max_tokens=MAX_TOKENS), max_tokens=None, retries=0
    ).grammar
    schema = closed_schema()
    lines = ["| layout | company | date | address | total | mean | s/doc |", "|---|---|---|---|---|---|---|"]
    for layout in get_args(PromptLayout):
        hits = dict.fromkeys(FIELDS, 0)
        t0 = time.perf_counter()
        for doc in docs:
            ids = render_prompt(model, build_messages(doc["text"], schema, layout=layout))
            try:
                text = run_generation(model, ids, grammar=grammar, limits=Limits(max_tokens=MAX_TOKENS)).text
            except OutputBudgetExceeded:  # a runaway string: every field counts as missed
                text = ""
            for f, ok in field_matches(parse_valid(text, schema), doc["expected"]).items():
                hits[f] += ok
        dt = (time.perf_counter() - t0) / len(docs)
        accs = [hits[f] / len(docs) for f in FIELDS]
        lines.append(f"| {layout} | " + " | ".join(f"{a:.2f}" for a in accs) + f" | {sum(accs) / 4:.3f} | {dt:.2f} |")
        print(lines[-1], file=sys.stderr)
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(
            "# Extraction prompt layouts (SROIE dev)\n\n"
            f"`python bench/extract_prompts.py --docs {args.docs} --threads {args.threads}` on "
            f"{time.strftime('%Y-%m-%d')}: SmolLM2-135M-Instruct, greedy, constrained by the closed Receipt schema, "
            f"first {len(docs)} receipts of ../shared/data/sroie. Exact match per field after whitespace "
            "normalisation and case-folding; total as a number.\n\n" + table + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
