"""Serving benchmark: `pocket-agent serve` vs llama-cpp-python's own server (`llama_cpp.server`).

8 concurrent clients x 5 requests each (mixed json_schema / tools / text), through the
official `openai` client, against each server in turn, on the same GGUF and thread count.
Every request is either answered, cleanly refused (an HTTP error with a JSON body), or lost
(connection error, timeout, unreadable reply). Structured answers are checked with
`jsonschema`: a json_schema reply must parse and validate, a tools reply must carry calls
whose arguments validate against the called tool's parameters.

Run (one benchmark at a time on a shared machine):

    flock /tmp/pocket-bench.lock python bench/serve.py            # writes bench/serve.md

The peer takes OpenAI's `tools` + `tool_choice` with `--chat_format chatml-function-calling`;
for structured output it takes its own `{"type": "json_object", "schema": ...}` form (its
server does not accept OpenAI's `json_schema` form; the script records what it answers to it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pocket_agent.runtime import default_model_path  # noqa: E402

SYSTEM = "You are a helpful assistant."
INVOICE = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string"},
        "company": {"type": "string"},
        "total": {"type": "number"},
    },
    "required": ["invoice_number", "company", "total"],
    "additionalProperties": False,
}
DOCS = [
    ("INV-2041", "ACME Ltd", "31.50"),
    ("INV-0007", "Blue Harbor Cafe", "12.00"),
    ("A-5591", "Northwind Traders", "249.99"),
    ("INV-3310", "Lotus Books", "8.75"),
    ("R-1188", "Green Valley Farm", "64.20"),
    ("INV-9002", "Sunrise Hardware", "102.40"),
    ("C-0420", "Metro Pharmacy", "19.95"),
    ("INV-7731", "Harbor Freight Co", "77.10"),
]
CURRENCIES = ["CNY", "EUR", "GBP", "JPY", "USD"]
CONVERT = {
    "type": "function",
    "function": {
        "name": "convert",
        "description": "Convert money between currencies.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "src": {"type": "string", "enum": CURRENCIES},
                "dst": {"type": "string", "enum": CURRENCIES},
            },
            "required": ["amount", "src", "dst"],
            "additionalProperties": False,
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [CONVERT, WEATHER]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CITIES = ["Paris", "Rome", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Seoul"]
KINDS = ["json_schema", "tools", "text", "json_schema", "tools"]


@dataclass(frozen=True)
class Req:
    client: int
    index: int
    kind: str
    body: dict[str, Any]


def requests_for(client: int, peer: bool, max_tokens: int) -> list[Req]:
    """The 5 requests of one client: json_schema, tools, text, json_schema, tools."""
    out = []
    for i, kind in enumerate(KINDS):
        k = (client + i) % len(DOCS)
        number, company, total = DOCS[k]
        messages = [{"role": "system", "content": SYSTEM}]
        body: dict[str, Any] = {"model": "local", "temperature": 0, "max_tokens": max_tokens}
        if kind == "json_schema":
            text = f"Invoice {number}\n{company}\nTotal due: {total} EUR\nThank you for your business."
            messages.append({"role": "user", "content": f"Extract the invoice fields as JSON.\n\n{text}"})
            if peer:
                body["response_format"] = {"type": "json_object", "schema": INVOICE}
            else:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "Invoice", "schema": INVOICE, "strict": True},
                }
        elif kind == "tools":
            if i == 1:
                messages.append({"role": "user", "content": f"How much is {total} EUR in {CURRENCIES[k % 5]}?"})
                body["tool_choice"] = {"type": "function", "function": {"name": "convert"}}
            else:
                messages.append({"role": "user", "content": f"What's the weather in {CITIES[k]}?"})
                body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
            body["tools"] = TOOLS
        else:
            messages.append({"role": "user", "content": f"Write one sentence about {CITIES[k]}."})
            body["max_tokens"] = min(max_tokens, 48)
        body["messages"] = messages
        out.append(Req(client, i, kind, body))
    return out


@dataclass
class Result:
    req: Req
    status: str  # answered | refused | lost
    latency_s: float
    valid: bool | None = None
    http: int | None = None
    detail: str = ""
    completion_tokens: int = 0
    finish: str = ""


def check(req: Req, completion: Any) -> tuple[bool, str]:
    """Whether an answer is what the request asked for."""
    choice = completion.choices[0]
    msg = choice.message
    if req.kind == "json_schema":
        try:
            jsonschema.validate(json.loads(msg.content or ""), INVOICE)
        except (ValueError, jsonschema.ValidationError) as exc:
            return False, f"not schema-valid: {str(exc)[:80]}"
        return True, ""
    if req.kind == "tools":
        calls = msg.tool_calls or []
        if not calls:
            return False, "no tool call"
        for c in calls:
            if c.function.name not in PARAMS:
                return False, f"unknown tool {c.function.name}"
            try:
                jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])
            except (ValueError, jsonschema.ValidationError) as exc:
                return False, f"arguments not valid: {str(exc)[:80]}"
        return True, ""
    return bool((msg.content or "").strip()), ""


def run_one(client: openai.OpenAI, req: Req) -> Result:
    t0 = time.perf_counter()
    try:
        completion = client.chat.completions.create(**req.body)
    except openai.APIStatusError as exc:
        shaped = isinstance(exc.body, dict)
        return Result(
            req,
            "refused" if shaped else "lost",
            time.perf_counter() - t0,
            http=exc.status_code,
            detail=str(exc)[:120],
        )
    except (openai.APIConnectionError, openai.APITimeoutError, ValueError) as exc:
        return Result(req, "lost", time.perf_counter() - t0, detail=f"{type(exc).__name__}: {str(exc)[:100]}")
    dt = time.perf_counter() - t0
    valid, why = check(req, completion)
    usage = completion.usage
    return Result(
        req,
        "answered",
        dt,
        valid=valid,
        http=200,
        detail=why,
        completion_tokens=usage.completion_tokens if usage else 0,
        finish=completion.choices[0].finish_reason or "",
    )


@dataclass
class SystemRun:
    name: str
    command: str
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    round: int = 1
    load: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def running(cmd: list[str], base: str, log: Path) -> Iterator[None]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{cmd[:4]} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}"
                )
            try:
                if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[:4]} did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def bench_system(name: str, cmd: list[str], port: int, peer: bool, args: argparse.Namespace, round_: int) -> SystemRun:
    base = f"http://127.0.0.1:{port}"
    run = SystemRun(name, " ".join(cmd).replace(sys.executable, "python"), round=round_)
    run.load = os.getloadavg()[0]
    log = Path(args.logs) / f"serve-{name}.log"
    with running(cmd, base, log):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=args.timeout)
        # One warm-up request, not counted (first grammar compile, first decode).
        run_one(client, requests_for(0, peer, args.max_tokens)[2])
        if peer:  # what the peer answers to OpenAI's own json_schema form
            std = requests_for(0, False, args.max_tokens)[0]
            r = run_one(client, std)
            run.extra["openai_json_schema_form"] = (
                f"HTTP {r.http}" if r.status != "answered" else f"answered (schema-valid: {r.valid})"
            )
        jobs = [q for c in range(args.clients) for q in requests_for(c, peer, args.max_tokens)[: args.requests]]
        by_client: dict[int, list[Req]] = {}
        for q in jobs:
            by_client.setdefault(q.client, []).append(q)

        def client_loop(reqs: list[Req]) -> list[Result]:
            return [run_one(client, q) for q in reqs]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.clients) as pool:
            for rs in pool.map(client_loop, by_client.values()):
                run.results.extend(rs)
        run.wall_s = time.perf_counter() - t0
    if peer and "Input should be 'text' or 'json_object'" in log.read_text(errors="replace"):
        run.extra["openai_json_schema_form"] += (
            " (its log: a request-validation error, response_format.type must be 'text' or 'json_object')"
        )
    return run


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * (len(s) - 1))))
    return s[k]


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("pocket-agent-mnn", "llama_cpp_python", "llguidance", "fastapi", "uvicorn", "sse-starlette", "openai"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "?"
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", load avg at start " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{load}"


def row(run: SystemRun) -> dict[str, Any]:
    rs = run.results
    answered = [r for r in rs if r.status == "answered"]
    structured = [r for r in answered if r.req.kind != "text"]
    lat = [r.latency_s for r in answered]
    tokens = sum(r.completion_tokens for r in answered)
    return {
        "n": len(rs),
        "answered": len(answered),
        "refused": sum(r.status == "refused" for r in rs),
        "lost": sum(r.status == "lost" for r in rs),
        "valid_structured": f"{sum(bool(r.valid) for r in structured)}/{len(structured)}",
        "valid_json": f"{sum(bool(r.valid) for r in structured if r.req.kind == 'json_schema')}/"
        f"{sum(r.req.kind == 'json_schema' for r in structured)}",
        "valid_tools": f"{sum(bool(r.valid) for r in structured if r.req.kind == 'tools')}/"
        f"{sum(r.req.kind == 'tools' for r in structured)}",
        "p50": statistics.median(lat) if lat else float("nan"),
        "p95": pct(lat, 95),
        "rps": len(answered) / run.wall_s if run.wall_s else 0.0,
        "tok_s": tokens / run.wall_s if run.wall_s else 0.0,
        "wall": run.wall_s,
        "length": sum(r.finish == "length" for r in answered),
    }


def write_md(runs: list[SystemRun], args: argparse.Namespace, meta: dict[str, Any]) -> str:
    v = meta["versions"]
    lines = [
        "# Serving: `pocket-agent serve` vs `llama_cpp.server`",
        "",
        f"Model: embedded default `{Path(meta['model']).name}`, {args.threads} thread(s), n_ctx {args.n_ctx}, "
        f"greedy (temperature 0), each server alone on the machine (one after the other).",
        f"Load: {args.clients} concurrent clients x {args.requests} requests each "
        f"(json_schema, tools, text, json_schema, tools), official `openai` client, no retries, "
        f"max_tokens {args.max_tokens} (text requests 48). One uncounted warm-up request per server.",
        f"Machine: {meta['machine']}. Run time {meta['minutes']:.1f} min.",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        "Systems:",
    ]
    names = list(dict.fromkeys(r.name for r in runs))
    merged = []
    for name in names:
        mine = [r for r in runs if r.name == name]
        all_rounds = SystemRun(name, mine[0].command, extra=mine[0].extra, round=0)
        all_rounds.results = [x for r in mine for x in r.results]
        all_rounds.wall_s = sum(r.wall_s for r in mine)
        merged.append(all_rounds)
        lines.append(f"- *{name}*: `{mine[0].command}` (port chosen per run)")
    lines += [
        "",
        "| system | round | load avg at start | requests | answered | cleanly refused | lost "
        "| schema-valid (structured) | json_schema valid | tool calls valid | cut at max_tokens | p50 s | p95 s "
        "| req/s | completion tok/s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ordered = sorted(runs, key=lambda r: (names.index(r.name), r.round))
    for run in ordered + merged:
        r = row(run)
        label = f"**{run.name}**" if run.round == 0 else run.name
        when = "all" if run.round == 0 else str(run.round)
        load = "" if run.round == 0 else f"{run.load:.1f}"
        lines.append(
            f"| {label} | {when} | {load} | {r['n']} | {r['answered']} | {r['refused']} | {r['lost']} "
            f"| {r['valid_structured']} "
            f"| {r['valid_json']} | {r['valid_tools']} | {r['length']} | {r['p50']:.1f} | {r['p95']:.1f} "
            f"| {r['rps']:.2f} | {r['tok_s']:.1f} | {r['wall']:.0f} |"
        )
    lines += [
        "",
        "- *answered*: HTTP 200 with a chat completion. *cleanly refused*: an HTTP error with a JSON body. "
        "*lost*: connection error, client timeout or an unreadable reply.",
        "- *schema-valid*: json_schema replies parse and validate against the schema (`jsonschema`); tools "
        "replies carry at least one call, each naming a given tool with arguments valid against its "
        "parameters. Text replies are not counted here.",
        "- Latency is per request as the client sees it, queue time included (8 clients share one model "
        "that serves one request at a time on both servers), so p50/p95 are dominated by waiting; "
        "req/s and completion tok/s are over the whole run's wall time.",
        "- The machine is shared (2 cores, other sessions working): a run's speed follows the load more than "
        "the server. The systems alternate round by round; compare rows of similar load, and the **all** rows.",
    ]
    lines += [
        "",
        "Per request kind (answered requests): mean latency (queue time included) / mean completion tokens. "
        "Every client sends its kinds in the same order, so a kind's latency mostly reflects its place in the "
        "queue. Completion tokens are as each server reports them: ours count the whole turn, including the "
        '`<tool_call>{"name": ..., "arguments": ` wrapper that the grammar forces (fed as one batch).',
        "Both servers get greedy requests with the same messages; the peer sees structured output as "
        '`{"type": "json_object", "schema": ...}`, its own form.',
        "",
        "| system | " + " | ".join(dict.fromkeys(KINDS)) + " |",
        "|---|" + "---|" * len(dict.fromkeys(KINDS)),
    ]
    for run in merged:
        cells = []
        for kind in dict.fromkeys(KINDS):
            rs = [r for r in run.results if r.req.kind == kind and r.status == "answered"]
            if rs:
                lat = statistics.mean(r.latency_s for r in rs)
                tok = statistics.mean(r.completion_tokens for r in rs)
                cells.append(f"{lat:.1f} s / {tok:.0f} tok")
            else:
                cells.append("-")
        lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    lines.append("")
    for run in merged:
        for val in run.extra.values():
            lines.append(f"- {run.name}, OpenAI's `response_format={{'type': 'json_schema', ...}}` form: {val}.")
    failures = [(run.name, r) for run in runs for r in run.results if r.status != "answered" or r.valid is False]
    if failures:
        lines += ["", "Failures:", ""]
        for name, r in failures[:30]:
            lines.append(f"- {name} client {r.req.client} #{r.req.index} {r.req.kind}: {r.status} {r.detail}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--timeout", type=float, default=900.0, help="client timeout per request, s")
    p.add_argument("--only", choices=["ours", "peer"], default=None)
    p.add_argument("--rounds", type=int, default=2, help="times each system is run, alternating")
    p.add_argument("--logs", default="/tmp")
    p.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = p.parse_args()
    model = str(default_model_path())
    meta = {"machine": machine(), "versions": versions(), "model": model}
    t0 = time.perf_counter()
    runs = []
    for k in range(1, args.rounds + 1):  # the systems alternate, so a busier spell hits both
        if args.only in (None, "ours"):
            port = free_port()
            cmd = [sys.executable, "-m", "pocket_agent", "serve", "--model", model, "--threads", str(args.threads)]
            cmd += ["--n-ctx", str(args.n_ctx), "--port", str(port), "--max-queue", "64", "--timeout", "900"]
            runs.append(bench_system("pocket-agent serve", cmd, port, False, args, k))
        if args.only in (None, "peer"):
            port = free_port()
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_threads", str(args.threads)]
            cmd += ["--n_threads_batch", str(args.threads), "--n_ctx", str(args.n_ctx), "--port", str(port)]
            cmd += ["--host", "127.0.0.1", "--chat_format", "chatml-function-calling", "--verbose", "False"]
            runs.append(bench_system("llama_cpp.server", cmd, port, True, args, k))
    meta["minutes"] = (time.perf_counter() - t0) / 60
    md = write_md(runs, args, meta)
    Path(args.out).write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
