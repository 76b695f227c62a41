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

from ..errors import InvalidInputError

if TYPE_CHECKING:
    from .extract import AdapterResult

TASKS = ("decide", "extract", "tools")


def add_tune_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        help="train a LoRA adapter on the CPU (extra: train)",
        description=(
            "Train an adapter from labelled JSONL rows. decide: {question, options, answer, context?} rows -> "
            "a Dec adapter (LoRA + pointer head) that decide() loads with --adapter or load_decision_adapter(). "
            "extract: {text, output} rows and --schema (or a schema per row) -> a GGUF LoRA; "
            "extract(..., adapter=path) or model.load_lora(path) applies it. "
            "tools: {messages, tools, output} rows (output: {tool_calls: [...]} or {content: ...}) -> a GGUF LoRA "
            "for an Agent's turns; model.load_lora(path) applies it."
        ),
    )
    p.add_argument("task", choices=TASKS, help="what the adapter is for")
    p.add_argument("data", help="JSONL training examples")
    p.add_argument("-o", "--out", required=True, help="output: decide: a folder or .zip; extract, tools: a .gguf file")
    p.add_argument("--schema", "-s", default=None, help="(extract) module:PydanticClass or schema.json")
    p.add_argument("--model", "-m", default=None, help="the base model, a .gguf file (default: the embedded model)")
    p.add_argument(
        "--checkpoint", default=None, help="HF folder of the same weights (default: converted from the GGUF)"
    )
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--layer", type=int, default=None, help="block the head reads (default: 60%% of the depth)")
    p.add_argument("--lora-blocks", type=int, default=None, help="blocks that carry the LoRA")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--resume", default=None, metavar="DIR", help="save training state here and resume from it")
    p.add_argument("--threads", "-t", type=int, default=None)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run_tune_command)
    return p


def run_tune_command(args: argparse.Namespace) -> int:
    try:
        from . import DecideTraining, SftTraining, train_decide_adapter, train_extract_adapter, train_tools_adapter
    except ImportError as exc:  # torch or transformers missing
        raise InvalidInputError(
            f"pocket-agent tune needs the train extra ({exc.name} is missing): pip install 'pocket-agent-mnn[train]'"
        ) from exc
    from ..decision import load_examples
    from ..runtime import load_model
    from ._progress import ProgressBar

    overrides: dict[str, Any] = {}
    for name in ("epochs", "rank", "lr", "seed"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.lora_blocks is not None:
        overrides["lora_blocks"] = args.lora_blocks
    if args.task != "decide" and args.layer is not None:
        raise InvalidInputError("--layer applies to decide adapters only.")
    if args.task == "tools" and args.schema is not None:
        raise InvalidInputError("--schema applies to extract adapters only; a tools row carries its own tools.")
    threads = args.threads
    model = load_model(args.model, threads=threads)
    bar = ProgressBar(enabled=not args.quiet)
    if args.task in ("tools", "extract"):
        rows = list(_read_rows(args.data))
        if args.task == "tools":
            train: Any = functools.partial(train_tools_adapter, rows, model)
        else:
            from ..extraction import load_schema

            if args.schema is None and not all(isinstance(r, dict) and "schema" in r for r in rows):
                raise InvalidInputError(
                    "tune extract needs --schema (module:PydanticClass or schema.json), or a 'schema' in every row."
                )
            schema = load_schema(args.schema) if args.schema is not None else None
            train = functools.partial(train_extract_adapter, rows, schema, model)
        res = train(
            training=SftTraining(threads=threads, **overrides),
            checkpoint=args.checkpoint,
            resume=args.resume,
            progress=bar,
            metadata={"data": str(args.data)},
        )
        return _report_lora(res, args.out)
    if args.layer is not None:
        overrides["layer"] = args.layer
    training = DecideTraining(threads=threads, **overrides)
    examples = load_examples(args.data)
    result = train_decide_adapter(
        examples,
        model,
        training=training,
        checkpoint=args.checkpoint,
        resume=args.resume,
        progress=bar,
        metadata={"data": str(args.data)},
    )
    path = result.adapter.save(args.out)
    print(result.summary())
    print(f"wrote {path}")
    return 0


def _report_lora(res: AdapterResult, out: str) -> int:
    """Save a generation adapter's LoRA to ``out`` and say how training went."""
    path = res.save(out)
    print(res.summary())
    print(f"wrote {path}; apply it with model.load_lora({str(path)!r})")
    return 0


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
