"""The ``pocket-agent`` command line as a new user meets it (issue 37, item 4): run through
the real console entry (``python -m pocket_agent``), from a folder that is not the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_GGUF

from pocket_agent._cli_common import load_reference, load_schema_option
from pocket_agent.tools.cli import load_tools

SCHEMA_PY = '''
from pydantic import BaseModel, Field


class Receipt(BaseModel):
    """Two short fields: the output is a few dozen tokens."""

    date: str = Field(description="the date as written", max_length=20)
    total: str = Field(description="the total amount paid", max_length=10)


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b
'''
RECEIPTS = ("Corner Shop, 12/03/2024. Bread 2.50, milk 1.20. TOTAL 3.70", "Kiosk 2024-05-01 coffee TOTAL 2.00")
TINY = ("--model", str(TINY_GGUF), "-t", "1", "--max-tokens", "48", "--adapter", "none")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m pocket_agent ARGS`` in ``cwd``, without a model chosen by the environment."""
    env = {k: v for k, v in os.environ.items() if k != "POCKET_AGENT_MODEL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pocket_agent", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=600, check=False)


def _stderr_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    """A Pydantic model (and a tool function) in a .py file outside any package."""
    path = tmp_path / "schemas" / "my_schema.py"
    path.parent.mkdir()
    path.write_text(SCHEMA_PY, encoding="utf-8")
    return path


@pytest.fixture
def documents(tmp_path: Path) -> list[Path]:
    paths = []
    for i, text in enumerate(RECEIPTS):
        paths.append(tmp_path / f"receipt{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    return paths


def test_version_prints_the_distribution_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    proc = _cli("--version", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pocket-agent {version('pocket-agent-mnn')}"
    assert "exit status" in _cli("--help", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    "args",
    [
        ("extract", "missing.txt", "--schema", "s.json"),
        ("extract", "--many", "missing.jsonl", "--schema", "s.json"),
        ("decide", "Is it?", "-o", "no", "-o", "yes", "--context-file", "missing.txt"),
        ("tune", "extract", "missing.jsonl", "-o", "out.gguf", "--schema", "s.json"),
    ],
    ids=["document", "many", "context-file", "training-data"],
)
def test_a_missing_input_file_is_one_error_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    proc = _cli(*args, cwd=tmp_path)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("pocket-agent") and "error:" in lines[0] and "missing." in lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("extract", "{doc}", "--schema", "nowhere/absent.py:Receipt"), "file not found"),
        (("extract", "{doc}", "--schema", "{schema}:Nothing"), "'Nothing'"),
        (("extract", "{doc}", "--schema", "no_such_module:Receipt"), "cannot import"),
        (("extract", "{doc}", "--schema", "{schema}:Receipt", "--max-tokens", "lots"), "--max-tokens"),
        (("generate", "hi", "--threads", "0"), "--threads"),
        (("run", "task", "--tools", "{doc}:add"), "not a Python file"),
        (("extract", "{doc}", "--schema", "{schema}:Receipt", "--out", "no/such/dir/out.json"), "--out"),
    ],
    ids=["schema-file", "schema-attr", "schema-module", "max-tokens", "threads", "tools-file", "out-folder"],
)
def test_bad_input_is_one_error_line(
    tmp_path: Path, schema_file: Path, documents: list[Path], args: tuple[str, ...], says: str
) -> None:
    filled = [a.format(doc=documents[0], schema=schema_file) for a in args]
    proc = _cli(*filled, cwd=tmp_path)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert says in lines[0]


def test_schema_and_tools_references_share_one_loader(
    tmp_path: Path, schema_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import BaseModel

    schema = load_schema_option(f"{schema_file}:Receipt")
    assert isinstance(schema, type) and issubclass(schema, BaseModel)
    assert [t.name for t in load_tools(f"{schema_file}:add")] == ["add"]
    monkeypatch.chdir(schema_file.parent)  # module:Attr imports from the current folder
    assert load_reference("my_schema:Receipt", "--schema").model_fields.keys() == {"date", "total"}


@pytest.mark.slow
def test_generate_without_a_model_path_uses_the_embedded_model(tmp_path: Path) -> None:
    proc = _cli("generate", "Name one colour.", "--max-tokens", "8", "-t", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the exact greedy text depends on the llama.cpp build's CPU kernels
    assert proc.stdout.strip()
    assert "tokens; stopped:" in proc.stderr


@pytest.mark.slow
def test_schema_from_a_py_file(tmp_path: Path, schema_file: Path, documents: list[Path]) -> None:
    proc = _cli("extract", str(documents[0]), "--schema", f"{schema_file}:Receipt", *TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) == {"date", "total"}


@pytest.mark.slow
def test_several_files_give_one_result_each_in_order(tmp_path: Path, schema_file: Path, documents: list[Path]) -> None:
    files = [str(d) for d in documents]
    proc = _cli("extract", *files, "--schema", f"{schema_file}:Receipt", *TINY, cwd=tmp_path)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["index"], r["file"]) for r in rows] == [(0, files[0]), (1, files[1])]
    failed = sum(not r["ok"] for r in rows)
    assert proc.returncode == (1 if failed else 0), proc.stderr
    assert all(set(r["value"]) == {"date", "total"} for r in rows if r["ok"])
    summary = f"pocket-agent extract: 2 document(s), {2 - failed} done, {failed} failed"
    assert _stderr_lines(proc)[-1].startswith(summary)


@pytest.mark.slow
def test_decide_takes_dash_t(tmp_path: Path) -> None:
    args = ("decide", "Is the sky blue?", "-o", "no", "-o", "yes", "--method", "cloze", "--json")
    proc = _cli(*args, "--model", str(TINY_GGUF), "-t", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["choice"] in ("no", "yes")


@pytest.mark.slow
def test_many_with_a_failing_row_ends_with_a_summary_line(tmp_path: Path, schema_file: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"text": RECEIPTS[0]}) + "\n{not json\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ("extract", "--many", str(inp), "--out", str(out), "--schema", f"{schema_file}:Receipt", *TINY)
    proc = _cli(*args, cwd=tmp_path)  # stderr is a pipe, not a terminal
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["ok"] for r in rows][1:] == [False] and len(rows) == 2
    failed = sum(not r["ok"] for r in rows)
    assert proc.returncode == 1, proc.stderr
    summary = _stderr_lines(proc)[-1]
    assert summary.startswith(f"pocket-agent extract: 2 document(s), {2 - failed} done, {failed} failed")
    assert str(out) in summary and "exit status 1" in summary
