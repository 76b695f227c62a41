"""The front door runs as written: every Python block of the README and of the docs pages,
every script in ``examples/``, and the docs site's strict build.

A page's blocks run in order as one script (a later block may use what an earlier one
defined, as a reader does), in an empty folder, in a fresh interpreter. A page that talks to
``http://127.0.0.1:8000`` gets a real ``pocket-agent serve`` on a free port instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SERVER_URL = "127.0.0.1:8000"
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name not in {"__init__.py", "invoice_schema.py"})
RUN_TIMEOUT_S = 900

_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    """The page's fenced Python blocks, in order."""
    return [m.group(1) for m in _BLOCK.finditer(page.read_text(encoding="utf-8"))]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("POCKET_AGENT_THREADS", os.environ.get("POCKET_AGENT_TEST_THREADS", "1"))
    env.pop("POCKET_AGENT_API_KEY", None)
    return env


def _run(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def _served(tmp: Path) -> Iterator[str]:
    from test_server import _start  # the server fixture's own start and stop

    servers = _start(tmp)
    try:
        yield next(servers).base.removeprefix("http://")
    finally:
        servers.close()


def test_the_pages_have_python_to_run() -> None:
    counts = {p.name: len(python_blocks(p)) for p in PAGES}
    assert counts["README.md"] >= 5, counts
    assert sum(counts.values()) >= 15, counts


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    code = "\n\n".join(python_blocks(page))
    servers: Iterator[str] | None = None
    if SERVER_URL in code:
        (tmp_path / "server").mkdir()
        servers = _served(tmp_path / "server")
        code = code.replace(SERVER_URL, next(servers))
    work = tmp_path / "work"
    work.mkdir()
    script = work / f"{page.stem}_blocks.py"
    script.write_text(code, encoding="utf-8")
    try:
        done = _run(script, work)
    finally:
        if servers is not None:
            servers.close()
    assert done.returncode == 0, f"{page.name}'s Python blocks failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example: Path) -> None:
    done = _run(example, example.parent)
    assert done.returncode == 0, f"{example.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.stdout.strip(), f"{example.name} printed nothing"


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: no broken link, no docstring the API reference cannot read."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**_env(), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    assert "pip install" in text.split("```python")[0]  # installing comes before the first Python
    for link in re.findall(r"\]\(((?:docs|bench)/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
