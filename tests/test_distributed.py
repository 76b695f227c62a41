"""pocket_agent.distributed on a local Ray cluster (``ray.init(num_cpus=2)``), real models.

Needs the ``ray`` extra: CI installs it, so these tests fail rather than skip without it.
The SROIE test extracts 40 receipts from ``../shared/data/sroie`` (or its copy in ``tests/data``)
plus 5 bad rows with two actors of the default model and checks every value against ``extract_many`` in this
process (same model file, greedy, same options).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from conftest import ROOT, TINY_GGUF, TINY_MNN, dev_data
from pydantic import BaseModel, Field, model_validator

from pocket_agent import decide_many, extract_many
from pocket_agent.distributed import decide_dataset, extract_dataset
from pocket_agent.distributed._schema import ShippedSchema
from pocket_agent.errors import InvalidInputError, SchemaError
from pocket_agent.runtime import Model, load_model

# Bounded output so 40 receipts x 2 runs stay at a few minutes on 2 shared cores.
OPTIONS: dict[str, Any] = {"max_tokens": 48}


class ReceiptKeys(BaseModel):
    """Two short fields: the output is at most ~40 tokens."""

    date: str = Field(description="the date as written", max_length=20)
    total: str = Field(description="the total amount paid", max_length=10)


class Checked(BaseModel):
    """A class with a validator the grammar cannot express, to ship by value."""

    total: str = Field(max_length=10)

    @model_validator(mode="after")
    def no_x(self) -> Checked:
        if "x" in self.total:
            raise ValueError("total must not contain x")
        return self


BAD_ROWS: list[tuple[str, Any, str]] = [
    ("bad-empty", "", "InvalidInputError"),
    ("bad-blank", "  \n ", "InvalidInputError"),
    ("bad-int", 42, "InvalidInputError"),
    ("bad-none", None, "InvalidInputError"),
    ("bad-long", "receipt total " * 3000, "ContextOverflowError"),
]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


def receipts(n: int) -> list[dict[str, Any]]:
    sroie = dev_data("sroie") / "receipts.jsonl"
    if not sroie.is_file():
        pytest.fail(f"SROIE data missing: {sroie}")
    rows = [json.loads(line) for line in sroie.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= n
    return [{"id": r["id"], "text": r["text"]} for r in rows[:n]]


def dataset(rows: list[dict[str, Any]]) -> Any:
    # one block: a column of mixed types (str, int, None) is then stored as Python objects;
    # extract_dataset cuts it into blocks for the actors.
    return ray.data.from_items(rows, override_num_blocks=1)


def by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {r["id"]: r for r in rows}
    assert len(out) == len(rows), "a row came back twice"
    return out


@pytest.mark.slow
def test_sroie_on_two_actors_equals_extract_many(local_ray: Any, smollm: Model, default_gguf: Path) -> None:
    good = receipts(40)
    rows = good + [{"id": i, "text": t} for i, t, _ in BAD_ROWS]
    out = by_id(
        extract_dataset(
            dataset(rows), ReceiptKeys, model=default_gguf, actors=2, threads_per_actor=1, batch_size=4, **OPTIONS
        ).take_all()
    )
    assert len(out) == 45 and set(out) == {r["id"] for r in rows}
    for r in rows:  # every input column is kept
        assert out[r["id"]]["text"] == r["text"]

    # the actors run the model as extract(model=None) does: the shipped adapter merged into the weights
    merged = load_model(default_gguf, threads=1, merge_adapter="extract")
    try:
        local = list(extract_many([r["text"] for r in good], ReceiptKeys, model=merged, progress=False, **OPTIONS))
    finally:
        merged.close()
    assert all(o.ok for o in local), [str(o.error) for o in local if not o.ok]
    for r, o in zip(good, local, strict=True):
        got = out[r["id"]]
        assert got["error"] is None and got["error_type"] is None, got["error"]
        assert json.loads(got["value"]) == o.value.model_dump(mode="json"), r["id"]
    # the receipts differ, so a row mixed up with another would show
    assert len({out[r["id"]]["value"] for r in good}) > 20

    for row_id, _, error_type in BAD_ROWS:
        got = out[row_id]
        assert got["value"] is None
        assert got["error_type"] == error_type, (row_id, got["error"])
        assert got["error"]


def _reference_in_subprocess(model: Path, texts: list[Any], schema: dict[str, Any]) -> list[Any]:
    """extract_many in a fresh process (MNN allows one model per process)."""
    code = textwrap.dedent(
        """
        import json, sys
        from pocket_agent import extract_many, load_model
        model, texts, schema, options = json.loads(sys.stdin.read())
        m = load_model(model, threads=1)
        out = [o.value if o.ok else type(o.error).__name__
               for o in extract_many(texts, schema, model=m, progress=False, **options)]
        print(json.dumps(out))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([str(model), texts, schema, OPTIONS]),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=ROOT,
    )
    result: list[Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.mnn
@pytest.mark.parametrize("model_path", [TINY_GGUF, TINY_MNN], ids=["gguf", "mnn"])
def test_both_backends_one_model_per_actor(local_ray: Any, model_path: Path) -> None:
    if not model_path.exists():
        pytest.fail(f"fixture model missing: {model_path}; run scripts/build_fixtures.py")
    schema = {**ReceiptKeys.model_json_schema(), "additionalProperties": False}
    rows = [*receipts(3), {"id": "bad-int", "text": 7}, {"id": "bad-empty", "text": ""}]
    out = by_id(extract_dataset(dataset(rows), schema, model=model_path, actors=2, batch_size=1, **OPTIONS).take_all())
    expected = _reference_in_subprocess(model_path, [r["text"] for r in rows], schema)
    got = [json.loads(out[r["id"]]["value"]) if out[r["id"]]["value"] else out[r["id"]]["error_type"] for r in rows]
    assert got == expected
    assert expected[-2:] == ["InvalidInputError", "InvalidInputError"]
    assert all(isinstance(v, dict) for v in expected[:3]), expected


def test_decide_dataset_equals_decide_many(local_ray: Any, tiny_gguf: Model) -> None:
    questions = [
        {"id": "q1", "question": "Is this review positive?", "options": ["no", "yes"], "context": "Loved it."},
        {"id": "q2", "question": "Which colour is the sky?", "options": ["blue", "green", "red"], "context": None},
        {"id": "q3", "question": "Pick a number.", "options": ["one", "two"], "context": "Two is right."},
    ]
    bad = [
        {"id": "b1", "question": "Only one option?", "options": ["yes"], "context": None},
        {"id": "b2", "question": "", "options": ["a", "b"], "context": None},
    ]
    out = by_id(
        decide_dataset(
            ray.data.from_items(questions + bad), model=TINY_GGUF, actors=1, method="cloze", batch_size=5
        ).take_all()
    )
    assert len(out) == 5
    local = decide_many([{k: q[k] for k in ("question", "options", "context")} for q in questions], model=tiny_gguf)
    for q, d in zip(questions, local, strict=True):
        got = out[q["id"]]
        assert got["error"] is None, got["error"]
        assert (got["choice"], got["index"]) == (d.choice, d.index)
        assert got["scores"] == pytest.approx(d.scores, abs=1e-4)
    for b in bad:
        assert out[b["id"]]["choice"] is None and out[b["id"]]["error_type"] == "InvalidInputError"


def test_schema_travels_by_value_with_its_validators(tmp_path: Path) -> None:
    """A class from a test module (not importable elsewhere) is rebuilt in another process."""
    shipped = ShippedSchema.of(Checked)
    blob = tmp_path / "schema.pickle"
    blob.write_bytes(pickle.dumps(shipped))
    code = textwrap.dedent(
        f"""
        import pickle, sys
        assert "test_distributed" not in sys.modules
        cls = pickle.loads(open({str(blob)!r}, "rb").read()).load()
        print(cls.__name__, cls.model_validate_json('{{"total":"9.00"}}').total)
        try:
            cls.model_validate_json('{{"total":"9x"}}')
        except Exception as exc:
            print(type(exc).__name__)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path
    )
    assert proc.stdout.split() == ["Checked", "9.00", "ValidationError"]
    # a JSON Schema dict travels as itself; a broken blob falls back to the class's JSON Schema
    assert ShippedSchema.of({"type": "object"}).load() == {"type": "object"}
    broken = ShippedSchema(shipped.json_schema, b"not a pickle", "x.Checked")
    assert broken.load()["additionalProperties"] is False


def test_bad_arguments_fail_before_anything_runs(local_ray: Any, tiny_gguf: Model) -> None:
    ds = ray.data.from_items([{"text": "a"}])
    with pytest.raises(InvalidInputError, match="no option 'max_tokenz'"):
        extract_dataset(ds, ReceiptKeys, model=TINY_GGUF, max_tokenz=5)
    with pytest.raises(InvalidInputError, match="cannot travel"):
        extract_dataset(ds, ReceiptKeys, model=tiny_gguf)
    with pytest.raises(InvalidInputError, match="actors"):
        extract_dataset(ds, ReceiptKeys, model=TINY_GGUF, actors=0)
    with pytest.raises(InvalidInputError, match="threads_per_actor"):
        extract_dataset(ds, ReceiptKeys, model=TINY_GGUF, threads_per_actor=0)
    with pytest.raises(SchemaError):
        extract_dataset(ds, {"type": "nonsense"}, model=TINY_GGUF)
    with pytest.raises(InvalidInputError, match=r"ray\.data\.Dataset"):
        extract_dataset([{"text": "a"}], ReceiptKeys, model=TINY_GGUF)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="no option 'temperature'"):
        decide_dataset(ds, model=TINY_GGUF, temperature=0.5)


def test_a_missing_text_column_gives_error_rows(local_ray: Any) -> None:
    out = extract_dataset(
        ray.data.from_items([{"body": "x"}, {"body": "y"}]), ReceiptKeys, model=TINY_GGUF, actors=1, **OPTIONS
    ).take_all()
    assert [r["error_type"] for r in out] == ["InvalidInputError", "InvalidInputError"]
    assert "no column 'text'" in out[0]["error"] and [r["body"] for r in out] == ["x", "y"]


def test_importing_pocket_agent_does_not_import_ray() -> None:
    code = "import sys, pocket_agent, pocket_agent.distributed, pocket_agent.cli; print('ray' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert proc.stdout.strip() == "False"


@pytest.mark.slow
def test_cli_many_with_ray_writes_what_the_single_process_path_writes(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({**ReceiptKeys.model_json_schema(), "additionalProperties": False}))
    docs = receipts(3)
    inp = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": docs[0]["text"]}), "{not json", json.dumps(docs[1]["text"]), json.dumps(5)]
    lines += [json.dumps({"text": docs[2]["text"]}), json.dumps({"no_text": 1})]
    inp.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    outputs = {}
    for mode in ("ray", "local"):
        out = tmp_path / f"{mode}.jsonl"
        cmd = [sys.executable, "-m", "pocket_agent", "extract", "--schema", str(schema), "--many", str(inp)]
        cmd += ["--out", str(out), "--threads", "1", "--model", str(TINY_GGUF), "--max-tokens", "48"]
        cmd += ["--ray", "--actors", "2"] if mode == "ray" else []
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 1, proc.stderr  # some lines failed
        outputs[mode] = [json.loads(line) for line in out.read_text().splitlines()]
        assert "6 document(s), 3 done, 3 failed" in proc.stderr  # the summary line, the same on both paths
    assert outputs["ray"] == outputs["local"]
    assert [r["index"] for r in outputs["ray"]] == list(range(6))
    assert [r["ok"] for r in outputs["ray"]] == [True, False, True, False, True, False]
