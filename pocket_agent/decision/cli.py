"""``pocket-agent decide``: answer a question from the command line, or train a pointer head.

::

    pocket-agent decide "Is this review positive?" -o no -o yes --context "Great film."
    pocket-agent decide train data.jsonl -o my.dec [--model M] [--layer L]

The main CLI calls :func:`add_decide_parser` with its sub-parsers; the registered parser
sets ``func`` to :func:`run_decide_command`, which returns the process exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._cli_common import EXIT_OK, CliParser, add_model_options, check_input, open_model, read_input, run_command
from ..errors import InvalidInputError
from ._features import PARTS, FeatureSpec

_USAGE = (
    'pocket-agent decide "question" -o OPTION -o OPTION [--context TEXT] [--model M] [--threads N] [--method M]\n'
    "                           [--adapter PATH]\n"
    "       pocket-agent decide train DATA.jsonl -o OUT [--model M] [--threads N] [--layer L] [--features ...]"
)


def add_decide_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``decide`` (and its ``train`` form) on an ``argparse`` sub-parser collection."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "decide",
        help="pick one of several options in one forward pass, or train a pointer head",
        description=(
            "Answer a multiple-choice question (decide QUESTION -o OPT -o OPT ...), or train a pointer head "
            "from labelled JSONL rows {question, options, answer, context?} (decide train DATA.jsonl -o OUT)."
        ),
        usage=_USAGE,
    )
    p.add_argument("question", help="the question, or the word 'train' followed by the training data file")
    p.add_argument("data", nargs="?", help="(train) JSONL file of labelled questions")
    p.add_argument(
        "-o",
        "--option",
        dest="o",
        action="append",
        default=[],
        metavar="TEXT",
        help="an option (repeat for each option); with 'train': the output adapter path (folder, or .zip)",
    )
    p.add_argument("--context", default=None, help="text the question is about")
    p.add_argument("--context-file", default=None, help="read the context from this file")
    add_model_options(p)
    p.add_argument("--method", default="auto", choices=["auto", "cloze", "letter", "pointer"])
    p.add_argument("--adapter", default=None, help="a Dec adapter (folder, .zip or head.safetensors) to load")
    p.add_argument("--json", action="store_true", help="print the decision as JSON")
    t = p.add_argument_group("training (decide train)")
    t.add_argument(
        "--features",
        default=None,
        help=f"'auto' (default: pick the best of a few candidates) or comma-separated parts ({', '.join(PARTS)})",
    )
    t.add_argument(
        "--layer",
        default="auto",
        help="read hidden states after this block (an integer), at 'final_norm', or 'auto' (60%% of the depth)",
    )
    t.add_argument("--rotations", type=int, default=1, help="option-rotated copies per training question")
    t.add_argument("--val-fraction", type=float, default=0.2, help="share of questions held out for validation")
    t.add_argument("--seed", type=int, default=0, help="shuffle seed of the split")
    t.add_argument("--no-compare", action="store_true", help="skip scoring the zero-shot methods on validation")
    p.set_defaults(func=run_decide_command)
    return p


def run_decide_command(args: argparse.Namespace) -> int:
    """Run ``decide`` or ``decide train`` from parsed arguments; return the exit status."""
    if args.question == "train" and args.data is not None:
        return _train(args)
    if args.data is not None:
        raise InvalidInputError(f"unexpected argument {args.data!r}; give each option with -o.")
    return _decide(args)


def _decide(args: argparse.Namespace) -> int:
    from .adapter import load_decision_adapter
    from .core import decide

    context = read_input(args.context_file, "--context-file") if args.context_file else args.context
    model = open_model(args)
    if args.adapter:
        load_decision_adapter(model, args.adapter)
    d = decide(args.question, args.o, context=context, model=model, method=args.method)
    if args.json:
        print(json.dumps({"choice": d.choice, "index": d.index, "scores": d.scores, "method": d.method}))
    else:
        print(d.choice)
        for opt, p in zip(d.options, d.scores, strict=True):
            mark = "*" if opt == d.choice else " "
            print(f" {mark} {p:6.3f}  {opt}", file=sys.stderr)
        print(f"   method: {d.method}", file=sys.stderr)
    return EXIT_OK


def _train(args: argparse.Namespace) -> int:
    from .train import HeadTraining, default_layer, load_examples, train_head

    if len(args.o) != 1:
        raise InvalidInputError("decide train needs exactly one output path: -o OUT (a folder, or a .zip file).")
    out = args.o[0]
    check_input(args.data, "training data")
    examples = load_examples(args.data)
    layer: int | str = args.layer
    if isinstance(layer, str) and layer.isdigit():
        layer = int(layer)
    elif layer not in ("auto", "final_norm"):
        raise InvalidInputError(f"--layer must be an integer, 'final_norm' or 'auto', got {layer!r}.")
    model = open_model(args)
    features: FeatureSpec | str = "auto"
    if args.features and args.features != "auto":
        parts = tuple(p.strip() for p in args.features.split(",") if p.strip())
        features = FeatureSpec(parts=parts, layer=default_layer(model) if layer == "auto" else layer)

    def progress(stage: str, done: int, total: int) -> None:
        print(f"\r{stage}: {done}/{total}", end="", file=sys.stderr, flush=True)

    result = train_head(
        examples,
        model,
        training=HeadTraining(
            features=features,
            layer=layer,
            rotations=args.rotations,
            val_fraction=args.val_fraction,
            seed=args.seed,
            compare=() if args.no_compare else ("cloze", "letter"),
        ),
        progress=progress,
        metadata={"data": str(args.data)},
    )
    print(file=sys.stderr)
    path = result.adapter.save(out)
    print(result.summary())
    print(f"saved {path}; use it with: pocket-agent decide QUESTION -o ... --adapter {path}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m pocket_agent.decision.cli ...``)."""
    parser = CliParser(prog="pocket-agent")
    sub = parser.add_subparsers(dest="command", required=True)
    add_decide_parser(sub)
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
