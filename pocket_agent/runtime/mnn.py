"""MNN LLM builds (``config.json`` + ``llm.mnn``) through pymnn's ``MNN.llm``.

pymnn crashes the interpreter on several kinds of misuse (``forward`` before a successful
load, ``forward([])``, a second ``Llm`` in one process). Every such path is checked here
in Python before it reaches C.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import (
    AdapterError,
    BackendError,
    BackendUnavailableError,
    ModelLoadError,
    ModelNotFoundError,
    ModelStateError,
)
from ._cpu import default_threads
from ._mnn_engines import ONE_THREAD, EngineChooser
from .base import Capabilities, EvalOutput, LogitsSelection, Model, ModelInfo, Vocabulary, reusable_length
from .chat_template import ChatTemplate, chatml_template

DEFAULT_N_CTX = 4096
_live_lock = threading.Lock()


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence C-level stdout (MNN prints device info on import and progress on load)."""
    try:
        fd = os.dup(1)
    except OSError:  # pragma: no cover - no stdout to protect
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
            try:
                yield
            finally:
                _libc_fflush()  # C stdio buffers what MNN printed; drop it before restoring
                os.dup2(fd, 1)
    finally:
        os.close(fd)


def _libc_fflush() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


def _mnn_llm() -> Any:
    try:
        with _quiet_stdout():
            import MNN.llm as mnn_llm
    except ImportError as exc:  # pragma: no cover - exercised only without the dependency
        raise BackendUnavailableError("MNN builds need pymnn: pip install 'MNN>=3.6.1,<3.7'") from exc
    return mnn_llm


def pymnn_build() -> str:
    """Which pymnn this process runs: the installed ``MNN`` package's version, or the build
    of ``scripts/build_pymnn.sh`` (MNN's AVX-512 kernels in; the PyPI wheel has none) when
    that comes first on the path."""
    import MNN

    built = getattr(MNN, "POCKET_AGENT_BUILD", None)
    if isinstance(built, str):
        return f"{built}, {Path(MNN.__file__).parent.parent}"
    try:
        return f"MNN {version('MNN')} (pip)"
    except PackageNotFoundError:
        return f"MNN at {Path(MNN.__file__).parent}"


@dataclass
class _EngineState:
    """What the base class and this backend know of an engine's KV cache while it is not active."""

    cached: list[int] = field(default_factory=list)
    prefill_memo: Any = None
    single_from: int | None = None
    all_logits: bool = False
    noisy_next: bool = False


class MnnModel(Model):
    """An MNN LLM build evaluated by pymnn on the CPU.

    pymnn holds one LLM per process: creating a second one crashes the interpreter, even
    after the first was freed, so a second load raises :class:`ModelStateError` instead.
    Run a second MNN model in another process. ``memory="low"`` (the export default)
    quantises activations at run time, so incremental decoding and a full recompute agree
    on the argmax but not bit for bit; ``memory="normal"`` is exact and ~4x slower.

    MNN fixes the thread count at load and its multi-thread runtime collapses beside a busy
    process. With ``threads`` > 1 and ``adaptive_threads`` (the default) the model also holds
    a one-thread engine sharing the weights (``pocket_agent.runtime._mnn_engines``) and
    evaluates each prompt, and the steps after it, on whichever engine measures faster.
    Both engines compute the same logits.
    """

    backend = "mnn"
    _live: ClassVar[MnnModel | None] = None
    _loaded_once: ClassVar[Path | None] = None

    def __init__(
        self,
        config_path: str | os.PathLike[str],
        *,
        n_ctx: int | None = None,
        threads: int | None = None,
        memory: str = "low",
        precision: str = "low",
        config: dict[str, Any] | None = None,
        adaptive_threads: bool = True,
    ) -> None:
        super().__init__()
        cfg_path = Path(config_path)
        if cfg_path.is_dir():
            cfg_path = cfg_path / "config.json"
        build = _read_build(cfg_path)
        with _live_lock:
            if MnnModel._loaded_once is not None:
                raise ModelStateError(
                    f"An MNN model was already loaded in this process ({MnnModel._loaded_once}); pymnn crashes "
                    f"when a second one is created, even after the first is closed. Reuse the loaded model, load "
                    f"the second one in another process, or use its GGUF form with llama.cpp."
                )
            MnnModel._loaded_once = cfg_path
            MnnModel._live = self
        self._llm: Any = None
        self._loaded = False
        self._created = False
        self._all_logits = False
        self._noisy_next = False
        self._engines: list[Any] = []  # pymnn LLM objects: the ceiling engine, then a one-thread twin
        self._parked: _EngineState | None = None  # the inactive engine's state
        self._chooser = EngineChooser()
        try:
            self._load(cfg_path, build, n_ctx, threads, memory, precision, config or {})
            if adaptive_threads and self._threads > 1:
                self._add_one_thread_engine(build)
        except BaseException:
            with _live_lock:
                if MnnModel._live is self:
                    MnnModel._live = None
                if not self._created:  # nothing native was made: another load is still safe
                    MnnModel._loaded_once = None
            raise

    def _load(
        self,
        cfg_path: Path,
        build: dict[str, Any],
        n_ctx: int | None,
        threads: int | None,
        memory: str,
        precision: str,
        extra: dict[str, Any],
    ) -> None:
        mnn_llm = _mnn_llm()
        threads = threads or default_threads()
        llm = mnn_llm.create(str(cfg_path.resolve()))
        self._created = True
        settings = {
            "backend_type": "cpu",
            "thread_num": threads,
            "memory": memory,
            "precision": precision,
            "all_logits": self._all_logits,
            "use_template": False,
            "reuse_kv": False,
            **extra,
        }
        llm.set_config(settings)
        with _quiet_stdout():
            ok = llm._c_obj.load()
        if ok is False:
            raise ModelLoadError(
                f"MNN could not load {cfg_path}: check that llm.mnn and llm.mnn.weight are complete and were "
                f"exported by a compatible llmexport."
            )
        self._llm = llm
        self._engines = [llm._c_obj]
        self._loaded = True
        atexit.register(self.close)  # freeing pymnn during interpreter teardown segfaults
        self._threads = threads
        self._cfg_path = cfg_path
        llm_cfg = build.get("llm_config", {})
        probe = self._forward([0])
        n_vocab = int(probe.shape[-1])
        self._llm.reset()
        self.vocab = self._read_vocab(cfg_path.parent, n_vocab, build.get("tokenizer_file"))
        trained = int(llm_cfg.get("max_position_embeddings", 0) or 0)
        if n_ctx is None:
            n_ctx = min(trained, DEFAULT_N_CTX) if trained > 0 else DEFAULT_N_CTX
        # all-logits forwards are reconfigurations that cost about a prefill (_set_all_logits)
        self.capabilities = Capabilities(multi_sequence=False, hidden_states=False, lora=True, cheap_all_logits=False)
        weight = cfg_path.parent / build.get("llm_weight", "llm.mnn.weight")
        model_file = cfg_path.parent / build.get("llm_model", "llm.mnn")
        self._chat_template = self._read_chat_template(cfg_path.parent, llm_cfg)
        self.info = ModelInfo(
            backend=self.backend,
            path=cfg_path,
            name=cfg_path.parent.name,
            architecture=str(llm_cfg.get("model_type", "unknown")),
            n_vocab=self.vocab.size,
            n_ctx=n_ctx,
            n_ctx_train=trained,
            n_embd=int(llm_cfg.get("hidden_size", 0) or 0),
            file_size=sum(f.stat().st_size for f in (model_file, weight) if f.is_file()),
            chat_template_source=self._chat_template.source,
            extra={"threads": str(threads), "memory": memory, "precision": precision, "pymnn": pymnn_build()},
        )

    # -- build files -------------------------------------------------------------------

    def _read_vocab(self, folder: Path, n_vocab: int, tokenizer_file: str | None) -> Vocabulary:
        special, stops = _tokenizer_special_ids(folder, tokenizer_file)
        pieces: list[bytes] = []
        for tok in range(n_vocab):
            try:
                text = self._llm.tokenizer_decode(tok)
                piece = text.encode("utf-8") if isinstance(text, str) else bytes(text)
            except UnicodeDecodeError as exc:
                piece = bytes(exc.object)
            except Exception:
                piece = b""
            pieces.append(piece)
        eos = [t for t in stops if 0 <= t < n_vocab]
        im_end = _find(pieces, b"<|im_end|>")
        if im_end is not None and im_end not in eos:
            eos.append(im_end)
        special |= set(eos)
        return Vocabulary(
            token_bytes=tuple(pieces),
            special_ids=frozenset(t for t in special if 0 <= t < n_vocab),
            eos_ids=tuple(eos),
            bos_id=None,
        )

    def _read_chat_template(self, folder: Path, llm_cfg: dict[str, Any]) -> ChatTemplate:
        eos = self.vocab.token_bytes[self.vocab.eos_ids[0]].decode("utf-8", "replace") if self.vocab.eos_ids else ""
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            return ChatTemplate(jinja_file.read_text(encoding="utf-8"), source="chat_template.jinja", eos_token=eos)
        jinja = llm_cfg.get("jinja")
        if isinstance(jinja, dict) and isinstance(jinja.get("chat_template"), str):
            return ChatTemplate(
                jinja["chat_template"],
                source="llm_config.json:jinja.chat_template",
                bos_token=str(jinja.get("bos", "") or ""),
                eos_token=str(jinja.get("eos", "") or eos),
            )
        tok_cfg = folder / "tokenizer_config.json"
        if tok_cfg.is_file():
            with contextlib.suppress(ValueError, OSError):
                data = json.loads(tok_cfg.read_text(encoding="utf-8"))
                if isinstance(data.get("chat_template"), str):
                    return ChatTemplate(
                        data["chat_template"], source="tokenizer_config.json:chat_template", eos_token=eos
                    )
        return chatml_template()

    @property
    def chat_template(self) -> ChatTemplate:
        assert self._chat_template is not None
        return self._chat_template

    # -- tokens ------------------------------------------------------------------------

    def tokenize(self, text: str | bytes, *, special: bool = False) -> list[int]:
        self._check_open()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not data:
            return []
        # MNN's tokenizer takes text and always parses special-token text; split both
        # cases off and tokenize them here.
        valid, rest = _split_valid_utf8(data)
        ids: list[int] = []
        if valid:
            ids.extend(self._tokenize_text(valid, special))
        if rest:
            ids.extend(self._greedy_bytes(rest))
        return ids

    def _tokenize_text(self, text: str, special: bool) -> list[int]:
        if special or not any(s in text for s in self._special_texts()):
            return [int(t) for t in self._llm.tokenizer_encode(text)]
        out: list[int] = []
        for part, is_special in _split_on(text, self._special_texts()):
            if is_special:
                out.extend(self._greedy_bytes(part.encode("utf-8")))
            elif part:
                out.extend(int(t) for t in self._llm.tokenizer_encode(part))
        return out

    def _special_texts(self) -> list[str]:
        cached: list[str] | None = getattr(self, "_special_text_cache", None)
        if cached is None:
            cached = sorted(
                {self.vocab.token_bytes[t].decode("utf-8", "replace") for t in self.vocab.special_ids} - {""},
                key=len,
                reverse=True,
            )
            self._special_text_cache = cached
        return cached

    def _greedy_bytes(self, data: bytes) -> list[int]:
        """Longest-match tokenization over ordinary tokens (for bytes MNN cannot take)."""
        table: dict[bytes, int] | None = getattr(self, "_byte_table", None)
        if table is None:
            table = {}
            for i, piece in enumerate(self.vocab.token_bytes):
                if piece and i not in self.vocab.special_ids and piece not in table:
                    table[piece] = i
            self._byte_table = table
            self._max_piece = max((len(p) for p in table), default=1)
        out = []
        i = 0
        while i < len(data):
            for n in range(min(self._max_piece, len(data) - i), 0, -1):
                tok = table.get(data[i : i + n])
                if tok is not None:
                    out.append(tok)
                    i += n
                    break
            else:
                raise BackendError(f"No token covers byte {data[i]:#x}; the vocabulary is not byte-level.")
        return out

    # -- evaluation --------------------------------------------------------------------

    def _forward(self, tokens: list[int]) -> np.ndarray:
        if not self._loaded:  # forward before load segfaults in pymnn
            raise ModelStateError("The MNN model is not loaded.")
        if not tokens:  # forward([]) raises SIGFPE in pymnn
            raise BackendError("Internal error: empty forward.")
        engine = self._chooser.active
        start = time.perf_counter()
        var = self._engines[engine].forward(tokens)
        if var is None:
            raise BackendError("MNN forward returned no logits.")
        arr = np.array(var.read(), dtype=np.float32, copy=True)  # read() aliases engine memory
        if len(self._engines) > 1:
            self._chooser.record(engine, len(tokens), time.perf_counter() - start)
        return arr.reshape(-1, arr.shape[-1])

    def _set_all_logits(self, on: bool) -> None:
        # Logits for every position cost about as much again as the prefill itself, so
        # they are switched on only for calls that ask for more than the last position.
        if on != self._all_logits:
            with _quiet_stdout():
                self._engines[self._chooser.active].set_config(json.dumps({"all_logits": on}))
            self._all_logits = on
            self._noisy_next = True

    def _eval(self, tokens: list[int], positions: list[int], hidden: bool) -> EvalOutput:
        start = len(self._cached)
        self._set_all_logits(bool(positions) and positions != [len(tokens) - 1])
        try:
            if self._noisy_next:  # the first forward after a reconfiguration prints a warning
                with _quiet_stdout():
                    logits = self._forward(tokens)
                self._noisy_next = False
            else:
                logits = self._forward(tokens)
        except BaseException:
            self._rollback(start)
            raise
        if logits.shape[0] != len(tokens):
            # builds without all-logits support return only the last row
            if positions and positions != [len(tokens) - 1]:
                return self._eval_stepwise(tokens, positions, start, logits)
            rows = logits[-1:][: len(positions)]
        else:
            rows = logits[positions] if positions else logits[:0]
        return EvalOutput(logits=np.ascontiguousarray(rows), positions=list(positions))

    def _eval_stepwise(self, tokens: list[int], positions: list[int], start: int, _: np.ndarray) -> EvalOutput:
        self._rollback(start)
        rows: dict[int, np.ndarray] = {}
        done = 0
        for p in sorted(set(positions)):
            rows[p] = self._forward(tokens[done : p + 1])[-1]
            done = p + 1
        if done < len(tokens):
            self._forward(tokens[done:])
        return EvalOutput(logits=np.stack([rows[p] for p in positions]), positions=list(positions))

    def _rollback(self, n: int) -> None:
        with _quiet_stdout():
            self._engines[self._chooser.active].erase_history(n, 0)
        self._noisy_next = True

    def _reset(self) -> None:
        with _quiet_stdout():
            for engine in self._engines:  # both: after reset() no cache is left to reuse
                engine.reset()
        if self._parked is not None:  # keeps its all-logits configuration
            self._parked = _EngineState(all_logits=self._parked.all_logits, noisy_next=True)
        self._noisy_next = True

    # -- the one-thread engine -----------------------------------------------------------

    def _add_one_thread_engine(self, build: dict[str, Any]) -> None:
        """A second LLM on this build's graph that shares the weights, loaded with one thread
        (``create_lora`` copies the configuration, thread count included). Without it (an
        MNN that refuses) the model runs on ``threads`` alone."""
        ceiling = self._engines[0]
        try:
            with _quiet_stdout():
                ceiling.set_config(json.dumps({"thread_num": 1}))
                try:
                    twin = ceiling.create_lora(str(build.get("llm_model", "llm.mnn")))
                finally:  # what later create_lora calls (LoRA adapters) copy
                    ceiling.set_config(json.dumps({"thread_num": self._threads}))
                if twin is None:
                    return
                probe = twin.forward([0])
                twin.reset()
        except Exception:
            return
        if probe is None:
            return
        self._engines.append(twin)
        self._parked = _EngineState()
        self.info = ModelInfo(
            **{**self.info.__dict__, "extra": {**self.info.extra, "threads": f"{self._threads} (adaptive: MNN)"}}
        )

    def _use_engine(self, tokens: Sequence[int]) -> None:
        """Choose the engine for a prefill of ``tokens`` and make it the active one."""
        if self._parked is None or not self._loaded:
            return
        active = self._chooser.active
        parked = self._parked
        uncached = [0, 0]  # the tokens each engine would evaluate
        uncached[active] = len(tokens) - self.reusable_prefix(tokens)
        uncached[1 - active] = len(tokens) - reusable_length(parked.cached, parked.single_from, tokens)
        if self._chooser.choose(uncached) == active:
            return
        self._parked = _EngineState(
            self._cached, self._prefill_memo, self._single_from, self._all_logits, self._noisy_next
        )
        self._cached = parked.cached
        self._prefill_memo = parked.prefill_memo
        self._single_from = parked.single_from
        self._all_logits = parked.all_logits
        self._noisy_next = parked.noisy_next

    def engine_threads(self) -> int:
        """The thread count of the engine that evaluates now (``threads`` or 1)."""
        return 1 if self._chooser.active == ONE_THREAD else self._threads

    def prefill(
        self,
        tokens: Sequence[int],
        *,
        logits: LogitsSelection = "last",
        hidden: bool = False,
    ) -> EvalOutput:
        with self.lock:  # the engine chosen is the one the prefill runs on
            toks = self._check_ids(tokens)
            self._use_engine(toks)
            return super().prefill(toks, logits=logits, hidden=hidden)

    prefill.__doc__ = Model.prefill.__doc__

    # -- LoRA --------------------------------------------------------------------------

    def _load_lora(self, path: Path) -> object:
        rel = os.path.relpath(path.resolve(), self._cfg_path.parent.resolve())
        try:
            handle = self._llm._c_obj.create_lora(rel)
        except Exception as exc:
            raise AdapterError(f"MNN could not load the LoRA {path}: {exc}") from exc
        if handle is None:
            raise AdapterError(f"MNN could not load the LoRA {path}.")
        return handle

    def _apply_loras(self) -> None:
        raise AdapterError(
            "MNN LoRA adapters are separate models that share the base weights; use the handle returned by "
            "create_lora through pocket_agent.decision, not runtime scaling."
        )

    # -- lifecycle ---------------------------------------------------------------------

    def _close(self) -> None:
        self._loaded = False
        self._loras.clear()
        del self._engines[1:]  # the twin uses the first engine's weights: free it first
        self._engines.clear()
        self._llm = None
        atexit.unregister(self.close)
        with _live_lock:
            if MnnModel._live is self:
                MnnModel._live = None


def _read_build(cfg_path: Path) -> dict[str, Any]:
    if not cfg_path.exists():
        raise ModelNotFoundError(f"MNN config not found: {cfg_path}")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{cfg_path} is not readable JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_path} is not an MNN LLM config (expected a JSON object).")
    folder = cfg_path.parent
    missing = [
        name
        for name in (cfg.get("llm_model", "llm.mnn"), cfg.get("llm_weight", "llm.mnn.weight"))
        if not (folder / name).is_file()
    ]
    if missing:
        raise ModelNotFoundError(f"The MNN build in {folder} is incomplete: missing {', '.join(missing)}.")
    llm_cfg_file = folder / "llm_config.json"
    llm_cfg: dict[str, Any] = {}
    if llm_cfg_file.is_file():
        with contextlib.suppress(ValueError, OSError):
            llm_cfg = json.loads(llm_cfg_file.read_text(encoding="utf-8"))
    return {**cfg, "llm_config": llm_cfg}


def _tokenizer_special_ids(folder: Path, tokenizer_file: str | None) -> tuple[set[int], list[int]]:
    """Special and stop token ids from the header of MNN's tokenizer file.

    Both ``tokenizer.txt`` and the binary ``tokenizer.mtok`` start with three text lines:
    ``<magic> <type>``, ``<n_special> <n_stop> <n_prefix>``, then the ids of the special,
    stop and prefix tokens.
    """
    names = [tokenizer_file] if tokenizer_file else []
    names += ["tokenizer.mtok", "tokenizer.txt"]
    path = next((folder / n for n in names if n and (folder / n).is_file()), None)
    if path is None:
        return set(), []
    try:
        with path.open("rb") as f:
            f.readline()
            counts = f.readline().split()
            ids = [int(x) for x in f.readline().split()]
        n_special, n_stop = int(counts[0]), int(counts[1])
    except (IndexError, ValueError, OSError):
        return set(), []
    return set(ids[:n_special]), ids[n_special : n_special + n_stop]


def _find(pieces: list[bytes], target: bytes) -> int | None:
    for i, p in enumerate(pieces):
        if p == target:
            return i
    return None


def _split_valid_utf8(data: bytes) -> tuple[str, bytes]:
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as exc:
        return data[: exc.start].decode("utf-8"), data[exc.start :]


def _split_on(text: str, needles: list[str]) -> list[tuple[str, bool]]:
    parts: list[tuple[str, bool]] = []
    i = 0
    buf_start = 0
    while i < len(text):
        for n in needles:
            if text.startswith(n, i):
                parts.append((text[buf_start:i], False))
                parts.append((n, True))
                i += len(n)
                buf_start = i
                break
        else:
            i += 1
    parts.append((text[buf_start:], False))
    return parts
