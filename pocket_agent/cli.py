"""The ``pocket-agent`` command line (also ``python -m pocket_agent``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import PocketAgentError


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


def cmd_generate(args: argparse.Namespace) -> int:
    from .generate import SamplingParams, TokenEvent, render_prompt, run_generation
    from .runtime import load_model

    model = load_model(args.model, threads=args.threads)
    prompt = args.prompt if args.prompt != "-" else sys.stdin.read()
    ids = render_prompt(model, prompt, system=args.system)

    def show(ev: TokenEvent) -> None:
        sys.stdout.write(ev.text)
        sys.stdout.flush()

    result = run_generation(
        model,
        ids,
        max_tokens=args.max_tokens,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed),
        on_event=show,
    )
    sys.stdout.write("\n")
    st = result.stats
    if args.verbose:
        rate = st.completion_tokens / st.decode_s if st.decode_s else 0.0
        print(
            f"[{result.finish_reason}] prompt {st.prompt_tokens} tokens in {st.prefill_s:.2f}s, "
            f"{st.completion_tokens} tokens at {rate:.1f} tok/s",
            file=sys.stderr,
        )
    model.close()
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert_to_mnn

    if args.to != "mnn":
        raise SystemExit(f"--to {args.to}: only 'mnn' is supported.")
    out = convert_to_mnn(
        args.source, args.output, quant_bit=args.quant_bit, quant_block=args.quant_block, overwrite=args.overwrite
    )
    print(f"MNN build written: {out}")
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
    p_gen.add_argument("--max-tokens", type=int, default=256)
    p_gen.add_argument("--temperature", type=float, default=0.0)
    p_gen.add_argument("--top-p", type=float, default=1.0)
    p_gen.add_argument("--top-k", type=int, default=0)
    p_gen.add_argument("--seed", type=int, default=None)
    p_gen.add_argument("--verbose", "-v", action="store_true", help="print token counts and speed to stderr")
    p_gen.set_defaults(func=cmd_generate)

    p_conv = sub.add_parser("convert", help="convert a GGUF file or HF folder to an MNN build (extra: convert)")
    p_conv.add_argument("source", help="MODEL.gguf or a Hugging Face model folder")
    p_conv.add_argument("--to", default="mnn", choices=["mnn"])
    p_conv.add_argument("--quant-bit", type=int, default=4)
    p_conv.add_argument("--quant-block", type=int, default=64)
    p_conv.add_argument("--output", "-o", type=Path, required=True, help="output folder")
    p_conv.add_argument("--overwrite", action="store_true")
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
