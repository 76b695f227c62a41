"""Training a Dec adapter (LoRA + pointer head) on the CPU, its GGUF LoRA export, and resuming.

Runs on the tiny fixture (2 blocks, width 64) and its own Hugging Face folder, so each
training takes seconds. The shipped adapter of the default model is checked in
test_decision.py; its accuracy lives in bench/decide.md.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel

torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")

from conftest import FIXTURES, dev_data  # noqa: E402

from pocket_agent.decision import (  # noqa: E402
    DecisionAdapter,
    decide,
    load_decision_adapter,
    unload_decision_adapter,
)
from pocket_agent.errors import AdapterError, InvalidInputError  # noqa: E402
from pocket_agent.runtime import Model, StatesRequest  # noqa: E402
from pocket_agent.training import DecideTraining, train_decide_adapter  # noqa: E402
from pocket_agent.training._lora import read_gguf_lora_metadata, write_gguf_lora  # noqa: E402

TINY_HF = FIXTURES / "tiny-qwen3" / "hf"
FAST = DecideTraining(layer=0, lora_blocks=1, rank=4, epochs=1, batch_tokens=256, threads=1, evals_per_epoch=1)


def _examples(n: int, seed: int = 0) -> list[dict[str, object]]:
    """A learnable toy task: is the word in the review 'good' or 'bad'?"""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = rng.random() < 0.5
        word = rng.choice(["good", "great", "fine"] if good else ["bad", "awful", "poor"])
        rows.append(
            {
                "question": "Is the review positive?",
                "context": f"Review {i}: the food was {word}.",
                "options": ["no", "yes"],
                "answer": int(good),
            }
        )
    return rows


@pytest.fixture(scope="module")
def trained(tiny_gguf: Model) -> object:
    return train_decide_adapter(_examples(24), tiny_gguf, training=FAST, checkpoint=TINY_HF)


def test_trained_adapter_has_a_lora_and_a_head_and_decides(trained: object, tiny_gguf: Model, tmp_path: Path) -> None:
    res = trained
    adapter = res.adapter  # type: ignore[attr-defined]
    assert set(adapter.lora_paths) == {"llamacpp"}
    record = json.loads(adapter.metadata["training"])
    assert record["task"] == "decide" and record["rank"] == 4 and record["steps"] == res.steps > 0  # type: ignore[attr-defined]
    assert record["n_train"] + record["n_val"] == 24
    lora_meta = read_gguf_lora_metadata(adapter.lora_paths["llamacpp"])
    assert lora_meta["task"] == "decide" and lora_meta["base_model_id"] == adapter.base_model_id
    path = adapter.save(tmp_path / "tiny.dec.zip")
    back = DecisionAdapter.read(path)
    assert set(back.lora_paths) == {"llamacpp"}
    load_decision_adapter(tiny_gguf, back)
    try:
        d = decide("Is the review positive?", ["no", "yes"], context="the food was good.", model=tiny_gguf)
        assert d.method == "pointer" and abs(sum(d.scores) - 1.0) < 1e-6
    finally:
        unload_decision_adapter(tiny_gguf)


def test_the_exported_lora_changes_the_states_it_was_trained_on(trained: object, tiny_gguf: Model) -> None:
    adapter = trained.adapter  # type: ignore[attr-defined]
    ids = tiny_gguf.tokenize("the food was good.")
    req = [StatesRequest(prefix=ids, prefix_positions=[len(ids) - 1])]
    base = tiny_gguf.layer_states(req, layer=0)[0].prefix
    lora = tiny_gguf.open_lora(adapter.lora_paths["llamacpp"])
    try:
        on = tiny_gguf.layer_states(req, layer=0, loras=[(lora, 1.0)])[0].prefix
        off = tiny_gguf.layer_states(req, layer=0, loras=[(lora, 0.0)])[0].prefix
    finally:
        tiny_gguf.close_lora(lora)
    assert np.abs(on - base).max() > 1e-4
    np.testing.assert_array_equal(off, base)


def test_a_zero_lora_written_by_us_reproduces_the_base_model(tiny_gguf: Model, tmp_path: Path) -> None:
    n = tiny_gguf.info.n_embd
    state = {
        "blk.0.attn_v.weight.lora_a": torch.randn(2, n),
        "blk.0.attn_v.weight.lora_b": torch.zeros(tiny_gguf_kv_width(tiny_gguf), 2),
    }
    path = write_gguf_lora(tmp_path / "zero.gguf", state, architecture="qwen3", alpha=2.0, metadata={"task": "x"})
    ids = tiny_gguf.tokenize("hello there")
    tiny_gguf.reset()
    base = tiny_gguf.eval(ids, logits="all").logits
    adapter = tiny_gguf.load_lora(path)
    try:
        tiny_gguf.reset()
        with_lora = tiny_gguf.eval(ids, logits="all").logits
    finally:
        tiny_gguf.remove_lora(adapter)
        tiny_gguf.reset()
    np.testing.assert_array_equal(with_lora, base)


def tiny_gguf_kv_width(model: Model) -> int:
    cfg = json.loads((TINY_HF / "config.json").read_text())
    return int(cfg["num_key_value_heads"]) * int(cfg["head_dim"])


def test_training_is_reproducible_with_a_seed(tiny_gguf: Model) -> None:
    a = train_decide_adapter(_examples(16), tiny_gguf, training=FAST, checkpoint=TINY_HF)
    b = train_decide_adapter(_examples(16), tiny_gguf, training=FAST, checkpoint=TINY_HF)
    assert a.adapter.lora_paths["llamacpp"].read_bytes() == b.adapter.lora_paths["llamacpp"].read_bytes()
    np.testing.assert_array_equal(a.adapter.head.weight, b.adapter.head.weight)


def test_training_resumes_from_its_saved_state(tiny_gguf: Model, tmp_path: Path) -> None:
    rows = _examples(16)
    state = tmp_path / "state"
    one = train_decide_adapter(rows, tiny_gguf, training=FAST, checkpoint=TINY_HF, resume=state)
    assert (state / "state.pt").is_file()
    two_epochs = DecideTraining(**{**FAST.__dict__, "epochs": 2})
    with pytest.raises(InvalidInputError, match="different training"):
        train_decide_adapter(rows, tiny_gguf, training=two_epochs, checkpoint=TINY_HF, resume=state)
    more = train_decide_adapter(rows, tiny_gguf, training=FAST, checkpoint=TINY_HF, resume=state)
    # the saved state says epoch 1 of 1 is done: nothing is trained again
    assert more.steps == one.steps
    assert more.history == one.history
    with pytest.raises(InvalidInputError, match="different training"):
        train_decide_adapter(_examples(16, seed=1), tiny_gguf, training=FAST, checkpoint=TINY_HF, resume=state)


def test_an_adapter_is_refused_by_another_base_model(trained: object, smollm: Model) -> None:
    with pytest.raises(AdapterError, match="trained for base model"):
        load_decision_adapter(smollm, trained.adapter)  # type: ignore[attr-defined]


def test_bad_training_input_is_a_typed_error(tiny_gguf: Model) -> None:
    with pytest.raises(InvalidInputError, match="too few"):
        train_decide_adapter(_examples(3), tiny_gguf, training=FAST, checkpoint=TINY_HF)
    with pytest.raises(InvalidInputError, match="positive integer"):
        DecideTraining(epochs=0)
    with pytest.raises(InvalidInputError, match="not a Hugging Face checkpoint"):
        train_decide_adapter(_examples(12), tiny_gguf, training=FAST, checkpoint=FIXTURES)
    with pytest.raises(InvalidInputError, match="layer"):
        train_decide_adapter(_examples(12), tiny_gguf, training=DecideTraining(layer=5), checkpoint=TINY_HF)


# -- extraction adapters ---------------------------------------------------------------


def _receipts(n: int) -> list[dict[str, object]]:
    rng = random.Random(0)
    rows = []
    for i in range(n):
        shop = rng.choice(["ACME", "Bolt Ltd", "Corner Shop", "Delta Mart"])
        total = f"{rng.randint(1, 99)}.{rng.randint(0, 99):02d}"
        text = f"{shop}\nReceipt {i}\nItem 1.00\nTOTAL {total}\nThank you"
        rows.append({"text": text, "output": {"shop": shop, "total": total}})
    return rows


class Shop(BaseModel):
    shop: str
    total: float


def test_an_extraction_adapter_learns_the_answers_and_applies_at_run_time(tiny_gguf: Model, tmp_path: Path) -> None:
    from pocket_agent import extract
    from pocket_agent.training import SftTraining, train_extract_adapter

    training = SftTraining(lora_blocks=2, rank=4, epochs=3, batch_tokens=512, lr=3e-3, threads=1, patience=3)
    res = train_extract_adapter(_receipts(24), Shop, tiny_gguf, training=training, checkpoint=TINY_HF)
    assert res.val_loss < res.base_val_loss  # it learned something about the held-out receipts
    meta = read_gguf_lora_metadata(res.path)
    assert meta["task"] == "extract" and json.loads(meta["schema"])["properties"]["shop"]["type"] == "string"
    path = res.save(tmp_path / "shop.gguf")
    lora = tiny_gguf.load_lora(path)
    try:
        out = extract("Bolt Ltd\nTOTAL 12.50", schema=Shop, model=tiny_gguf)
        assert isinstance(out, Shop)
    finally:
        tiny_gguf.remove_lora(lora)
    # or per call: switched on while extract runs, off afterwards, same result
    assert extract("Bolt Ltd\nTOTAL 12.50", schema=Shop, model=tiny_gguf, adapter=path) == out
    assert [a.scale for a in tiny_gguf.loras] == [0.0]
    with pytest.raises(InvalidInputError, match="text"):
        train_extract_adapter([{"output": {}}] * 6, Shop, tiny_gguf, training=training, checkpoint=TINY_HF)


def test_one_extraction_adapter_trains_on_many_schemas(tiny_gguf: Model) -> None:
    from pocket_agent.training import SftTraining, train_extract_adapter
    from pocket_agent.training.extract import extract_examples

    rows: list[dict[str, object]] = []
    for i, row in enumerate(_receipts(12)):
        output = dict(row["output"])  # type: ignore[call-overload]
        if i % 2:  # the other schema: only the shop, under another name
            rows.append({"text": row["text"], "output": {"store": output["shop"]}, "schema": _store_schema()})
        else:
            rows.append({**row, "schema": Shop.model_json_schema()})
    sft = extract_examples(tiny_gguf, rows, None)
    assert tiny_gguf.decode(sft[1].answer).startswith('{"store": ') and "- store (string)" in tiny_gguf.decode(
        sft[1].prompt
    )
    training = SftTraining(lora_blocks=1, rank=4, epochs=1, batch_tokens=512, threads=1)
    res = train_extract_adapter(rows, None, tiny_gguf, training=training, checkpoint=TINY_HF)
    assert read_gguf_lora_metadata(res.path)["schema"] == "per example"
    with pytest.raises(InvalidInputError, match="no schema"):
        extract_examples(tiny_gguf, [{"text": "x", "output": {}}], None)


def _store_schema() -> dict[str, object]:
    return {"type": "object", "properties": {"store": {"type": "string"}}, "required": ["store"]}


@pytest.mark.slow
def test_tune_command_trains_both_kinds_of_adapter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import TINY_GGUF

    from pocket_agent.cli import main

    data = tmp_path / "decide.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _examples(16)), encoding="utf-8")
    common = ["--model", str(TINY_GGUF), "--checkpoint", str(TINY_HF), "--epochs", "1", "--rank", "4", "-q", "-t", "1"]
    out = tmp_path / "tiny.dec.zip"
    assert main(["tune", "decide", str(data), "-o", str(out), "--layer", "0", "--lora-blocks", "1", *common]) == 0
    assert DecisionAdapter.read(out).has_lora
    assert "Dec adapter (LoRA + head)" in capsys.readouterr().out

    rows = tmp_path / "extract.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in _receipts(12)), encoding="utf-8")
    schema = tmp_path / "shop.json"
    schema.write_text(json.dumps(Shop.model_json_schema()), encoding="utf-8")
    gguf = tmp_path / "shop.gguf"
    assert main(["tune", "extract", str(rows), "--schema", str(schema), "-o", str(gguf), *common]) == 0
    assert read_gguf_lora_metadata(gguf)["task"] == "extract"
    # a typed error, exit status 2, and a message that says what to add
    assert main(["tune", "extract", str(rows), "-o", str(gguf), *common]) == 2
    assert "--schema" in capsys.readouterr().err
    # rows that carry their own schema need no --schema
    own = tmp_path / "own.jsonl"
    own.write_text(
        "\n".join(json.dumps({**r, "schema": Shop.model_json_schema()}) for r in _receipts(12)), encoding="utf-8"
    )
    assert main(["tune", "extract", str(own), "-o", str(gguf), *common]) == 0


def test_a_cloze_objective_adapter_reads_option_log_probabilities_with_its_lora(tiny_gguf: Model) -> None:
    training = DecideTraining(**{**FAST.__dict__, "objective": "cloze"})
    res = train_decide_adapter(_examples(16), tiny_gguf, training=training, checkpoint=TINY_HF)
    adapter = res.adapter
    assert adapter.features.parts == ("option_logprob",) and adapter.features.layer == "final_norm"
    assert json.loads(adapter.metadata["training"])["lora_blocks"] == [1, 1]  # the last block of two
    load_decision_adapter(tiny_gguf, adapter)
    try:
        before = list(tiny_gguf.loras)
        d = decide("Is the review positive?", ["no", "yes"], context="the food was bad.", model=tiny_gguf)
        assert d.method == "pointer"
        # the LoRA is on only while the pointer method runs
        assert [a.scale for a in tiny_gguf.loras] == [a.scale for a in before]
        assert all(a.scale == 0.0 for a in before) and adapter.lora in before
    finally:
        unload_decision_adapter(tiny_gguf)


def test_a_lora_for_another_base_model_is_refused_before_it_reaches_llama_cpp(
    trained: object, smollm: Model, tiny_gguf: Model
) -> None:
    path = trained.adapter.lora_paths["llamacpp"]  # type: ignore[attr-defined]
    with pytest.raises(AdapterError, match="was trained for base model"):
        smollm.load_lora(path)
    with pytest.raises(AdapterError, match="was trained for base model"):
        smollm.open_lora(path)
    tiny_gguf.remove_lora(tiny_gguf.load_lora(path))  # its own base takes it


def test_metadata_added_after_training_keeps_the_weights(trained: object, tiny_gguf: Model, tmp_path: Path) -> None:
    from pocket_agent.training._lora import update_gguf_lora_metadata

    src = trained.adapter.lora_paths["llamacpp"]  # type: ignore[attr-defined]
    path = tmp_path / "lora.gguf"
    path.write_bytes(Path(src).read_bytes())
    before = read_gguf_lora_metadata(path)
    update_gguf_lora_metadata(path, {"call_bias": "0.5"})
    after = read_gguf_lora_metadata(path)
    assert after == {**before, "call_bias": "0.5"}
    ids = tiny_gguf.tokenize("the food was good")
    logits = []
    for p in (Path(src), path):
        lora = tiny_gguf.load_lora(p)
        tiny_gguf.reset()
        logits.append(tiny_gguf.eval(ids).logits[-1].copy())
        tiny_gguf.remove_lora(lora)
    np.testing.assert_array_equal(logits[0], logits[1])


# -- tools adapters --------------------------------------------------------------------


def _tool_specs() -> list[dict[str, object]]:
    weather = {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    add = {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    }
    return [{"type": "function", "function": weather}, add]  # both spec forms


def _tool_rows(n: int) -> list[dict[str, object]]:
    """A learnable toy task: weather questions call get_weather, sums call add, greetings are answered."""
    rng = random.Random(0)
    rows: list[dict[str, object]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            city = rng.choice(["Paris", "Oslo", "Lima", "Cairo", "Tokyo"])
            msg, output = (
                f"What is the weather in {city}?",
                {"tool_calls": [{"name": "get_weather", "arguments": {"city": city}}]},
            )
        elif kind == 1:
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            msg, output = f"What is {a} plus {b}?", {"tool_calls": [{"name": "add", "arguments": {"b": b, "a": a}}]}
        else:
            msg, output = rng.choice(["Hello!", "Hi there.", "Good morning!"]), {"content": "Hello! How can I help?"}
        rows.append({"messages": [{"role": "user", "content": msg}], "tools": _tool_specs(), "output": output})
    return rows


def test_tools_examples_are_the_agents_prompt_and_the_turn_its_grammar_writes(tiny_gguf: Model) -> None:
    from pocket_agent.tools import Agent
    from pocket_agent.training.tools import end_of_turn_id, tool_examples

    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    called = [
        *ask,
        {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "name": "get_weather", "content": "sunny, 18 C"},
    ]
    rows = [
        {"messages": ask, "output": {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}},
        {"messages": [{"role": "user", "content": "2 plus 3?"}], "output": {"tool_calls": [_add(b=3, a=2)] * 2}},
        {"messages": [{"role": "user", "content": "Hello!"}], "output": {"content": "Hello! How can I help?"}},
        {"messages": called, "output": {"content": "It is sunny in Oslo."}},
    ]
    rows = [{**r, "tools": _tool_specs()} for r in rows]
    sft = tool_examples(tiny_gguf, rows)
    agent = Agent(tools=_tool_specs(), model=tiny_gguf)
    end = end_of_turn_id(tiny_gguf)
    assert end is not None and tiny_gguf.decode([end]) == "<|im_end|>"  # what the chat template closes a turn with
    for row, ex in zip(rows, sft, strict=True):
        assert ex.prompt == agent.prompt_ids(row["messages"])  # type: ignore[arg-type]
        assert ex.answer[-1] == end and agent.grammar("auto").accepts_tokens(ex.answer[:-1])
    answers = [tiny_gguf.decode(ex.answer[:-1]) for ex in sft]
    assert answers[0] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    # arguments in the schema's order (the only order the grammar writes), calls separated by a newline
    add = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert answers[1] == add + "\n" + add
    assert answers[2:] == ["Hello! How can I help?", "It is sunny in Oslo."]


def _add(**arguments: int) -> dict[str, object]:
    return {"name": "add", "arguments": arguments}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"messages": []}, r"examples\[0\] has no messages"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "must end with a user or tool message"),
        ({"tools": []}, r"examples\[0\] has no tools"),
        ({"output": {"tool_calls": [{"name": "search", "arguments": {}}]}}, "'search', which is not one of"),
        ({"output": {"tool_calls": [{"name": "add", "arguments": [1, 2]}]}}, "must be an object"),
        ({"output": {"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}}, "Invalid arguments for tool 'add'"),
        ({"output": {"content": ""}}, "non-empty string"),
        ({"output": {"content": "<tool_call>"}}, "cannot start with"),
        ({"output": {}}, "output must be"),
    ],
)
def test_bad_tools_rows_are_typed_errors_that_name_the_row(tiny_gguf: Model, change: dict, message: str) -> None:
    from pocket_agent.training.tools import tool_examples

    with pytest.raises(InvalidInputError, match=message):
        tool_examples(tiny_gguf, [{**_tool_rows(1)[0], **change}])


def test_a_tools_adapter_learns_the_turns(tiny_gguf: Model, tmp_path: Path) -> None:
    from pocket_agent.training import SftTraining, train_tools_adapter

    training = SftTraining(lora_blocks=2, rank=4, epochs=3, batch_tokens=1024, lr=3e-3, threads=1, patience=3)
    res = train_tools_adapter(_tool_rows(18), tiny_gguf, training=training, checkpoint=TINY_HF, metadata={"run": 1})
    assert res.task == "tools" and res.val_loss < res.base_val_loss
    meta = read_gguf_lora_metadata(res.path)
    assert meta["task"] == "tools" and meta["run"] == "1"
    assert json.loads(meta["examples"]) == 18 and json.loads(meta["tool_names"]) == 2
    assert json.loads(meta["call_examples"]) == 12 and json.loads(meta["answer_examples"]) == 6
    tiny_gguf.remove_lora(tiny_gguf.load_lora(res.save(tmp_path / "tools.gguf")))  # llama.cpp takes it


@pytest.mark.slow
def test_tune_command_trains_a_tools_adapter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import TINY_GGUF

    from pocket_agent.cli import main

    data = tmp_path / "tools.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _tool_rows(8)), encoding="utf-8")
    common = ["--model", str(TINY_GGUF), "--checkpoint", str(TINY_HF), "--epochs", "1", "--rank", "4", "-q", "-t", "1"]
    out = tmp_path / "tools.gguf"
    assert main(["tune", "tools", str(data), "-o", str(out), "--lora-blocks", "1", *common]) == 0
    assert read_gguf_lora_metadata(out)["task"] == "tools"
    assert "load_lora" in capsys.readouterr().out
    assert main(["tune", "tools", str(data), "-o", str(out), "--schema", "x.json", *common]) == 2
    assert "--schema applies to extract" in capsys.readouterr().err


def test_bfcl_rows_become_tools_training_rows(tiny_gguf: Model) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import tools_data

    from pocket_agent.training.tools import tool_examples

    assert tools_data.ground_truth_calls([{"f": {"x": [5], "unit": ["meters", "m", ""], "opt": [""]}}]) == [
        {"name": "f", "arguments": {"x": 5, "unit": "meters"}}
    ]
    assert tools_data.resolve({"d": [{"k": ["", "v"]}], "l": [[]]}) == {"d": {"k": "v"}, "l": []}
    # an optional parameter whose value does not fit its schema (BFCL's null = the default) is left out
    schema = {"properties": {"x": {"type": "integer"}, "since": {"type": "string"}}}
    assert tools_data.call_arguments({"x": [3], "since": ["", None]}, schema) == {"x": 3}
    with pytest.raises(ValueError, match="held-out"):
        tools_data.read_rows("live_simple")
    bfcl = dev_data("bfcl")
    if not (bfcl / "parallel.jsonl").is_file():
        pytest.fail(f"BFCL data missing: {bfcl}")
    rows = [tools_data.convert_row(tools_data.read_rows(c, bfcl)[0], c) for c in ("parallel", "irrelevance")]
    assert [len(r["output"].get("tool_calls", [])) for r in rows] == [3, 0]
    assert rows[1]["output"] == {"content": tools_data.NO_TOOL_ANSWER}
    assert rows[0]["tools"][0]["function"]["parameters"]["type"] == "object"  # BFCL "dict", normalised
    assert len(tool_examples(tiny_gguf, rows)) == 2  # training takes them


def test_synthetic_tool_conversations_are_valid_training_rows(tiny_gguf: Model) -> None:
    """Every shape is generated, reproducibly; call arguments are spans or numbers of the request
    (what grounded arguments can write) and validate against the tool's schema."""
    import sys

    import jsonschema

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import tools_synthetic

    from pocket_agent.training.tools import tool_examples

    rows = tools_synthetic.examples(120, seed=0)
    assert rows == tools_synthetic.examples(120, seed=0)
    assert {r["category"] for r in rows} == {"synthetic_" + s for s in tools_synthetic.SHAPES}
    for row in rows:
        specs = {t["function"]["name"]: t["function"]["parameters"] for t in row["tools"]}
        request = next(m["content"] for m in reversed(row["messages"]) if m["role"] == "user")
        for call in row["output"].get("tool_calls", []):
            jsonschema.validate(call["arguments"], specs[call["name"]])
            for value in call["arguments"].values():
                assert str(value) in request, (value, request)
    assert len(tool_examples(tiny_gguf, rows)) == len(rows)
