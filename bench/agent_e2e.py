"""Agents end to end, as a user would use them: pocket_agent's ``Agent`` against
llama-cpp-python's own ``chatml-function-calling`` loop, on the same model and the same tools.

Data (``bench/agent_e2e_tasks.py``; ``--check`` prints the counts): 121 tasks over eleven
tool sets of plain typed Python functions with docstrings over fixed tables (calculator,
currency, weather, geography, units, calendar, notes, contacts, stocks, dictionary,
timezone; two or three tools each, so the tool must be chosen by its description).
Kinds: *single* (one call), *multi-step* (two calls, independent or the second using the
first's result), *chit-chat* (the right action is no call), *failing tool* (the right
call raises, e.g. an unknown city; the right answer says it failed and invents no value).
About a third of the tasks are in Chinese.

Halves: the tasks sorted by (kind, language, tool set, SHA-1 of the id) alternate between
*dev* (for fitting or tuning anything) and *test* (the half to report), so each half holds
half of every kind x language stratum; ``--check`` verifies that both halves hold every
tool set, language and kind. Editing the task list can move tasks between halves.

Systems, each task run from scratch (the model loaded once per system):

  * *ours*: ``Agent(tools=[...functions...], model=m, limits=Limits(max_tokens, max_steps)).run(text)``
    with every default (scored routing, grounded arguments, the shipped tools adapter), one
    agent per tool set reused across its tasks; no instructions;
  * *llamacpp*: ``Llama(<same GGUF>, chat_format="chatml-function-calling")``'s
    ``create_chat_completion([system, user], tools=<specs built from the signatures and
    docstrings>, tool_choice="auto")``; its calls run on the same functions, each result is
    appended as ``{"role": "tool", "tool_call_id", "content"}`` and the loop repeats until it
    answers in text or ``--max-steps`` turns. The handler shows tools only with a system
    message (one line is given) and its completions ignore ``max_tokens``, so every
    completion is capped at ``--max-tokens``; an exception ends the task as a failure.

Scoring per task (``agent_e2e_tasks.py`` has the matchers):

  * *tool*: the names of all calls made, in order, equal the expected ones (none for chit-chat);
  * *args*: *tool* holds and every call has exactly the expected arguments, each acceptable:
    numbers within 0.006 or 0.05%, strings case-insensitive after trimming, entity names by
    the tool's own resolver ("美元" = "USD"), dates by the tool's date parser, expressions
    by their value;
  * *answer*: the final text states the result: every expected number appears (numbers read
    from the text with thousands separators, signs ignored, within 0.006 or 0.05%, so 2-decimal
    rounding passes) and one of each expected strings' options appears; for a failing tool,
    the answer contains a failure cue ("sorry", "unable", "not found", "无法", "找不到"...)
    and no number that neither the task nor the tool's error wrote; for chit-chat, any
    non-empty text;
  * *e2e*: all three.

A run without a text answer (no answer within ``--max-steps`` turns: ours raises
``MaxStepsExceeded``, the peer keeps calling; or an exception: a token budget, a peer crash)
keeps the calls it made and fails *answer*. The report also counts the calls made on
chit-chat, the runs of each ending, the calls that errored on tasks whose tools should not
fail, turns and wall seconds per task; ``--details`` gets every task's calls, results and answer.

    python bench/agent_e2e.py --check
    python bench/agent_e2e.py [--half test|dev|all] [--n N] [--threads 1] [--systems ours,llamacpp]
                              [--out bench/agent_e2e.md] [--details /tmp/agent_e2e_details.jsonl]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import inspect
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import agent_e2e_tasks as data
from agent_e2e_tasks import Task

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("ours", "llamacpp")
SYSTEM_PROMPT = "You are a helpful assistant that can call functions."
DEFAULT_DETAILS = Path("/tmp/agent_e2e_details.jsonl")
ROWS = (
    ("single", lambda t: t.kind == "single"),
    ("multi-step", lambda t: t.kind == "multi"),
    ("chit-chat", lambda t: t.kind == "chitchat"),
    ("failing tool", lambda t: t.kind == "error"),
    ("English", lambda t: t.lang == "en"),
    ("Chinese", lambda t: t.lang == "zh"),
    ("all", lambda t: True),
)
MEASURES = ("tool", "args", "answer", "e2e")


# --- halves -------------------------------------------------------------------------------------


def _digest(task_id: str) -> str:
    return hashlib.sha1(task_id.encode("utf-8")).hexdigest()


def halves(tasks: Sequence[Task] = data.TASKS) -> dict[str, str]:
    """``{task id: "dev" | "test"}``: tasks sorted by (kind, language, tool set, SHA-1 of id) alternate."""
    order = sorted(tasks, key=lambda t: (t.kind, t.lang, t.toolset, _digest(t.id)))
    return {t.id: ("dev" if i % 2 == 0 else "test") for i, t in enumerate(order)}


def select(half: str, n: int | None = None, ids: str | None = None) -> list[Task]:
    """The tasks of ``half`` (``all``: both) in SHA-1 order (which mixes kinds), the first ``n``."""
    split = halves()
    tasks = [t for t in data.TASKS if half == "all" or split[t.id] == half]
    if ids:
        wanted = {i.strip() for i in ids.split(",") if i.strip()}
        tasks = [t for t in tasks if t.id in wanted]
    tasks.sort(key=lambda t: _digest(t.id))
    return tasks if n is None else tasks[:n]


# --- tool specs for the peer ----------------------------------------------------------------------

_JSON_TYPES = {str: "string", float: "number", int: "integer", bool: "boolean"}


def parse_doc(doc: str | None) -> tuple[str, dict[str, str]]:
    """A Google-style docstring's summary (first paragraph) and ``Args:`` descriptions."""
    text = inspect.cleandoc(doc or "")
    summary = " ".join(text.split("\n\n", 1)[0].split())
    args: dict[str, str] = {}
    section = re.search(r"^Args:\s*\n((?:[ \t]+.*\n?)+)", text, re.MULTILINE)
    if section:
        for m in re.finditer(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.+)$", section.group(1), re.MULTILINE):
            args[m.group(1)] = m.group(2).strip()
    return summary, args


def openai_spec(fn: Callable[..., Any]) -> dict[str, Any]:
    """An OpenAI tool spec from a typed function's signature and docstring."""
    hints = get_type_hints(fn)
    summary, arg_docs = parse_doc(fn.__doc__)
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, p in inspect.signature(fn).parameters.items():
        node: dict[str, Any] = {"type": _JSON_TYPES[hints[name]]}
        if name in arg_docs:
            node["description"] = arg_docs[name]
        props[name] = node
        if p.default is inspect.Parameter.empty:
            required.append(name)
    params = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": fn.__name__, "description": summary, "parameters": params}}


def execute(tools: dict[str, Callable[..., Any]], name: str, arguments: Any) -> tuple[str, str]:
    """Run one peer call on the task's functions: ``(status, content)``, errors as the text
    ``Error: <type>: <message>`` (what pocket_agent's loop feeds back too)."""
    fn = tools.get(name)
    if fn is None:
        return "error", f"Error: there is no tool named {name!r}."
    if not isinstance(arguments, dict):
        return "error", f"Error: the arguments of {name} are not a JSON object."
    try:
        out = fn(**arguments)
    except Exception as exc:
        return "error", f"Error: {type(exc).__name__}: {exc}"
    return "ok", out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)


# --- runs -----------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one system did on one task."""

    calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments", "status", "content"}
    final: str | None = None
    stop: str = "answer"  # "answer", "max_turns" (no text answer within --max-steps) or "exception"
    turns: int = 0
    seconds: float = 0.0
    error: str = ""


def run_ours(agents: dict[str, Any], model: Any, task: Task, max_tokens: int, max_steps: int) -> Run:
    """pocket_agent's default ``Agent`` on the task (one agent per tool set, reused)."""
    from pocket_agent import Agent, Limits
    from pocket_agent.errors import MaxStepsExceeded

    agent = agents.get(task.toolset)
    if agent is None:
        limits = Limits(max_tokens=max_tokens, max_steps=max_steps)
        agent = agents[task.toolset] = Agent(tools=data.TOOLSETS[task.toolset], model=model, limits=limits)
    run = Run()

    def on_event(ev: Any) -> None:
        if ev.kind == "tool_call" and ev.call is not None:
            run.calls.append({"name": ev.call.name, "arguments": dict(ev.call.arguments), "status": "", "content": ""})
        elif ev.kind == "tool_result" and ev.result is not None and run.calls:
            run.calls[-1].update(status=ev.result.status, content=ev.result.content)
        elif ev.kind == "step":
            run.turns += 1

    t0 = time.perf_counter()
    try:
        result = agent.run(task.text, on_event=on_event)
        final = result.final
        run.final = final if isinstance(final, str) else json.dumps(final, ensure_ascii=False, default=str)
    except MaxStepsExceeded as exc:
        run.stop, run.error = "max_turns", f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # any failure of the library counts against it; the bench goes on
        run.stop, run.error = "exception", f"{type(exc).__name__}: {exc}"[:300]
    run.seconds = time.perf_counter() - t0
    return run


def make_peer(model_path: Path, threads: int, max_tokens: int) -> Any:
    """llama-cpp-python's ``Llama`` with ``chatml-function-calling``, every completion capped."""
    from _env import guard_peer_llama
    from llama_cpp import Llama

    guard_peer_llama()

    class CappedLlama(Llama):  # type: ignore[misc]
        """Every completion the chat handler starts is capped at ``max_tokens`` (its argument
        and message completions pass ``max_tokens=None``)."""

        def create_completion(self, *args: Any, **kwargs: Any) -> Any:
            mt = kwargs.get("max_tokens")
            kwargs["max_tokens"] = max_tokens if mt is None or mt <= 0 else min(mt, max_tokens)
            return super().create_completion(*args, **kwargs)

    return CappedLlama(
        model_path=str(model_path),
        chat_format="chatml-function-calling",
        n_ctx=4096,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


def run_peer(llm: Any, task: Task, max_tokens: int, max_steps: int) -> Run:
    """llama-cpp-python's loop: complete, run the calls, append the results, until a text answer."""
    fns = data.TOOLSETS[task.toolset]
    tools = {f.__name__: f for f in fns}
    specs = [openai_spec(f) for f in fns]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.text},
    ]
    run = Run()
    t0 = time.perf_counter()
    try:
        for _ in range(max_steps):
            resp = llm.create_chat_completion(
                messages=messages, tools=specs, tool_choice="auto", max_tokens=max_tokens, temperature=0.0
            )
            run.turns += 1
            msg = resp["choices"][0]["message"]
            tool_calls = msg.get("tool_calls") or []
            if not tool_calls:
                run.final = msg.get("content") or ""
                break
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            for tc in tool_calls:
                name, raw = tc["function"]["name"], tc["function"]["arguments"]
                try:
                    arguments = json.loads(raw)
                except (json.JSONDecodeError, TypeError):
                    arguments = raw
                status, content = execute(tools, name, arguments)
                run.calls.append({"name": name, "arguments": arguments, "status": status, "content": content})
                messages.append({"role": "tool", "tool_call_id": tc.get("id", ""), "content": content})
        else:
            run.stop, run.error = "max_turns", f"no text answer within {max_steps} turns"
    except Exception as exc:  # the peer's own failures (grammar build, context overflow) count as wrong
        run.stop, run.error = "exception", f"{type(exc).__name__}: {exc}"[:300]
    run.seconds = time.perf_counter() - t0
    return run


# --- scoring --------------------------------------------------------------------------------------


def score(task: Task, run: Run) -> dict[str, bool]:
    """The four per-task verdicts (see the module docs)."""
    names = [c["name"] for c in run.calls]
    tool_ok = names == [c.name for c in task.calls]
    args_ok = tool_ok and all(
        isinstance(made["arguments"], dict)
        and set(made["arguments"]) == set(want.args)
        and all(data.argument_matches(made["arguments"][k], v) for k, v in want.args.items())
        for made, want in zip(run.calls, task.calls, strict=False)
    )
    texts = [c.get("content", "") for c in run.calls]
    final = run.final or ""
    answer_ok = run.final is not None and all(req.holds(final, task, texts) for req in task.answer)
    return {"tool": tool_ok, "args": args_ok, "answer": answer_ok, "e2e": tool_ok and args_ok and answer_ok}


# --- environment ----------------------------------------------------------------------------------


def machine() -> str:
    """CPU model (``lscpu``), cores and load."""
    from _env import cpu_model

    cpu = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout
        cpu = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except (OSError, subprocess.SubprocessError):
        pass
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.machine()}, {cpu or cpu_model()}, {os.cpu_count()} cores, load {load} at start"
    )


def versions() -> dict[str, str]:
    """pocket_agent's git commit (``-dirty`` with local changes), package versions."""
    from importlib.metadata import version

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "?"
    if git("status", "--porcelain", "--", "pocket_agent"):
        commit += "-dirty"
    out = {"pocket_agent commit": commit, "python": platform.python_version()}
    for pkg in ("pocket-agent-mnn", "llama_cpp_python", "llguidance"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "?"
    return out


def adapter_note(model: Any) -> str:
    """Which tools LoRA the default agent switches on for the model."""
    try:
        from pocket_agent.runtime.task_adapters import find_shipped_adapter

        path = find_shipped_adapter(model, "tools")
    except Exception as exc:  # the note is informative only
        return f"unknown ({type(exc).__name__})"
    return "none (base weights)" if path is None else f"`{Path(path).name}` (shipped)"


# --- report ---------------------------------------------------------------------------------------


def _cell(hits: int, n: int) -> str:
    return f"{hits}/{n} ({100 * hits / n:.0f}%)" if n else "-"


def table(records: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[str]:
    """Markdown rows: per category, each system's tool / args / answer / e2e."""
    header = "| category | n | " + " | ".join(f"{s} {m}" for s in systems for m in MEASURES) + " |"
    lines = [header, "|---|---:|" + "---:|" * (len(systems) * len(MEASURES))]
    tasks = {t.id: t for t in data.TASKS}
    for label, pick in ROWS:
        rs = [r for r in records if pick(tasks[r["id"]])]
        if not rs:
            continue
        cells = [label if label != "all" else "**all**", str(len(rs))]
        for s in systems:
            for m in MEASURES:
                cells.append(_cell(sum(r[s]["score"][m] for r in rs), len(rs)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def behaviour(records: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[str]:
    """Markdown rows: calls made on chit-chat, tasks that raised, calls that raised, seconds."""
    tasks = {t.id: t for t in data.TASKS}
    chat = [r for r in records if tasks[r["id"]].kind == "chitchat"]
    lines = [
        "| system | calls made on chit-chat | chit-chat tasks with a call | no text answer within the turn limit | "
        "runs that raised | calls that errored (failing-tool tasks excluded) | turns/task | s/task |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in systems:
        calls_on_chat = sum(len(r[s]["calls"]) for r in chat)
        chat_with_call = sum(1 for r in chat if r[s]["calls"])
        max_turns = sum(1 for r in records if r[s]["stop"] == "max_turns")
        raised = sum(1 for r in records if r[s]["stop"] == "exception")
        errored = sum(
            1
            for r in records
            if tasks[r["id"]].kind != "error"
            for c in r[s]["calls"]
            if c.get("status") not in ("ok", "")
        )
        n = len(records)
        turns = sum(r[s]["turns"] for r in records) / n
        secs = sum(r[s]["seconds"] for r in records) / n
        lines.append(
            f"| {s} | {calls_on_chat} | {chat_with_call}/{len(chat)} | {max_turns} | {raised} | {errored} | "
            f"{turns:.1f} | {secs:.1f} |"
        )
    return lines


def report(meta: dict[str, Any], records: Sequence[dict[str, Any]]) -> str:
    systems: list[str] = meta["systems"]
    md = [
        "# Agents end to end: pocket_agent `Agent` vs llama-cpp-python `chatml-function-calling`",
        "",
        f"Date {meta['date']}. Machine: {meta['machine']}.",
        *[
            f"System {k[len('commit_') :]} ran pocket_agent at commit {v}."
            for k, v in meta.items()
            if k.startswith("commit_")
        ],
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        f"Model: `{meta['model']}` (the embedded default), greedy, {meta['threads']} thread(s); ours runs it as its "
        f"runtime loads it ({meta.get('ours_weights', '?')}), with the tools adapter {meta.get('adapter', '?')}; "
        "the peer loads the GGUF file as shipped.",
        f"Settings: at most {meta['max_tokens']} tokens per turn (ours) / per completion (peer), "
        f"at most {meta['max_steps']} turns per task. Run time {meta['minutes']} min.",
        f"Tasks: `bench/agent_e2e_tasks.py`, half `{meta['half']}`"
        + (f", first {meta['n']} in SHA-1 order" if meta.get("n") else "")
        + (f", ids {meta['ids']}" if meta.get("ids") else "")
        + f": {len(records)} tasks.",
        "",
    ]
    split = halves()
    parts = ["dev", "test"] if meta["half"] == "all" else [meta["half"]]
    for part in parts:
        rs = [r for r in records if split[r["id"]] == part]
        if not rs:
            continue
        md += [f"## {part} half ({len(rs)} tasks)", "", *table(rs, systems), "", *behaviour(rs, systems), ""]
    md += [
        "- *tool*: the calls' names in order equal the expected ones (no call on chit-chat); *args*: and every "
        "argument is acceptable (numbers within 0.006 or 0.05%, strings case-insensitive, names through the "
        "tool's own resolver, so `美元` = `USD`); *answer*: the final text states the result (each expected "
        "number, signs ignored, within 0.006 or 0.05%; one of each expected strings' options); for a failing "
        "tool a failure cue and no number the task or the error did not write; for chit-chat any text); "
        "*e2e*: all three.",
        "- *calls made on chit-chat*: the total number of calls on tasks whose right action is none.",
        "- *s/task*: wall seconds per task; compare the systems of one run, not runs.",
        "- The peer's handler as shipped (llama-cpp-python `chatml-function-calling`) renders a `tool` message "
        "as its role header only, without its content, so the peer never sees a tool's result or error; it "
        "shows each tool's parameter schema but not its description, and renders earlier calls' arguments "
        "HTML-escaped (`&#34;city&#34;`).",
        "",
        "Reproduce: `python bench/agent_e2e.py --half "
        + meta["half"]
        + (f" --n {meta['n']}" if meta.get("n") else "")
        + f" --threads {meta['threads']} --systems {','.join(systems)} --out bench/agent_e2e.md`.",
    ]
    return "\n".join(md) + "\n"


# --- check ----------------------------------------------------------------------------------------


def check() -> list[str]:
    """Data and scorer self-checks that need no model."""
    problems = list(data.check())
    tasks = data.TASKS
    n = len(tasks)
    zh = sum(t.lang == "zh" for t in tasks)
    if n < 80:
        problems.append(f"only {n} tasks")
    if len(data.TOOLSETS) < 8:
        problems.append(f"only {len(data.TOOLSETS)} tool sets")
    if zh < 0.25 * n:
        problems.append(f"only {zh}/{n} Chinese tasks")
    if sum(t.kind == "chitchat" for t in tasks) < 10:
        problems.append("fewer than 10 chit-chat tasks")
    split = halves()
    for part in ("dev", "test"):
        mine = [t for t in tasks if split[t.id] == part]
        for attr, wanted in (("toolset", set(data.TOOLSETS)), ("lang", {"en", "zh"}), ("kind", set(data.KINDS))):
            missing = wanted - {getattr(t, attr) for t in mine}
            if missing:
                problems.append(f"{part} half lacks {attr} {sorted(missing)}")
    # the scorer on hand-made answers
    by_id = {t.id: t for t in tasks}
    cases: list[tuple[str, str, list[str], bool]] = [
        ("cur-zh-2", "500人民币约等于10,416.67日元。", [], True),
        ("cur-zh-2", "About 10416.7 yen.", [], True),
        ("cur-zh-2", "About 10,400 yen.", [], False),
        ("stk-en-3", "TSLA fell 3.1% today.", [], True),
        ("geo-en-1", "The capital of Australia is Canberra.", [], True),
        ("geo-en-1", "It is Sydney.", [], False),
        ("dict-zh-2", "猫 in English is cat.", [], True),
        ("dict-zh-2", "It is a category.", [], False),
        ("wx-en-err", "Sorry, I couldn't find weather data for Atlantis.", ["Error: ValueError: unknown city"], True),
        ("wx-en-err", "Sorry, it is 21 °C in Atlantis.", ["Error: ValueError: unknown city"], False),
        ("wx-en-err", "It is sunny in Atlantis.", ["Error: ValueError: unknown city"], False),
        ("cal-en-err", "2024-02-30 is not a valid date.", ["Error: ValueError: not a valid date: '2024-02-30'"], True),
        ("calc-en-chat", "You're welcome!", [], True),
        ("calc-en-chat", "  ", [], False),
    ]
    for tid, answer, texts, want in cases:
        got = all(req.holds(answer, by_id[tid], texts) for req in by_id[tid].answer)
        if got != want:
            problems.append(f"scorer: {tid} {answer!r} -> {got}, expected {want}")
    t = by_id["cur-en-1"]
    good = Run(calls=[{"name": "convert_currency", "arguments": {"amount": 100, "src": "dollars", "dst": "eur"}}])
    good.final = "100 USD is 92.00 EUR."
    if not score(t, good)["e2e"]:
        problems.append("scorer: a right run of cur-en-1 is not e2e")
    wrong = Run(calls=[{"name": "calculate", "arguments": {"expression": "100 * 0.92"}}], final="92")
    if score(t, wrong)["tool"]:
        problems.append("scorer: calculate for a currency question counts as the right tool")
    # every function becomes a peer spec and a pocket_agent tool
    for fns in data.TOOLSETS.values():
        for fn in fns:
            spec = openai_spec(fn)["function"]
            if not spec["description"] or set(spec["parameters"]["properties"]) != set(
                inspect.signature(fn).parameters
            ):
                problems.append(f"spec of {fn.__name__} is incomplete")
    try:
        from pocket_agent import tool

        for fns in data.TOOLSETS.values():
            for fn in fns:
                tool(fn)
    except Exception as exc:
        problems.append(f"pocket_agent.tool rejects a function: {type(exc).__name__}: {exc}")
    return problems


def summary() -> str:
    """Counts of tasks per kind x language and half."""
    split = halves()
    lines = ["| kind | en dev | en test | zh dev | zh test | total |", "|---|---:|---:|---:|---:|---:|"]
    for kind in data.KINDS:
        cells = [
            sum(1 for t in data.TASKS if t.kind == kind and t.lang == lang and split[t.id] == part)
            for lang in ("en", "zh")
            for part in ("dev", "test")
        ]
        lines.append(f"| {kind} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} |")
    n = len(data.TASKS)
    zh = sum(t.lang == "zh" for t in data.TASKS)
    lines.append(f"\n{n} tasks, {len(data.TOOLSETS)} tool sets, {zh} Chinese ({100 * zh / n:.0f}%)")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------


def collect(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the chosen systems on the chosen tasks."""
    from pocket_agent.runtime import default_model_path, load_model

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    tasks = select(args.half, args.n, args.ids)
    model_path = default_model_path()
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "versions": versions(),
        "model": model_path.name,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "max_steps": args.max_steps,
        "half": args.half,
        "n": args.n,
        "ids": args.ids,
        "systems": systems,
    }
    runs: dict[str, dict[str, Run]] = {t.id: {} for t in tasks}
    t_all = time.perf_counter()
    if "ours" in systems:
        model = load_model(model_path, threads=args.threads)
        meta["ours_weights"] = getattr(getattr(model, "info", None), "extra", {}).get("quantization", "?")
        meta["adapter"] = adapter_note(model)
        agents: dict[str, Any] = {}
        for t in tasks:
            runs[t.id]["ours"] = run_ours(agents, model, t, args.max_tokens, args.max_steps)
            _progress(args, "ours", t, runs[t.id]["ours"])
        model.close()
        print(" ours", flush=True)
    if "llamacpp" in systems:
        llm = make_peer(model_path, args.threads, args.max_tokens)
        for t in tasks:
            runs[t.id]["llamacpp"] = run_peer(llm, t, args.max_tokens, args.max_steps)
            _progress(args, "llamacpp", t, runs[t.id]["llamacpp"])
        llm.close()
        print(" llamacpp", flush=True)
    meta["minutes"] = round((time.perf_counter() - t_all) / 60, 1)
    split = halves()
    records = []
    for t in tasks:
        rec: dict[str, Any] = {"id": t.id, "half": split[t.id], "kind": t.kind, "lang": t.lang, "text": t.text}
        for s in systems:
            run = runs[t.id][s]
            rec[s] = {**asdict(run), "seconds": round(run.seconds, 2), "score": score(t, run)}
        records.append(rec)
    return meta, records


def merge_details(paths: Sequence[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The records of several ``--details`` files side by side (the first file's tasks and meta;
    each later file adds the systems the earlier ones lack, on the tasks it shares)."""
    meta: dict[str, Any] = {}
    by_id: dict[str, dict[str, Any]] = {}
    for path in paths:
        lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        file_meta, records = lines[0]["meta"], lines[1:]
        if not meta:
            meta = dict(file_meta)
            by_id = {r["id"]: r for r in records}
            continue
        added = [s for s in file_meta["systems"] if s not in meta["systems"]]  # a system already there stays
        meta["systems"] = [*meta["systems"], *added]
        meta["minutes"] = round(meta.get("minutes", 0) + file_meta.get("minutes", 0), 1)
        meta.update({k: v for k, v in file_meta.items() if k.startswith("commit_")})
        for r in records:
            if r["id"] in by_id:
                by_id[r["id"]].update({s: r[s] for s in added if s in r})
    return meta, list(by_id.values())


def _progress(args: argparse.Namespace, system: str, task: Task, run: Run) -> None:
    if args.verbose:
        calls = [(c["name"], c["arguments"]) for c in run.calls]
        msg = f"[{system}] {task.id}: {score(task, run)} calls={calls} final={run.final!r} {run.error}"
        print(msg[:500], flush=True)
    else:
        print(".", end="", flush=True)


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="check the task data and the scorer (no model), then exit")
    ap.add_argument("--half", choices=("dev", "test", "all"), default="test")
    ap.add_argument("--n", type=int, default=None, help="only the first N tasks of the half (SHA-1 order; smoke runs)")
    ap.add_argument("--ids", default=None, help="only these task ids (comma-separated)")
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest on a shared 2-core machine")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: ours, llamacpp")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per turn (ours) / per completion (peer)")
    ap.add_argument("--max-steps", type=int, default=4, help="most model turns per task")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here (e.g. bench/agent_e2e.md)")
    ap.add_argument("--details", type=Path, default=DEFAULT_DETAILS, help="per-task JSONL (meta line first)")
    ap.add_argument(
        "--from-details",
        type=Path,
        nargs="+",
        default=None,
        help="rebuild the report from --details files (several: their systems side by side, matched by task id)",
    )
    ap.add_argument(
        "--label",
        default="ours",
        help="name the ours system in the details and report (e.g. ours-main for a run of another checkout)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)

    if args.check:
        problems = check()
        print(summary())
        for p in problems:
            print("PROBLEM:", p)
        print("check: ok" if not problems else f"check: {len(problems)} problem(s)")
        return 0 if not problems else 1
    if args.from_details:
        meta, records = merge_details(args.from_details)
    else:
        meta, records = collect(args)
        if args.label != "ours":
            meta["systems"] = [args.label if s == "ours" else s for s in meta["systems"]]
            import pocket_agent

            where = Path(pocket_agent.__file__).resolve().parent
            head = subprocess.run(
                ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            )
            meta[f"commit_{args.label}"] = f"{head.stdout.strip() or '?'} ({where.parent})"
            for r in records:
                if "ours" in r:
                    r[args.label] = r.pop("ours")
        args.details.parent.mkdir(parents=True, exist_ok=True)
        with args.details.open("w", encoding="utf-8") as f:
            f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
        print(f"details: {args.details}")
    md = report(meta, records)
    print()
    print(md)
    if args.out:
        args.out.write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
