"""The limit: the best prefill and decode tok/s this machine allows for a GGUF model.

Measures the machine, then turns the model's weights into a ceiling:

  * matrix throughput: int8 GEMM (u8 x s8 -> s32, fbgemm's AVX2/AVX-512 kernels: the same
    instruction class llama.cpp uses for quantized weights, whose activations it quantizes
    to 8 bits before the dot products), bf16 GEMM (oneDNN: AVX512-BF16 where the CPU has it,
    the class of llama.cpp's BF16 kernels) and f32 GEMM (MKL/OpenBLAS), at 1 and 2 threads;
  * memory bandwidth: a streaming read of an array far larger than the last-level cache.

  prefill tok/s <= throughput / FLOPs per prompt token. A prompt token multiplies every
      block weight (2 FLOPs per weight, at the int8 rate for quantized types, the bf16 rate for
      BF16, the f32 rate for other float types) plus attention over the context (f32 rate);
      the output head runs only for
      the last prompt position, so it is left out.
  decode tok/s <= bandwidth / bytes read per token: every block weight, the output head (tied
      to the token embedding in SmolLM2) and the K/V cache of the context.

Both are ceilings, not predictions: real kernels also unpack 4-bit blocks, apply scales and
synchronise threads. Other benches import :func:`machine_limit`::

    sys.path.insert(0, "bench"); from limit import machine_limit
    lim = machine_limit(model_path, threads=1)    # Limit(prefill_tok_s=..., decode_tok_s=..., ...)

    python bench/limit.py [--model PATH] [--threads 1 2] [--out bench/limit.md]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import cpu_model, package_versions  # noqa: E402

PACKAGES = ("llama-cpp-python", "torch", "gguf", "numpy")

# GGUF weight types llama.cpp multiplies with integer dot products on x86 (activations quantized
# to Q8 first); the rest (F32, F16, BF16) go through float kernels.
FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}
GEMM_SHAPES = ((512, 576, 1536), (512, 1536, 576))  # SmolLM2-135M's FFN shapes, a 512-token prompt
READ_BYTES = 512 * 2**20


# -- the machine ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """Measured throughput of this machine at one thread count."""

    threads: int
    int8_gops: float
    """int8 GEMM, giga multiply-adds x 2 per second (GOP/s)."""
    f32_gflops: float
    bf16_gflops: float
    read_gbs: float
    """Streaming read bandwidth, GB/s (10^9 bytes)."""


def _best(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _gemm_int8(threads: int, repeats: int) -> float:
    import warnings

    import torch

    torch.set_num_threads(threads)
    torch.backends.quantized.engine = "fbgemm"
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m, k, n in GEMM_SHAPES:
            lin = torch.ao.nn.quantized.Linear(k, n)
            lin.set_weight_bias(torch.quantize_per_tensor(torch.randn(n, k), 0.02, 0, torch.qint8), None)
            x = torch.quantize_per_tensor(torch.randn(m, k), 0.05, 128, torch.quint8)
            rates.append(2 * m * k * n / _best(lambda lin=lin, x=x: lin(x), repeats) / 1e9)
    return max(rates)


def _gemm_float(threads: int, repeats: int, dtype: str) -> float:
    import torch

    torch.set_num_threads(threads)
    rates = []
    for m, k, n in GEMM_SHAPES:
        a, b = torch.randn(m, k).to(getattr(torch, dtype)), torch.randn(k, n).to(getattr(torch, dtype))
        rates.append(2 * m * k * n / _best(lambda a=a, b=b: a @ b, repeats) / 1e9)
    return max(rates)


def _read_bandwidth(threads: int, repeats: int) -> float:
    import torch

    torch.set_num_threads(threads)
    buf = torch.ones(READ_BYTES // 8, dtype=torch.int64)  # 16x a 32 MiB L3: no cache hits
    return READ_BYTES / _best(lambda: buf.sum(), repeats) / 1e9


@functools.cache
def measure_machine(threads: int, repeats: int = 7) -> Machine:
    """Measure int8, f32 and bf16 GEMM throughput and read bandwidth with ``threads`` threads
    (needs torch, from the ``convert`` extra); cached per process."""
    return Machine(
        threads=threads,
        int8_gops=_gemm_int8(threads, repeats),
        f32_gflops=_gemm_float(threads, repeats, "float32"),
        bf16_gflops=_gemm_float(threads, repeats, "bfloat16"),
        read_gbs=_read_bandwidth(threads, repeats),
    )


# -- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCost:
    """What one token costs a GGUF model, read from its tensors and metadata."""

    name: str
    block_params_int: int
    """Block weights of quantized types (multiplied with int8 dot products)."""
    block_params_float: int
    """Block weights of float types other than BF16."""
    block_params_bf16: int
    head_params: int
    head_type: str
    block_bytes: int
    head_bytes: int
    n_layer: int
    n_embd: int
    n_kv_dim: int
    """K (= V) width per layer: n_head_kv x head_dim."""
    weight_types: str

    @property
    def params(self) -> int:
        return self.block_params_int + self.block_params_float + self.block_params_bf16 + self.head_params

    def prefill_ops(self, context: int) -> tuple[float, float, float]:
        """(int8 ops, bf16 FLOPs, f32 FLOPs) for one prompt token at ``context`` tokens of attention."""
        attn = 4.0 * self.n_layer * self.n_embd * context  # QK^T and PV
        return 2.0 * self.block_params_int, 2.0 * self.block_params_bf16, 2.0 * self.block_params_float + attn

    def decode_bytes(self, context: int) -> float:
        """Bytes read for one decoded token with ``context`` tokens in the K/V cache (F16)."""
        return self.block_bytes + self.head_bytes + 2 * 2 * self.n_layer * self.n_kv_dim * context


@functools.cache
def model_cost(path: str) -> ModelCost:
    """Parameters, bytes and shapes of the GGUF model at ``path`` (needs the ``gguf`` package)."""
    from gguf import GGUFReader

    r = GGUFReader(path)

    def meta(suffix: str) -> Any:
        for key, f in r.fields.items():
            if key.endswith(suffix):
                return f.contents()
        return None

    blocks_int = blocks_float = blocks_bf16 = head = block_bytes = head_bytes = 0
    head_type, types = "", {}
    has_output = any(t.name == "output.weight" for t in r.tensors)
    for t in r.tensors:
        kind = t.tensor_type.name
        types[kind] = types.get(kind, 0) + int(t.n_elements)
        if t.name == "output.weight" or (t.name == "token_embd.weight" and not has_output):
            head, head_bytes, head_type = int(t.n_elements), int(t.n_bytes), kind
        elif t.name.startswith("blk.") and len(t.shape) >= 2:  # matrices; norms are vectors
            block_bytes += int(t.n_bytes)
            if kind == "BF16":
                blocks_bf16 += int(t.n_elements)
            elif kind in FLOAT_TYPES:
                blocks_float += int(t.n_elements)
            else:
                blocks_int += int(t.n_elements)
    n_embd = int(meta(".embedding_length"))
    n_head = int(meta(".attention.head_count"))
    n_head_kv = int(meta(".attention.head_count_kv") or n_head)
    return ModelCost(
        name=str(meta("general.name") or Path(path).stem),
        block_params_int=blocks_int,
        block_params_float=blocks_float,
        block_params_bf16=blocks_bf16,
        head_params=head,
        head_type=head_type,
        block_bytes=block_bytes,
        head_bytes=head_bytes,
        n_layer=int(meta(".block_count")),
        n_embd=n_embd,
        n_kv_dim=n_head_kv * (n_embd // n_head),
        weight_types=", ".join(f"{k} {v / 1e6:.1f}M" for k, v in sorted(types.items(), key=lambda kv: -kv[1])),
    )


# -- the limit -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """The best tok/s the machine allows for one model at one thread count."""

    prefill_tok_s: float
    decode_tok_s: float
    threads: int
    context: int
    machine: Machine
    cost: ModelCost


def machine_limit(model: Any = None, *, threads: int = 1, context: int = 512) -> Limit:
    """The prefill and decode ceilings for ``model`` (a path, a loaded ``Model``, or ``None``
    for the embedded default) with ``threads`` threads; attention and the K/V cache are
    counted at ``context`` tokens (the prompt length, for prefill: its mean context is half)."""
    if model is None:
        from pocket_agent.runtime import default_model_path

        model = default_model_path()
    path = str(getattr(model, "path", model))
    info = getattr(model, "info", None)
    if info is not None and "weights" in info.extra:  # a loaded model running from a re-laid-out copy
        path = info.extra["weights"]
    cost = model_cost(path)
    mach = measure_machine(threads)
    int_ops, bf16_ops, f32_ops = cost.prefill_ops(context // 2)
    prefill_s = (
        int_ops / (mach.int8_gops * 1e9) + bf16_ops / (mach.bf16_gflops * 1e9) + f32_ops / (mach.f32_gflops * 1e9)
    )
    decode_s = cost.decode_bytes(context) / (mach.read_gbs * 1e9)
    return Limit(
        prefill_tok_s=1.0 / prefill_s,
        decode_tok_s=1.0 / decode_s,
        threads=threads,
        context=context,
        machine=mach,
        cost=cost,
    )


# -- the actual model ----------------------------------------------------------------------------


def model_speed(model: Any, prompt: list[int], repeats: int = 3, n_decode: int = 64) -> tuple[float, float]:
    """Median plain ``Model.prefill`` tok/s on ``prompt`` and one-token ``Model.eval`` tok/s of a
    loaded ``model`` (its cache is left empty)."""
    import numpy as np

    model.reset()
    model.prefill(prompt)  # warm-up
    pre, dec = [], []
    for _ in range(repeats):
        model.reset()
        t0 = time.perf_counter()
        logits = model.prefill(prompt).logits[-1]
        pre.append(len(prompt) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(n_decode):
            logits = model.eval([int(np.argmax(logits))]).logits[-1]
        dec.append(n_decode / (time.perf_counter() - t0))
    model.reset()
    return statistics.median(pre), statistics.median(dec)


def measure_actual(
    threads: int, prompt: list[int] | None = None, repeats: int = 3, n_decode: int = 64
) -> dict[str, float]:
    """Plain ``Model.prefill`` and one-token ``Model.eval`` tok/s of the default model (median)."""
    from pocket_agent.runtime import load_model

    model = load_model(threads=threads)
    try:
        toks = prompt if prompt is not None else receipt_prompt(model)
        prefill, decode = model_speed(model, toks, repeats, n_decode)
        return {"prompt_tokens": len(toks), "prefill_tok_s": prefill, "decode_tok_s": decode}
    finally:
        model.close()


def receipt_prompt(model: Any) -> list[int]:
    """The extraction prompt of the first SROIE receipt, as bench/extract.py builds it."""
    from extract import closed_schema, load_docs

    from pocket_agent.extraction import build_messages
    from pocket_agent.generate import render_prompt

    return render_prompt(model, build_messages(load_docs(1)[0]["text"], closed_schema()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF path (default: the embedded default model)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-actual", action="store_true", help="only the limit, not the default model's speed")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from pocket_agent.runtime import default_model_path, load_model
    from pocket_agent.runtime.layout import runtime_gguf

    # the limit of the weights the actual rows run: the default model's BF16 or Q8_0 copy
    path = args.model or str(runtime_gguf(default_model_path(), "auto", is_default_model=True))
    cost = model_cost(path)
    context = 512
    if not args.no_actual:
        m = load_model(threads=1)
        prompt = receipt_prompt(m)
        m.close()
        context = len(prompt)
    rows_m = [
        "| threads | int8 GEMM GOP/s | bf16 GEMM GFLOP/s | f32 GEMM GFLOP/s | read GB/s |",
        "|---|---|---|---|---|",
    ]
    rows_l = [
        "| threads | prefill limit tok/s | decode limit tok/s | actual prefill tok/s | of limit "
        "| actual decode tok/s | of limit |",
        "|---|---|---|---|---|---|---|",
    ]
    # the model first: torch's OpenMP threads, once started, would compete with llama.cpp's
    actual = {} if args.no_actual else {t: measure_actual(t, prompt) for t in args.threads}
    for t in args.threads:
        lim = machine_limit(path, threads=t, context=context)
        mc = lim.machine
        rows_m.append(f"| {t} | {mc.int8_gops:.0f} | {mc.bf16_gflops:.0f} | {mc.f32_gflops:.0f} | {mc.read_gbs:.1f} |")
        if args.no_actual:
            rows_l.append(f"| {t} | {lim.prefill_tok_s:.0f} | {lim.decode_tok_s:.0f} | - | - | - | - |")
        else:
            act = actual[t]
            rows_l.append(
                f"| {t} | {lim.prefill_tok_s:.0f} | {lim.decode_tok_s:.0f} | {act['prefill_tok_s']:.0f} | "
                f"{act['prefill_tok_s'] / lim.prefill_tok_s:.0%} | {act['decode_tok_s']:.1f} | "
                f"{act['decode_tok_s'] / lim.decode_tok_s:.0%} |"
            )
        print(rows_m[-1], "\n" + rows_l[-1], flush=True)
    lines = [
        "# The limit: best possible prefill and decode on this machine",
        "",
        f"Generated by `python bench/limit.py{' --out ' + str(args.out) if args.out else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}; "
        "shared with other work, so every figure is a single run's best-of-7 (machine) or median of 3 (actual).",
        f"- Versions: python {platform.python_version()}, {package_versions(PACKAGES)}",
        f"- Model: {cost.name} ({Path(path).name}): {cost.params / 1e6:.1f}M matrix parameters "
        f"({cost.weight_types}); blocks {cost.block_params_int / 1e6:.1f}M quantized + "
        f"{cost.block_params_bf16 / 1e6:.1f}M BF16 + {cost.block_params_float / 1e6:.1f}M other float; "
        f"output head {cost.head_params / 1e6:.1f}M {cost.head_type} "
        f"(tied to the token embedding); {cost.n_layer} layers, n_embd {cost.n_embd}, K/V width {cost.n_kv_dim}.",
        f"- Bytes read per decoded token: {(cost.block_bytes + cost.head_bytes) / 1e6:.1f} MB of weights "
        f"+ the F16 K/V cache at {context} tokens. Prompt for the actual rows: the extraction prompt of the first "
        f"SROIE receipt ({context} tokens), attention counted at its mean context ({context // 2}).",
        "",
        "## Machine",
        "",
        *rows_m,
        "",
        "- int8 GEMM: fbgemm u8 x s8 (torch quantized Linear), the instruction class of llama.cpp's quantized dot "
        "products; bf16 GEMM: torch (oneDNN), the class of llama.cpp's BF16 kernels; f32 GEMM: torch (MKL); "
        "each the best of SmolLM2's FFN shapes at 512 rows. "
        f"Read: sum of a {READ_BYTES >> 20} MiB int64 array (16x the L3 cache).",
        "",
        "## Limit and the default model against it (plain `Model.prefill`, one-token `Model.eval`)",
        "",
        *rows_l,
        "",
        "- prefill limit = 1 / (2 x quantized block weights / int8 rate + 2 x BF16 block weights / bf16 rate "
        "+ (2 x other float block weights + attention) / f32 rate); the head runs once per prompt, so it is "
        "left out. decode limit = read bandwidth / bytes per token (all weights including the head, plus the "
        "K/V cache).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
