"""BFCL function calling: pocket_agent's Agent.step against llama-cpp-python's own
``chatml-function-calling`` handler, on the same model.

For every question of a category (first ``--n`` rows of ``../shared/data/bfcl/<category>.jsonl``)
both systems see the question's function specs and produce their first action:

  * pocket_agent: ``Agent(tools=[Tool.from_openai(spec) ...], model=m).step(question)``;
  * peer: ``Llama(..., chat_format="chatml-function-calling").create_chat_completion(
    [system, *question], tools=..., tool_choice="auto")`` (the handler shows tools only when
    the conversation has a system message, so the same one-line system message is added).
    Its argument completions ignore ``max_tokens``; a thin ``Llama`` subclass caps every
    completion at ``--max-tokens`` so a runaway argument cannot fill the context.

Scoring follows BFCL's AST checker: the function name must match; every parameter the model
gives must exist and its value must be in the acceptable list (strings compared after BFCL's
standardisation: spaces and ``,./-_*^`` removed, lower case; ints accepted for floats);
parameters whose acceptable list holds ``""`` may be omitted, all others are required; the
number of calls must equal the ground truth's; parallel categories match calls order-free;
``irrelevance`` is correct when no function is called.

Well-formed: every call parses, names one of the question's functions, and its arguments
validate (``jsonschema``) against the function's schema normalised to standard JSON Schema
(BFCL ``dict``/``float``/``tuple``... mapped, objects closed).

    python bench/bfcl.py [--n 10] [--categories simple_python,...] [--threads 2] [--out bench/bfcl.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "bfcl"
CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "irrelevance"]
SYSTEM = "You are a helpful assistant that can call functions."

Call = tuple[str, dict[str, Any]]


# --- BFCL checker ------------------------------------------------------------------------


def standardize(s: str) -> str:
    """BFCL's string normalisation before comparing values."""
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", s).lower().replace("'", '"')


def value_matches(value: Any, acceptable: Any) -> bool:
    """Whether ``value`` equals one acceptable value (BFCL rules, recursively)."""
    if isinstance(acceptable, str) and isinstance(value, str):
        return standardize(value) == standardize(acceptable)
    if isinstance(acceptable, bool) or isinstance(value, bool):
        return isinstance(acceptable, bool) and isinstance(value, bool) and value == acceptable
    if isinstance(acceptable, (int, float)) and isinstance(value, (int, float)):
        # ints are accepted where floats are expected; a float is not an int.
        if isinstance(acceptable, int) and isinstance(value, float):
            return False
        return float(value) == float(acceptable)
    if isinstance(acceptable, list) and isinstance(value, (list, tuple)):
        return len(value) == len(acceptable) and all(
            value_matches(v, a) for v, a in zip(value, acceptable, strict=True)
        )
    if isinstance(acceptable, dict) and isinstance(value, dict):
        # A ground-truth dict maps each key to its list of acceptable values ("" = optional).
        for k, options in acceptable.items():
            opts = options if isinstance(options, list) else [options]
            if k not in value:
                if "" not in opts:
                    return False
                continue
            if not any(value_matches(value[k], o) for o in opts if o != ""):
                return False
        return all(k in acceptable for k in value)
    return bool(value == acceptable)


def call_matches(call: Call, expected: dict[str, dict[str, list[Any]]]) -> bool:
    """One model call against one ground-truth entry ``{name: {param: [acceptable...]}}``."""
    ((gt_name, gt_params),) = expected.items()
    name, args = call
    if name != gt_name:
        return False
    for p in args:
        if p not in gt_params:
            return False
    for p, options in gt_params.items():
        if p not in args:
            if "" not in options:
                return False
            continue
        if not any(value_matches(args[p], o) for o in options if o != ""):
            return False
    return True


def score(category: str, calls: list[Call], ground_truth: list[dict[str, Any]] | None) -> bool:
    """BFCL correctness of a model's first action."""
    if category == "irrelevance":
        return not calls
    gt = ground_truth or []
    if len(calls) != len(gt):
        return False
    if category in ("parallel", "parallel_multiple"):
        # order-free: some assignment of model calls to ground-truth entries must match
        if len(gt) > 6:
            used: set[int] = set()
            for exp in gt:
                hit = next((i for i, c in enumerate(calls) if i not in used and call_matches(c, exp)), None)
                if hit is None:
                    return False
                used.add(hit)
            return True
        return any(
            all(call_matches(c, e) for c, e in zip(perm, gt, strict=True)) for perm in itertools.permutations(calls)
        )
    return all(call_matches(c, e) for c, e in zip(calls, gt, strict=True))


def well_formed(calls: list[tuple[str, Any]], validators: dict[str, Any]) -> bool:
    """Every call names a known function and its arguments are a schema-valid object."""
    for name, args in calls:
        v = validators.get(name)
        if v is None or not isinstance(args, dict) or not v.is_valid(args):
            return False
    return True


# --- systems -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    calls: list[tuple[str, Any]] = field(default_factory=list)
    correct: bool = False
    wellformed: bool = True
    seconds: float = 0.0
    error: str = ""
    routing: dict[str, float] = field(default_factory=dict)


GROUNDED: dict[str, Any] = {"true": True, "all": "all", "false": False}


def load_rows(category: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    path = DATA / f"{category}.jsonl"
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line, _ in zip(f, range(start + n), strict=False)]
    return rows[start:]


def run_ours(
    model: Any,
    row: dict[str, Any],
    max_tokens: int,
    call_threshold: float | None = None,
    grounded: Any = True,
    adapter: Any = "auto",
) -> Outcome:
    """The DEFAULT agent (scored routing, grounded arguments); ``call_threshold`` only for the
    optional ``ours+thr`` comparison column."""
    from pocket_agent.errors import PocketAgentError
    from pocket_agent.tools import Agent, Tool

    tools = [Tool.from_openai(f) for f in row["function"]]
    agent = Agent(
        tools=tools,
        model=model,
        max_tokens=max_tokens,
        call_threshold=call_threshold,
        grounded=grounded,
        adapter=adapter,
    )
    t0 = time.perf_counter()
    try:
        step = agent.step(row["question"][0])
    except PocketAgentError as exc:
        return Outcome(calls=[], seconds=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:200])
    out = Outcome(calls=[(c.name, c.arguments) for c in step.tool_calls], seconds=time.perf_counter() - t0)
    if step.routing is not None:
        out.routing = {k: round(v, 3) for k, v in step.routing.scores.items()}
    return out


def make_peer(model_path: Path, threads: int, max_tokens: int) -> Any:
    from _env import guard_peer_llama
    from llama_cpp import Llama

    guard_peer_llama()

    class CappedLlama(Llama):  # type: ignore[misc]
        """Every completion the chat handler starts is capped at ``max_tokens``."""

        def create_completion(self, *args: Any, **kwargs: Any) -> Any:
            mt = kwargs.get("max_tokens")
            kwargs["max_tokens"] = max_tokens if mt is None or mt <= 0 else min(mt, max_tokens)
            return super().create_completion(*args, **kwargs)

    return CappedLlama(
        str(model_path),
        chat_format="chatml-function-calling",
        n_ctx=4096,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


def run_peer(llm: Any, row: dict[str, Any], max_tokens: int) -> Outcome:
    from pocket_agent.tools import Tool

    tools = [Tool.from_openai(f).to_openai() for f in row["function"]]
    messages = list(row["question"][0])
    if not messages or messages[0].get("role") != "system":
        messages = [{"role": "system", "content": SYSTEM}, *messages]
    t0 = time.perf_counter()
    try:
        resp = llm.create_chat_completion(
            messages=messages, tools=tools, tool_choice="auto", max_tokens=max_tokens, temperature=0.0
        )
    except Exception as exc:  # the peer's own failures (grammar build, context) count as wrong
        return Outcome(calls=[], wellformed=False, seconds=time.perf_counter() - t0, error=repr(exc)[:200])
    elapsed = time.perf_counter() - t0
    msg = resp["choices"][0]["message"]
    calls: list[tuple[str, Any]] = []
    ok = True
    for tc in msg.get("tool_calls") or []:
        fn = tc["function"]
        try:
            args = json.loads(fn["arguments"])
        except (json.JSONDecodeError, TypeError):
            args, ok = fn["arguments"], False
        calls.append((fn["name"], args))
    return Outcome(calls=calls, wellformed=ok, seconds=elapsed)


# --- main ---------------------------------------------------------------------------------------


def _validators(row: dict[str, Any]) -> dict[str, Any]:
    import jsonschema

    from pocket_agent.tools import Tool

    out = {}
    for f in row["function"]:
        params = Tool.from_openai(f).parameters
        out[f["name"]] = jsonschema.Draft202012Validator(params)
    return out


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("pocket-agent-mnn", "llama_cpp_python", "llguidance", "pydantic", "jsonschema"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "?"
    return out


def machine() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ""
    try:
        load = ", load avg at start " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        pass
    from _env import guard_peer_llama

    buffers = guard_peer_llama()
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{load}; llama.cpp {buffers}"


def _adapter_note(model: Any, adapter: Any) -> str:
    """Which tools LoRA *ours* runs with, and what it records (data, steps, routing constant)."""
    from pocket_agent.runtime.task_adapters import adapter_record, find_shipped_adapter

    path = find_shipped_adapter(model, "tools") if adapter == "auto" else adapter
    if path is None:
        return "none (base weights)"
    rec = adapter_record(path)
    return (
        f"`{Path(path).name}` (task {rec.get('task')}, {rec.get('steps')} steps, call_bias "
        f"{rec.get('call_bias', 'not recorded: routed on the base weights')}, more_calls_bias "
        f"{rec.get('more_calls_bias', 'not recorded')}; data: {rec.get('data', '?')})"
    )


def collect(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run every system on every sampled question; returns run metadata and per-question records."""
    from pocket_agent.runtime import default_model_path, load_model

    cats = [c.strip() for c in args.categories.split(",") if c.strip()]
    meta: dict[str, Any] = {
        "machine": machine(),
        "versions": versions(),
        "n": args.n,
        "start": args.start,
        "grounded": args.grounded,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "threshold": args.threshold,
        "categories": cats,
    }
    model_path = default_model_path()
    meta["model"] = model_path.name
    model = load_model(model_path, threads=args.threads)
    meta["ours_weights"] = model.info.extra.get("quantization", "?")
    peer = None if args.no_peer else make_peer(model_path, args.threads, args.max_tokens)
    names = (
        ["ours"]
        + (["ours-base"] if args.base else [])
        + (["ours+thr"] if args.threshold > 0 else [])
        + ([] if peer is None else ["peer"])
    )
    adapter = None if args.adapter == "none" else args.adapter
    meta["adapter"] = _adapter_note(model, adapter)
    meta["adapter_arg"] = args.adapter
    meta["systems"] = names
    records: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for cat in cats:
        for row in load_rows(cat, args.n, args.start):
            vals = _validators(row)
            systems = {"ours": run_ours(model, row, args.max_tokens, grounded=GROUNDED[args.grounded], adapter=adapter)}
            if args.base:
                systems["ours-base"] = run_ours(
                    model, row, args.max_tokens, grounded=GROUNDED[args.grounded], adapter=None
                )
            if args.threshold > 0:
                systems["ours+thr"] = run_ours(model, row, args.max_tokens, args.threshold)
            if peer is not None:
                systems["peer"] = run_peer(peer, row, args.max_tokens)
            gt = row.get("ground_truth") or []
            rec: dict[str, Any] = {"category": cat, "id": row["id"], "expected_calls": len(gt)}
            for name, o in systems.items():
                o.wellformed = o.wellformed and well_formed(o.calls, vals)
                parsed = [(n, a) for n, a in o.calls if isinstance(a, dict)]
                o.correct = len(parsed) == len(o.calls) and score(cat, parsed, row.get("ground_truth"))
                rec[name] = {
                    "calls": o.calls,
                    "correct": o.correct,
                    "wellformed": o.wellformed,
                    "unparsed": len(o.calls) - len(parsed),
                    "seconds": round(o.seconds, 2),
                    "error": o.error,
                    "routing": o.routing,
                }
            records.append(rec)
            if args.verbose:
                print(json.dumps(rec, ensure_ascii=False)[:400], flush=True)
            else:
                print(".", end="", flush=True)
        if not args.verbose:
            print(f" {cat}", flush=True)
    meta["minutes"] = round((time.perf_counter() - t_all) / 60, 1)
    model.close()
    return meta, records


def report(meta: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The markdown report: accuracy and well-formedness per category, then behaviour counts."""
    names: list[str] = meta["systems"]
    cats: list[str] = meta["categories"]
    header = "| category | n | " + " | ".join(f"{n} acc | {n} well-formed | {n} s/q" for n in names) + " |"
    lines = [header, "|" + "---|" * (2 + 3 * len(names))]
    totals = {n: [0, 0, 0.0] for n in names}
    for cat in cats:
        rs = [r for r in records if r["category"] == cat]
        if not rs:
            continue
        cells = [cat, str(len(rs))]
        for n in names:
            acc = sum(r[n]["correct"] for r in rs)
            wf = sum(r[n]["wellformed"] for r in rs)
            sec = sum(r[n]["seconds"] for r in rs)
            totals[n][0] += acc
            totals[n][1] += wf
            totals[n][2] += sec
            cells += [f"{acc / len(rs):.2f}", f"{wf}/{len(rs)}", f"{sec / len(rs):.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    nq = len(records)
    cells = ["**all**", str(nq)]
    for n in names:
        acc, wf, sec = totals[n]
        cells += [f"**{acc / nq:.2f}**", f"{wf}/{nq} ({100 * wf / nq:.0f}%)", f"{sec / nq:.1f}"]
    lines.append("| " + " | ".join(cells) + " |")

    calling = [r for r in records if r["category"] != "irrelevance"]
    irrel = [r for r in records if r["category"] == "irrelevance"]
    beh = [
        "| system | called a function (call categories) | wrong number of calls (when calling) | "
        "arguments not JSON (cut at the token cap) | not schema-valid | called on irrelevance | exceptions |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        called = [r for r in calling if r[n]["calls"]]
        wrong_count = sum(1 for r in called if len(r[n]["calls"]) != r["expected_calls"])
        unparsed = sum(1 for r in records if r[n]["unparsed"])
        invalid = sum(1 for r in records if not r[n]["wellformed"] and not r[n]["unparsed"])
        irr = sum(1 for r in irrel if r[n]["calls"])
        errs = sum(1 for r in records if r[n]["error"])
        beh.append(
            f"| {n} | {len(called)}/{len(calling)} | {wrong_count}/{len(called)} | {unparsed} | {invalid} | "
            f"{irr}/{len(irrel)} | {errs} |"
        )
    v = meta["versions"]
    slow = sum(1 for r in records if r["ours"]["seconds"] > 10)
    beh.append("")
    beh.append(
        f"Questions over 10 s (ours): {slow}/{len(records)}; "
        f"slowest {max(r['ours']['seconds'] for r in records):.1f} s."
    )
    weights_note = (
        f"both systems in one process; ours runs it as our runtime loads it ({meta['ours_weights']}: the BF16 or Q8_0 "
        "copy of `pocket_agent.runtime.layout`), the peer loads the file as shipped."
        if "ours_weights" in meta
        else "both systems on the same GGUF in one process."
    )
    md = [
        "# BFCL function calling: pocket_agent vs llama-cpp-python `chatml-function-calling`",
        "",
        f"Model: embedded default `{meta['model']}` (SmolLM2-135M-Instruct), greedy, {meta['threads']} thread(s), "
        + weights_note,
        f"Sample: rows {meta.get('start', 0)}-{meta.get('start', 0) + meta['n'] - 1} of each category of "
        "`shared/data/bfcl` (development split); "
        + ("" if meta.get("grounded", "true") == "true" else f"ours with `grounded={meta['grounded']}`; ")
        + f"token cap {meta['max_tokens']} per turn (ours) / per completion (peer).",
        f"Machine: {meta['machine']}. Run time {meta['minutes']} min for all systems.",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        "Systems: *ours* = "
        + (
            "the default `Agent(tools).step(question)`"
            if meta.get("adapter_arg", "auto") == "auto"
            else f"`Agent(tools, adapter=...).step(question)` (opt-in adapter: `--adapter {meta['adapter_arg']}`)"
        )
        + ": tool_choice auto, routed by the scored "
        "decision of `pocket_agent.tools.routing` (the model's probability of answering and of each tool's call, "
        "calibrated against a content-free question, one constant `CALL_BIAS` fitted by `bench/bfcl_calibrate.py` "
        "on rows 15-29 of every category, disjoint from the rows scored here; a tool needing a number the "
        "question does not state, or states only in units of another dimension, is not offered), "
        "string arguments grounded in the question, enums the question "
        "names narrowed and written, numbers cut short completed from the question, one call for a question "
        "that joins nothing, a call repeating an earlier one of the turn dropped; "
        + (
            f"*ours+thr* = the same with `call_threshold={meta['threshold']}` (call when the model puts at least "
            "that probability on starting a call); "
            if "ours+thr" in names
            else ""
        )
        + f"with the tools LoRA {meta.get('adapter', 'none (base weights)')}; "
        + (
            "*ours-base* = the same agent on the base weights (`adapter=None`, the routing constant of the base "
            "model); "
            if "ours-base" in names
            else ""
        )
        + "*peer* = llama-cpp-python `chatml-function-calling`, tool_choice auto, with a one-line "
        "system message (the handler shows tools only then), temperature 0, every completion capped at the "
        "token cap (its argument completions otherwise ignore `max_tokens`).",
        "",
        *lines,
        "",
        '- *acc*: BFCL AST rules (name; values in the acceptable lists, strings standardised; `""` = optional; '
        "call count; parallel categories order-free; irrelevance = no call).",
        "- *well-formed*: every call parses, names a given function and its arguments validate with "
        "`jsonschema` against the function's schema normalised to standard JSON Schema (BFCL `dict`/`float`/"
        "`tuple`... mapped, objects closed). A question answered without calls is well-formed.",
        "- *s/q*: wall seconds per question on a shared, busy 2-core machine: compare columns of one run, "
        "not runs. With 2 threads under contention llama.cpp slowed to ~0.3 decode tok/s (vs ~34 with 1).",
        "",
        "Behaviour:",
        "",
        *beh,
        "",
        "SmolLM2-135M was not tuned on the Qwen `<tool_call>` format, so left to sample its first token it rarely "
        "starts a call (0/50 on the call categories before routing; see git history of this file). The peer's "
        "first grammar offers only "
        "`functions.<name>:` or `message:`, and this model mostly picks a function, on call categories and "
        "`irrelevance` alike. `call_threshold` decides by the model's probability of starting a call instead "
        "of its argmax token. Every call our grammar admitted was schema-valid; the peer's failures are "
        "argument strings or arrays that ran on until the token cap.",
        "",
        f"Reproduce: `python bench/bfcl.py --n {meta['n']} --threads {meta['threads']}"
        + (" --base" if "ours-base" in names else "")
        + ("" if meta.get("adapter_arg", "auto") == "auto" else f" --adapter {meta['adapter_arg']}")
        + " --jsonl runs.jsonl "
        "--out bench/bfcl.md` (`--from-jsonl runs.jsonl` rebuilds the report without running).",
    ]
    return "\n".join(md) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10, help="questions per category (the first N rows)")
    ap.add_argument("--start", type=int, default=0, help="first row of each category (15+: calibration rows)")
    ap.add_argument(
        "--grounded", choices=sorted(GROUNDED), default="true", help="ours: Agent(grounded=...); default: the default"
    )
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest on a shared 2-core machine")
    ap.add_argument(
        "--threshold",
        type=float,
        default=0.0,
        help="also run ours with Agent(call_threshold=T) (the old opt-in threshold, e.g. 0.005); 0: skip",
    )
    ap.add_argument("--max-tokens", type=int, default=192, help="token cap per turn (ours) / per completion (peer)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python's handler")
    ap.add_argument("--adapter", default="auto", help="tools LoRA for ours: auto (shipped), none, or a .gguf path")
    ap.add_argument("--base", action="store_true", help="also run ours on the base weights (adapter=None)")
    ap.add_argument("--out", type=Path, default=None, help="write the report (markdown) here")
    ap.add_argument("--jsonl", type=Path, default=None, help="write the run (meta line + per-question records) here")
    ap.add_argument("--from-jsonl", type=Path, default=None, help="rebuild the report from a --jsonl file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)

    if args.from_jsonl:
        lines = [json.loads(x) for x in args.from_jsonl.read_text(encoding="utf-8").splitlines() if x.strip()]
        meta, records = lines[0]["meta"], lines[1:]
    else:
        meta, records = collect(args)
        if args.jsonl:
            with args.jsonl.open("w", encoding="utf-8") as f:
                f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
    md = report(meta, records)
    print()
    print(md)
    if args.out:
        args.out.write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
