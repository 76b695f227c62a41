"""The extraction LoRA shipped for the default model: found by identity, switched on only
while ``extract`` runs, and chosen per call (``adapter="auto" | None | path``).

Its accuracy lives in bench/adapters.md and bench/extract.md; these tests check the
mechanism on the real default model and the real shipped file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import chat_ids
from pydantic import BaseModel, Field

from pocket_agent import extract, extract_many, extract_stream
from pocket_agent.errors import AdapterError, InvalidInputError, OutputBudgetExceeded
from pocket_agent.runtime import Model
from pocket_agent.runtime.identity import model_identity
from pocket_agent.runtime.scripted import ScriptedModel
from pocket_agent.runtime.task_adapters import (
    NO_DEFAULT_ENV,
    adapter_record,
    find_shipped_adapter,
    shipped_adapters,
    task_adapter,
)

DOC = "Harbour Health Practice\nAppointment for Mei Patel with Dr. Ben Garcia on 12.08.2023 at 21:15.\n"


class Appointment(BaseModel):
    patient: str = Field(description="the patient's name")
    doctor: str
    date: str


def _base_logits(m: Model) -> np.ndarray:
    m.reset()
    out = m.eval(chat_ids(m, "Name a colour."), logits="last").logits[-1].copy()
    m.reset()
    return out


@pytest.fixture
def shipped(smollm: Model) -> Path:
    path = find_shipped_adapter(smollm, "extract")
    assert path is not None, "no extraction LoRA shipped for the default model (bench/adapters.py extract --ship)"
    return path


def test_the_default_model_has_a_small_extraction_lora_that_records_its_base(smollm: Model, shipped: Path) -> None:
    assert shipped in shipped_adapters() and shipped.parent.name == "data"
    assert shipped.stat().st_size < 8_000_000  # a few MB inside the wheel
    record = adapter_record(shipped)
    assert record["task"] == "extract"
    assert record["base_model_id"] == model_identity(smollm)
    assert "sroie" in record["data"] and "synthetic" in record["data"]  # documented sources


def test_extract_switches_the_lora_on_only_while_it_runs(smollm: Model, shipped: Path) -> None:
    base = _base_logits(smollm)
    with task_adapter(smollm, "auto", "extract") as lora:
        assert lora is not None and lora.path == shipped and lora.scale == 1.0
        tuned = _base_logits(smollm)
    assert np.abs(tuned - base).max() > 1e-2  # the adapter changes the model while on
    assert lora.scale == 0.0 and lora in smollm.loras  # loaded once, then off
    extract(DOC, Appointment, model=smollm)
    assert all(a.scale == 0.0 for a in smollm.loras)
    np.testing.assert_array_equal(_base_logits(smollm), base)  # chat, tools and decide see the base weights


def test_auto_equals_the_shipped_path_and_none_equals_the_base_model(
    smollm: Model, shipped: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auto = extract(DOC, Appointment, model=smollm)
    assert extract(DOC, Appointment, model=smollm, adapter=shipped) == auto
    assert extract(DOC, Appointment, model=smollm, adapter=str(shipped)) == auto
    base = extract(DOC, Appointment, model=smollm, adapter=None)
    monkeypatch.setenv(NO_DEFAULT_ENV, "1")
    assert extract(DOC, Appointment, model=smollm) == base
    monkeypatch.delenv(NO_DEFAULT_ENV)
    # every path of extraction uses the same adapter
    assert [o.value for o in extract_many([DOC, DOC], Appointment, model=smollm)] == [auto, auto]
    assert list(extract_stream(DOC, Appointment, model=smollm))[-1] == auto
    assert [o.value for o in extract_many([DOC], Appointment, model=smollm, adapter=None)] == [base]
    assert all(a.scale == 0.0 for a in smollm.loras)


def test_a_lora_the_caller_applied_is_left_alone(smollm: Model, shipped: Path) -> None:
    mine = smollm.load_lora(shipped, scale=0.5)  # the caller's own choice of weights
    try:
        with task_adapter(smollm, "auto", "extract") as used:
            assert used is None and mine.scale == 0.5
    finally:
        smollm.remove_lora(mine)


def test_bad_adapter_choices_are_typed_errors(smollm: Model, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="adapter must be"):
        extract(DOC, Appointment, model=smollm, adapter=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="adapter must be"):
        extract(DOC, Appointment, model=smollm, adapter="")
    with pytest.raises(AdapterError, match="not found"):
        extract(DOC, Appointment, model=smollm, adapter=tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    with pytest.raises(AdapterError):
        extract(DOC, Appointment, model=smollm, adapter=junk)
    assert all(a.scale == 0.0 for a in smollm.loras)


def test_models_without_gguf_loras_get_no_shipped_adapter() -> None:
    scripted = ScriptedModel(['{"patient": "Mei Patel", "doctor": "Dr. Ben Garcia", "date": "12.08.2023"}'])
    assert find_shipped_adapter(scripted, "extract") is None
    assert extract(DOC, Appointment, model=scripted).patient == "Mei Patel"


@pytest.mark.slow
def test_cli_takes_the_adapter_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pocket_agent.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    schema = tmp_path / "appointment.json"
    schema.write_text(__import__("json").dumps(Appointment.model_json_schema()), encoding="utf-8")
    for choice in ("auto", "none"):
        assert main(["extract", str(doc), "--schema", str(schema), "--adapter", choice, "-t", "1"]) == 0
        assert '"patient"' in capsys.readouterr().out
    assert main(["extract", str(doc), "--schema", str(schema), "--adapter", str(tmp_path / "no.gguf")]) == 2
    assert "not found" in capsys.readouterr().err


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def test_an_agent_switches_its_tools_lora_on_for_its_turns_with_its_routing_constant(
    smollm: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gguf
    from test_lora import write_lora

    import pocket_agent.tools.turn as turn_module
    from pocket_agent import Agent
    from pocket_agent.tools.routing import CALL_BIAS

    path = write_lora(tmp_path / "tools.gguf", "llama", layers=2, rank=4, seed=3)
    # the same random LoRA, recording the routing constant it was calibrated with
    reader = gguf.GGUFReader(str(path))
    calibrated = tmp_path / "tools-calibrated.gguf"
    w = gguf.GGUFWriter(str(calibrated), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 4.0)
    w.add_string("pocket_agent.task", "tools")
    w.add_float32("pocket_agent.call_bias", 1.5)
    w.add_float32("pocket_agent.more_calls_bias", 2.0)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data).reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    task = "What is 17 plus 25?"
    base = Agent([add], model=smollm, adapter=None)
    assert base.route([{"role": "user", "content": task}]).raw == base.route([{"role": "user", "content": task}]).raw
    raw_base = base.route([{"role": "user", "content": task}]).raw
    # an adapter with its own constant routes on its own weights with that constant
    with_constant = Agent([add], model=smollm, adapter=calibrated)
    raw_calibrated = with_constant.route([{"role": "user", "content": task}]).raw
    assert max(abs(raw_base[k] - raw_calibrated[k]) for k in raw_base) > 1e-3  # scored with the LoRA on
    assert all(a.scale == 0.0 for a in smollm.loras)  # and off again
    assert with_constant._router.bias == pytest.approx(1.5)
    # one without a constant writes the calls; the base weights route with CALL_BIAS
    tuned = Agent([add], model=smollm, adapter=path)
    raw_tuned = tuned.route([{"role": "user", "content": task}]).raw
    assert max(abs(raw_base[k] - raw_tuned[k]) for k in raw_base) < 1e-4
    assert tuned._router.bias == CALL_BIAS
    on_while_generating: list[list[str]] = []
    end_biases: list[float] = []
    real_stream = turn_module.stream_tokens

    def watched(model: Model, *args: Any, **kwargs: Any) -> Any:
        on_while_generating.append([a.path.name for a in model.loras if a.scale != 0.0])
        end_biases.append(kwargs.get("end_bias", 0.0))
        return real_stream(model, *args, **kwargs)

    monkeypatch.setattr(turn_module, "stream_tokens", watched)
    step = Agent([add], model=smollm, adapter=path, tool_choice="required").step(task)
    assert on_while_generating == [["tools.gguf"]] and step.tool_calls
    assert all(a.scale == 0.0 for a in smollm.loras)
    # a turn of calls goes on to another call as readily as the adapter records
    Agent([add], model=smollm, adapter=calibrated, tool_choice="required").step(task)
    Agent([add], model=smollm, adapter=calibrated, tool_choice="none").step(task)
    assert end_biases == [0.0, -2.0, 0.0]
    step = Agent([add], model=smollm, adapter=calibrated).step(task)
    assert step.routing is not None and all(a.scale == 0.0 for a in smollm.loras)
    with pytest.raises(InvalidInputError, match="adapter must be"):
        Agent([add], model=smollm, adapter=7)  # type: ignore[arg-type]


def test_tasks_nest_each_on_its_own_adapter(smollm: Model, shipped: Path, tmp_path: Path) -> None:
    from test_lora import write_lora

    other = write_lora(tmp_path / "other.gguf", "llama", layers=2, rank=4, seed=5)
    with task_adapter(smollm, "auto", "extract") as outer:
        assert outer is not None and outer.scale == 1.0
        with task_adapter(smollm, other, "tools") as inner:  # e.g. an Agent step inside extract_many
            assert inner is not None and inner.scale == 1.0 and outer.scale == 0.0
        with task_adapter(smollm, None, "extract") as none:  # adapter=None inside: truly the base weights
            assert none is None and outer.scale == 0.0
        assert outer.scale == 1.0 and inner.scale == 0.0
    assert all(a.scale == 0.0 for a in smollm.loras)


def test_answer_turns_and_agents_without_tools_run_on_the_base_weights(smollm: Model, tmp_path: Path) -> None:
    from test_lora import write_lora

    from pocket_agent import Agent

    path = write_lora(tmp_path / "tools.gguf", "llama", layers=2, rank=4, seed=4)
    shipped_tools = find_shipped_adapter(smollm, "tools")  # the default Agent's (bench/bfcl.md)
    assert shipped_tools is not None
    record = adapter_record(shipped_tools)
    assert record["task"] == "tools" and "call_bias" not in record  # routed on the base weights
    assert float(record["more_calls_bias"]) > 0
    base = _base_logits(smollm)
    seen: list[np.ndarray] = []
    import pocket_agent.tools.turn as turn_module

    real_stream = turn_module.stream_tokens

    def spy(model: Model, *args: object, **kwargs: object) -> object:
        seen.append(_base_logits(model))
        return real_stream(model, *args, **kwargs)

    turn_module.stream_tokens = spy  # type: ignore[assignment]
    try:
        for tools, choice, task in (
            ([add], "none", "Say hi."),
            ([add], "required", "What is 17 plus 25?"),
            ([], "auto", "Say hi."),  # no tools: never the tools LoRA
        ):
            with contextlib.suppress(OutputBudgetExceeded):  # only the weights matter here
                Agent(tools, model=smollm, tool_choice=choice, max_tokens=4, adapter=path).step(task)
    finally:
        turn_module.stream_tokens = real_stream
    np.testing.assert_array_equal(seen[0], base)
    assert np.abs(seen[1] - base).max() > 1e-2  # a call turn runs on the adapter
    np.testing.assert_array_equal(seen[2], base)
    assert all(a.scale == 0.0 for a in smollm.loras)


def test_recorded_numbers_are_read_or_refused() -> None:
    from pocket_agent.runtime.task_adapters import recorded_number

    assert recorded_number({"call_bias": "1.5"}, "call_bias", "a.gguf") == 1.5
    assert recorded_number({}, "more_calls_bias", "a.gguf") is None
    for bad in ("lots", "nan", "inf"):
        with pytest.raises(AdapterError, match="more_calls_bias must be a finite number"):
            recorded_number({"more_calls_bias": bad}, "more_calls_bias", "a.gguf")
