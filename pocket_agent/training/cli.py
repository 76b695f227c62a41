"""``pocket-agent tune``: train an adapter on the CPU from JSONL examples.

::

    pocket-agent tune decide DATA.jsonl -o my.dec.zip [--model M] [--epochs N] [--resume DIR]
    pocket-agent tune extract DATA.jsonl --schema module:Model -o extract.gguf [--model M]
    pocket-agent tune tools DATA.jsonl -o tools.gguf [--model M]

Needs the ``train`` extra (torch, transformers). The main CLI calls :func:`add_tune_parser`.
"""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

from .._cli_common import EXIT_OK, add_model_options, check_input, load_schema_option, open_model, positive_int
from ..errors import InvalidInputError

if TYPE_CHECKING:
    from .extract import AdapterResult

TASKS = ("decide", "extract", "tools")


def add_tune_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``tune decide|extract|tools DATA.jsonl -o OUT ...`` on the ``pocket-agent`` sub-parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        help="train a LoRA adapter on the CPU (extra: train)",
        description=(
            "Train an adapter from labelled JSONL rows. decide: {question, options, answer, context?} rows -> "
            "a Dec adapter (LoRA + pointer head) that decide() loads with --adapter or load_decision_adapter(). "
            "extract: {text, output} rows and --schema (or a schema per row) -> a GGUF LoRA; "
            "'pocket-agent extract --adapter PATH' applies it. "
            "tools: {messages, tools, output} rows (output: {tool_calls: [...]} or {content: ...}) -> a GGUF LoRA "
            "for an Agent's turns; in Python, model.load_lora(PATH) applies it."
        ),
    )
    p.add_argument("task", choices=TASKS, help="what the adapter is for")
    p.add_argument("data", help="JSONL training examples")
    p.add_argument("-o", "--out", required=True, help="output: decide: a folder or .zip; extract, tools: a .gguf file")
    p.add_argument(
        "--schema",
        "-s",
        default=None,
        help="(extract) schema.json, module:PydanticClass or path/to/file.py:PydanticClass",
    )
    add_model_options(
        p, model_help="the base model, a .gguf file (default: $POCKET_AGENT_MODEL, else the embedded model)"
    )
    p.add_argument(
        "--checkpoint", default=None, help="HF folder of the same weights (default: converted from the GGUF)"
    )
    p.add_argument("--epochs", type=positive_int, default=None)
    p.add_argument("--rank", type=positive_int, default=None)
    p.add_argument("--layer", type=int, default=None, help="block the head reads (default: 60%% of the depth)")
    p.add_argument("--lora-blocks", type=positive_int, default=None, help="blocks that carry the LoRA")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--resume", default=None, metavar="DIR", help="save training state here and resume from it")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run_tune_command)
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings given on the command line, checked against the task."""
    if args.task != "decide" and args.layer is not None:
        raise InvalidInputError("--layer applies to decide adapters only.")
    if args.task == "tools" and args.schema is not None:
        raise InvalidInputError("--schema applies to extract adapters only; a tools row carries its own tools.")
    overrides: dict[str, Any] = {}
    for name in ("epochs", "rank", "lr", "seed", "lora_blocks", "layer"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    return overrides


def run_tune_command(args: argparse.Namespace) -> int:
    """Run ``tune decide|extract|tools``; return the exit status."""
    overrides = _overrides(args)
    check_input(args.data, "training data")
    try:
        from . import DecideTraining, SftTraining, train_decide_adapter, train_extract_adapter, train_tools_adapter
    except ImportError as exc:  # torch or transformers missing
        raise InvalidInputError(
            f"pocket-agent tune needs the train extra ({exc.name} is missing): pip install 'pocket-agent-mnn[train]'"
        ) from exc
    from ..decision import load_examples
    from ._progress import ProgressBar

    bar = ProgressBar(enabled=not args.quiet)
    common: dict[str, Any] = {
        "checkpoint": args.checkpoint,
        "resume": args.resume,
        "progress": bar,
        "metadata": {"data": str(args.data)},
    }
    if args.task == "decide":
        examples = load_examples(args.data)
        training = DecideTraining(threads=args.threads, **overrides)
        result = train_decide_adapter(examples, open_model(args), training=training, **common)
        path = result.adapter.save(args.out)
        print(result.summary())
        print(f"wrote {path}; use it with: pocket-agent decide QUESTION -o ... --adapter {path}")
        return EXIT_OK
    rows = list(_read_rows(args.data))
    train: Any = functools.partial(train_tools_adapter, rows)
    if args.task == "extract":
        if args.schema is None and not all(isinstance(r, dict) and "schema" in r for r in rows):
            raise InvalidInputError(
                "tune extract needs --schema (schema.json, module:PydanticClass or file.py:PydanticClass), "
                "or a 'schema' in every row."
            )
        schema = load_schema_option(args.schema) if args.schema is not None else None
        train = functools.partial(train_extract_adapter, rows, schema)
    res = train(open_model(args), training=SftTraining(threads=args.threads, **overrides), **common)
    return _report_lora(res, args.out, args.task)


def _report_lora(res: AdapterResult, out: str, task: str) -> int:
    """Save a generation adapter's LoRA to ``out`` and say how training went and how to use it."""
    path = res.save(out)
    print(res.summary())
    if task == "extract":
        print(f"wrote {path}; use it with: pocket-agent extract FILE --schema ... --adapter {path}")
    else:
        print(f"wrote {path}; in Python, model.load_lora({str(path)!r}) applies it")
    return EXIT_OK


def _read_rows(path: str) -> list[dict[str, Any]]:
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"Training data not found: {p}")
    rows = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise InvalidInputError(f"{p}:{n}: not valid JSON: {exc}") from exc
    if not rows:
        raise InvalidInputError(f"{p} holds no examples.")
    return rows
