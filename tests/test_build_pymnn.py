"""scripts/build_pymnn.sh refuses a folder that is not an MNN source tree before building anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import ROOT


def test_build_pymnn_names_what_is_missing(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_pymnn.sh"), str(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "is not an MNN source tree (no CMakeLists.txt)" in proc.stderr
    assert not (tmp_path / "out" / "MNN").exists()
