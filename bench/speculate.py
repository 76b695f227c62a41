"""Copy speculation: extract_many with Sampling(speculate=True) against speculate=False.

Same run, same documents (SROIE receipts, the schema and prompt of bench/extract.py), one model
per mode so each keeps its own KV cache as extract_many would, documents alternating which mode
goes first. Reports s/doc, decode tok/s (output tokens over the time after the prompt), output
tokens per model evaluation, draft tokens proposed and accepted, whether the outputs are equal,
field accuracy; llama-cpp-python's JSON-schema mode on the same documents as the peer.

    python bench/speculate.py [--docs 15] [--threads 1] [--out bench/speculate.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract import FIELDS, MAX_TOKENS, Receipt, field_matches, load_docs, run_llama_cpp
from limit import machine_limit
from runtime import machine

import pocket_agent.extraction as extraction
from pocket_agent import Limits, Sampling, extract_many
from pocket_agent.generate import TokenEvent, stream_tokens
from pocket_agent.runtime import load_model
from pocket_agent.usage import Usage


@dataclass
class Run:
    """One document under one mode."""

    seconds: float
    value: dict[str, Any] | None
    tokens: list[int]
    usage: Usage


@dataclass
class Mode:
    name: str
    speculate: bool
    runs: list[Run] = field(default_factory=list)

    def s_per_doc(self) -> float:
        return statistics.mean(r.seconds for r in self.runs)

    def total(self, key: str) -> float:
        return float(sum(getattr(r.usage, key) for r in self.runs))

    def decode_tok_s(self) -> float:
        return self.total("completion_tokens") / self.total("decode_s")

    def prefill_tok_s(self) -> float:
        return self.total("prompt_tokens_evaluated") / self.total("prefill_s")


_calls: list[tuple[Usage, list[int]]] = []


def _recording_stream_tokens(*args: Any, **kwargs: Any) -> Generator[TokenEvent, None, Any]:
    """extract_many's own generation loop, with its usage and tokens kept for the report."""
    usage = Usage()
    tokens: list[int] = []
    _calls.append((usage, tokens))
    gen = stream_tokens(*args, **{**kwargs, "usage": usage})
    while True:
        try:
            ev = next(gen)
        except StopIteration as done:
            return done.value
        tokens.extend(ev.tokens)
        yield ev


def run_one(mode: Mode, model: Any, text: str) -> None:
    _calls.clear()
    t0 = time.perf_counter()
    (outcome,) = extract_many(
        [text],
        Receipt,
        model=model,
        sampling=Sampling(speculate=mode.speculate),
        limits=Limits(max_tokens=MAX_TOKENS),
        retries=0,
        progress=False,
    )
    dt = time.perf_counter() - t0
    usage = Usage()
    tokens: list[int] = []
    for u, toks in _calls:
        usage += u
        tokens = toks
    value = outcome.value.model_dump() if outcome.ok else None
    mode.runs.append(Run(dt, value, tokens, usage))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    extraction.stream_tokens = _recording_stream_tokens  # type: ignore[assignment]
    docs = load_docs(args.docs)
    modes = [Mode("ours, speculate=False", False), Mode("ours, speculate=True", True)]
    models = [load_model(threads=args.threads) for _ in modes]
    for i, doc in enumerate(docs):
        order = [0, 1] if i % 2 == 0 else [1, 0]
        for k in order:
            run_one(modes[k], models[k], doc["text"])
        off, on = modes[0].runs[-1], modes[1].runs[-1]
        print(
            f"doc {i}: off {off.seconds:.2f}s on {on.seconds:.2f}s equal={off.tokens == on.tokens} "
            f"drafts {on.usage.draft_accepted}/{on.usage.draft_tokens}",
            file=sys.stderr,
        )
    peer = None if args.no_peer else run_llama_cpp(docs, args.threads, models[0])

    off, on = modes
    equal_tokens = sum(a.tokens == b.tokens for a, b in zip(off.runs, on.runs, strict=True))
    equal_values = sum(a.value == b.value for a, b in zip(off.runs, on.runs, strict=True))
    lim = machine_limit(models[0], threads=args.threads)
    lines = [
        "| contender | s/doc | prefill tok/s (of limit) | decode tok/s (of limit) | output tokens per evaluation "
        "| decode s/doc | draft tokens accepted / proposed | valid | " + " | ".join(FIELDS) + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(FIELDS),
    ]
    for m in modes:
        matches = [field_matches(r.value, d["expected"]) for r, d in zip(m.runs, docs, strict=True)]
        lines.append(
            f"| {m.name} | {m.s_per_doc():.2f} | {m.prefill_tok_s():.0f} ({m.prefill_tok_s() / lim.prefill_tok_s:.0%}) "
            f"| {m.decode_tok_s():.1f} ({m.decode_tok_s() / lim.decode_tok_s:.0%}) "
            f"| {m.total('completion_tokens') / max(m.total('decode_calls'), 1):.2f} "
            f"| {m.total('decode_s') / len(m.runs):.2f} "
            f"| {m.total('draft_accepted'):.0f} / {m.total('draft_tokens'):.0f} "
            f"| {sum(r.value is not None for r in m.runs)}/{len(m.runs)} | "
            + " | ".join(f"{sum(x[f] for x in matches) / len(matches):.2f}" for f in FIELDS)
            + " |"
        )
    if peer is not None:
        lines.append(
            f"| {peer.name} | {statistics.mean(peer.seconds):.2f} | - | - | - | - "
            f"| - | {sum(peer.valid)}/{len(peer.valid)} | "
            + " | ".join(f"{peer.field_acc(f):.2f}" for f in FIELDS)
            + " |"
        )
    notes = [
        f"- outputs equal to speculate=False: {equal_tokens}/{len(docs)} token for token, "
        f"{equal_values}/{len(docs)} extracted values",
        f"- speculate=True is {off.s_per_doc() / on.s_per_doc():.2f}x faster per document than speculate=False; "
        f"decode {on.decode_tok_s() / off.decode_tok_s():.2f}x",
    ]
    if peer is not None:
        ps = statistics.mean(peer.seconds)
        notes.append(
            f"- per document: speculate=True {ps / on.s_per_doc():.2f}x, speculate=False {ps / off.s_per_doc():.2f}x "
            f"faster than {peer.name}"
        )
    for a, b, d in zip(off.runs, on.runs, docs, strict=True):
        if a.value != b.value:
            notes.append(f"- differs on {d.get('id', '?')}: off {a.value} / on {b.value}")
    text = "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
    print(text)
    if args.out:
        from importlib.metadata import version

        vers = ", ".join(f"{p} {version(p)}" for p in ("llama-cpp-python", "llguidance"))
        args.out.write_text(
            "# Copy speculation\n\n"
            f"Generated by `python bench/speculate.py --docs {args.docs} --threads {args.threads} --out {args.out}` on "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n"
            f"- Machine: {machine()}; shared with other work, so compare rows of one run.\n"
            f"- Python {platform.python_version()}; {vers}\n"
            f"- Model: SmolLM2-135M-Instruct GGUF Q4_1 (embedded default) as our runtime runs it, "
            f"{models[0].info.extra.get('quantization', '?')}, {args.threads} thread(s), greedy, "
            f"max_tokens {MAX_TOKENS}, retries 0.\n"
            f"- Data: first {len(docs)} SROIE receipts, the schema and prompt of bench/extract.py; "
            "`extract_many` one document at a time, one model per mode (each keeps its own prompt cache), "
            "documents alternating which mode runs first. Limits from bench/limit.py (prefill limit at a "
            "512-token context).\n"
            "- decode tok/s: output tokens (sampled and forced) over the seconds spent evaluating them; output "
            "tokens per evaluation: output tokens over model calls after the prompt.\n\n" + text
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
