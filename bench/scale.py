"""Scale-out benchmark: ``extract_many`` in one process vs ``extract_dataset`` on Ray Data.

Same model (the embedded SmolLM2-135M-Instruct GGUF), same SROIE receipts
(../shared/data/sroie), same small schema and options, greedy:

  1 process x 1 thread     extract_many in this process
  1 process x 2 threads    the same with both cores in one model (--two-threads)
  Ray, 1 actor x 1 thread  extract_dataset(actors=1) on a local Ray (ray.init(num_cpus=2))
  Ray, 2 actors x 1 thread extract_dataset(actors=2)

Also measures the fixed costs a Ray run pays once: Ray start-up, the rebalance of the
input, and per actor the process start, import and model load (a probe actor that does
what an extraction actor's ``__init__`` does, timed from inside and outside).

    flock /tmp/pocket-bench.lock python bench/scale.py [--docs 24] [--out bench/scale.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _env import package_versions
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "sroie" / "receipts.jsonl"
OPTIONS: dict[str, Any] = {"max_tokens": 48}
BATCH = 4


class ReceiptKeys(BaseModel):
    """Two short fields (output at most ~40 tokens), so the prompt dominates as in most extraction."""

    date: str = Field(description="the date as written", max_length=20)
    total: str = Field(description="the total amount paid", max_length=10)


@dataclass
class Run:
    name: str
    workers: str
    wall_s: float  # everything this run paid, start-up included
    work_s: float  # the extraction alone (single process: after the model load)
    docs: int
    values: dict[str, str | None]
    load: str = ""  # the 1-minute load average at the start and end: other sessions share the machine

    @property
    def rate(self) -> float:
        return self.docs / self.wall_s


def load_docs(n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"id": r["id"], "text": r["text"]} for r in rows[:n]]


def value_json(v: Any) -> str:
    return json.dumps(v.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))


def single_process(docs: list[dict[str, Any]], threads: int) -> tuple[Run, float]:
    from pocket_agent import extract_many, load_model

    t0 = time.perf_counter()
    model = load_model(threads=threads, merge_adapter="extract")  # as the actors (and extract(model=None)) load it
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    outs = list(extract_many([d["text"] for d in docs], ReceiptKeys, model=model, progress=False, **OPTIONS))
    work = time.perf_counter() - t1
    model.close()
    values = {d["id"]: value_json(o.value) if o.ok else None for d, o in zip(docs, outs, strict=True)}
    name = f"extract_many, 1 process x {threads} thread(s)"
    return Run(name, f"1 x {threads}", load_s + work, work, len(docs), values), load_s


def probe_actor(ray: Any) -> dict[str, float]:
    """What an extraction actor's __init__ costs: process start + import, model load, grammar compile."""

    @ray.remote(num_cpus=1)
    class Probe:
        def __init__(self) -> None:
            t0 = time.perf_counter()
            from pocket_agent import extract_many, load_model

            t1 = time.perf_counter()
            model = load_model(threads=1, merge_adapter="extract")
            t2 = time.perf_counter()
            for _ in extract_many([], ReceiptKeys, model=model, progress=False, **OPTIONS):
                pass
            t3 = time.perf_counter()
            self.times = {"import_s": t1 - t0, "load_s": t2 - t1, "compile_s": t3 - t2}

        def timings(self) -> dict[str, float]:
            return self.times

    t0 = time.perf_counter()
    actor = Probe.remote()  # type: ignore[attr-defined]
    times: dict[str, float] = ray.get(actor.timings.remote())
    times["ready_s"] = time.perf_counter() - t0
    ray.kill(actor)
    return times


def on_ray(ray: Any, docs: list[dict[str, Any]], actors: int, default_gguf: Path) -> tuple[Run, float]:
    from pocket_agent.distributed import extract_dataset

    ds = ray.data.from_items(docs, override_num_blocks=1)
    t0 = time.perf_counter()
    mapped = extract_dataset(
        ds, ReceiptKeys, model=default_gguf, actors=actors, threads_per_actor=1, batch_size=BATCH, **OPTIONS
    )
    rebalance_s = time.perf_counter() - t0
    rows = mapped.take_all()
    wall = time.perf_counter() - t0
    values = {r["id"]: r["value"] for r in rows}
    run = Run(f"Ray Data, {actors} actor(s) x 1 thread", f"{actors} x 1", wall, wall - rebalance_s, len(docs), values)
    return run, rebalance_s


def versions() -> str:
    return package_versions(("ray", "pyarrow", "llama-cpp-python", "llguidance", "pocket-agent-mnn"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=24)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--two-threads", action="store_true", help="also one process with both cores in one model")
    args = ap.parse_args()
    docs = load_docs(args.docs)
    from pocket_agent.runtime import default_model_path

    gguf = default_model_path()

    runs: list[Run] = []
    la = os.getloadavg()[0]
    base, load_1 = single_process(docs, 1)
    base.load = f"{la:.1f} -> {os.getloadavg()[0]:.1f}"
    runs.append(base)
    print(f"{base.name}: {base.rate:.3f} docs/s (model load {load_1:.2f}s)", flush=True)

    t0 = time.perf_counter()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    ray_start = time.perf_counter() - t0
    ray.data.DataContext.get_current().enable_progress_bars = False
    probe = probe_actor(ray)
    print(f"ray start {ray_start:.2f}s, probe actor {probe}", flush=True)
    rebalance: dict[int, float] = {}
    for k in (1, 2):
        la = os.getloadavg()[0]
        run, rebalance[k] = on_ray(ray, docs, k, gguf)
        run.load = f"{la:.1f} -> {os.getloadavg()[0]:.1f}"
        runs.append(run)
        print(f"{run.name}: {run.rate:.3f} docs/s (wall {run.wall_s:.1f}s)", flush=True)
    ray.shutdown()
    if args.two_threads:
        la = os.getloadavg()[0]
        two_threads, _ = single_process(docs, 2)
        two_threads.load = f"{la:.1f} -> {os.getloadavg()[0]:.1f}"
        runs.append(two_threads)
        print(f"{two_threads.name}: {two_threads.rate:.3f} docs/s", flush=True)

    per_doc = base.work_s / len(docs)  # one model, one thread, warm
    lines = [
        "| run | processes x threads | wall s | docs/s (wall) | speed-up vs 1 x 1 | fixed cost s | same values "
        "| load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        workers = int(r.workers.split(" x ")[0])
        ideal = len(docs) * per_doc / workers  # the documents alone, spread perfectly
        same = sum(1 for d in docs if r.values.get(d["id"]) == base.values[d["id"]])
        lines.append(
            f"| {r.name} | {r.workers} | {r.wall_s:.1f} | {r.rate:.3f} | {r.rate / base.rate:.2f}x | "
            f"{r.wall_s - ideal:.1f} | {same}/{len(docs)} | {r.load} |"
        )
    table = "\n".join(lines)
    fixed = (
        f"- Ray start-up (`ray.init(num_cpus=2)`, local): {ray_start:.2f} s, once per job (0 when joining a cluster).\n"
        f"- Per actor, paid in parallel by all actors: ready after {probe['ready_s']:.2f} s = process start and "
        f"`import pocket_agent` {probe['import_s']:.2f} s + model load {probe['load_s']:.2f} s + schema compile "
        f"{probe['compile_s']:.2f} s + Ray's scheduling (the rest). "
        f"In this process the model loaded in {load_1:.2f} s.\n"
        f"- Rebalance (the input run and cut into blocks of at most {BATCH} rows before the actors start): "
        + ", ".join(f"{k} actor(s) {v:.2f} s" for k, v in rebalance.items())
        + ".\n"
        f"- One document on one warm 1-thread model: {per_doc:.2f} s (from the 1 x 1 run).\n"
    )
    ray1 = next(r for r in runs if r.workers == "1 x 1" and r.name.startswith("Ray"))
    ray2 = next(r for r in runs if r.workers == "2 x 1")
    # the documents' part of each Ray run: wall minus the rebalance and the per-actor start
    work1 = ray1.work_s - probe["ready_s"]
    work2 = ray2.work_s - probe["ready_s"]
    eff = (work1 / work2) / 2
    scaling = (
        "## Predicting N machines x M cores\n\n"
        "With one thread per actor and one actor per core, a corpus of D documents takes about\n\n"
        "    T = T_ray + T_rebalance + T_actor + D x t_doc / (N x M x e)\n\n"
        f"where, measured here: T_ray = {ray_start:.1f} s (a local `ray.init`; 0 when the job joins a running "
        f"cluster), T_rebalance = {rebalance[2]:.1f}-{rebalance[1]:.1f} s for these {len(docs)} documents (it grows "
        f"with the input: it is one pass over it), T_actor = {probe['ready_s']:.1f} s (all actors start in "
        f"parallel; the model load is {probe['load_s']:.2f} s of it for the cached copies of a 98 MB GGUF, and it "
        f"grows with the model file), t_doc = {per_doc:.2f} s for one ~400-token receipt on one warm 1-thread "
        "model, and e is "
        f"the efficiency of one more actor: here 2 actors did the documents' part {work1 / work2:.2f}x as fast "
        f"as 1 actor (e = {eff:.2f}).\n\n"
        "Where the curve stops being linear, and why:\n\n"
        "- Fixed costs. Below a few hundred documents per actor the start-up terms dominate: the Ray rows "
        "above lose to one process at 1 actor and gain less than 2x at 2 actors because about "
        f"{ray2.wall_s - ray2.work_s + probe['ready_s']:.0f}-{ray1.wall_s - ray1.work_s + probe['ready_s']:.0f} s "
        "of a "
        f"{ray2.wall_s:.0f}-{ray1.wall_s:.0f} s run is start-up. For a million receipts on 100 cores the "
        "documents' part is hours and the fixed part well under a minute.\n"
        "- Physical cores (reasoning). An actor is one compute-bound thread; the count that scales is physical cores, "
        "not logical CPUs. Two SMT siblings share one core's vector units, so an actor per hyperthread adds "
        "little: give Ray `num_cpus` = physical cores, or use threads_per_actor=2 on SMT machines. Here there "
        "is no SMT, but the two cores are shared with other sessions (the load column), which is why e is "
        "below 1 and varies between runs.\n"
        "- Memory bandwidth (reasoning, not measured here). Prefill, most of an extraction, is compute-bound, "
        "but each decoded token reads all the weights: ~100 MB per token for this model, so an actor decoding "
        "at 20-45 tokens/s (a 22 ms decode step in bench/extract.md) streams 2-4.5 GB/s. A socket with "
        "100-200 GB/s runs out at a few dozen actors decoding at once; past that, more cores per machine add "
        "less than their share, while more machines still add fully.\n"
        "- The tail. Work goes out in batches (`batch_size`, here "
        f"{BATCH}); the last batches leave some actors idle for up to batch_size x t_doc. Keep D / (actors x "
        "batch_size) well above 1, or lower batch_size for small jobs (extract_dataset already shrinks it when "
        "there are fewer rows than actors x batch_size).\n"
        "- Not a limit: the driver and the object store move only text (kilobytes per document) and the "
        "results (a short JSON string), so they are not the bottleneck until very large clusters.\n"
        "- One process with both cores in one model (1 x 2) is the alternative on one machine: it avoids Ray's "
        "start-up, but llama.cpp's threads synchronise at every layer, so on a busy machine one stalled "
        "thread stalls both, and it does not extend past one machine.\n"
    )
    print(table)
    print(fixed)
    print(scaling)
    if args.out:
        sys.path.insert(0, str(ROOT / "bench"))
        from runtime import machine

        text = (
            "# Scale-out benchmark: one process vs Ray Data actors\n\n"
            f"Generated by `flock /tmp/pocket-bench.lock python bench/scale.py --docs {args.docs} "
            f"{'--two-threads ' if args.two_threads else ''}--out {args.out}` "
            f"on {time.strftime('%Y-%m-%d')}.\n\n"
            f"- Machine: {machine()}; shared with other sessions and noisy, so compare rows of one run.\n"
            f"- Python {platform.python_version()}; {versions()}\n"
            "- Model: SmolLM2-135M-Instruct GGUF Q4_1 (embedded default), loaded everywhere as `extract(model=None)` "
            "loads it (the extraction adapter merged; split weights where BF16 is native), greedy, "
            f"max_tokens {OPTIONS['max_tokens']}; Ray batch size {BATCH}.\n"
            f"- Data: first {len(docs)} SROIE receipts (../shared/data/sroie, about 400 tokens each), schema "
            "{date, total} (strings of at most 20 and 10 characters), so the prompt dominates each document.\n"
            "- wall s: everything a user waits for, start-up included (the single-process rows include the model "
            "load; the Ray rows include the rebalance, actor start and model load, not `ray.init`). fixed cost s: "
            "wall minus the documents' own time spread perfectly over the workers (documents x s/doc of the "
            "1 x 1 run / workers). same values: documents whose value equals the 1 x 1 run's.\n\n"
            f"{table}\n\n## Fixed costs\n\n{fixed}\n{scaling}"
        )
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
