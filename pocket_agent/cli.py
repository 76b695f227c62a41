"""The ``pocket-agent`` command line (also ``python -m pocket_agent``).

Shared pieces (parser, model options, references, errors, exit statuses) are in
:mod:`pocket_agent._cli_common`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ._cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    CliParser,
    add_model_options,
    check_input,
    check_output,
    load_schema_option,
    open_model,
    open_output,
    positive_int,
    read_input,
    row_error,
    run_command,
    summary_line,
    version_string,
)
from .errors import InvalidInputError
from .options import DEFAULT_MAX_TOKENS


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} GB"


def cmd_info(args: argparse.Namespace) -> int:
    """``info``: print what a model is."""
    model = open_model(args)
    info = model.info
    rows = [
        ("backend", info.backend),
        ("path", str(info.path)),
        ("name", info.name),
        ("architecture", info.architecture),
        ("vocab size", str(info.n_vocab)),
        ("context", f"{info.n_ctx} (trained {info.n_ctx_train})"),
        ("embedding size", str(info.n_embd)),
        ("chat template", info.chat_template_source),
        ("file size", _human_size(info.file_size)),
        ("eos tokens", ", ".join(repr(model.decode([t])) for t in model.vocab.eos_ids)),
    ]
    rows += [(k, _with_size(v) if k in ("weights", "generation weights") else v) for k, v in info.extra.items()]
    rows += _default_model_rows(args, info.backend)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    model.close()
    return EXIT_OK


def _with_size(path: str) -> str:
    try:
        return f"{path} ({_human_size(Path(path).stat().st_size)})"
    except OSError:
        return path


def _default_model_rows(args: argparse.Namespace, backend: str) -> list[tuple[str, str]]:
    """For the default model on llama.cpp: how its tasks share it, and what the cache holds."""
    import os

    from .runtime.layout import cache_usage
    from .runtime.loader import ENV_MODEL, tasks_note

    if args.model is not None or os.environ.get(ENV_MODEL) or backend != "llamacpp":
        return []
    count, size, folder = cache_usage()
    cache = f"{count} derived copies, {_human_size(size)}, in {folder} (safe to delete; rewritten on use)"
    return [("tasks", tasks_note()), ("cache", cache)]


_FINISH_WORDS = {
    "eos": "the model ended its reply",
    "length": "--max-tokens was reached",
    "stop": "a stop string was reached",
    "grammar": "the output was complete",
}


def cmd_generate(args: argparse.Namespace) -> int:
    """``generate``: stream a reply to a prompt."""
    from .generate import TokenEvent, render_prompt, run_generation
    from .options import Limits, Sampling

    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    limits = Limits(max_tokens=args.max_tokens)
    prompt = args.prompt if args.prompt != "-" else sys.stdin.read()
    model = open_model(args)
    ids = render_prompt(model, prompt, system=args.system)

    def show(ev: TokenEvent) -> None:
        sys.stdout.write(ev.text)
        sys.stdout.flush()

    result = run_generation(model, ids, sampling=sampling, limits=limits, on_event=show)
    sys.stdout.write("\n")
    u = result.usage
    line = f"[{u.completion_tokens} tokens; stopped: {_FINISH_WORDS.get(result.finish_reason, result.finish_reason)}]"
    if args.verbose:
        rate = u.completion_tokens / u.decode_s if u.decode_s else 0.0
        line += f" prompt {u.prompt_tokens} tokens in {u.prefill_s:.2f}s, {rate:.1f} tok/s"
    print(line, file=sys.stderr)
    model.close()
    return EXIT_OK


def cmd_convert(args: argparse.Namespace) -> int:
    """``convert``: a GGUF file or HF folder to an MNN build."""
    from .convert import main_convert

    return main_convert(args)


def _jsonable(value: Any) -> Any:
    from pydantic import BaseModel

    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _read_jsonl_texts(path: Path) -> Iterator[Any]:
    """Documents from a JSONL file: each line a JSON string or an object with "text".

    A line that is not valid JSON yields an error object, so extract_many reports it for
    that line and goes on.
    """
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                yield InvalidInputError(f"line {n} is not valid JSON: {exc}")
                continue
            if isinstance(row, dict):
                yield row.get("text", InvalidInputError(f"line {n} has no 'text' field"))
            else:
                yield row


def _adapter_choice(value: str) -> str | None:
    """``--adapter``: ``auto``, ``none`` or a LoRA file's path."""
    return None if value.lower() == "none" else value


def _write_rows(outcomes: Iterable[Any], out: TextIO, files: Sequence[str] | None) -> tuple[int, int]:
    """One JSON line per outcome (``files``: the document each came from); (rows, failed)."""
    total = failed = 0
    for res in outcomes:
        row: dict[str, Any] = {"index": res.index}
        if files is not None:
            row["file"] = files[res.index]
        row["ok"] = res.ok
        if res.ok:
            row["value"] = _jsonable(res.value)
        else:
            failed += 1
            row["error"] = row_error(type(res.error).__name__, str(res.error))
            row["error_type"] = type(res.error).__name__
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        out.flush()
        total += 1
    return total, failed


def _extract_rows(args: argparse.Namespace, schema: Any, texts: Iterable[Any], files: Sequence[str] | None) -> int:
    """Extract from several documents: JSON lines, a summary line on stderr, exit 1 if any failed."""
    from .extraction import extract_many

    model = open_model(args, merge_adapter=_merge(args))
    outcomes = extract_many(
        texts, schema, model=model, max_tokens=args.max_tokens, adapter=_adapter_choice(args.adapter)
    )
    out = open_output(args.out)
    try:
        total, failed = _write_rows(outcomes, out, files)
    finally:
        if out is not sys.stdout:
            out.close()
    print(summary_line("extract", total, failed, args.out), file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def _merge(args: argparse.Namespace) -> str | None:
    # the shipped adapter: merged into the weights, which runs faster than applying it (runtime/merged.py)
    return "extract" if _adapter_choice(args.adapter) == "auto" else None


def _check_extract_inputs(args: argparse.Namespace) -> None:
    """Every input and the output place, checked before a model is loaded."""
    if args.many and args.files:
        raise InvalidInputError("give documents as FILE arguments or as --many INPUT.jsonl, not both.")
    if not args.many and not args.files:
        raise InvalidInputError("give a FILE to extract from (- reads stdin), several FILEs, or --many INPUT.jsonl.")
    if args.files.count("-") > 1:
        raise InvalidInputError("stdin (-) can be read once; give it as one FILE only.")
    for path in args.files:
        check_input(path, "document")
    if args.many:
        check_input(args.many, "--many input")
    if args.ray and not args.many:
        raise InvalidInputError("--ray runs --many INPUT.jsonl on a Ray cluster; give --many.")
    check_output(args.out)


def cmd_extract(args: argparse.Namespace) -> int:
    """``extract``: one JSON object per document (pretty for one FILE, JSON lines for several or --many)."""
    _check_extract_inputs(args)
    schema = load_schema_option(args.schema)
    if args.ray:  # the actors load the model; Ray is imported only here
        from .distributed.cli import extract_many_on_ray

        return extract_many_on_ray(args, schema)
    if args.many:
        return _extract_rows(args, schema, _read_jsonl_texts(Path(args.many)), None)
    texts = [read_input(path, "document") for path in args.files]
    if len(texts) > 1:
        return _extract_rows(args, schema, texts, args.files)
    from .extraction import extract

    model = open_model(args, merge_adapter=_merge(args))
    value = extract(texts[0], schema, model=model, max_tokens=args.max_tokens, adapter=_adapter_choice(args.adapter))
    out = open_output(args.out)
    try:
        print(json.dumps(_jsonable(value), ensure_ascii=False, indent=2), file=out)
    finally:
        if out is not sys.stdout:
            out.close()
    return EXIT_OK


def _probability(text: str) -> float:
    """``argparse`` type of ``--top-p``: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number above 0 and at most 1, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    """``argparse`` type of ``--temperature``: a number of at least 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text!r}")
    return value


def _add_generate_parser(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate a reply to a prompt (chat template applied)")
    add_model_options(p, positional=True)
    p.add_argument("prompt", help="the user message ('-' reads stdin)")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument("--temperature", type=_non_negative, default=0.0, help="0 (default) picks the likeliest token")
    p.add_argument("--top-p", type=_probability, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--verbose", "-v", action="store_true", help="also print prompt size and speed to stderr")
    p.set_defaults(func=cmd_generate)


def _add_extract_parser(sub: Any) -> None:
    p = sub.add_parser(
        "extract",
        help="extract a JSON object matching a schema from documents",
        description=(
            "One FILE: the JSON object, indented. Several FILEs or --many: one JSON line per document, in order "
            '({"index", "file" (FILEs only), "ok", "value" or "error"}), then a summary line on stderr; '
            "the exit status is 1 when any document failed."
        ),
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="the documents ('-' reads stdin)")
    p.add_argument(
        "--schema", "-s", required=True, help="schema.json, module:PydanticClass or path/to/file.py:PydanticClass"
    )
    p.add_argument("--many", default=None, metavar="INPUT.jsonl", help="extract from every line of a JSONL file")
    p.add_argument("--out", "-o", default=None, metavar="OUT", help="where the results go (default stdout)")
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens of one output (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--adapter",
        default="auto",
        metavar="auto|none|LORA.gguf",
        help="extraction LoRA: auto (the one shipped for the model, default), none, or a file from 'tune extract'",
    )
    p.add_argument(
        "--ray", action="store_true", help="run --many on Ray Data (extra: ray): local Ray, or $RAY_ADDRESS if set"
    )
    p.add_argument("--actors", type=positive_int, default=None, help="with --ray: models in parallel (default: CPUs)")
    add_model_options(p)
    p.set_defaults(func=cmd_extract)


def build_parser() -> argparse.ArgumentParser:
    """The ``pocket-agent`` parser with every subcommand."""
    parser = CliParser(
        prog="pocket-agent",
        description="Structured extraction, agents and decisions on tiny on-device language models.",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument("--version", action="version", version=version_string())
    sub = parser.add_subparsers(dest="command", required=True)

    p_info = sub.add_parser("info", help="print what a model is: backend, architecture, vocab, context, template")
    add_model_options(p_info, positional=True)
    p_info.set_defaults(func=cmd_info)

    _add_generate_parser(sub)
    _add_extract_parser(sub)

    from .tools.cli import add_run_parser

    add_run_parser(sub)

    from .decision.cli import add_decide_parser

    add_decide_parser(sub)

    from .training.cli import add_tune_parser

    add_tune_parser(sub)

    from .server.cli import add_serve_parser

    add_serve_parser(sub)

    p_conv = sub.add_parser("convert", help="convert a GGUF file or HF folder to an MNN build (extra: convert)")
    from .convert import add_convert_arguments

    add_convert_arguments(p_conv)
    p_conv.set_defaults(func=cmd_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pocket-agent``; returns the exit status (see ``pocket-agent --help``)."""
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
