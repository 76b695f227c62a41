"""Extraction benchmark: pocket_agent.extract vs the peers a user would pick, in one run.

Same model (the embedded SmolLM2-135M-Instruct GGUF), same threads, same schema, same
documents (SROIE receipts from ../shared/data/sroie) and the same chat prompt for all:

  ours          pocket_agent.extract (llguidance masks, fast-forward of forced tokens,
                grounded strings, number fields chosen among the printed numbers)
  ours-greedy-numbers  the same without the number choice (ablation)
  ours-many-bf16  extract_many on one BF16 copy (layout="bf16"), the adapter merged; the ours rows
                run the adapter merged into the one copy layout "auto" picks (BF16 where llama.cpp
                computes BF16 natively: then the same model as this row)
  ours-many-q8_0  extract_many on the Q8_0 copy (layout="q8_0")
  ours-many-lora  extract_many on the default model, the adapter applied at run time: what
                extract(model=None) runs (one model serves extract, decide and Agent)
  ours-many-speed extract_many under layout="speed": the adapter merged, split weights where BF16
                is native (what extract(model=None) ran before one model served every task)
  ours-mnn      the same on the MNN backend (the model converted to MNN q4, 8-bit head; base
                weights, as MNN applies no LoRA at run time)
  ours-mnn-extract  the MNN extraction build (the shipped adapter merged in, its layers 8-bit);
                each MNN row runs in a child process (pymnn: one model per process)
  ours-mnn-extract-avx512  the same on a pymnn built with MNN's AVX-512 kernels
                (scripts/build_pymnn.sh; --pymnn DIR; the PyPI wheel has none)
  llama-cpp     llama-cpp-python create_chat_completion(response_format=json_object+schema)
  llama-cpp-q8_0 / llama-cpp-bf16  the same on our Q8_0 / BF16 copy of the model
  outlines      outlines 1.3 Generator over the same llama.cpp model
  unconstrained plain generation of the same JSON with our runtime (no grammar)

Reports per contender: seconds per document, output tokens/s, share of outputs that parse
and validate, SROIE per-field exact match; for ours also mask time per token (median,
p99), share of fast-forwarded tokens and compile time.

    python bench/extract.py [--docs 20] [--threads 2] [--chunks 4] [--out bench/extract.md]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "sroie" / "receipts.jsonl"
MAX_TOKENS = 256
FIELDS = ("company", "date", "address", "total")


class Receipt(BaseModel):
    """SROIE task 3 key fields."""

    company: str = Field(description="the company (shop) name at the top of the receipt")
    date: str = Field(description="the date of the receipt as written")
    address: str = Field(description="the shop's full address")
    total: float = Field(description="the total amount paid, a number")


def closed_schema() -> dict[str, Any]:
    s = Receipt.model_json_schema()
    s["additionalProperties"] = False
    return s


def load_docs(n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:n]


def norm(v: Any) -> str:
    return " ".join(str(v).split()).casefold()


def field_matches(pred: dict[str, Any] | None, expected: dict[str, Any]) -> dict[str, bool]:
    out = {}
    for f in FIELDS:
        if pred is None or f not in pred or f not in expected:  # a few receipts lack a field: wrong for all
            out[f] = False
        elif f == "total":
            try:
                # the labels write some totals with a currency sign ("$8.20")
                out[f] = abs(float(pred[f]) - float(re.sub(r"[^0-9.\-]", "", str(expected[f])))) < 1e-6
            except (TypeError, ValueError):
                out[f] = False
        else:
            out[f] = norm(pred[f]) == norm(expected[f])
    return out


def parse_valid(text: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
        jsonschema.validate(data, schema)
    except (ValueError, jsonschema.ValidationError):
        return None
    return data if isinstance(data, dict) else None


class Result:
    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds: list[float] = []
        self.tokens: list[int] = []
        self.valid: list[bool] = []
        self.matches: list[dict[str, bool]] = []
        self.mask_us: list[float] = []
        self.forced = 0
        self.decode_step_s: list[float] = []
        self.compile_ms = float("nan")
        self.gen_tokens = 0  # output tokens after the prompt was evaluated ...
        self.gen_seconds = 0.0  # ... and the time they took (ours and unconstrained only)
        self.errors: list[str] = []
        self.grounded_compile_ms: list[float] = []  # per-document grounded grammar (ours)
        self.choose_ms: list[float] = []  # per-document choice of number fields (ours)
        # prompt tokens evaluated / output tokens evaluated after the prompt, and their seconds
        # (ours: timed around Model.prefill / Model.eval; llama-cpp-python: llama.cpp's own counters)
        self.prefill_tokens = 0
        self.prefill_s = 0.0
        self.decode_tokens = 0
        self.decode_s = 0.0
        self.weights: Path | None = None  # the weight file(s) the row ran, for its limit
        self.gen_weights: Path | None = None  # split weights: the file generation ran on (its decode limit)

    def merge(self, later: Result) -> Result:
        """This row's results followed by ``later``'s (the same contender on the next documents)."""
        lists = ("seconds", "tokens", "valid", "matches", "mask_us", "decode_step_s", "errors")
        for name in (*lists, "grounded_compile_ms", "choose_ms"):
            getattr(self, name).extend(getattr(later, name))
        for name in ("forced", "gen_tokens", "gen_seconds", "prefill_tokens", "prefill_s", "decode_tokens", "decode_s"):
            setattr(self, name, getattr(self, name) + getattr(later, name))
        return self  # compile_ms stays the first (cold) one; weights are the same

    def add(self, seconds: float, tokens: int, pred: dict[str, Any] | None, expected: dict[str, Any]) -> None:
        self.seconds.append(seconds)
        self.tokens.append(tokens)
        self.valid.append(pred is not None)
        self.matches.append(field_matches(pred, expected))

    def tps(self) -> float:
        return sum(self.tokens) / sum(self.seconds) if self.seconds else 0.0

    def field_acc(self, f: str) -> float:
        return sum(m[f] for m in self.matches) / len(self.matches) if self.matches else 0.0

    def prefill_tok_s(self) -> float | None:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else None

    def decode_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s else None


class EvalTimer:
    """Times a loaded ``Model``'s evaluations: those inside ``prefill`` (the prompt) and the
    rest (the output: sampled tokens and forced runs), by wrapping the two methods on the
    instance until :meth:`close`."""

    def __init__(self, model: Any, res: Result) -> None:
        self.model, self.res = model, res
        self._in_prefill = False
        orig_eval, orig_prefill = model.eval, model.prefill

        def timed_eval(tokens: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = orig_eval(tokens, **kw)
            dt = time.perf_counter() - t0
            if self._in_prefill:
                res.prefill_tokens += len(tokens)
                res.prefill_s += dt
            else:
                res.decode_tokens += len(tokens)
                res.decode_s += dt
            return out

        def timed_prefill(tokens: Any, **kw: Any) -> Any:
            self._in_prefill = True
            try:
                return orig_prefill(tokens, **kw)
            finally:
                self._in_prefill = False

        model.eval, model.prefill = timed_eval, timed_prefill

    def close(self) -> None:
        del self.model.eval, self.model.prefill


def weights_of(model: Any) -> Path:
    """The file a loaded model runs: a GGUF (its re-laid-out copy where it runs one) or an MNN build's config."""
    extra = getattr(getattr(model, "info", None), "extra", {}) or {}
    return Path(extra.get("weights") or model.path)


def generation_weights_of(model: Any) -> Path | None:
    """The file generation runs on where a model runs split weights (layout 'split'), else None."""
    extra = getattr(getattr(model, "info", None), "extra", {}) or {}
    return Path(extra["generation weights"]) if extra.get("generation weights") else None


def runs_from(model: Any) -> str:
    """What the header says about the weights a model runs: one copy, or split weights."""
    kind = Path(weights_of(model)).suffixes[-2].lstrip(".").upper()
    gen = generation_weights_of(model)
    if gen is None:
        return f"its {kind} copy"
    if gen == Path(weights_of(model)):
        return f"its {kind} copy, prompts in a second context with flash attention"
    return (
        f"split weights: prompts on its {kind} copy with flash attention, generation on its "
        f"{gen.suffixes[-2].lstrip('.').upper()} copy"
    )


def run_ours(
    docs: list[dict[str, Any]],
    model: Any,
    label: str = "ours (pocket_agent.extract)",
    choose: bool = True,
    adapter: Any = "auto",
) -> Result:
    """extract()'s pipeline, timed per part; ``adapter`` as extract() takes it ("auto": the shipped LoRA)."""
    from pocket_agent.runtime.task_adapters import task_adapter

    with task_adapter(model, adapter, "extract"):
        res = Result(label)
        timer = EvalTimer(model, res)
        try:
            return _run_ours(docs, model, res, choose)
        finally:
            timer.close()


def _run_ours(docs: list[dict[str, Any]], model: Any, res: Result, choose: bool) -> Result:
    from pocket_agent import Limits
    from pocket_agent.errors import PocketAgentError
    from pocket_agent.extraction import _prepare, _text_grammar, build_messages
    from pocket_agent.generate import render_prompt, run_generation
    from pocket_agent.grammars import clear_cache
    from pocket_agent.grounding import DEFAULT_GROUNDING, choose_numbers, widen_words

    res.weights = weights_of(model)
    res.gen_weights = generation_weights_of(model)
    clear_cache()
    t0 = time.perf_counter()
    limits = Limits(max_tokens=MAX_TOKENS)
    prepared = _prepare(Receipt, model, sampling=None, limits=limits, max_tokens=None, retries=0)
    res.compile_ms = (time.perf_counter() - t0) * 1000
    schema = closed_schema()
    for doc in docs:
        ids = render_prompt(model, build_messages(doc["text"], schema))
        t0 = time.perf_counter()
        try:
            # the grammar extract() uses for this document: grounded strings, json.dumps layout
            grammar = _text_grammar(prepared, doc["text"], DEFAULT_GROUNDING)
            res.grounded_compile_ms.append((time.perf_counter() - t0) * 1000)
            out = run_generation(model, ids, grammar=grammar, limits=limits)
            t1 = time.perf_counter()
            text = out.text
            if choose:  # what extract() does after generating: numbers chosen among the printed ones
                text, _ = choose_numbers(model, ids, text, prepared.grammar_schema, doc["text"])
            text, _ = widen_words(text, prepared.grammar_schema, doc["text"])  # and strings widened to whole words
            res.choose_ms.append((time.perf_counter() - t1) * 1000)
        except PocketAgentError as exc:
            res.errors.append(type(exc).__name__)
            res.add(time.perf_counter() - t0, MAX_TOKENS, None, doc["expected"])
            continue
        dt = time.perf_counter() - t0
        u = out.usage
        res.gen_tokens += u.completion_tokens
        res.gen_seconds += dt - u.prefill_s
        res.mask_us += [s * 1e6 for s in u.mask_times]
        res.forced += u.forced_tokens
        if u.decode_calls:
            res.decode_step_s.append(u.decode_s / u.decode_calls)
        res.add(dt, u.completion_tokens, parse_valid(text, schema), doc["expected"])
    return res


def run_many(docs: list[dict[str, Any]], model: Any, batch: int, label: str = "") -> Result:
    """The public ``extract_many`` over all documents (shipped adapter, everything extract() does); s/doc is
    the run's wall time divided by the documents (with ``batch > 1`` documents overlap)."""
    from pocket_agent import Limits, extract_many

    res = Result(label or f"ours, extract_many(batch={batch})")
    model.reset()
    # with batch > 1 the sampled tokens are evaluated in the lanes' context, outside Model.eval: not timed
    timer = EvalTimer(model, res) if batch == 1 else None
    t0 = time.perf_counter()
    try:
        outcomes = list(
            extract_many(
                [d["text"] for d in docs], Receipt, model=model, limits=Limits(max_tokens=MAX_TOKENS), batch=batch
            )
        )
    finally:
        if timer is not None:
            timer.close()
    per_doc = (time.perf_counter() - t0) / len(docs)
    res.weights = weights_of(model)
    res.gen_weights = generation_weights_of(model)
    for outcome, doc in zip(outcomes, docs, strict=True):
        pred = outcome.value.model_dump() if outcome.ok else None
        if not outcome.ok:
            res.errors.append(type(outcome.error).__name__)
        res.add(per_doc, 0, pred, doc["expected"])
    return res


def run_unconstrained(docs: list[dict[str, Any]], model: Any) -> Result:
    from pocket_agent import Limits
    from pocket_agent.extraction import build_messages
    from pocket_agent.generate import render_prompt, run_generation

    res = Result("unconstrained (same runtime, no grammar)")
    plain = Limits(max_tokens=MAX_TOKENS, repeat_limit=None)  # plain generation: no loop guard
    schema = closed_schema()
    for doc in docs:
        ids = render_prompt(model, build_messages(doc["text"], schema))
        t0 = time.perf_counter()
        out = run_generation(model, ids, limits=plain)
        dt = time.perf_counter() - t0
        res.gen_tokens += out.usage.completion_tokens
        res.gen_seconds += dt - out.usage.prefill_s
        res.add(dt, out.usage.completion_tokens, parse_valid(out.text, schema), doc["expected"])
    return res


_PEERS: dict[tuple[str, int, str], Any] = {}


def _llama(threads: int, path: Path | None = None, use: str = "chat") -> Any:
    """llama-cpp-python on ``path`` (default: the GGUF file as shipped, what its users load);
    one instance per (file, threads, use), kept across chunks like a user's long-lived model."""
    from _env import guard_peer_llama
    from llama_cpp import Llama

    guard_peer_llama()

    from pocket_agent.runtime import default_model_path

    key = (str(path or default_model_path()), threads, use)
    if key not in _PEERS:
        _PEERS[key] = Llama(key[0], n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
    return _PEERS[key]


class LlamaCounters:
    """llama.cpp's own prompt / one-token evaluation counters of a ``llama_cpp.Llama``, added to a Result."""

    def __init__(self, llm: Any, res: Result) -> None:
        import llama_cpp

        self.lc, self.ctx, self.res = llama_cpp, llm._ctx.ctx, res

    def __enter__(self) -> None:
        self.lc.llama_perf_context_reset(self.ctx)

    def __exit__(self, *exc: object) -> None:
        d = self.lc.llama_perf_context(self.ctx)
        self.res.prefill_tokens += int(d.n_p_eval)
        self.res.prefill_s += float(d.t_p_eval_ms) / 1000
        self.res.decode_tokens += int(d.n_eval)
        self.res.decode_s += float(d.t_eval_ms) / 1000


def copy_of_default(kind: str) -> Path:
    """Our runtime's ``kind`` ("q8_0" or "bf16") copy of the default model (pocket_agent.runtime.layout)."""
    from pocket_agent.runtime import default_model_path
    from pocket_agent.runtime.layout import weights_copy

    return weights_copy(default_model_path(), kind)  # type: ignore[arg-type]


def run_llama_cpp(
    docs: list[dict[str, Any]],
    threads: int,
    model: Any,
    path: Path | None = None,
    label: str = "llama-cpp-python json_object+schema",
) -> Result:
    from pocket_agent.extraction import build_messages
    from pocket_agent.runtime import default_model_path

    res = Result(label)
    res.weights = path or default_model_path()
    llm = _llama(threads, path)
    schema = closed_schema()
    for doc in docs:
        messages = build_messages(doc["text"], schema)
        t0 = time.perf_counter()
        with LlamaCounters(llm, res):
            out = llm.create_chat_completion(
                messages=messages,  # type: ignore[arg-type]
                response_format={"type": "json_object", "schema": schema},
                temperature=0.0,
                max_tokens=MAX_TOKENS,
            )
        dt = time.perf_counter() - t0
        text = out["choices"][0]["message"]["content"] or ""  # type: ignore[index]
        res.add(dt, int(out["usage"]["completion_tokens"]), parse_valid(text, schema), doc["expected"])  # type: ignore[index]
    return res


_GENERATORS: dict[str, Any] = {}


def run_outlines(docs: list[dict[str, Any]], threads: int, model: Any) -> Result:
    import numba  # noqa: F401 - outlines-core's numpy kernels; without it outlines runs UNCONSTRAINED
    import outlines

    from pocket_agent.extraction import build_messages
    from pocket_agent.runtime import default_model_path

    res = Result("outlines (llama.cpp)")
    res.weights = default_model_path()
    llm = _llama(threads, use="outlines")
    if "outlines" not in _GENERATORS:
        _GENERATORS["outlines"] = outlines.Generator(outlines.from_llamacpp(llm), Receipt)
    gen = _GENERATORS["outlines"]
    schema = closed_schema()
    for doc in docs:
        prompt = model.chat_template.render(build_messages(doc["text"], schema), add_generation_prompt=True)
        t0 = time.perf_counter()
        with LlamaCounters(llm, res):
            text = gen(prompt, max_tokens=MAX_TOKENS, temperature=0.0)
        dt = time.perf_counter() - t0
        n_tok = len(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))
        res.add(dt, n_tok, parse_valid(text, schema), doc["expected"])
    return res


MNN_ROWS = {
    "ours-mnn": "ours on MNN (same model, base weights: MNN applies no LoRA at run time)",
    "ours-mnn-extract": "ours on MNN, extraction build (the adapter merged in, its layers at 8 bits)",
    "ours-mnn-extract-avx512": "ours on MNN, extraction build, on pymnn built with AVX-512 (scripts/build_pymnn.sh)",
}


def run_mnn_row(row: str, docs: list[dict[str, Any]], threads: int) -> Result:
    """One MNN row, in this process (pymnn allows one model per process: see mnn_row_in_child)."""
    from pocket_agent.convert import ensure_default_mnn
    from pocket_agent.runtime import load_model

    config = ensure_default_mnn(task="extract" if row.startswith("ours-mnn-extract") else None)
    model = load_model(config, threads=threads)
    run_ours(docs[:1], model, "warm-up")  # a fresh process per slice: its first document untimed
    return run_ours(docs, model, MNN_ROWS[row])


def mnn_row_in_child(row: str, n_docs: int, threads: int, first: int = 0, pymnn: Path | None = None) -> Result:
    """Run an MNN row on documents ``first..n_docs-1`` in a child process of this script and
    take its Result back; with ``pymnn`` (a scripts/build_pymnn.sh folder) the child imports MNN from it."""
    env = dict(os.environ)
    if pymnn is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pymnn), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pickle"
        cmd = [sys.executable, __file__, "--docs", str(n_docs), "--threads", str(threads)]
        cmd += ["--mnn-worker", row, str(out), "--worker-first", str(first)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"{row} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        result: Result = pickle.loads(out.read_bytes())
        return result


def pymnn_dir(path: Path | None) -> Path:
    """The folder of a pymnn built by scripts/build_pymnn.sh, checked."""
    if path is None or not (path / "MNN" / "__init__.py").is_file():
        raise SystemExit("the row ours-mnn-extract-avx512 needs --pymnn DIR, a folder made by scripts/build_pymnn.sh")
    return path.resolve()


def row_limits(results: dict[str, Result], context: int, threads: int) -> dict[str, tuple[float, float]]:
    """Each row's prefill and decode ceilings (tok/s) from bench/limit.py for the weights it ran, with
    attention and the K/V cache at ``context`` tokens. An MNN build's decode ceiling counts its own
    weight bytes; its prefill ceiling is the GGUF's (the same multiply-adds). Measures the machine, so
    call it after the contenders: torch's threads, once started, would compete with theirs."""
    sys.path.insert(0, str(ROOT / "bench"))
    from limit import machine_limit

    out: dict[str, tuple[float, float]] = {}
    for name, r in results.items():
        if r.weights is None:
            continue
        if r.weights.suffix == ".gguf":
            lim = machine_limit(str(r.weights), threads=threads, context=context)
            decode = lim.decode_tok_s
            if r.gen_weights is not None:  # split weights: prompts on one file, generation on the other
                decode = machine_limit(str(r.gen_weights), threads=threads, context=context).decode_tok_s
            out[name] = (lim.prefill_tok_s, decode)
        else:  # an MNN build: config.json beside llm.mnn and its weight file
            lim = machine_limit(None, threads=threads, context=context)
            weight_bytes = sum(f.stat().st_size for f in r.weights.parent.glob("llm.mnn*"))
            kv_bytes = 2 * 2 * lim.cost.n_layer * lim.cost.n_kv_dim * context
            out[name] = (lim.prefill_tok_s, lim.machine.read_gbs * 1e9 / (weight_bytes + kv_bytes))
    return out


def of_limit(value: float | None, limit: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" + (f" ({value / limit:.0%})" if limit else "")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--only",
        nargs="+",
        default=[
            "ours",
            "ours-many",
            "ours-many-lora",
            "ours-many-speed",
            "ours-many-batch4",
            "ours-many-bf16",
            "ours-many-q8_0",
            "ours-q4_1",
            "ours-base",
            "ours-greedy-numbers",
            "ours-mnn",
            "ours-mnn-extract",
            "llama-cpp",
            "llama-cpp-q8_0",
            "llama-cpp-bf16",
            "outlines",
            "unconstrained",
        ],
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--pymnn",
        type=Path,
        default=None,
        help="a pymnn built by scripts/build_pymnn.sh (AVX-512 kernels): the row ours-mnn-extract-avx512 runs on it",
    )
    ap.add_argument(
        "--chunks",
        type=int,
        default=4,
        help="run the contenders in turn on each of this many slices of the documents (the order rotating), "
        "so a busy spell on a shared machine falls on every row alike",
    )
    ap.add_argument("--mnn-worker", nargs=2, metavar=("ROW", "RESULT_FILE"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-first", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    from pocket_agent.runtime import load_model

    docs = load_docs(args.docs)
    if args.mnn_worker:
        row, result_file = args.mnn_worker
        Path(result_file).write_bytes(pickle.dumps(run_mnn_row(row, docs[args.worker_first :], args.threads)))
        return 0
    # base weights: the peers' tokenizer, rows with the LoRA at run time (what extract(model=None) runs:
    # one model for every task, runtime/loader.py)
    model = load_model(threads=args.threads)
    # the extraction adapter merged into the weights of one copy (what `pocket-agent extract` loads)
    extraction = load_model(threads=args.threads, merge_adapter="extract")
    other_layouts: dict[str, Any] = {}

    def in_layout(layout: str) -> Any:  # merged too where the layout writes a copy (not 'original')
        if layout not in other_layouts:
            other_layouts[layout] = load_model(threads=args.threads, layout=layout, merge_adapter="extract")
        return other_layouts[layout]

    def runners(part: list[dict[str, Any]], first: int) -> dict[str, Callable[[], Result]]:
        end = first + len(part)
        return {
            "ours": lambda: run_ours(part, extraction),
            "ours-many": lambda: run_many(part, extraction, 1),
            "ours-many-lora": lambda: run_many(
                part, model, 1, "ours, extract_many(batch=1), the LoRA applied at run time (the default model)"
            ),
            "ours-many-speed": lambda: run_many(
                part, in_layout("speed"), 1, "ours, extract_many(batch=1), layout='speed' (merged; split where BF16)"
            ),
            "ours-many-batch4": lambda: run_many(part, extraction, 4),
            "ours-many-bf16": lambda: run_many(
                part, in_layout("bf16"), 1, "ours, extract_many(batch=1) on one BF16 copy (layout='bf16')"
            ),
            "ours-many-q8_0": lambda: run_many(
                part, in_layout("q8_0"), 1, "ours, extract_many(batch=1) on the Q8_0 copy (layout='q8_0')"
            ),
            "ours-base": lambda: run_ours(part, model, "ours with the base weights (adapter=None)", adapter=None),
            "ours-greedy-numbers": lambda: run_ours(
                part, extraction, "ours without the number choice (numbers decoded greedily)", choose=False
            ),
            "ours-q4_1": lambda: run_ours(
                part, in_layout("original"), "ours on the Q4_1 weights as shipped (layout='original')"
            ),
            "ours-mnn": lambda: mnn_row_in_child("ours-mnn", end, args.threads, first),
            "ours-mnn-extract": lambda: mnn_row_in_child("ours-mnn-extract", end, args.threads, first),
            "ours-mnn-extract-avx512": lambda: mnn_row_in_child(
                "ours-mnn-extract-avx512", end, args.threads, first, pymnn_dir(args.pymnn)
            ),
            "llama-cpp": lambda: run_llama_cpp(part, args.threads, model),
            "llama-cpp-q8_0": lambda: run_llama_cpp(
                part,
                args.threads,
                model,
                copy_of_default("q8_0"),
                "llama-cpp-python json_object+schema on our Q8_0 copy",
            ),
            "llama-cpp-bf16": lambda: run_llama_cpp(
                part,
                args.threads,
                model,
                copy_of_default("bf16"),
                "llama-cpp-python json_object+schema on our BF16 copy",
            ),
            "outlines": lambda: run_outlines(part, args.threads, model),
            "unconstrained": lambda: run_unconstrained(part, model),
        }

    results: dict[str, Result] = {}
    failed: set[str] = set()
    for name in args.only:  # warm-up, untimed: first loads, compiles and caches (MNN rows warm in each child)
        if not name.startswith("ours-mnn"):
            try:
                runners(docs[:1], 0)[name]()
            except Exception:  # reported below, when the contender runs
                pass
    n_chunks = max(1, min(args.chunks, len(docs)))
    bounds = [round(i * len(docs) / n_chunks) for i in range(n_chunks + 1)]
    for c in range(n_chunks):
        first, end = bounds[c], bounds[c + 1]
        order = args.only[c % len(args.only) :] + args.only[: c % len(args.only)]
        for name in order:
            if name in failed:
                continue
            print(f"running {name} on documents {first}..{end - 1}...", file=sys.stderr)
            try:
                part = runners(docs[first:end], first)[name]()
            except Exception as exc:  # one contender that cannot run (a missing extra) leaves the others' rows
                print(f"  {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                failed.add(name)
                results.pop(name, None)
                continue
            results[name] = results[name].merge(part) if name in results else part
    results = {name: results[name] for name in args.only if name in results}

    ours = results.get("ours")
    from pocket_agent.extraction import build_messages
    from pocket_agent.generate import render_prompt

    prompts = [render_prompt(model, build_messages(d["text"], closed_schema())) for d in docs]
    context = round(statistics.mean(len(ids) for ids in prompts))
    try:
        limits = row_limits(results, context, args.threads)
    except Exception as exc:  # torch or gguf missing: the rows without their fraction of the limit
        print(f"  no limits: {type(exc).__name__}: {exc}", file=sys.stderr)
        limits = {}
    lines = [
        "| contender | s/doc | output tok/s | prefill tok/s (of limit) | decode tok/s (of limit) | parse+valid "
        "| company | date | address | total |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        pre_lim, dec_lim = limits.get(name, (None, None))
        lines.append(
            f"| {r.name} | {statistics.mean(r.seconds):.2f} | {f'{r.tps():.1f}' if sum(r.tokens) else '-'} | "
            f"{of_limit(r.prefill_tok_s(), pre_lim, 0)} | {of_limit(r.decode_tok_s(), dec_lim, 1)} | "
            f"{sum(r.valid)}/{len(r.valid)} | " + " | ".join(f"{r.field_acc(f):.2f}" for f in FIELDS) + " |"
        )
    notes = []
    if limits:
        lim = next(iter(limits.values()))
        notes.append(
            f"- limits (bench/limit.py, this machine at {args.threads} thread(s), attention and K/V cache at the mean "
            f"prompt of {context} tokens): prefill from int8, bf16 and f32 GEMM throughput, decode from read "
            "bandwidth over the weight bytes of the row's own file (Q4_1 file, BF16 or Q8_0 copy, or MNN build). "
            "prefill: prompt tokens evaluated (cached prefixes excluded) per second; decode: output tokens evaluated "
            "after the prompt per "
            "second (sampled and forced; for llama-cpp-python peers llama.cpp's own counters of one-token "
            f"evaluations). Example ceilings for the first row: {lim[0]:.0f} / {lim[1]:.0f} tok/s"
        )
    if ours is not None:
        n_out = sum(ours.tokens)
        step = statistics.median(ours.decode_step_s) if ours.decode_step_s else float("nan")
        mask_med = statistics.median(ours.mask_us) if ours.mask_us else float("nan")
        notes += [
            f"- ours: mask + apply per sampled token median {mask_med:.0f} us, p99 {pct(ours.mask_us, 0.99):.0f} us; "
            f"median decode step {step * 1000:.1f} ms, so masking is {100 * mask_med / 1e6 / step:.1f}% of a step",
            f"- ours: {ours.forced}/{n_out} output tokens fast-forwarded ({100 * ours.forced / max(n_out, 1):.0f}%), "
            f"schema compile {ours.compile_ms:.1f} ms (cold cache)",
        ]
        if ours.grounded_compile_ms:
            g = ours.grounded_compile_ms
            notes.append(
                f"- ours: per-document grounded grammar build + compile median {statistics.median(g):.1f} ms, "
                f"max {max(g):.1f} ms (included in s/doc)"
            )
        if ours.choose_ms:
            c = ours.choose_ms
            notes.append(
                f"- ours: choosing the number fields among the printed numbers median {statistics.median(c):.0f} ms, "
                f"max {max(c):.0f} ms per document (included in s/doc)"
            )
        if ours.errors:
            notes.append(f"- ours: errors {ours.errors}")
        if "unconstrained" in results:
            free = results["unconstrained"]
            ours_rate = ours.gen_tokens / ours.gen_seconds
            free_rate = free.gen_tokens / free.gen_seconds
            notes.append(
                f"- effective output tokens/s after the prompt (forced tokens count): ours {ours_rate:.1f} vs "
                f"unconstrained {free_rate:.1f} ({ours_rate / free_rate:.2f}x)"
            )
    mine_rows = (
        "ours",
        "ours-many",
        "ours-many-lora",
        "ours-many-batch4",
        "ours-many-bf16",
        "ours-many-q8_0",
        "ours-mnn",
    )
    for mine in (*mine_rows, "ours-mnn-extract", "ours-mnn-extract-avx512"):
        for key in ("llama-cpp", "llama-cpp-q8_0", "llama-cpp-bf16", "outlines"):
            if key in results and mine in results:
                sp = statistics.mean(results[key].seconds) / statistics.mean(results[mine].seconds)
                notes.append(f"- {results[mine].name} is {sp:.2f}x faster per document than {results[key].name}")
    table = "\n".join(lines)
    print(table)
    print("\n".join(notes))
    if args.out:
        from importlib.metadata import version

        vers = []
        for pkg in ("llama-cpp-python", "llguidance", "outlines", "outlines-core", "numba", "MNN", "pocket-agent-mnn"):
            try:
                vers.append(f"{pkg} {version(pkg)}")
            except Exception:
                vers.append(f"{pkg} not installed")
        if "ours-mnn-extract-avx512" in args.only:
            vers.append(f"the AVX-512 row's pymnn: MNN 3.6.1 sources built by scripts/build_pymnn.sh into {args.pymnn}")
        sys.path.insert(0, str(ROOT / "bench"))
        from runtime import machine

        args.out.write_text(
            "# Extraction benchmark\n\n"
            f"Generated by `python bench/extract.py --docs {args.docs} --threads {args.threads} "
            f"--chunks {n_chunks} --only {' '.join(args.only)}{f' --pymnn {args.pymnn}' if args.pymnn else ''} "
            f"--out {args.out}` "
            f"on {time.strftime('%Y-%m-%d')}.\n\n"
            f"- Machine: {machine()}; shared and noisy, so compare rows of one run. The documents run in "
            f"{n_chunks} slices; on each slice every contender runs in turn, the order rotating, so a busy spell "
            "falls on all rows alike; every contender first runs the first document once, untimed (loads, "
            "compiles, caches).\n"
            f"- Python {platform.python_version()}; {', '.join(vers)}\n"
            f"- Model: SmolLM2-135M-Instruct GGUF Q4_1 (embedded default), {args.threads} threads, greedy, "
            f"max_tokens {MAX_TOKENS}. Our runtime runs it from {runs_from(extraction)} (`load_model` layout 'auto', "
            "pocket_agent.runtime.layout), with the extraction adapter merged into the weights "
            "(`load_model(merge_adapter='extract')`, what `extract(model=None)` runs) unless the row says otherwise; "
            "the peers load the Q4_1 file as shipped unless the row says otherwise.\n"
            f"- Data: first {len(docs)} SROIE receipts (../shared/data/sroie), schema "
            "{company, date, address, total: number} closed; the same chat prompt for every contender. "
            "Field scores are exact match after whitespace normalisation and case-folding; total as a number.\n\n"
            f"{table}\n\n" + "\n".join(notes) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
