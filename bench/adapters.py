"""Adapters trained on this CPU, against the base model, in one run (issue #14).

    python bench/adapters.py decide    # Dec adapter (LoRA + head) vs cloze and the shipped head
    python bench/adapters.py extract   # extraction LoRA (SROIE + synthetic documents) vs the base model
    python bench/adapters.py tools     # tools LoRA on BFCL dev rows 30+ (accuracy: bench/bfcl.py)
    python bench/adapters.py extract --ship   # --ship: also write the adapter shipped in pocket_agent/data/

decide: trained on the train parts of the dev sets in ../shared/data/mcq (bench/decide.py's
split: seeded permutation, last 30% = test part), scored on the first 60 rows of each
test part. extract: trained on the usable SROIE receipts 40..202 and synthetic documents of
many kinds and schemas (bench/extract_synthetic.py), scored on receipts 0..39 (the rows
bench/extract.md scores) with bench/extract.py's pipeline (grounded strings, number
choice), on held-out synthetic documents and on the quick start's invoice. tools: trained on
BFCL rows 30+ (bench/tools_data.py; live_simple held out entirely) and synthetic everyday
conversations (bench/tools_synthetic.py: one-tool requests, several calls, near misses, answers
after a tool's result); it routes on the base weights (`bench/bfcl_calibrate.py --adapter
bench/out/tools.gguf --write` would fit a routing constant of its own on rows 15-29, which
routed worse) and `bench/bfcl.py --base` scores rows 0-9. Each task prints a table and rewrites
its section of bench/adapters.md.

The shipped adapters reproduce with:

    python bench/adapters.py extract --epochs 6 --lr 3e-4 --ship
    python bench/adapters.py tools --epochs 2 --per-category 50 --synthetic 300 --ship

(the tools LoRA records no routing constant, so the agent routes on the base weights; it records
TOOLS_MORE_CALLS_BIAS, fitted on BFCL rows 15-29.)
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import decide as dbench  # noqa: E402
import extract as xbench  # noqa: E402
from _env import cpu_model, package_versions  # noqa: E402

from pocket_agent.decision import (  # noqa: E402
    DecisionAdapter,
    decide_many,
    find_shipped_head,
    load_decision_adapter,
    model_identity,
    unload_decision_adapter,
)
from pocket_agent.decision.core import forget_default_head  # noqa: E402
from pocket_agent.runtime import load_model  # noqa: E402
from pocket_agent.training import DecideTraining, train_decide_adapter  # noqa: E402
from pocket_agent.training._progress import ProgressBar  # noqa: E402
from pocket_agent.training._sft import SftTraining  # noqa: E402
from pocket_agent.training.extract import train_extract_adapter  # noqa: E402

OUT = ROOT / "bench" / "adapters.md"
DECIDE_SETS = ("arc_easy", "sst2", "boolq", "zh_sentiment")
N_TEST = 60
SROIE_TEST = 40
SYNTHETIC_TEST = 90


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def header(args: argparse.Namespace, t0: float, load0: str) -> list[str]:
    vers = package_versions(["pocket-agent-mnn", "torch", "transformers", "llama_cpp_python", "numpy"])
    python = sys.version.split()[0]
    return [
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python bench/adapters.py "
        f"{' '.join(sys.argv[1:])}` in {time.time() - t0:.0f} s.",
        "",
        f"- Machine: {cpu_model()}, 2 cores; torch threads {args.threads}, llama.cpp threads 1; load average "
        f"at start / end: {load0} / {dbench.loadavg()} (the cores are shared with other jobs).",
        f"- Versions: python {python}, {vers}",
        "- Model: SmolLM2-135M-Instruct Q4_1 (the embedded default); training runs on its dequantised weights "
        "(float32 torch), inference on llama.cpp with the exported GGUF LoRA.",
    ]


def run_decide(args: argparse.Namespace) -> list[str]:
    t0, load0 = time.time(), dbench.loadavg()
    m = load_model(threads=1)
    forget_default_head(m)
    rows: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for name in args.train_sets:
        train, _ = dbench.split(name)
        used[name] = len(train)
        rows += train
    given = {k: v for k, v in {"lr": args.lr, "head_lr": args.head_lr}.items() if v is not None}
    training = DecideTraining(objective=args.objective, epochs=args.epochs, threads=args.threads, **given)
    shipped_path = find_shipped_head(m)  # what ships today, scored before it is replaced
    shipped_adapter = DecisionAdapter.read(shipped_path) if shipped_path is not None else None
    log(f"training the Dec adapter on {len(rows)} questions ({used})")
    rss0 = peak_mb()
    res = train_decide_adapter(
        rows,
        m,
        training=training,
        progress=ProgressBar(every=60),
        metadata={
            "data": {k: f"../shared/data/mcq/{k}.jsonl train part ({v} rows)" for k, v in used.items()},
            "split": "seeded permutation (numpy default_rng(0)), last 30% = test part",
            "script": "bench/adapters.py decide --ship",
        },
    )
    log(res.summary())
    saved = res.adapter.save(ROOT / "bench" / "out" / "dec-adapter.zip")
    log(f"wrote {saved}")
    if args.ship:
        out = ROOT / "pocket_agent" / "data" / f"dec-{model_identity(m)[:16]}.zip"
        for old in out.parent.glob(f"dec-{model_identity(m)[:16]}*"):
            old.unlink()
        res.adapter.save(out)
        log(f"wrote {out} ({out.stat().st_size} bytes)")
    table = []
    for name in DECIDE_SETS:
        _, test = dbench.split(name)
        test = test[:N_TEST]
        gold = [r["answer"] for r in test]
        rec: dict[str, Any] = {"set": name}
        rec["cloze"] = dbench.acc([d.index for d in decide_many(test, model=m, method="cloze")], gold)
        if shipped_adapter is not None:
            load_decision_adapter(m, shipped_adapter)
            rec["shipped"] = dbench.acc([d.index for d in decide_many(test, model=m, method="pointer")], gold)
            unload_decision_adapter(m)
        load_decision_adapter(m, res.adapter)
        t1 = time.perf_counter()
        rec["dec"] = dbench.acc([d.index for d in decide_many(test, model=m, method="pointer")], gold)
        rec["dec_ms"] = (time.perf_counter() - t1) * 1000 / len(test)
        unload_decision_adapter(m)
        table.append(rec)
        log(json.dumps(rec))
    record = json.loads(res.adapter.metadata["training"])
    reads = (
        "the head reads the mean log-probability of each option's text"
        if training.objective == "cloze"
        else f"the head reads block {record['layer']} at the option marker"
    )
    lines = header(args, t0, load0)
    lines += [
        f"- Data: train parts of {', '.join(f'{k} ({v})' for k, v in used.items())}; {res.n_val} of them held out "
        f"for early stopping; scored on the first {N_TEST} rows of each test part.",
        f"- Training: objective `{training.objective}` ({reads}); LoRA rank {training.rank} (alpha "
        f"{training.alpha}) on {record['lora_targets']} of blocks {record['lora_blocks'][0]}.."
        f"{record['lora_blocks'][1]}; {res.steps} steps; **{res.seconds / 60:.1f} min, peak memory "
        f"{max(res.peak_rss_mb, rss0):.0f} MB**; "
        f"LoRA file {res.adapter.lora_paths['llamacpp'].stat().st_size / 1e6:.1f} MB.",
        f"- Validation (held-out train rows, llama.cpp): Dec adapter {res.val_accuracy:.3f}, the same head on the base "
        f"model {res.base_val_accuracy:.3f}. Validation loss by step (torch): "
        + ", ".join(f"{h['step']:.0f}: {h['val_loss']:.3f}" for h in res.history),
        "",
        "| set | cloze | head shipped before (no LoRA) | **Dec adapter (LoRA + head)** | ms/question |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        shipped = f"{r['shipped']:.3f}" if "shipped" in r else "-"
        lines.append(f"| {r['set']} | {r['cloze']:.3f} | {shipped} | **{r['dec']:.3f}** | {r['dec_ms']:.0f} |")
    lines.append("")
    lines.append(
        "One forward pass per question: the prompt once, each option as its own continuation with the LoRA "
        "applied (switched on only while the pointer method runs)."
    )
    return lines


def usable(expected: dict[str, Any]) -> bool:
    """A training receipt has all four fields and a total that is a number (a few say 'RM41.45')."""
    if set(expected) != set(xbench.FIELDS):
        return False
    try:
        float(str(expected["total"]).replace(",", ""))
    except ValueError:
        return False
    return True


def score_synthetic(rows: list[dict[str, Any]], m: Any, adapter: Any) -> tuple[int, int, int]:
    """(exact fields, fields, valid objects) of ``extract`` on held-out synthetic documents."""
    from pocket_agent import extract
    from pocket_agent.errors import PocketAgentError

    right = total = valid = 0
    for row in rows:
        total += len(row["output"])
        try:
            got = extract(row["text"], row["schema"], model=m, adapter=adapter)
        except PocketAgentError:
            continue
        valid += 1
        for key, want in row["output"].items():
            have = got.get(key)
            if isinstance(want, (int, float)) or row["schema"]["properties"][key].get("type") == "number":
                try:
                    right += abs(float(have) - float(want)) < 1e-6
                except (TypeError, ValueError):
                    pass
            else:
                right += xbench.norm(have) == xbench.norm(want)
    return right, total, valid


def quick_start_fields(m: Any, adapter: Any) -> str:
    """How many of the README quick start's five invoice fields come out right."""
    sys.path.insert(0, str(ROOT / "examples"))
    from extract_invoice import TEXT  # type: ignore[import-not-found]
    from invoice_schema import Invoice  # type: ignore[import-not-found]

    from pocket_agent import extract

    want = {"invoice_number": "INV-2041", "seller": "ACME Tools Ltd", "date": "1 March 2024", "total": 44.3}
    want["currency"] = "EUR"
    got = extract(TEXT, Invoice, model=m, adapter=adapter).model_dump()
    wrong = [k for k, v in want.items() if got[k] != v]
    return f"{len(want) - len(wrong)}/5" + (f" (wrong: {', '.join(f'{k}={got[k]!r}' for k in wrong)})" if wrong else "")


def run_extract(args: argparse.Namespace) -> list[str]:
    import extract_synthetic

    from pocket_agent.runtime.task_adapters import adapter_record

    t0, load0 = time.time(), dbench.loadavg()
    m = load_model(threads=1)
    docs = [json.loads(line) for line in xbench.DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    test, train = docs[:SROIE_TEST], docs[SROIE_TEST:]
    rows = [{"text": d["text"], "output": d["expected"]} for d in train if usable(d["expected"])]
    n_sroie = len(rows)
    n_synthetic = 270 if args.synthetic is None else args.synthetic
    rows += extract_synthetic.examples(n_synthetic, seed=0)
    held_out = extract_synthetic.examples(SYNTHETIC_TEST, seed=1)
    given = {"lr": args.lr} if args.lr is not None else {}
    training = SftTraining(epochs=args.epochs, threads=args.threads, lora_blocks=args.lora_blocks, **given)
    data = (
        f"../shared/data/sroie/receipts.jsonl rows {SROIE_TEST}..{len(docs) - 1} ({n_sroie} usable); "
        f"{n_synthetic} synthetic documents of {len(extract_synthetic.KINDS)} kinds "
        "(bench/extract_synthetic.py, seed 0)"
    )
    if args.adapter is None:
        log(f"training the extraction LoRA on {n_sroie} receipts and {n_synthetic} synthetic documents")
        res = train_extract_adapter(
            rows,
            xbench.Receipt,
            m,
            training=training,
            progress=ProgressBar(every=60),
            metadata={"data": data},
        )
        log(res.summary())
        lora_path = res.save(ROOT / "bench" / "out" / "extract.gguf")
        if args.ship:
            shipped = ROOT / "pocket_agent" / "data" / f"extract-{model_identity(m)[:16]}.gguf"
            res.save(shipped)
            log(f"shipped {shipped.relative_to(ROOT)}")
    else:
        lora_path = Path(args.adapter)
    record = adapter_record(lora_path)
    log(f"scoring {lora_path}: steps {record.get('steps')}, val loss {record.get('val_loss')}")
    results, synth, quick = [], [], []
    for label, choice in (("base model", None), ("with the extraction LoRA", lora_path)):
        results.append(xbench.run_ours(test, m, label=label, adapter=choice))
        synth.append(score_synthetic(held_out, m, choice))
        quick.append(quick_start_fields(m, choice))
        log(f"{label}: synthetic {synth[-1]}, quick start {quick[-1]}")
    lines = header(args, t0, load0)
    training_line = (
        f"- Training: LoRA rank {record.get('rank')} on blocks {record.get('lora_blocks')}; {record.get('steps')} "
        f"steps; validation loss per answer token {record.get('base_val_loss')} -> {record.get('val_loss')}; "
        f"LoRA file {lora_path.stat().st_size / 1e6:.1f} MB."
    )
    if args.adapter is None:
        training_line += f" **{res.seconds / 60:.1f} min, peak memory {res.peak_rss_mb:.0f} MB.**"
    lines += [
        f"- Data: {record.get('data', data)}; 15% held out for early stopping. Scored on SROIE receipts "
        f"0..{SROIE_TEST - 1} (never trained on), on {SYNTHETIC_TEST} synthetic documents from another seed "
        "(other values, other schemas), and on the README quick start's invoice.",
        training_line,
        "",
        "| contender | valid | "
        + " | ".join(xbench.FIELDS)
        + " | SROIE exact fields | s/doc | synthetic exact fields | quick-start invoice |",
        "|---|---|" + "---|" * len(xbench.FIELDS) + "---|---|---|---|",
    ]
    for r, (right, total, _), q in zip(results, synth, quick, strict=True):
        accs = [r.field_acc(f) for f in xbench.FIELDS]
        exact = sum(round(a * len(test)) for a in accs)
        lines.append(
            f"| {r.name} | {sum(r.valid)}/{len(test)} | "
            + " | ".join(f"{a:.2f}" for a in accs)
            + f" | {exact} | {np.mean(r.seconds):.2f} | {right}/{total} | {q} |"
        )
    return lines


# How much readier a turn of calls is to go on to another call under the tools LoRA (added
# to "another call" against ending, log scale; recorded in the file as
# pocket_agent.more_calls_bias). The LoRA, trained on few parallel turns, ends after its first
# call: on BFCL rows 15-29 its margin for going on is -1.3 to -5.5 after a call that answers a
# one-call request and mostly -2 to +2.4 where several calls are asked. Fitted on those rows
# (simple, multiple, parallel, parallel_multiple, live_simple; 75 questions, bench/bfcl.py
# --start 15): 0 -> 28 right, 1.2 -> 30 (no row lost), 2.5 -> 29 (3 one-call rows get a
# second call to a neighbouring tool).
TOOLS_MORE_CALLS_BIAS = 1.2


def run_tools(args: argparse.Namespace) -> list[str]:
    """Train the tools LoRA on BFCL dev rows 30+ (live_simple held out); accuracy: bench/bfcl.md."""
    import random

    import tools_data
    import tools_synthetic

    t0, load0 = time.time(), dbench.loadavg()
    m = load_model(threads=1)
    rows, counts = tools_data.build(m)
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_cat.setdefault(row["category"], []).append(row)
    rng = random.Random(0)
    picked = [
        r
        for cat in by_cat.values()
        for r in (cat if len(cat) <= args.per_category else rng.sample(cat, args.per_category))
    ]
    n_synthetic = 300 if args.synthetic is None else args.synthetic
    synthetic = tools_synthetic.examples(n_synthetic, seed=0)
    given = {"lr": args.lr} if args.lr is not None else {}
    training = SftTraining(epochs=args.epochs, threads=args.threads, lora_blocks=args.lora_blocks, **given)
    used = {cat: sum(r["category"] == cat for r in picked) for cat in by_cat}
    shapes = {s: sum(r["category"] == "synthetic_" + s for r in synthetic) for s in tools_synthetic.SHAPES}
    data = (
        "../shared/data/bfcl rows 30+ of "
        + ", ".join(f"{cat} ({n})" for cat, n in used.items())
        + f"; {tools_data.HELD_OUT} held out entirely (bench/tools_data.py, seed 0); "
        + f"{n_synthetic} synthetic conversations (bench/tools_synthetic.py, seed 0: "
        + ", ".join(f"{s} {n}" for s, n in shapes.items())
        + ")"
    )
    picked += synthetic
    log(f"training the tools LoRA on {len(picked)} rows: {used}")
    from pocket_agent.training import train_tools_adapter

    res = train_tools_adapter(
        picked,
        m,
        training=training,
        progress=ProgressBar(every=60),
        metadata={"data": data, "more_calls_bias": str(TOOLS_MORE_CALLS_BIAS)},
    )
    log(res.summary())
    path = res.save(ROOT / "bench" / "out" / "tools.gguf")
    if args.ship:
        shipped = ROOT / "pocket_agent" / "data" / f"tools-{model_identity(m)[:16]}.gguf"
        res.save(shipped)
        log(f"shipped {shipped.relative_to(ROOT)} (score it: bench/bfcl.py --base)")
    dropped = {cat: (c.too_long, c.invalid) for cat, c in counts.items()}
    lines = header(args, t0, load0)
    lines += [
        f"- Data: {data}. Rows with prompts over {tools_data.MAX_PROMPT_TOKENS} tokens or ground truth the schema "
        f"refuses were dropped (too long, refused per category: {dropped}); at most {args.per_category} rows per "
        "category (seeded). Irrelevance rows answer one fixed sentence. 15% held out for early stopping.",
        f"- Training: LoRA rank {training.rank} on the last {training.lora_blocks} blocks; {res.steps} steps; "
        f"**{res.seconds / 60:.1f} min, peak memory {res.peak_rss_mb:.0f} MB**; LoRA file "
        f"{path.stat().st_size / 1e6:.1f} MB; validation loss per answer token {res.base_val_loss:.3f} -> "
        f"{res.val_loss:.3f}.",
        "- The file records no routing constant (the agent routes on the base weights) and "
        f"more_calls_bias {TOOLS_MORE_CALLS_BIAS} (fitted on BFCL rows 15-29); accuracy against the base agent and "
        "the peer is in `bench/bfcl.md` (`bench/bfcl.py --base`).",
    ]
    return lines


def write_section(task: str, lines: list[str]) -> None:
    title = {
        "decide": "## decide: the Dec adapter",
        "extract": "## extract: an extraction LoRA",
        "tools": "## tools: the tools LoRA",
    }[task]
    text = OUT.read_text(encoding="utf-8") if OUT.exists() else "# Adapters trained on the CPU (`bench/adapters.py`)\n"
    body = title + "\n\n" + "\n".join(lines).rstrip() + "\n"
    pattern = re.compile(re.escape(title) + r"\n.*?(?=\n## |\Z)", re.S)
    text = pattern.sub(lambda _: body, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + body
    OUT.write_text(text.rstrip("\n") + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["decide", "extract", "tools"])
    ap.add_argument("--threads", type=int, default=2, help="torch threads for training")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=None, help="LoRA learning rate (default: the task's)")
    ap.add_argument("--head-lr", type=float, default=None, help="(decide) head learning rate")
    ap.add_argument("--lora-blocks", type=int, default=10, help="(extract) blocks carrying the LoRA")
    ap.add_argument("--train-sets", type=lambda s: s.split(","), default=list(dbench.SHIPPED_SETS))
    ap.add_argument("--objective", choices=["hidden", "cloze"], default="cloze", help="(decide) what the head reads")
    ap.add_argument("--ship", action="store_true", help="write the adapter into pocket_agent/data/")
    ap.add_argument(
        "--synthetic", type=int, default=None, help="synthetic training rows (default: extract 270, tools 300)"
    )
    ap.add_argument("--adapter", default=None, help="(extract) score this LoRA instead of training one")
    ap.add_argument("--per-category", type=int, default=80, help="(tools) most training rows per BFCL category")
    args = ap.parse_args()
    runners = {"decide": run_decide, "extract": run_extract, "tools": run_tools}
    lines = runners[args.task](args)
    print("\n".join(lines))
    write_section(args.task, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
