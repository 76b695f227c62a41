"""Reading the output of one transformer block from llama.cpp.

llama.cpp names the output of block ``i`` ``l_out-<i>`` in its compute graph and lets a
context observe graph nodes through an evaluation callback (``cb_eval``). A
:class:`LayerTap` is such a callback: in "ask" mode it says which node it wants (one
name, checked with a string compare), in "observe" mode it copies that node's rows and
can stop the rest of the graph, which saves the compute of every later block.

The callback runs for every graph node, so it is installed only on a context made for
reading states (never on the context that generates), and it must not raise: ctypes
swallows exceptions in callbacks, so errors are kept and re-raised by the caller.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import BackendError

GGML_TYPE_F32 = 0


def _library_names() -> tuple[str, ...]:
    if sys.platform == "darwin":
        return ("libggml-base.dylib",)
    if sys.platform == "win32":
        return ("ggml-base.dll",)
    return ("libggml-base.so",)


def load_ggml_base(llama_cpp_module: Any) -> ctypes.CDLL:
    """The ``ggml-base`` library that llama-cpp-python ships next to ``libllama``."""
    lib_dir = Path(llama_cpp_module.__file__).parent / "lib"
    for name in _library_names():
        path = lib_dir / name
        if path.exists():
            lib = ctypes.CDLL(str(path))
            break
    else:
        raise BackendError(
            f"Reading layer states needs llama.cpp's ggml-base library, which was not found in {lib_dir}."
        )
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_nelements.argtypes = [ctypes.c_void_p]
    lib.ggml_nelements.restype = ctypes.c_int64
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return lib


class LayerTap:
    """An evaluation callback that copies the output of one transformer block.

    Set :attr:`layer` before a decode (``None`` observes nothing); afterwards
    :attr:`rows` holds the block's output for every token of the batch, ``[n_tokens,
    n_embd]`` float32, in batch order. With :attr:`stop` the graph is cut after the
    block, so the later blocks (and the logits) are not computed: the keys and values
    of the later blocks are then missing for the decoded tokens, and the caller must
    remove those tokens from the cache before anything else attends to them.
    """

    def __init__(self, ggml: ctypes.CDLL, callback_type: Any, n_embd: int) -> None:
        self._ggml = ggml
        self._n_embd = n_embd
        self._want = b""
        self.stop = True
        self.rows: NDArray[np.float32] | None = None
        self.error: str | None = None
        # llama_context_params.cb_eval accepts only instances of llama_cpp's own callback type
        self.callback = callback_type(self._on_node)

    @property
    def layer(self) -> int | None:
        return int(self._want.rsplit(b"-", 1)[1]) if self._want else None

    @layer.setter
    def layer(self, value: int | None) -> None:
        self._want = b"" if value is None else f"l_out-{value}".encode()
        self.rows = None
        self.error = None

    def _on_node(self, tensor: int | None, ask: bool, _user_data: int | None) -> bool:
        try:
            if not self._want or tensor is None or self._ggml.ggml_get_name(tensor) != self._want:
                return not ask  # ask: not wanted; observe (never reached for unwanted nodes): go on
            if ask:
                return True
            return self._copy(tensor)
        except BaseException as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return False

    def _copy(self, tensor: int) -> bool:
        if ctypes.c_int32.from_address(tensor).value != GGML_TYPE_F32:
            self.error = f"the node {self._want.decode()} is not float32"
            return False
        n = int(self._ggml.ggml_nelements(tensor))
        if n <= 0 or n % self._n_embd:
            self.error = f"the node {self._want.decode()} has {n} elements, not a multiple of {self._n_embd}"
            return False
        buf = np.empty(n, dtype=np.float32)
        self._ggml.ggml_backend_tensor_get(tensor, buf.ctypes.data, 0, n * 4)
        self.rows = buf.reshape(-1, self._n_embd)
        return not self.stop
