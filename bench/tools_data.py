"""Training rows for the tools adapter from the BFCL development split.

Reads ``../shared/data/bfcl/<category>.jsonl`` and writes ``{messages, tools, output}`` rows
(plus ``id`` and ``category``) for ``pocket-agent tune tools`` / ``train_tools_adapter``:

- categories ``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``,
  ``live_multiple`` (at most ``--live-cap`` rows, a seeded choice) and ``irrelevance``;
  ``live_simple`` is the held-out category and is never read;
- rows ``30`` and later only: rows 0-9 of every category are the ones ``bench/bfcl.py``
  scores and rows 15-29 the ones ``bench/bfcl_calibrate.py`` fits ``CALL_BIAS`` on;
- tools are the row's functions as ``Tool.from_openai`` normalises them (BFCL ``dict``,
  ``float``, ``tuple``... mapped to JSON Schema), as ``bench/bfcl.py`` shows them to the agent;
- the output of a call row is its ground truth, each parameter set to its first acceptable
  value that is not ``""`` (a parameter whose only acceptable value is ``""`` is optional and
  left out; dict values are option maps and are resolved the same way, recursively); an
  optional parameter (``""`` acceptable) whose value does not fit its schema, mostly BFCL's
  ``null`` for "left at its default", is left out too; an ``irrelevance`` row answers with
  one fixed sentence;
- rows whose prompt (the default agent's, on the model) is longer than
  ``--max-prompt-tokens`` are dropped, and so are rows the training would refuse (ground
  truth that does not validate against the normalised schema, too many calls); both counted.

    python bench/tools_data.py OUT.jsonl [--model M.gguf] [--live-cap 150] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "bfcl"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_multiple", "irrelevance")
HELD_OUT = "live_simple"
FIRST_ROW = 30
LIVE_CAP = 150
MAX_PROMPT_TOKENS = 1536
NO_TOOL_ANSWER = "I can't do that with the tools I have."


def read_rows(category: str, data: Path = DATA) -> list[dict[str, Any]]:
    """Rows ``FIRST_ROW`` and later of a BFCL category (never the scored or calibration rows)."""
    if category == HELD_OUT:
        raise ValueError(f"{HELD_OUT} is the held-out category; it is never trained on.")
    with (data / f"{category}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for i, line in enumerate(f) if i >= FIRST_ROW and line.strip()]


def first_acceptable(options: Any) -> tuple[bool, Any]:
    """The first acceptable value that is not ``""`` (resolved by :func:`resolve`), and whether there is one."""
    for option in options if isinstance(options, list) else [options]:
        if option != "":
            return True, resolve(option)
    return False, None


def resolve(value: Any) -> Any:
    """One ground-truth value made concrete: a dict maps each key to its acceptable values
    (BFCL's checker reads it so), a list is a list of such values, anything else is itself."""
    if isinstance(value, dict):
        out = {}
        for key, options in value.items():
            present, chosen = first_acceptable(options)
            if present:
                out[key] = chosen
        return out
    if isinstance(value, list):
        return [resolve(v) for v in value]
    return value


def call_arguments(params: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One ground-truth call's ``{param: [acceptable...]}`` as arguments; with the tool's
    ``schema``, an optional parameter whose value does not fit it is left out."""
    import jsonschema

    props = (schema or {}).get("properties") or {}
    out = resolve(params)
    for key, options in params.items():
        optional = isinstance(options, list) and "" in options
        if optional and key in out and isinstance(props.get(key), Mapping):
            if not jsonschema.Draft202012Validator(props[key]).is_valid(out[key]):
                del out[key]
    return out


def ground_truth_calls(
    ground_truth: Iterable[Mapping[str, Any]], schemas: Mapping[str, Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """BFCL ground truth (``[{name: {param: [acceptable...]}}, ...]``) as ``{name, arguments}``
    calls; ``schemas`` maps tool names to their (normalised) parameter schemas."""
    calls = []
    for entry in ground_truth:
        for name, params in entry.items():
            calls.append({"name": name, "arguments": call_arguments(params, (schemas or {}).get(name))})
    return calls


def convert_row(row: Mapping[str, Any], category: str) -> dict[str, Any]:
    """A BFCL row as a tools-adapter training row (``id`` and ``category`` kept for reference)."""
    from pocket_agent.tools import Tool

    tools = [Tool.from_openai(f) for f in row["function"]]
    messages = [dict(m) for m in row["question"][0]]
    if category == "irrelevance":
        output: dict[str, Any] = {"content": NO_TOOL_ANSWER}
    else:
        schemas = {t.name: t.parameters for t in tools}
        output = {"tool_calls": ground_truth_calls(row["ground_truth"], schemas)}
    specs = [t.to_openai() for t in tools]
    return {"id": row["id"], "category": category, "messages": messages, "tools": specs, "output": output}


@dataclass
class Counts:
    """What happened to one category's rows."""

    rows: int = 0
    kept: int = 0
    too_long: int = 0
    invalid: int = 0


def sample_live(rows: Sequence[dict[str, Any]], cap: int, seed: int) -> list[dict[str, Any]]:
    """At most ``cap`` rows, a seeded choice kept in file order."""
    if len(rows) <= cap:
        return list(rows)
    picked = sorted(random.Random(seed).sample(range(len(rows)), cap))
    return [rows[i] for i in picked]


def build(
    model: Any, *, live_cap: int = LIVE_CAP, seed: int = 0, max_prompt_tokens: int = MAX_PROMPT_TOKENS
) -> tuple[list[dict[str, Any]], dict[str, Counts]]:
    """Training rows of every category and what was kept or dropped per category.

    Each row goes through ``tool_examples`` (what training does with it), so a kept row is one
    training accepts, and its prompt length is the agent's own.
    """
    from pocket_agent.errors import InvalidInputError
    from pocket_agent.training.tools import tool_examples

    out: list[dict[str, Any]] = []
    counts: dict[str, Counts] = {}
    for cat in CATEGORIES:
        rows = read_rows(cat)
        c = counts[cat] = Counts(rows=len(rows))
        if cat == "live_multiple":
            rows = sample_live(rows, live_cap, seed)
        for row in rows:
            converted = convert_row(row, cat)
            try:
                (example,) = tool_examples(model, [converted])
            except InvalidInputError:
                c.invalid += 1
                continue
            if len(example.prompt) > max_prompt_tokens:
                c.too_long += 1
                continue
            out.append(converted)
            c.kept += 1
    return out, counts


def main(argv: Iterable[str] | None = None) -> int:
    """Write the training rows to the given JSONL path and print counts per category."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="JSONL file to write")
    ap.add_argument("--model", default=None, help="GGUF whose prompts are measured (default: the embedded model)")
    ap.add_argument("--live-cap", type=int, default=LIVE_CAP, help="most live_multiple rows")
    ap.add_argument("--seed", type=int, default=0, help="seed of the live_multiple choice")
    ap.add_argument("--max-prompt-tokens", type=int, default=MAX_PROMPT_TOKENS)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(list(argv) if argv is not None else None)

    from pocket_agent.runtime import load_model

    model = load_model(args.model, threads=args.threads)
    rows, counts = build(model, live_cap=args.live_cap, seed=args.seed, max_prompt_tokens=args.max_prompt_tokens)
    print(f"| category | rows {FIRST_ROW}+ | kept | prompt > {args.max_prompt_tokens} tokens | refused |")
    print("|---|---|---|---|---|")
    for cat, c in counts.items():
        print(f"| {cat} | {c.rows} | {c.kept} | {c.too_long} | {c.invalid} |")
    total = Counts(*(sum(getattr(c, k) for c in counts.values()) for k in ("rows", "kept", "too_long", "invalid")))
    print(f"| all | {total.rows} | {total.kept} | {total.too_long} | {total.invalid} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
