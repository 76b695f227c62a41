"""What the benchmark reports say about the machine and the installed packages."""

from __future__ import annotations

import platform
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def package_versions(packages: Iterable[str]) -> str:
    """``"pkg 1.2.3, other not installed"`` for the given distributions."""
    out = []
    for pkg in packages:
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} not installed")
    return ", ".join(out)


def guard_peer_llama() -> str:
    """Make llama-cpp-python's own ``Llama`` (the peers: its JSON-schema mode, its function
    calling, outlines on it) load weights as pocket_agent does on this CPU: without
    llama.cpp's extra buffer types where they crash the process (Intel AMX, llama.cpp#20824).
    Unguarded, every peer segfaults on its first prompt there. Returns the decision, for
    the report."""
    import llama_cpp.llama as llama_module

    from pocket_agent.runtime._cpu import cpu_flags, decide_extra_buffers, extra_buffers_setting
    from pocket_agent.runtime.llamacpp import system_info

    decision = decide_extra_buffers(system_info(), cpu_flags(), extra_buffers_setting(None))
    lib = llama_module.llama_cpp
    original = getattr(lib, "_pocket_agent_original_params", lib.llama_model_default_params)

    def default_params() -> object:
        params = original()
        params.use_extra_bufts = decision.use_extra_buffers
        return params

    lib._pocket_agent_original_params = original
    lib.llama_model_default_params = default_params
    return f"extra buffer types {decision.reason}"
