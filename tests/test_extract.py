"""extract(), extract_many(), extract_stream() and generate() on the default model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import ROOT
from pydantic import BaseModel, Field, model_validator

from pocket_agent import Limits, Sampling, extract, extract_many, extract_stream, generate
from pocket_agent.errors import (
    ContextOverflowError,
    ExtractionError,
    InvalidInputError,
    ModelNotFoundError,
    OutputBudgetExceeded,
    SchemaError,
    UnsupportedSchemaError,
)
from pocket_agent.extraction import complete_fields
from pocket_agent.generate import render_prompt, run_generation
from pocket_agent.grammars import Choice, Regex, compile_grammar
from pocket_agent.grammars.grounding import number_options
from pocket_agent.runtime import Model

RECEIPT = "BOOK TA .K (TAMAN DAYA) SDN BHD\nNO.53, JALAN SAGU 18, TAMAN DAYA\nDATE: 25/12/2018\nTOTAL: 9.00"


class Receipt(BaseModel):
    company: str = Field(description="the shop's company name")
    date: str = Field(description="the date as written")
    total: float = Field(description="the total paid")


def test_extract_returns_validated_model(smollm: Model) -> None:
    r = extract(RECEIPT, Receipt, model=smollm)
    assert isinstance(r, Receipt)
    assert isinstance(r.total, float)
    # grounded by default: the date and the total are values the receipt prints
    printed = {float(n) for n in number_options(RECEIPT, quantities=True)}
    assert r.date in RECEIPT and r.total in printed


def test_extract_json_schema_dict_returns_valid_data(smollm: Model) -> None:
    schema = {
        "type": "object",
        "properties": {
            "company": {"type": "string", "maxLength": 40},
            "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "kind": {"enum": ["receipt", "invoice", "other"]},
        },
        "required": ["company", "items", "kind"],
        "additionalProperties": False,
    }
    data = extract(RECEIPT, schema, model=smollm)
    jsonschema.validate(data, schema)


def test_cross_field_validator_retries_then_fails_with_context(smollm: Model) -> None:
    calls = {"n": 0}

    class Strict(BaseModel):
        company: str
        total: float

        @model_validator(mode="after")
        def never_valid(self) -> Strict:
            calls["n"] += 1
            raise ValueError("total must match the sum of the items")

    with pytest.raises(ExtractionError) as info:
        extract(RECEIPT, Strict, model=smollm, retries=1)
    assert calls["n"] == 2  # the first attempt and one retry
    assert json.loads(info.value.last_output)["company"] is not None
    assert "sum of the items" in str(info.value)


def test_free_strings_are_capped(smollm: Model) -> None:
    class Note(BaseModel):
        text: str = Field(description="the whole document copied verbatim, then repeated")

    note = extract(RECEIPT * 3, Note, model=smollm, limits=Limits(max_string_chars=20, max_tokens=200))
    assert len(note.text) <= 20
    with pytest.raises(InvalidInputError):
        extract(RECEIPT, Note, model=smollm, limits=Limits(max_string_chars=0))


def test_output_budget_exhausted_carries_partial(smollm: Model) -> None:
    with pytest.raises(OutputBudgetExceeded) as info:
        extract(RECEIPT, Receipt, model=smollm, max_tokens=5)
    assert info.value.partial.startswith('{"company":')
    assert info.value.tokens <= 5


@pytest.mark.parametrize("bad", [None, 42, b"bytes", "", "   \n"])
def test_bad_text_is_a_typed_error(smollm: Model, bad: Any) -> None:
    with pytest.raises(InvalidInputError):
        extract(bad, Receipt, model=smollm)


def test_bad_schemas_are_typed_errors(smollm: Model) -> None:
    with pytest.raises(SchemaError):
        extract(RECEIPT, {"type": "object", "properties": {"a": {"type": "strng"}}}, model=smollm)
    with pytest.raises(InvalidInputError):
        extract(RECEIPT, 42, model=smollm)  # type: ignore[call-overload]
    with pytest.raises(UnsupportedSchemaError) as info:
        extract(
            RECEIPT,
            {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
            model=smollm,
        )
    assert info.value.feature == "uniqueItems"
    assert info.value.path == "#/properties/tags"


def test_document_longer_than_context_says_so(smollm: Model) -> None:
    with pytest.raises(ContextOverflowError, match="Nothing was cut"):
        extract("total 9.00 " * 3000, Receipt, model=smollm)


def test_missing_model_path_is_typed(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        extract(RECEIPT, Receipt, model=str(tmp_path / "nope.gguf"))


def test_extract_many_reuses_prefix_and_survives_bad_items(smollm: Model) -> None:
    docs: list[Any] = [RECEIPT, 42, RECEIPT.replace("9.00", "12.50"), ""]
    before = smollm.stats.tokens_evaluated
    outcomes = list(extract_many(docs, Receipt, model=smollm, progress=False))
    assert [o.index for o in outcomes] == [0, 1, 2, 3]
    assert [o.ok for o in outcomes] == [True, False, True, False]
    assert isinstance(outcomes[1].error, InvalidInputError)
    assert all(isinstance(o.value, Receipt) for o in outcomes if o.ok)
    # the second good document shared the system prompt and field list with the first
    prompt = render_prompt(smollm, [{"role": "user", "content": RECEIPT}])
    assert smollm.stats.tokens_evaluated - before < 2 * len(prompt) + 200


def test_extract_stream_yields_growing_partials_then_object(smollm: Model) -> None:
    items = list(extract_stream(RECEIPT, Receipt, model=smollm))
    *partials, final = items
    assert isinstance(final, Receipt)
    assert [len(p) for p in partials] == sorted(len(p) for p in partials)
    assert list(partials[-1]) == ["company", "date", "total"]


def test_complete_fields_waits_for_delimiters() -> None:
    assert complete_fields('{"a":"x","b":12') == {"a": "x"}
    assert complete_fields('{"a":"x","b":12,') == {"a": "x", "b": 12}
    assert complete_fields('{"a":{"c":[1,2]},"b":"y"}') == {"a": {"c": [1, 2]}, "b": "y"}
    assert complete_fields('{"a":"unterminated') == {}


def test_generate_regex_choice_and_free_text(smollm: Model) -> None:
    r = generate("Give a date.", output_type=Regex(r"\d{4}-\d{2}-\d{2}"), model=smollm)
    assert len(r.text) == 10 and r.text[4] == "-" and r.finish_reason == "grammar"
    c = generate("Is the sky blue?", output_type=Choice(["yes", "no"]), model=smollm)
    assert c.text in ("yes", "no")
    free = generate("Say hi.", model=smollm, max_tokens=8)
    assert free.finish_reason in ("eos", "length") and free.usage.completion_tokens <= 8


def test_forced_tokens_are_fast_forwarded(smollm: Model) -> None:
    grammar = compile_grammar(Receipt, smollm)
    ids = render_prompt(smollm, [{"role": "user", "content": RECEIPT}])
    res = run_generation(smollm, ids, grammar=grammar)
    st = res.usage
    assert st.forced_tokens > 0
    # forced tokens go to the model in one evaluation per run, not one decode each
    assert st.decode_calls < st.completion_tokens
    Receipt.model_validate_json(res.text)


def test_sampling_is_seeded(smollm: Model) -> None:
    sampling = Sampling(temperature=1.0, top_p=0.9, top_k=40, seed=7)
    a = generate("Write a word.", model=smollm, sampling=sampling, max_tokens=8)
    b = generate("Write a word.", model=smollm, sampling=sampling, max_tokens=8)
    assert a.tokens == b.tokens
    with pytest.raises(InvalidInputError):
        generate("x", model=smollm, sampling=Sampling(temperature=-1))


@pytest.mark.slow
def test_cli_extract_many_keeps_going_past_a_corrupt_line(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"text": RECEIPT}) + "\n{not json\n" + json.dumps(RECEIPT.replace("9.00", "3.10")) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pocket_agent", "extract", "--schema", "examples.invoice_schema:Invoice"),
            *("--many", str(inp), "--out", str(out), "--threads", "1"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert proc.returncode == 1, proc.stderr  # one item failed
    assert [r["ok"] for r in rows] == [True, False, True]
    assert rows[1]["error_type"] == "InvalidInputError"
    assert set(rows[0]["value"]) == {"invoice_number", "seller", "date", "total", "currency"}


def test_repeat_limit_breaks_token_loops(smollm: Model) -> None:
    grammar = compile_grammar(Regex(r"1(0)*x"), smollm)
    ids = render_prompt(smollm, "Write the number one followed by a hundred zeros.")
    out = run_generation(smollm, ids, grammar=grammar, limits=Limits(max_tokens=60, repeat_limit=3))
    assert out.finish_reason == "grammar"
    assert out.text.startswith("1") and out.text.endswith("x")


def test_loop_detection_finds_cycles() -> None:
    from pocket_agent.generate import _looping_token

    assert _looping_token([7] * 8, 8) == 7
    assert _looping_token([5, 1, 2, 1, 2, 1, 2, 1, 2], 8) == 1
    assert _looping_token([9, *([3, 4, 5] * 3)], 8) == 3
    assert _looping_token([1, 2, 3, 4, 5, 6, 7, 8, 9], 8) is None
    assert _looping_token([1, 1, 1], 8) is None


@pytest.mark.slow
def test_the_branch_probe_runs_before_the_first_prompt_not_after_it() -> None:
    # branches_reliable's first call clears the KV cache: run after a document's prompt it
    # would cost that prompt again (measured: 1.7 s on one SROIE receipt)
    from pocket_agent.runtime import load_model
    from pocket_agent.runtime.branches import _reliable

    model = load_model(threads=1, n_ctx=1024)
    try:
        resets: list[int] = []
        reset = model.reset

        def watched_reset() -> None:
            resets.append(len(model.cached_tokens))
            reset()

        model.reset = watched_reset  # type: ignore[method-assign]
        extract(RECEIPT, Receipt, model=model, adapter=None)
        assert model in _reliable  # probed, whether or not a number had to be chosen
        assert all(n < 40 for n in resets), resets  # the probe's own short text only, never a prompt
    finally:
        model.close()
