"""Write tests/data: the small samples of ../shared/data that a plain clone's tests run on.

A user's clone has no ``../shared`` beside it, so the suites that read the development sets
(JSONSchemaBench, SROIE, SST-2, BFCL) fall back to these samples there (``tests/datasets.py``);
CI and developers have the full sets and run on them. Rerun after the shared sets change:

    python scripts/make_test_data.py            # from the repository root

The JSONSchemaBench sample is the first schemas in a seeded hash order (the order
``tests/test_generation_conformance.py`` draws its sample in), so the sample holds exactly the
schemas that test picks from the full set, plus more for the conformance suite.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tests"))
from conftest import schema_order_key  # noqa: E402  (the order the tests draw schemas in)

JSONSCHEMABENCH_SAMPLE = 150
MAX_SCHEMA_FILE_BYTES = 40_000  # keeps the sample near 1 MB; larger files stay in the full set
BFCL_ROWS = 40  # bench/tools_data.py reads rows 30 and later
WHOLE_FILES = ("sroie/receipts.jsonl", "mcq/sst2.jsonl")


def main() -> int:
    if not SHARED.is_dir():
        print(f"no development data at {SHARED}", file=sys.stderr)
        return 1
    if OUT.exists():
        for sub in ("jsonschemabench", "sroie", "mcq", "bfcl"):
            shutil.rmtree(OUT / sub, ignore_errors=True)
    files = sorted((SHARED / "jsonschemabench").glob("*.json"), key=lambda p: schema_order_key(p.name))
    picked = [p for p in files if p.stat().st_size <= MAX_SCHEMA_FILE_BYTES][:JSONSCHEMABENCH_SAMPLE]
    (OUT / "jsonschemabench").mkdir(parents=True)
    for p in picked:
        shutil.copyfile(p, OUT / "jsonschemabench" / p.name)
    for rel in WHOLE_FILES:
        (OUT / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED / rel, OUT / rel)
    (OUT / "bfcl").mkdir(parents=True)
    for category in ("parallel", "irrelevance"):
        lines = (SHARED / "bfcl" / f"{category}.jsonl").read_text(encoding="utf-8").splitlines()[:BFCL_ROWS]
        (OUT / "bfcl" / f"{category}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({size / 1e6:.2f} MB, {len(picked)} schemas)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
