"""The ``pocket-agent`` command line (also ``python -m pocket_agent``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import InvalidInputError, PocketAgentError


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} GB"


def cmd_info(args: argparse.Namespace) -> int:
    from .runtime import load_model

    model = load_model(args.model, threads=args.threads)
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
    rows += [(k, v) for k, v in info.extra.items()]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    model.close()
    return 0


_FINISH_WORDS = {
    "eos": "the model ended its reply",
    "length": "--max-tokens was reached",
    "stop": "a stop string was reached",
    "grammar": "the output was complete",
}


def cmd_generate(args: argparse.Namespace) -> int:
    from .generate import TokenEvent, render_prompt, run_generation
    from .options import Limits, Sampling
    from .runtime import load_model

    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    limits = Limits(max_tokens=args.max_tokens)
    model = load_model(args.model, threads=args.threads)
    prompt = args.prompt if args.prompt != "-" else sys.stdin.read()
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
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
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


def cmd_extract(args: argparse.Namespace) -> int:
    from .extraction import extract, extract_many, load_schema
    from .runtime import load_model

    schema = load_schema(args.schema)
    if args.ray:  # the actors load the model; Ray is imported only here
        from .distributed.cli import extract_many_on_ray

        return extract_many_on_ray(args, schema)
    # the shipped adapter: merged into the weights, which runs faster than applying it (runtime/merged.py)
    merge = "extract" if _adapter_choice(args.adapter) == "auto" else None
    model = load_model(args.model, threads=args.threads, merge_adapter=merge)
    if args.many:
        out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
        failed = 0
        try:
            for res in extract_many(
                _read_jsonl_texts(Path(args.many)),
                schema,
                model=model,
                max_tokens=args.max_tokens,
                adapter=_adapter_choice(args.adapter),
            ):
                row: dict[str, Any] = {"index": res.index, "ok": res.ok}
                if res.ok:
                    row["value"] = _jsonable(res.value)
                else:
                    failed += 1
                    row["error"] = str(res.error)
                    row["error_type"] = type(res.error).__name__
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                out.flush()
        finally:
            if out is not sys.stdout:
                out.close()
        return 1 if failed else 0
    if args.file is None:
        raise InvalidInputError("Give a FILE (or - for stdin), or --many input.jsonl.")
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    value = extract(text, schema, model=model, max_tokens=args.max_tokens, adapter=_adapter_choice(args.adapter))
    print(json.dumps(_jsonable(value), ensure_ascii=False, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pocket-agent",
        description="Structured extraction, agents and decisions on tiny on-device language models.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser, positional: bool, optional: bool = False) -> None:
        if positional:
            p.add_argument(
                "model",
                nargs="?" if optional else None,
                default=None,
                help="a .gguf file, an MNN build config.json or its folder (default: $POCKET_AGENT_MODEL or embedded)",
            )
        else:
            p.add_argument("--model", "-m", default=None, help="model path (default: $POCKET_AGENT_MODEL or embedded)")
        p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: all cores)")

    p_info = sub.add_parser("info", help="print what a model is: backend, architecture, vocab, context, template")
    model_args(p_info, positional=True, optional=True)
    p_info.set_defaults(func=cmd_info)

    p_gen = sub.add_parser("generate", help="generate a reply to a prompt (chat template applied)")
    model_args(p_gen, positional=True)
    p_gen.add_argument("prompt", help="the user message ('-' reads stdin)")
    p_gen.add_argument("--system", default=None, help="system message")
    p_gen.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    p_gen.add_argument("--temperature", type=float, default=0.0)
    p_gen.add_argument("--top-p", type=float, default=1.0)
    p_gen.add_argument("--top-k", type=int, default=0)
    p_gen.add_argument("--seed", type=int, default=None)
    p_gen.add_argument("--verbose", "-v", action="store_true", help="also print prompt size and speed to stderr")
    p_gen.set_defaults(func=cmd_generate)

    p_ext = sub.add_parser("extract", help="extract a JSON object matching a schema from a document")
    p_ext.add_argument("file", nargs="?", default=None, help="the document ('-' reads stdin)")
    p_ext.add_argument("--schema", "-s", required=True, help="module:PydanticClass or schema.json")
    p_ext.add_argument("--many", default=None, metavar="INPUT.jsonl", help="extract from every line of a JSONL file")
    p_ext.add_argument("--out", "-o", default=None, metavar="OUT.jsonl", help="where --many writes (default stdout)")
    p_ext.add_argument("--max-tokens", type=int, default=None)
    p_ext.add_argument(
        "--adapter",
        default="auto",
        metavar="auto|none|LORA.gguf",
        help="extraction LoRA: auto (the one shipped for the model, default), none, or a file from 'tune extract'",
    )
    p_ext.add_argument(
        "--ray", action="store_true", help="run --many on Ray Data (extra: ray): local Ray, or $RAY_ADDRESS if set"
    )
    p_ext.add_argument("--actors", type=int, default=None, help="with --ray: models in parallel (default: CPUs)")
    p_ext.add_argument("--model", "-m", default=None, help="model path (default: $POCKET_AGENT_MODEL or embedded)")
    p_ext.add_argument("--threads", "-t", type=int, default=None)
    p_ext.set_defaults(func=cmd_extract)

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
    """Entry point of ``pocket-agent``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except PocketAgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into a command that stopped reading (head)
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
