"""Types that flow to a user's code: mypy (strict) on tests/typing/user_script.py, which
asserts the types ``extract``, ``extract_many`` and ``Agent.run`` give back. The same script is
checked against the built wheel in a fresh venv by tests/test_package.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_users_script_type_checks(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-warn-unused-ignores",  # the package's own ignores are for other numpy/torch versions
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(HERE / "typing" / "user_script.py"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=HERE.parent,  # the package as installed here (editable); the wheel test checks the built wheel
    )
    assert done.returncode == 0, done.stdout + done.stderr
