"""Convert a GGUF file or a Hugging Face model folder to an MNN LLM build.

Pipeline (every heavy step runs in a subprocess of ``sys.executable``, so importing this
module, or calling :func:`convert_to_mnn` without ``lora``, never imports torch into the
caller; merging a LoRA reads it with torch in the calling process):

1. GGUF only: ``_gguf_to_hf.py`` loads the GGUF with transformers (dequantising it),
   copies the weights into a plain model and saves a transformers checkpoint.
2. ``llmexport`` (PyPI ``llmexport``) exports the checkpoint to ONNX and converts it to
   MNN with quantised weights.
3. The build is cleaned (no absolute paths, no intermediate files) and the original
   chat template is written to ``chat_template.jinja``.

MNN's Python tools try to ``pip install aliyun-log-python-sdk`` and send usage logs when
``aliyun.log`` is missing. The export step gets an empty ``aliyun.log`` stub package
(the logger's import then fails and MNN disables it), a ``pip`` guard on ``PATH`` that
refuses to run and records the attempt, and telemetry-off environment variables.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pocket_agent.convert._merge import lora_modules, merge_lora
from pocket_agent.errors import ConversionError, InvalidInputError, PocketAgentError
from pocket_agent.runtime._files import OFFLINE_ENV, log_tail, missing_modules
from pocket_agent.runtime.gguf_meta import GGUFFormatError, is_gguf_file, read_gguf_metadata
from pocket_agent.runtime.peft_lora import is_peft_adapter

INSTALL_HINT = "pip install 'pocket-agent-mnn[convert]'"

# Python modules the conversion subprocesses import (module name -> PyPI name).
REQUIRED_MODULES: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "gguf": "gguf",
    "llmexport": "llmexport",
    "onnx": "onnx",
    "MNN": "MNN",
}

# transformers ``model_type`` values that llmexport 0.0.5 maps for text generation.
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "internlm",
        "mobilellm",
        "baichuan",
        "gemma2",
        "gemma3_text",
        "phi",
        "minicpm",
        "hunyuan_v1_dense",
        "lfm2",
        "gpt_oss",
        "mimo",
    }
)

# GGUF ``general.architecture`` values that transformers can load and llmexport export.
SUPPORTED_GGUF_ARCHITECTURES: frozenset[str] = frozenset(
    {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "lfm2", "gpt-oss"}
)

# Files an MNN LLM build may contain; ``overwrite=True`` replaces only these names.
_BUILD_FILE_NAMES: frozenset[str] = frozenset(
    {
        "config.json",
        "llm_config.json",
        "llm.mnn",
        "llm.mnn.weight",
        "llm.mnn.json",
        "tokenizer.mtok",
        "tokenizer.txt",
        "chat_template.jinja",
        "export_args.json",
        "embeddings_bf16.bin",
        "embeddings_int8.bin",
        "embeddings_int4.bin",
    }
)

# Intermediate or machine-specific files llmexport leaves that a runtime does not need.
_DROP_FILES: tuple[str, ...] = ("llm.mnn.json", "export_args.json")

_TELEMETRY_ENV: dict[str, str] = {
    **OFFLINE_ENV,
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
}

# Printed by MNN's logger module right before it shells out to pip.
_PIP_ATTEMPT_MARKERS: tuple[str, ...] = ("aliyun-log-python-sdk",)

_LOG_TAIL_LINES = 40


def missing_convert_modules() -> list[str]:
    """PyPI names of the conversion dependencies that are not installed (no imports)."""
    return missing_modules(REQUIRED_MODULES)


def _llmexport_dir() -> Path:
    spec = importlib.util.find_spec("llmexport")
    if spec is None or not spec.submodule_search_locations:
        raise ConversionError(f"llmexport is not installed: {INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / "llmexport.py").is_file():
        raise ConversionError(f"llmexport at {folder} has no llmexport.py; install llmexport==0.0.5 ({INSTALL_HINT})")
    return folder


def _tail(log_path: Path) -> str:
    return log_tail(log_path, _LOG_TAIL_LINES)


def read_chat_template_from_hf(folder: Path) -> str | None:
    """The chat template of a Hugging Face model folder, or ``None`` if it has none.

    Looks at ``chat_template.jinja`` (transformers >= 4.49 writes it) and then at
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates
    of which ``default`` is used).
    """
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    cfg_file = folder / "tokenizer_config.json"
    if not cfg_file.is_file():
        return None
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = cfg.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {
            t.get("name"): t.get("template")
            for t in template
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        default = named.get("default")
        if isinstance(default, str):
            return default
        for value in named.values():
            if isinstance(value, str):
                return value
    return None


def _inspect_source(source: Path) -> tuple[str, str | None]:
    """Check the source and return ``(kind, chat_template)``; kind is 'gguf' or 'hf'."""
    if not source.exists():
        raise ConversionError(f"model not found: {source} does not exist")
    if source.is_dir():
        cfg_path = source / "config.json"
        if not cfg_path.is_file():
            raise ConversionError(
                f"{source} is a folder without config.json: expected a Hugging Face model "
                "folder (config.json + *.safetensors) or a .gguf file"
            )
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConversionError(f"{cfg_path} is not valid JSON: {exc}") from exc
        if not isinstance(cfg, dict):
            raise ConversionError(f"{cfg_path} does not hold a JSON object")
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConversionError(
                f"unsupported architecture: model_type {model_type!r} in {cfg_path}; "
                f"supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            )
        has_weights = any(source.glob("*.safetensors")) or any(source.glob("pytorch_model*.bin"))
        if not has_weights:
            raise ConversionError(f"{source} holds no weights (*.safetensors or pytorch_model*.bin)")
        return "hf", read_chat_template_from_hf(source)
    if not is_gguf_file(source):
        raise ConversionError(
            f"{source} is not a model: expected a .gguf file (GGUF magic bytes) or a Hugging Face model folder"
        )
    try:
        meta = read_gguf_metadata(source, ["general.architecture", "tokenizer.chat_template"])
    except (GGUFFormatError, OSError) as exc:
        raise ConversionError(f"cannot read GGUF metadata of {source}: {exc}") from exc
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ConversionError(
            f"unsupported architecture: GGUF general.architecture {arch!r} in {source}; "
            f"supported: {', '.join(sorted(SUPPORTED_GGUF_ARCHITECTURES))}"
        )
    template = meta.get("tokenizer.chat_template")
    return "gguf", template if isinstance(template, str) else None


def _prepare_output(output_dir: Path, overwrite: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise ConversionError(f"output path {output_dir} exists and is not a folder")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ConversionError(
            f"output folder {output_dir} is not empty; pass overwrite=True (--overwrite) to replace the build in it"
        )


def _sandbox(work: Path) -> tuple[dict[str, str], Path]:
    """Environment for the export subprocesses, and the pip-guard marker path."""
    stub = work / "stubs"
    (stub / "aliyun" / "log").mkdir(parents=True)
    (stub / "aliyun" / "__init__.py").write_text("", encoding="utf-8")
    (stub / "aliyun" / "log" / "__init__.py").write_text(
        '"""Empty stand-in: keeps MNN tools from installing aliyun-log-python-sdk."""\n',
        encoding="utf-8",
    )
    marker = work / "pip_attempts.txt"
    guard = work / "guard_bin"
    guard.mkdir()
    if os.name == "posix":
        for name in ("pip", "pip3", f"pip{sys.version_info[0]}.{sys.version_info[1]}"):
            script = guard / name
            script.write_text(
                "#!/bin/sh\n"
                f'echo "$0 $*" >> "{marker}"\n'
                'echo "pocket_agent: pip is disabled during conversion" >&2\n'
                "exit 1\n",
                encoding="utf-8",
            )
            script.chmod(0o755)
    env = dict(os.environ)
    env.update(_TELEMETRY_ENV)
    llmexport_dir = _llmexport_dir()
    paths = [str(stub), str(llmexport_dir)]
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _is_runtime_pymnn(Path(p))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = os.pathsep.join([str(guard), env.get("PATH", "")])
    return env, marker


def _is_runtime_pymnn(folder: Path) -> bool:
    """A pymnn built by scripts/build_pymnn.sh: MNN.expr and MNN.llm only, so it would hide the
    converter of the MNN wheel that llmexport runs."""
    init = folder / "MNN" / "__init__.py"
    try:
        return init.is_file() and "POCKET_AGENT_BUILD" in init.read_text(encoding="utf-8")
    except OSError:
        return False


def _run(
    cmd: Sequence[str], *, cwd: Path, env: dict[str, str], log_path: Path, step: str, timeout: float | None
) -> int:
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== {step}: {' '.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.run(
                list(cmd),
                cwd=str(cwd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(f"{step} timed out after {timeout} s; log tail:\n{_tail(log_path)}") from exc
        except OSError as exc:
            raise ConversionError(f"{step} could not start: {exc}") from exc
    return proc.returncode


def _check_no_pip(marker: Path, log_path: Path) -> None:
    attempts = marker.read_text(encoding="utf-8").strip() if marker.exists() else ""
    log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    hits = [m for m in _PIP_ATTEMPT_MARKERS if m in log_text]
    if attempts or hits:
        raise ConversionError(
            "the export step tried to run pip (MNN's telemetry logger); refusing the build. "
            f"attempts: {attempts or hits}"
        )


_UUID_RE = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _stable_model_uuid(model_file: Path) -> None:
    """Replace the random UUID MNNConvert stamps into ``llm.mnn`` with one derived from its content.

    MNNConvert writes a fresh uuid4 into every model, which is the only byte difference
    between two exports of the same weights; a content-derived UUID of the same length
    makes builds reproducible.
    """
    data = model_file.read_bytes()
    found = _UUID_RE.findall(data)
    if len(found) != 1:
        return
    blank = data.replace(found[0], b"0" * len(found[0]))
    h = hashlib.sha256(blank).hexdigest()
    stable = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}".encode()
    model_file.write_bytes(data.replace(found[0], stable))


def _finalize_build(build: Path, template: str | None) -> None:
    for name in _DROP_FILES:
        (build / name).unlink(missing_ok=True)
    cfg_path = build / "config.json"
    cfg: dict[str, Any] = json.loads(cfg_path.read_text(encoding="utf-8"))
    # Relative file names keep the build relocatable; MNN resolves them against the folder.
    for key in ("llm_model", "llm_weight", "tokenizer_file", "embedding_file"):
        value = cfg.get(key)
        if isinstance(value, str):
            cfg[key] = os.path.basename(value)
    for key in ("llm_model", "llm_weight", "tokenizer_file"):
        file_name = cfg.get(key)
        if not isinstance(file_name, str) or not (build / file_name).is_file():
            raise ConversionError(f"export produced no {key} file ({file_name!r}) in the build")
    cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=4) + "\n", encoding="utf-8")
    _stable_model_uuid(build / str(cfg["llm_model"]))

    llm_cfg_path = build / "llm_config.json"
    llm_cfg: dict[str, Any] = json.loads(llm_cfg_path.read_text(encoding="utf-8"))
    if template is not None:
        (build / "chat_template.jinja").write_text(template, encoding="utf-8")
        if "jinja" not in llm_cfg:
            llm_cfg["jinja"] = {"chat_template": template}
            llm_cfg_path.write_text(json.dumps(llm_cfg, ensure_ascii=False, indent=4) + "\n", encoding="utf-8")


def _install_build(build: Path, output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    for stale in _BUILD_FILE_NAMES:
        target = output_dir / stale
        if target.is_file() and not (build / stale).exists():
            target.unlink()
    for item in sorted(build.iterdir()):
        target = output_dir / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        shutil.move(str(item), str(target))


def _write_quant_config(path: Path, modules: Sequence[str], bits: int, block: int) -> None:
    """llmexport's per-layer quantisation file: ``modules`` (``"20.self_attn.v_proj"``) at
    ``bits`` in blocks of ``block`` (0: per channel). llmexport names a linear layer
    ``/layers.20/self_attn/v_proj/Linear``."""
    config = {}
    for qualified in modules:
        layer, _, rest = qualified.partition(".")
        config[f"/layers.{layer}/{rest.replace('.', '/')}/Linear"] = {"bits": bits, "block_size": block}
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")


def convert_to_mnn(
    source: str | Path,
    output_dir: str | Path,
    *,
    quant_bit: int = 4,
    quant_block: int | None = None,
    lm_quant_bit: int | None = None,
    overwrite: bool = False,
    timeout: float | None = None,
    lora: str | Path | None = None,
    lora_quant_bit: int | None = None,
) -> Path:
    """Convert a ``.gguf`` file or a Hugging Face model folder into an MNN LLM build.

    Args:
        source: a GGUF file, or a folder with ``config.json`` and ``*.safetensors``.
        output_dir: folder that receives ``config.json``, ``llm.mnn``, ``llm.mnn.weight``,
            ``tokenizer.mtok``, ``llm_config.json`` and ``chat_template.jinja``.
        quant_bit: weight bits (4 or 8).
        quant_block: quantisation block size along the input dimension (0 = per channel);
            ``None``: 32 from a GGUF (the block of its quantised types, so re-quantising
            loses almost nothing: on SmolLM2-135M's Q4_1 file it matches the GGUF's
            extraction accuracy, where 64 loses a third of the exact fields and 128 breaks
            the model; bench/mnn_settings.md), 64 from a Hugging Face folder.
        lm_quant_bit: bits of the output head (and tied embedding); ``None`` = ``quant_bit``.
            8 keeps small models' answers intact at 4-bit bodies (see the README).
        overwrite: replace an existing build in ``output_dir`` (only build files are touched).
        timeout: seconds allowed for each subprocess step, ``None`` for no limit.
        lora: a GGUF LoRA (e.g. from ``pocket-agent tune``) or a PEFT adapter folder to merge into the weights
            before quantising (:func:`pocket_agent.convert.merge_lora`); MNN cannot apply
            it at run time. Its changes are small against 4-bit steps: use ``quant_bit=8``
            (per channel, ``quant_block=0``, kept SmolLM2's extraction adapter whole where
            4 bits lost it), or ``lora_quant_bit=8``.
        lora_quant_bit: with ``lora``, the bits of the linear layers the LoRA changes (in
            blocks of ``quant_block``), the rest keeping ``quant_bit``: a 4-bit body with the
            adapted layers at 8 bits keeps SmolLM2's extraction adapter (112 SROIE fields
            against 110 for an 8-bit per-channel body) at 1.1x a 4-bit build's time, where
            the 8-bit body takes 1.3x (``bench/extract.md``).

    Returns:
        The path of the build's ``config.json`` (pass it to ``MNN.llm.create``).

    Raises:
        ConversionError: missing source, not a model, unsupported architecture, missing
            conversion dependencies, or a failed export (the message ends with the log tail).
        InvalidInputError: invalid quantisation settings.
        AdapterError: ``lora`` is not a GGUF LoRA for this model.
    """
    if quant_bit not in (4, 8):
        raise InvalidInputError(f"quant_bit must be 4 or 8, got {quant_bit!r}")
    if lm_quant_bit is not None and lm_quant_bit not in (4, 8):
        raise InvalidInputError(f"lm_quant_bit must be 4, 8 or None, got {lm_quant_bit!r}")
    if lora_quant_bit is not None and (lora_quant_bit not in (4, 8) or lora is None):
        raise InvalidInputError(f"lora_quant_bit must be 4 or 8 and needs a lora, got {lora_quant_bit!r}")
    if quant_block is not None and (
        isinstance(quant_block, bool)
        or not isinstance(quant_block, int)
        or quant_block < 0
        or (quant_block & (quant_block - 1))
    ):
        raise InvalidInputError(f"quant_block must be 0, a power of two or None, got {quant_block!r}")

    if lora is not None and not Path(lora).is_file() and not is_peft_adapter(lora):
        raise InvalidInputError(f"LoRA file not found: {lora} (a GGUF LoRA, or a PEFT adapter folder)")
    src = Path(source).expanduser().resolve()
    out = Path(output_dir).expanduser().resolve()
    kind, template = _inspect_source(src)
    if quant_block is None:
        quant_block = 32 if kind == "gguf" else 64
    _prepare_output(out, overwrite)
    missing = missing_convert_modules()
    if missing:
        raise ConversionError(f"model conversion needs {', '.join(missing)}, which are not installed: {INSTALL_HINT}")

    fd, log_name = tempfile.mkstemp(prefix="pocket_agent_convert_", suffix=".log")
    os.close(fd)
    log_path = Path(log_name)
    ok = False
    try:
        with tempfile.TemporaryDirectory(prefix="pocket_agent_convert_") as tmp:
            work = Path(tmp)
            env, marker = _sandbox(work)
            run_dir = work / "run"
            run_dir.mkdir()
            hf_dir = src
            if kind == "gguf":
                hf_dir = work / "hf"
                script = Path(__file__).with_name("_gguf_to_hf.py")
                rc = _run(
                    [sys.executable, str(script), str(src), str(hf_dir)],
                    cwd=run_dir,
                    env=env,
                    log_path=log_path,
                    step="GGUF -> transformers",
                    timeout=timeout,
                )
                if rc == 3:
                    raise ConversionError(f"unsupported architecture in {src}:\n{log_tail(log_path, 5)}")
                if rc != 0:
                    raise ConversionError(
                        f"reading {src} with transformers failed (exit {rc}); log {log_path}, tail:\n{_tail(log_path)}"
                    )
            quant_config: Path | None = None
            if lora is not None:
                if lora_quant_bit is not None:
                    quant_config = work / "quant_config.json"
                    _write_quant_config(quant_config, lora_modules(hf_dir, lora), lora_quant_bit, quant_block)
                hf_dir = merge_lora(hf_dir, lora, work / "merged")
            build = work / "mnn"
            cmd = [
                sys.executable,
                str(_llmexport_dir() / "llmexport.py"),
                "--path",
                str(hf_dir),
                "--dst_path",
                str(build),
                "--export",
                "mnn",
                "--quant_bit",
                str(quant_bit),
                "--quant_block",
                str(quant_block),
                # A path that does not exist makes llmexport use pymnn's converter.
                "--mnnconvert",
                str(work / "no-MNNConvert"),
            ]
            if lm_quant_bit is not None:
                cmd += ["--lm_quant_bit", str(lm_quant_bit)]
            if quant_config is not None:
                cmd += ["--quant_config", str(quant_config)]
            rc = _run(cmd, cwd=run_dir, env=env, log_path=log_path, step="llmexport", timeout=timeout)
            export_log = run_dir / ".export.log"
            if export_log.exists():
                with open(log_path, "a", encoding="utf-8") as log:
                    log.write("\n=== MNNConvert log (.export.log)\n")
                    log.write(export_log.read_text(encoding="utf-8", errors="replace"))
            _check_no_pip(marker, log_path)
            if rc != 0 or not (build / "config.json").is_file():
                raise ConversionError(f"llmexport failed (exit {rc}); log {log_path}, tail:\n{_tail(log_path)}")
            _finalize_build(build, template)
            _install_build(build, out)
        ok = True
    finally:
        if ok:
            log_path.unlink(missing_ok=True)
    return out / "config.json"


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``convert`` sub-command's arguments to ``parser``."""
    parser.add_argument("source", help="a .gguf file or a Hugging Face model folder")
    parser.add_argument("--to", choices=["mnn"], default="mnn", help="target format (default: mnn)")
    parser.add_argument("--quant-bit", type=int, choices=[4, 8], default=4, dest="quant_bit")
    parser.add_argument(
        "--quant-block",
        type=int,
        default=None,
        dest="quant_block",
        help="quantisation block (0: per channel; default: 32 from a GGUF, 64 from a Hugging Face folder)",
    )
    parser.add_argument(
        "--lm-quant-bit",
        type=int,
        choices=[4, 8],
        default=None,
        dest="lm_quant_bit",
        help="bits of the output head (default: --quant-bit)",
    )
    parser.add_argument(
        "--lora",
        default=None,
        help="a GGUF LoRA to merge into the weights first (MNN cannot apply it at run time; "
        "use --lora-quant-bit 8, or --quant-bit 8 --quant-block 0, to keep its changes)",
    )
    parser.add_argument(
        "--lora-quant-bit",
        type=int,
        choices=[4, 8],
        default=None,
        dest="lora_quant_bit",
        help="with --lora: bits of the layers the LoRA changes (blocks of --quant-block); the rest keep --quant-bit",
    )
    parser.add_argument("-o", "--output", required=True, help="output folder of the MNN build")
    parser.add_argument("--overwrite", action="store_true", help="replace a build already in the output folder")


def main_convert(args: argparse.Namespace) -> int:
    """Run ``pocket-agent convert`` from parsed arguments; returns the exit status."""
    target = getattr(args, "to", "mnn")
    if target != "mnn":
        print(f"pocket-agent convert: unsupported target {target!r} (only 'mnn')", file=sys.stderr)
        return 2
    source = getattr(args, "source", None) or getattr(args, "model", None)
    if source is None:
        print("pocket-agent convert: no model given", file=sys.stderr)
        return 2
    try:
        config = convert_to_mnn(
            source,
            args.output,
            quant_bit=int(getattr(args, "quant_bit", 4)),
            quant_block=getattr(args, "quant_block", None),
            lm_quant_bit=getattr(args, "lm_quant_bit", None),
            overwrite=bool(getattr(args, "overwrite", False)),
            lora=getattr(args, "lora", None),
            lora_quant_bit=getattr(args, "lora_quant_bit", None),
        )
    except PocketAgentError as exc:
        print(f"pocket-agent convert: {exc}", file=sys.stderr)
        return 1
    print(config)
    return 0
