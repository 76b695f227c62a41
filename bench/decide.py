"""Benchmark of pocket_agent.decision on the multiple-choice dev sets.

Accuracy (fixed split per set, seed 0; options in the original order and rotated by one):
  cloze, letter, greedy generation-then-match, a pointer head trained in this run on the
  set's train part, and the shipped general head (trained on the train parts of all sets).
Speed: decide() vs generation-based choice (greedy decoding masked to a token trie of the
options), and decide_many() vs a loop of decide().

    python bench/decide.py                    # writes bench/decide.md
    python bench/decide.py --train-shipped    # also retrains pocket_agent/data/<head>.safetensors

Features are extracted once per question and shared by every head trained or scored in
the run (train_head's feature_cache).

The data is read from ../shared/data/mcq (relative to the repository root) and never copied.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "mcq"
SETS = ("arc_easy", "sst2", "boolq", "zh_sentiment")
SHIPPED_SETS = ("arc_easy", "arc_challenge", "sst2", "boolq", "zh_sentiment")
TEST_SHARE = 0.3  # the last 30% of each set's seeded permutation is the test part
SEED = 0

from pocket_agent.decision import (  # noqa: E402
    DecisionAdapter,
    FeatureSpec,
    HeadTraining,
    decide,
    decide_many,
    extract_features,
    find_shipped_head,
    load_decision_adapter,
    model_identity,
    train_head,
    unload_decision_adapter,
)
from pocket_agent.decision._layout import DEFAULT_FORMAT  # noqa: E402
from pocket_agent.decision.core import forget_default_head  # noqa: E402
from pocket_agent.decision.train import _slice  # noqa: E402
from pocket_agent.runtime import Model, load_model  # noqa: E402

# -- data -------------------------------------------------------------------------------


def load_set(name: str) -> list[dict[str, Any]]:
    with (DATA / f"{name}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train part, test part) of a set: a seeded permutation, the last 30% is the test part."""
    rows = load_set(name)
    perm = np.random.default_rng(SEED).permutation(len(rows))
    n_test = int(len(rows) * TEST_SHARE)
    train = [rows[i] for i in perm[: len(rows) - n_test]]
    test = [rows[i] for i in perm[len(rows) - n_test :]]
    return train, test


def rotate(row: dict[str, Any], shift: int) -> dict[str, Any]:
    k = shift % len(row["options"])
    out = dict(row)
    out["options"] = row["options"][k:] + row["options"][:k]
    out["answer"] = (row["answer"] - k) % len(row["options"])
    return out


# -- baselines a user would write ----------------------------------------------------------


def gen_prompt(m: Model, row: dict[str, Any]) -> list[int]:
    ctx = row.get("context")
    text = (f"{ctx}\n\n" if ctx else "") + row["question"] + "\nOptions:\n"
    text += "".join(f"- {o}\n" for o in row["options"]) + "Answer with one of the options, exactly as written."
    rendered = m.chat_template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return m.tokenize(rendered, special=True)


def _norm(s: str) -> str:
    return " ".join("".join(c.lower() if c.isalnum() else " " for c in s).split())


def match_option(output: str, options: Sequence[str]) -> int | None:
    """Which option a free-text answer names: exact, then contained (earliest), then a prefix."""
    out = _norm(output)
    norms = [_norm(o) for o in options]
    for i, o in enumerate(norms):
        if out == o:
            return i
    found = [(out.find(o), -len(o), i) for i, o in enumerate(norms) if o and o in out]
    if found:
        return min(found)[2]
    pref = [i for i, o in enumerate(norms) if out and o.startswith(out)]
    if len(pref) == 1:
        return pref[0]
    return None


def generate_then_match(m: Model, row: dict[str, Any], max_new: int = 24) -> int | None:
    """Greedy (unconstrained) generation, then match the text to an option."""
    toks = gen_prompt(m, row)
    out = m.prefill(toks)
    logits = out.logits[-1]
    eos = set(m.vocab.eos_ids)
    newline = set(m.tokenize("\n"))
    gen: list[int] = []
    for _ in range(max_new):
        t = int(np.argmax(logits))
        if t in eos or (t in newline and gen):
            break
        gen.append(t)
        logits = m.eval([t]).logits[-1]
    return match_option(m.decode(gen), row["options"])


def trie_choice(m: Model, row: dict[str, Any]) -> int:
    """Generation-based choice: greedy decoding masked to tokens that continue an option."""
    seqs = [m.tokenize(o) for o in row["options"]]
    toks = gen_prompt(m, row)
    logits = m.prefill(toks).logits[-1]
    eos = m.vocab.eos_ids[0]
    done: list[int] = []
    while True:
        depth = len(done)
        alive = [i for i, s in enumerate(seqs) if s[:depth] == done]
        complete = [i for i in alive if len(seqs[i]) == depth]
        nxt = {seqs[i][depth] for i in alive if len(seqs[i]) > depth}
        if complete and not nxt:
            return complete[0]
        allowed = sorted(nxt | ({eos} if complete else set()))
        t = allowed[int(np.argmax(logits[allowed]))]
        if t == eos:
            return complete[0]
        done.append(t)
        if not any(len(seqs[i]) > depth + 1 and seqs[i][: depth + 1] == done for i in alive):
            # the chosen token completes an option and nothing longer continues it
            return next(i for i in alive if seqs[i] == done)
        logits = m.eval([t]).logits[-1]


# -- pointer heads -----------------------------------------------------------------------------


def head_predictions(
    m: Model, rows: Sequence[dict[str, Any]], heads: dict[str, DecisionAdapter], cache: dict[Any, Any]
) -> dict[str, list[int]]:
    """Each head's choice per row: features of one pass per question (the union of the
    heads' parts, read exactly as decide() reads them), sliced per head."""
    specs = {ad.features.layer for ad in heads.values()}
    assert len(specs) == 1 and all(ad.prompt == DEFAULT_FORMAT and not ad.has_lora for ad in heads.values())
    union = FeatureSpec(
        parts=tuple(dict.fromkeys(p for ad in heads.values() for p in ad.features.parts)), layer=specs.pop()
    )
    feats = extract_features(rows, m, features=union, cache=cache)
    out = {}
    for name, ad in heads.items():
        cols = _slice(union, ad.features.parts, m.info.n_embd)
        out[name] = [int(np.argmax(ad.head.scores(f[:, cols]))) for f in feats]
    return out


# -- reporting helpers -------------------------------------------------------------------------


def acc(preds: Sequence[int | None], gold: Sequence[int]) -> float:
    return float(np.mean([p == g for p, g in zip(preds, gold, strict=True)]))


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("pocket-agent-mnn", "numpy", "llama_cpp_python", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "?"
    return out


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores visible, {platform.system()} {platform.release()}"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the benchmark -------------------------------------------------------------------------------


def train_heads(m: Model, args: argparse.Namespace, cache: dict[Any, Any]) -> dict[str, Any]:
    """A head per set on its whole train part and, with --train-shipped, the general head
    on the train parts of all dev sets (written to pocket_agent/data/)."""
    own: dict[str, Any] = {}
    t0 = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:
        if done == total or done % 64 == 0:
            log(f"  {stage} {done}/{total} {time.perf_counter() - t0:.0f}s")

    for name in args.sets:
        train, _ = split(name)
        t1 = time.perf_counter()
        own_training = HeadTraining(rotations=0, val_fraction=0.15, compare=(), seed=SEED)
        res = train_head(train, m, training=own_training, progress=progress, feature_cache=cache)
        own[name] = {"adapter": res.adapter, "train_s": time.perf_counter() - t1, "n_train": len(train)}
        log(f"[{name}] own head: {res.summary().splitlines()[1]} ({own[name]['train_s']:.0f}s)")
    if args.train_shipped:
        rows: list[dict[str, Any]] = []
        used: dict[str, int] = {}
        for name in SHIPPED_SETS:
            train, _ = split(name)
            used[name] = len(train)
            rows += train
        res = train_head(
            rows,
            m,
            training=HeadTraining(rotations=0, val_fraction=0.15, compare=("cloze", "letter"), seed=SEED),
            progress=progress,
            feature_cache=cache,
            metadata={
                "data": {k: f"../shared/data/mcq/{k}.jsonl train part ({v} rows)" for k, v in used.items()},
                "split": f"seeded permutation (numpy default_rng({SEED})), last {int(TEST_SHARE * 100)}% = test part",
                "script": "bench/decide.py --train-shipped",
            },
        )
        log("shipped head: " + res.summary().replace("\n", "; "))
        out = ROOT / "pocket_agent" / "data" / f"dec-{model_identity(m)[:16]}.safetensors"
        for old in out.parent.glob(f"dec-{model_identity(m)[:16]}*.safetensors"):
            old.unlink()
        res.adapter.save(out)
        log(f"wrote {out} ({out.stat().st_size} bytes)")
    return own


def run_accuracy(
    m: Model, args: argparse.Namespace, shipped: DecisionAdapter | None, own: dict[str, Any], cache: dict[Any, Any]
) -> list[dict[str, Any]]:
    results = []
    for name in args.sets:
        _, test = split(name)
        test = test[: args.n_test]
        heads: dict[str, DecisionAdapter] = {"own": own[name]["adapter"]}
        if shipped is not None:
            heads["shipped"] = shipped
        rec: dict[str, Any] = {"set": name, "n_test": len(test), "n_train": own[name]["n_train"]}
        rec["train_s"] = own[name]["train_s"]
        gold = [r["answer"] for r in test]
        for h, preds in head_predictions(m, test, heads, cache).items():
            rec[f"{h}_acc"] = acc(preds, gold)
        for rot in (0, 1):
            rows = [rotate(r, rot) for r in test]
            g = [r["answer"] for r in rows]
            letter = [d.index for d in decide_many(rows, model=m, method="letter", batched=False)]
            gen = [generate_then_match(m, r) for r in rows]
            key = "rot" if rot else "orig"
            rec[f"letter_{key}"] = acc(letter, g)
            rec[f"gen_{key}"] = acc(gen, g)
            rec[f"gen_unmatched_{key}"] = float(np.mean([p is None for p in gen]))
            rec[f"letter_first_{key}"] = float(np.mean([p == 0 for p in letter]))
        cl = decide_many(test, model=m, method="cloze")
        rec["cloze_orig"] = acc([d.index for d in cl], gold)
        rec["majority"] = max(np.bincount(gold).tolist()) / len(gold)
        rec["chance"] = float(np.mean([1 / len(r["options"]) for r in test]))
        results.append(rec)
        log(f"[{name}] {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rec.items()})}")
    return results


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_speed(m: Model, args: argparse.Namespace, shipped: DecisionAdapter | None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name in ("sst2", "arc_easy"):
        rows += split(name)[1][: args.speed_n]
    out: dict[str, Any] = {"n": len(rows)}
    method = "pointer" if shipped is not None else "cloze"
    # warm up (template cache, page faults)
    decide(rows[0]["question"], rows[0]["options"], context=rows[0].get("context"), model=m, method=method)
    per: dict[str, list[float]] = {"decide": [], "decide_cloze": [], "trie": [], "gen": []}
    for r in rows:  # interleaved, so load changes hit every method alike
        q, o, c = r["question"], r["options"], r.get("context")
        per["decide"].append(timed(lambda q=q, o=o, c=c: decide(q, o, context=c, model=m, method=method)))
        per["decide_cloze"].append(timed(lambda q=q, o=o, c=c: decide(q, o, context=c, model=m, method="cloze")))
        per["trie"].append(timed(lambda r=r: trie_choice(m, r)))
        per["gen"].append(timed(lambda r=r: generate_then_match(m, r)))
    for k, v in per.items():
        out[f"{k}_ms_median"] = 1000 * statistics.median(v)
        out[f"{k}_ms_mean"] = 1000 * statistics.mean(v)
    items = [{"question": r["question"], "options": r["options"], "context": r.get("context")} for r in rows]

    def loop_vs_many(meth: str, tag: str, batched: bool | None) -> None:
        loop_t, many_t = [], []
        for _ in range(args.speed_reps):
            m.reset()
            loop_t.append(timed(lambda: [decide(**it, model=m, method=meth) for it in items]))  # type: ignore[arg-type]
            m.reset()
            many_t.append(timed(lambda: decide_many(items, model=m, method=meth, batched=batched)))  # type: ignore[arg-type]
        out[f"loop_{tag}_qps"] = len(items) / min(loop_t)
        out[f"many_{tag}_qps"] = len(items) / min(many_t)

    if method == "pointer":
        loop_vs_many("pointer", "pointer", None)
        loop_vs_many("pointer", "pointer_packed", True)
    for meth in ("letter", "cloze"):
        loop_vs_many(meth, meth, None)
    out["method"] = method
    return out


def write_report(
    path: Path, args: argparse.Namespace, acc_rows: list[dict[str, Any]], speed: dict[str, Any], meta: dict[str, Any]
) -> None:
    out: list[str] = []
    out.append("# Decision benchmark (`bench/decide.py`)\n")
    out.append(
        f"Generated {meta['date']} by `python bench/decide.py {' '.join(meta['argv'])}` in {meta['wall_s']:.0f} s.\n"
    )
    out.append(
        f"- Machine: {meta['machine']}; llama.cpp threads: {args.threads}; load average at start / end: "
        f"{meta['load_start']} / {meta['load_end']} (the cores are shared with other jobs)."
    )
    out.append("- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    out.append(f"- Model: {meta['model']} (identity `{meta['identity'][:16]}...`).")
    out.append(
        f"- Data: `../shared/data/mcq`, per set a seeded permutation (seed {SEED}); the last "
        f"{int(TEST_SHARE * 100)}% is the test part, the rest the train part. Every method is scored on the first "
        f"{args.n_test} rows of each test part."
    )
    out.append("- Shipped head: " + (meta["shipped"] or "none for this model") + "\n")
    out.append("## Accuracy\n")
    out.append(
        "`orig`: options in the data's order; `rot`: options rotated by one position (the right answer moves). "
        "Cloze and the pointer heads score each option as its own continuation of the question, so they cannot "
        "see the order of the options (rotated = original by construction; `test_decision.py` checks it). "
        "`gen`: greedy generation of up to 24 tokens after a prompt listing the options, then the text is matched "
        "to an option (unmatched counts as wrong): the baseline a user would write. `own head`: trained in this "
        "run on the set's train part (`n train` rows, 15% of them held out for early stopping and the L2 "
        "choice). `shipped head`: the general head in `pocket_agent/data/`, trained on the train parts of all "
        "five dev sets at once.\n"
    )
    hdr = ["set", "n train", "n test", "chance", "majority", "cloze", "letter orig", "letter rot", "gen orig"]
    hdr += ["gen rot", "**own head**", "shipped head"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for r in acc_rows:
        vals = [r["set"], str(r["n_train"]), str(r["n_test"]), f"{r['chance']:.2f}", f"{r['majority']:.2f}"]
        vals += [f"{r['cloze_orig']:.3f}"]
        for k in ("letter", "gen"):
            vals += [f"{r[k + '_orig']:.3f}", f"{r[k + '_rot']:.3f}"]
        vals += [f"**{r['own_acc']:.3f}**", f"{r['shipped_acc']:.3f}" if "shipped_acc" in r else "-"]
        out.append("| " + " | ".join(vals) + " |")
    out.append("")
    out.append(
        "Position bias: share of `letter` answers that were the first option (orig / rot): "
        + ", ".join(f"{r['set']} {r['letter_first_orig']:.2f}/{r['letter_first_rot']:.2f}" for r in acc_rows)
        + ". "
        "Unmatched generations (orig / rot): "
        + ", ".join(f"{r['set']} {r['gen_unmatched_orig']:.2f}/{r['gen_unmatched_rot']:.2f}" for r in acc_rows)
        + ".\n"
    )
    out.append(
        "Own-head training time in this run (feature extraction included; questions already extracted for "
        "another head come from the feature cache): "
        + ", ".join(f"{r['set']} {r['train_s']:.0f} s" for r in acc_rows)
        + ".\n"
    )
    s = speed
    out.append("## Speed\n")
    out.append(
        f"{s['n']} questions ({args.speed_n} sst2 + {args.speed_n} arc_easy from the test parts), one after "
        "another, methods interleaved per question. `decide` reuses the KV cache of the chat-template header "
        "like every method here.\n"
    )
    out.append("| per question | median ms | mean ms |")
    out.append("|---|---|---|")
    out.append(f"| `decide` ({s['method']}) | {s['decide_ms_median']:.0f} | {s['decide_ms_mean']:.0f} |")
    out.append(f"| `decide` (cloze) | {s['decide_cloze_ms_median']:.0f} | {s['decide_cloze_ms_mean']:.0f} |")
    out.append(
        f"| generation-based choice (greedy, token-trie mask) | {s['trie_ms_median']:.0f} | {s['trie_ms_mean']:.0f} |"
    )
    out.append(f"| generation then match (greedy, unconstrained) | {s['gen_ms_median']:.0f} | {s['gen_ms_mean']:.0f} |")
    out.append("")
    out.append(
        f"| throughput (questions/s, best of {args.speed_reps}) | loop of `decide` | `decide_many` | ratio | "
        "`decide_many` path |"
    )
    out.append("|---|---|---|---|---|")
    paths = {
        "pointer": ("pointer", "one question per decode, shared prefix reused (default; == decide exactly)"),
        "pointer_packed": ("pointer, `batched=True`", "up to 15 option sequences of several questions per decode"),
        "letter": ("letter", "batched where the probe passes, else sequential"),
        "cloze": ("cloze", "options batched per question"),
    }
    for tag, (label, how) in paths.items():
        if f"loop_{tag}_qps" not in s:
            continue
        lo, ma = s[f"loop_{tag}_qps"], s[f"many_{tag}_qps"]
        out.append(f"| {label} | {lo:.2f} | {ma:.2f} | {ma / lo:.2f}x | {how} |")
    out.append("")
    out.append(meta.get("notes", ""))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sets", type=lambda s: s.split(","), default=list(SETS))
    ap.add_argument("--n-test", type=int, default=60, help="test rows per set (from its test part)")
    ap.add_argument("--speed-n", type=int, default=8, help="questions per set for the speed section")
    ap.add_argument("--speed-reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "decide.md")
    ap.add_argument(
        "--train-shipped", action="store_true", help="also retrain the shipped head and write it to pocket_agent/data/"
    )
    args = ap.parse_args()

    t0 = time.perf_counter()
    load_start = loadavg()
    m = load_model(threads=args.threads)
    forget_default_head(m)
    cache: dict[Any, Any] = {}
    own = train_heads(m, args, cache)
    path = find_shipped_head(m)
    shipped = DecisionAdapter.read(path) if path is not None else None
    acc_rows = run_accuracy(m, args, shipped, own, cache)
    if shipped is not None:
        load_decision_adapter(m, shipped)
    speed = run_speed(m, args, shipped)
    unload_decision_adapter(m)
    info = shipped.info()["training"] if shipped is not None else None
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "argv": sys.argv[1:],
        "wall_s": time.perf_counter() - t0,
        "machine": machine(),
        "load_start": load_start,
        "load_end": loadavg(),
        "versions": versions(),
        "model": f"{m.info.name} ({m.path.name}; runs as {m.info.extra.get('layout', 'the file as it is')})",
        "identity": model_identity(m),
        "shipped": f"`{path.name}`, training record: `{json.dumps(info, ensure_ascii=False)}`" if path else "",
    }
    write_report(args.out, args, acc_rows, speed, meta)
    log(f"wrote {args.out} in {meta['wall_s']:.0f}s")
    print(args.out.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
