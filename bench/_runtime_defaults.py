"""The defaults' sections of bench/runtime.py: peak RSS per mode; the default thread count
against one thread, idle and beside a busy neighbour, one-shot and long-running; and what each
layout costs SROIE extraction.

Memory: each mode runs ``extract``, ``decide`` and ``Agent.run`` on the default model in a
process of its own and reports its peak RSS (``VmHWM``), next to llama-cpp-python's
``Llama`` on the same Q4_1 file (n_ctx 4096, a 194-token prompt and 64 decode steps).

Threads: the model loads with its default thread count (the cores this process may use) or
with ``threads=1`` / ``-t 1``; a neighbour started by the bench (``while True: pass``) keeps
one core busy in the *busy* rows.
  - one-shot ``generate``: what ``pocket-agent generate`` runs, in a fresh process (a 37-token
    prompt, up to 24 tokens); its prompt (prefill) and decode rates;
  - one-shot ``decide``: a fresh process, one ``decide`` call, timed after the load;
  - long-running: one process, 40 ``decide`` calls and 10 prompts of 194 tokens with 32
    steps each; the median call and the rates.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

MODES: dict[str, dict[str, str]] = {
    "default (auto)": {},
    "lean": {"POCKET_AGENT_LAYOUT": "lean"},
    "q8_0": {"POCKET_AGENT_LAYOUT": "q8_0"},
    "speed": {"POCKET_AGENT_LAYOUT": "speed"},
}

ALL_THREE = textwrap.dedent(
    """
    import json, resource
    from pydantic import BaseModel
    from pocket_agent import Agent, decide, extract, tool
    from pocket_agent.runtime import get_default_model

    class Invoice(BaseModel):
        invoice_number: str
        seller: str
        total: float

    @tool
    def convert(amount: float, src: str, dst: str) -> float:
        '''Convert money between currencies.

        Args:
            amount: how much money
            src: ISO code of the source currency
            dst: ISO code of the target currency
        '''
        return round(amount * 7.8, 2)

    def peak_mb():
        # VmHWM: this program's own peak (ru_maxrss keeps the peak of the process it was forked from)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    text = "ACME Tools Ltd, 12 Harbour Road, Leeds\\nINVOICE INV-2041\\n2 x claw hammer 19.90\\nTOTAL DUE (EUR) 44.30"
    extract(text, schema=Invoice)
    after_extract = peak_mb()
    decide("Is this an invoice?", ["yes", "no"], context=text)
    Agent(tools=[convert]).run("How much is 12 EUR in CNY?")
    models = {id(get_default_model()), id(get_default_model("extract"))}
    print(json.dumps({"extract": after_extract, "all": peak_mb(),
                      "models": len(models), "layout": get_default_model().info.extra.get("layout", "")}))
    """
)

PLAIN_LLAMA = textwrap.dedent(
    """
    import json, resource, sys
    sys.path.insert(0, "bench")
    from _env import guard_peer_llama
    guard_peer_llama()
    from llama_cpp import Llama
    from pocket_agent.runtime import default_model_path
    llm = Llama(str(default_model_path()), n_ctx=4096, n_threads=1, n_threads_batch=1, verbose=False)
    prompt = llm.tokenize((("Receipts from a small hardware shop list the company name, its address, the date of "
                            "the sale and the total paid. Extract those fields as JSON. ") * 6).encode(), add_bos=False)
    llm.eval(prompt)
    for _ in range(64):
        llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    print(json.dumps({"all": int(status["VmHWM"].split()[0]) / 1024}))
    """
)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POCKET_AGENT_")}
    env.update(extra)
    return env


def _run_json(code: str, env: dict[str, str], timeout: int = 900) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"a measured process failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def memory_section(rounds: int) -> str:
    """Peak RSS of extract + decide + Agent.run per mode, and of plain llama-cpp-python."""
    for extra in MODES.values():  # write every mode's copies first: the quantizer's own memory is not measured
        _run_json(ALL_THREE, _env({**extra, "POCKET_AGENT_THREADS": "1"}))
    rows = [
        "| mode | `POCKET_AGENT_LAYOUT` | weights loaded | models | peak RSS after extract, MB | "
        "peak RSS, extract + decide + Agent.run, MB |",
        "|---|---|---|---|---|---|",
    ]
    for name, extra in MODES.items():
        runs = [_run_json(ALL_THREE, _env({**extra, "POCKET_AGENT_THREADS": "1"})) for _ in range(rounds)]
        layout = runs[0]["layout"]
        rows.append(
            f"| {name} | {extra.get('POCKET_AGENT_LAYOUT', '(unset)')} | {layout} | {runs[0]['models']} | "
            f"{statistics.median(r['extract'] for r in runs):.0f} | {statistics.median(r['all'] for r in runs):.0f} |"
        )
    plain = [_run_json(PLAIN_LLAMA, _env({}))["all"] for _ in range(rounds)]
    rows.append(
        f"| llama-cpp-python `Llama`, same Q4_1 file, n_ctx 4096 (a prompt and 64 steps; no extract/decide/agent) "
        f"| - | the file as it is | 1 | - | {statistics.median(plain):.0f} |"
    )
    return "\n".join(rows) + "\n"


ONE_DECIDE = textwrap.dedent(
    """
    import json, sys, time
    from pocket_agent import decide, load_model
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else None
    model = load_model(threads=threads)
    t0 = time.perf_counter()
    decide("Is this review positive?", ["yes", "no"], context="Great little shop, friendly staff.", model=model)
    print(json.dumps({"seconds": time.perf_counter() - t0}))
    """
)

LONG_RUNNING = textwrap.dedent(
    """
    import json, statistics, sys, time
    import numpy as np
    from pocket_agent import decide, load_model
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else None
    model = load_model(threads=threads)
    calls = []
    for i in range(40):
        t0 = time.perf_counter()
        decide(f"Is review {i} positive?", ["yes", "no"], context="Great little shop, friendly staff.", model=model)
        calls.append(time.perf_counter() - t0)
    prompt = model.tokenize(("Receipts from a small hardware shop list the company name, its address, the date of "
                             "the sale and the total paid. Extract those fields as JSON. ") * 6)
    pre, dec = [], []
    for _ in range(10):
        model.reset()
        t0 = time.perf_counter()
        logits = model.prefill(prompt).logits[-1]
        pre.append(len(prompt) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(32):
            logits = model.eval([int(np.argmax(logits))]).logits[-1]
        dec.append(32 / (time.perf_counter() - t0))
    print(json.dumps({"decide_s": statistics.median(calls), "first_decide_s": calls[0],
                      "prefill": statistics.median(pre), "decode": statistics.median(dec)}))
    """
)

ONE_GENERATE = textwrap.dedent(
    """
    import json, sys
    from pocket_agent.generate import render_prompt, run_generation
    from pocket_agent.options import Limits
    from pocket_agent.runtime import load_model
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else None
    model = load_model(threads=threads)  # what `pocket-agent generate` runs (cli.cmd_generate), timed to the us
    ids = render_prompt(model, "What is the capital of France?")
    u = run_generation(model, ids, limits=Limits(max_tokens=24)).usage
    print(json.dumps({"prefill": u.prompt_tokens / u.prefill_s, "decode": u.completion_tokens / u.decode_s,
                      "prompt": u.prompt_tokens}))
    """
)


def _one_shot_generate(threads: int | None) -> dict[str, float]:
    """``pocket-agent generate`` in a fresh process: its prompt and decode rates."""
    return {k: float(v) for k, v in _run_json_args(ONE_GENERATE, [str(threads)] if threads else []).items()}


@contextmanager
def _neighbour(busy: bool) -> Iterator[None]:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    if spinner is not None:
        time.sleep(1.0)
    try:
        yield
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def _measure_threads(busy: bool, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Every workload with the default threads and with 1, alternated, ``rounds`` times."""
    out: dict[str, dict[str, list[float]]] = {"default": {}, "1": {}}
    with _neighbour(busy):
        for _ in range(rounds):
            for label, threads in (("default", None), ("1", 1)):
                got = out[label]
                arg = [str(threads)] if threads else []
                gen = _one_shot_generate(threads)
                one = _run_json_args(ONE_DECIDE, arg)
                loop = _run_json_args(LONG_RUNNING, arg)
                for key, value in (
                    ("gen_prefill", gen["prefill"]),
                    ("gen_decode", gen["decode"]),
                    ("one_decide", one["seconds"]),
                    ("loop_decide", loop["decide_s"]),
                    ("loop_first_decide", loop["first_decide_s"]),
                    ("loop_prefill", loop["prefill"]),
                    ("loop_decode", loop["decode"]),
                ):
                    got.setdefault(key, []).append(value)
    return out


def _run_json_args(code: str, args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env({}), cwd=ROOT, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"a measured process failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


_ROWS = (
    ("one-shot `pocket-agent generate`: prompt tok/s", "gen_prefill", True),
    ("one-shot `pocket-agent generate`: decode tok/s", "gen_decode", True),
    ("one-shot `decide` (first call after the load), s", "one_decide", False),
    ("long-running: first of 40 `decide` calls, s", "loop_first_decide", False),
    ("long-running: median of 40 `decide` calls, s", "loop_decide", False),
    ("long-running: prompt tok/s (194 tokens, median of 10)", "loop_prefill", True),
    ("long-running: decode tok/s (32 steps after each prompt)", "loop_decode", True),
)


def threads_section(rounds: int) -> str:
    """Default threads against 1 thread, idle and beside a busy neighbour (see the module doc)."""
    lines = [
        f"| machine | workload | default threads ({os.cpu_count()}, adaptive) | 1 thread | "
        "default vs 1 thread (speed) |",
        "|---|---|---|---|---|",
    ]
    for busy in (False, True):
        got = _measure_threads(busy, rounds)
        for label, key, higher_is_better in _ROWS:
            d, one = statistics.median(got["default"][key]), statistics.median(got["1"][key])
            speed = d / one if higher_is_better else one / d
            digits = 0 if higher_is_better and d >= 100 else (1 if higher_is_better else 3)
            lines.append(
                f"| {'busy' if busy else 'idle'} | {label} | {d:.{digits}f} | {one:.{digits}f} | {speed:.2f}x |"
            )
    return "\n".join(lines) + "\n"


EXTRACTION_LAYOUTS = {
    "default (auto): one BF16/Q8_0 copy, the LoRA at run time": {},
    "`pocket-agent extract`: the adapter merged into that copy": {"merge_adapter": "extract"},
    "speed: merged, split weights (the default before)": {"layout": "speed", "merge_adapter": "extract"},
    "lean: the Q4_1 file, the LoRA at run time": {"layout": "lean"},
}


def extraction_section(n_docs: int) -> str:
    """SROIE extraction (bench/extract.py's test receipts) on each layout in one process at 1
    thread, the layouts taking turns on every document (so a busy spell slows them alike)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from extract import Receipt, field_matches, load_docs

    from pocket_agent import extract_many
    from pocket_agent.runtime import load_model

    docs = load_docs(n_docs)
    models = {name: load_model(threads=1, **options) for name, options in EXTRACTION_LAYOUTS.items()}
    for m in models.values():  # warm-up: grammar compile, the adapter loaded
        list(extract_many([docs[0]["text"]], Receipt, model=m))
    names = list(models)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    exact = dict.fromkeys(names, 0)
    for i, doc in enumerate(docs):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            outcome = next(iter(extract_many([doc["text"]], Receipt, model=models[name])))
            seconds[name].append(time.perf_counter() - t0)
            value = outcome.value.model_dump() if outcome.ok and outcome.value is not None else None
            exact[name] += sum(field_matches(value, doc["expected"]).values())
    base = statistics.mean(seconds[names[0]])
    lines = ["| layout | s/doc | vs default | exact fields |", "|---|---|---|---|"]
    for name in names:
        mean = statistics.mean(seconds[name])
        lines.append(f"| {name} | {mean:.2f} | {mean / base:.2f}x | {exact[name]}/{4 * len(docs)} |")
    for m in models.values():
        m.close()
    return "\n".join(lines) + "\n"
