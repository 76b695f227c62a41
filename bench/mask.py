"""Grammar costs on the embedded model (SmolLM2-135M, vocabulary 49,152).

Measures, and writes ``bench/mask.md`` (``--no-write`` to only print):

1. compile time of an Invoice-like Pydantic model and a 30-field JSON Schema: cold
   (cache cleared), cache hit, and matcher creation;
2. next-token mask time (``GrammarMatcher.compute_mask``) per sampled token along real
   greedy constrained generations with the model (forced tokens are fed as one batch
   and need no mask);
3. ``apply_mask`` time for every variant in ``pocket_agent.grammars.mask.MASK_VARIANTS``
   on the real (mask, logits) pairs of those trajectories, split into sparse masks (few
   allowed tokens: JSON structure) and dense ones (inside strings).

Usage: ``python bench/mask.py [--threads N] [--no-write]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import timeit
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from _env import cpu_model
from mask_variants import MASK_VARIANTS
from pydantic import BaseModel, Field

from pocket_agent.grammars import (
    CompiledGrammar,
    apply_mask,
    clear_cache,
    compile_grammar,
    count_allowed,
    get_tokenizer,
)
from pocket_agent.runtime import Model, load_model

OUT = Path(__file__).with_name("mask.md")


class LineItem(BaseModel):
    description: str
    quantity: int
    unit_price: float


class Invoice(BaseModel):
    invoice_number: str
    date: str
    vendor: str
    currency: str
    total: float
    paid: bool
    items: list[LineItem] = Field(max_length=5)


def thirty_field_schema() -> dict[str, Any]:
    kinds: list[dict[str, Any]] = [
        {"type": "string"},
        {"type": "integer", "minimum": 0, "maximum": 100000},
        {"type": "number", "minimum": 0},
        {"type": "boolean"},
        {"enum": ["low", "medium", "high"]},
        {"type": "string", "format": "date"},
        {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        {"type": "string", "maxLength": 40},
        {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
        {"type": "integer"},
    ]
    props = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(30)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


RECEIPT = (
    "ACME WIDGETS LTD\nInvoice no. INV-2024-0117   Date: 2024-03-05\nCurrency: EUR\n"
    "2 x Widget, large      12.50\n1 x Gadget             99.99\n3 x Bolt pack           4.20\n"
    "TOTAL                 137.59\nPAID BY CARD"
)


def _stats_us(xs: list[float]) -> tuple[float, float]:
    arr = np.array(xs) * 1e6
    return float(np.median(arr)), float(np.percentile(arr, 99))


def time_compile(model: Model, output_type: Any, reps: int) -> dict[str, float]:
    cold = []
    for _ in range(reps):
        clear_cache()
        t0 = time.perf_counter()
        compile_grammar(output_type, model)
        cold.append(time.perf_counter() - t0)
    hit = []
    for _ in range(reps):
        t0 = time.perf_counter()
        c = compile_grammar(output_type, model)
        hit.append(time.perf_counter() - t0)
    mk = []
    for _ in range(reps):
        t0 = time.perf_counter()
        c.matcher()
        mk.append(time.perf_counter() - t0)
    engine = [compile_grammar(output_type, model).compile_seconds]
    return {
        "cold_ms": 1e3 * statistics.median(cold),
        "engine_ms": 1e3 * engine[0],
        "hit_us": 1e6 * statistics.median(hit),
        "matcher_us": 1e6 * statistics.median(mk),
    }


def trajectory(
    model: Model, grammar: CompiledGrammar, prompt: str, max_tokens: int = 400
) -> tuple[list[float], list[tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """Greedy constrained generation; returns mask times, (mask, logits) pairs, summary."""
    messages = [
        {"role": "system", "content": "You extract data as JSON."},
        {"role": "user", "content": prompt},
    ]
    ids = model.tokenize(model.chat_template.render(messages, add_generation_prompt=True), special=True)
    model.reset()
    logits = model.prefill(ids).logits[-1]
    m = grammar.matcher()
    eos = set(model.vocab.eos_ids)
    times: list[float] = []
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    out: list[int] = []
    forced_n = 0
    while not m.is_stopped() and len(out) < max_tokens:
        forced = m.forced_tokens()
        if forced:
            m.consume_many(forced)
            out += forced
            forced_n += len(forced)
            if m.is_stopped():
                break
            logits = model.eval(forced).logits[-1]
            continue
        t0 = time.perf_counter()
        mask = m.compute_mask()
        times.append(time.perf_counter() - t0)
        pairs.append((mask.copy(), logits.copy()))
        tok = int(np.argmax(apply_mask(logits, mask)))
        if tok in eos:
            break
        m.consume(tok)
        out.append(tok)
        logits = model.eval([tok]).logits[-1]
    text = model.decode(out)
    info = {"tokens": len(out), "forced": forced_n, "text": text, "complete": m.is_accepting(), "ids": out}
    return times, pairs, info


def replay(grammar: CompiledGrammar, ids: list[int], reps: int = 5) -> list[float]:
    """Mask times for the same output replayed without model evaluations in between
    (warm caches): the engine's own cost. Masks only where the run sampled."""
    times: list[float] = []
    for _ in range(reps):
        m = grammar.matcher()
        i = 0
        while i < len(ids) and not m.is_stopped():
            forced = m.forced_tokens()
            if forced:
                m.consume_many(forced)
                i += len(forced)
                continue
            t0 = time.perf_counter()
            m.compute_mask()
            times.append(time.perf_counter() - t0)
            m.consume(ids[i])
            i += 1
    return times


def _sample(group: list[Any], n: int) -> list[Any]:
    if len(group) <= n:
        return group
    step = len(group) / n
    return [group[int(i * step)] for i in range(n)]


def _best_call(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], logits: np.ndarray, mask: np.ndarray) -> float:
    def call() -> None:
        fn(logits, mask)

    return min(timeit.repeat(call, number=10, repeat=3)) / 10


def time_variants(
    pairs: list[tuple[np.ndarray, np.ndarray]], per_group: int = 60
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per variant: (median, p99) over sampled sparse and dense masks, and the mean per
    masked token weighted by how often each kind occurred."""
    sparse = [p for p in pairs if count_allowed(p[0]) <= 1536]
    dense = [p for p in pairs if count_allowed(p[0]) > 1536]
    res: dict[str, dict[str, tuple[float, float]]] = {}
    for name, fn in MASK_VARIANTS.items():
        row: dict[str, tuple[float, float]] = {}
        means = []
        for label, group in (("sparse", sparse), ("dense", dense)):
            per = []
            for mask, logits in _sample(group, per_group):
                per.append(_best_call(fn, logits, mask))
            row[label] = _stats_us(per) if per else (float("nan"), float("nan"))
            means.append((len(group), float(np.mean(per)) * 1e6 if per else 0.0))
        total = sum(n for n, _ in means)
        row["weighted_mean"] = (sum(n * m for n, m in means) / total if total else float("nan"), float("nan"))
        res[name] = row
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    model = load_model(threads=args.threads)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    get_tokenizer(model)
    tok_s = time.perf_counter() - t0

    schema30 = thirty_field_schema()
    comp = {
        "Invoice (Pydantic, nested list)": time_compile(model, Invoice, args.reps),
        "30-field JSON Schema": time_compile(model, schema30, args.reps),
    }

    runs = {
        "Invoice": trajectory(model, compile_grammar(Invoice, model), f"Extract the invoice.\n\n{RECEIPT}"),
        "30-field": trajectory(
            model,
            compile_grammar(schema30, model),
            "Fill in every field with plausible values for an order record.",
        ),
    }
    replays = {
        "Invoice": replay(compile_grammar(Invoice, model), runs["Invoice"][2]["ids"]),
        "30-field": replay(compile_grammar(schema30, model), runs["30-field"][2]["ids"]),
    }
    all_times = [t for r in runs.values() for t in r[0]]
    all_pairs = [p for r in runs.values() for p in r[1]]
    variants = time_variants(all_pairs)

    lines = [
        "# Grammar costs: compile, mask, apply_mask",
        "",
        "Produced by `python bench/mask.py` (SmolLM2-135M-Instruct Q4_1 through llama.cpp, vocabulary 49,152).",
        "The machine was shared with other work: treat single figures as orders of magnitude.",
        "",
        f"- Machine: {platform.machine()}, {cpu_model()}, {_ncpu()} CPUs visible; model threads {args.threads}",
        f"- Python {platform.python_version()}, llguidance {version('llguidance')}, numpy {version('numpy')}, "
        f"llama-cpp-python {version('llama_cpp_python')}, pydantic {version('pydantic')}",
        f"- Model load {load_s:.2f} s; llguidance tokenizer for the vocabulary (once per model) {tok_s * 1e3:.0f} ms",
        "",
        "## Compile",
        "",
        "| output type | cold (ms, with schema check) | engine only (ms) | cache hit (us) | new matcher (us) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, c in comp.items():
        lines.append(
            f"| {name} | {c['cold_ms']:.2f} | {c['engine_ms']:.2f} | {c['hit_us']:.1f} | {c['matcher_us']:.1f} |"
        )
    lines += [
        "",
        "## Next-token mask along greedy constrained generations",
        "",
        "In the loop (between model evaluations, caches cold) and replayed (same tokens, no model in between).",
        "",
        "| run | tokens out | forced (fast-forward) | masks | in loop median / p99 (us) "
        "| replayed median / p99 (us) | complete |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, (times, _pairs, info) in runs.items():
        med, p99 = _stats_us(times)
        rmed, rp99 = _stats_us(replays[name])
        lines.append(
            f"| {name} | {info['tokens']} | {info['forced']} ({100 * info['forced'] / max(info['tokens'], 1):.0f}%) "
            f"| {len(times)} | {med:.1f} / {p99:.1f} | {rmed:.1f} / {rp99:.1f} | {info['complete']} |"
        )
    med, p99 = _stats_us(all_times)
    rmed, rp99 = _stats_us([t for r in replays.values() for t in r])
    lines.append(f"| all | | | {len(all_times)} | {med:.1f} / {p99:.1f} | {rmed:.1f} / {rp99:.1f} | |")
    n_sparse = sum(1 for m, _ in all_pairs if count_allowed(m) <= 1536)
    lines += [
        "",
        "In-loop masks cost ~15x the replayed ones because every model evaluation streams ~100 MB of weights",
        "through the CPU caches: replaying with a 100 MB memory sweep before each mask gave ~110 us median",
        "(measured separately, same machine). llguidance drops the GIL while computing a mask, so a loop can",
        "compute the mask for step t+1 while the model evaluates token t. Either way it is well under 1% of a",
        "15-40 ms decode step.",
        "",
        f"Masks: {n_sparse} sparse (<= 1,536 tokens allowed; median allowed "
        f"{int(np.median([count_allowed(m) for m, _ in all_pairs if count_allowed(m) <= 1536] or [0]))}), "
        f"{len(all_pairs) - n_sparse} dense.",
        "",
        "## apply_mask variants",
        "",
        "Same real (mask, logits) pairs, up to 60 of each kind; best of 3x10 calls per mask; median / p99 over",
        "masks in us; last column: mean per masked token, weighted by how often each kind occurred.",
        "",
        "| variant | sparse masks | dense masks | mean per token |",
        "|---|---:|---:|---:|",
    ]
    for name, row in variants.items():
        cells = " | ".join(f"{row[k][0]:.1f} / {row[k][1]:.1f}" for k in ("sparse", "dense"))
        lines.append(f"| {name} | {cells} | {row['weighted_mean'][0]:.1f} |")
    lines += [
        "",
        "`apply_mask` (the adaptive variant) counts non-zero mask words: at most "
        "`SPARSE_WORDS` -> gather the allowed ids into a -inf row, else unpack the inverted mask "
        "and `np.copyto(where=)`. All variants return a new array; `inplace=True` saves the copy.",
        "",
        "## Sample outputs",
        "",
    ]
    for name, (_t, _p, info) in runs.items():
        lines.append(f"- {name}: `{info['text'][:300]}`")
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.no_write:
        OUT.write_text(report, encoding="utf-8")
        print(f"wrote {OUT}")


def _ncpu() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


if __name__ == "__main__":
    main()
