"""pocket_agent.decision on the real embedded model (SmolLM2-135M-Instruct GGUF); no mocks."""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS, dev_data

from pocket_agent.decision import (
    Decision,
    DecisionAdapter,
    FeatureSpec,
    HeadTraining,
    decide,
    decide_many,
    find_shipped_head,
    forget_default_head,
    get_decision_adapter,
    load_decision_adapter,
    load_examples,
    model_identity,
    train_head,
    unload_decision_adapter,
)
from pocket_agent.decision._features import log_softmax_at
from pocket_agent.decision._head import LinearHead
from pocket_agent.decision._layout import DEFAULT_FORMAT, cloze_layout
from pocket_agent.decision.adapter import new_adapter
from pocket_agent.decision.cli import main as cli_main
from pocket_agent.errors import AdapterError, ContextOverflowError, InvalidInputError
from pocket_agent.runtime import Model, default_model_path, load_model

REVIEW_POS = "A wonderful, moving film with brilliant acting. I loved every minute."
Q_SENT = "What is the sentiment of this movie review?"


@pytest.fixture(scope="module")
def model() -> Model:
    m = load_model(threads=THREADS)
    forget_default_head(m)  # each test decides which adapter is loaded
    yield m
    m.close()


@pytest.fixture
def clean(model: Model) -> Model:
    unload_decision_adapter(model)
    yield model
    unload_decision_adapter(model)


INNER = FeatureSpec(parts=("hidden@marker",), layer=17)  # what the shipped head reads
FINAL = FeatureSpec(parts=("hidden@marker",))  # the final norm, read from the generating context


def _random_adapter(model: Model, seed: int = 0, features: FeatureSpec = INNER) -> DecisionAdapter:
    rng = np.random.default_rng(seed)
    d = features.dim(model.info.n_embd)
    head = LinearHead(
        mean=rng.normal(size=d).astype(np.float32) * 0.01,
        scale=np.ones(d, dtype=np.float32),
        weight=rng.normal(size=d).astype(np.float32) * 0.1,
        bias=0.0,
    )
    return new_adapter(model, head, features, metadata={"training": json.dumps({"note": "random"})})


def _check_decision(d: Decision, options: list[str], method: str) -> None:
    assert isinstance(d, Decision)
    assert d.method == method
    assert len(d.scores) == len(options)
    assert all(0.0 <= p <= 1.0 for p in d.scores)
    assert math.isclose(sum(d.scores), 1.0, abs_tol=1e-6)
    assert 0 <= d.index < len(options)
    assert d.choice == options[d.index]
    assert d.scores[d.index] == max(d.scores)


# -- basic behaviour -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["cloze", "letter"])
def test_decide_returns_probabilities(clean: Model, method: str) -> None:
    opts = ["negative", "positive", "neutral"]
    d = decide(Q_SENT, opts, context=REVIEW_POS, model=clean, method=method)
    _check_decision(d, opts, method)


def test_auto_without_adapter_is_cloze(clean: Model) -> None:
    d = decide("Which is a fruit?", ["apple", "hammer"], model=clean)
    _check_decision(d, ["apple", "hammer"], "cloze")


def test_cloze_batched_equals_sequential(clean: Model) -> None:
    q = "Which planet is known as the Red Planet?"
    opts = ["Venus", "Mars", "Jupiter", "the planet Saturn"]
    d = decide(q, opts, model=clean, method="cloze")
    lay = cloze_layout(clean, DEFAULT_FORMAT, q, opts, None)
    sequential = []
    for branch in lay.branches:  # each option on its own, no batching, fresh cache
        clean.reset()
        n = len(lay.prefix)
        out = clean.eval(lay.prefix + branch, logits=list(range(n - 1, n + len(branch) - 1)))
        sequential.append(sum(log_softmax_at(out.logits[j], t) for j, t in enumerate(branch)))
    np.testing.assert_allclose(d.logits, sequential, atol=0.05)
    assert d.index == int(np.argmax(sequential))


@pytest.mark.parametrize("method", ["cloze", "letter"])
def test_decide_many_matches_decide(clean: Model, method: str) -> None:
    items = [
        {"question": Q_SENT, "options": ["negative", "positive"], "context": REVIEW_POS},
        ("Which animal barks?", ["cat", "dog", "fish"]),
        ("Is water wet?", ["no", "yes"], "Water is a liquid."),
    ]
    many = decide_many(items, model=clean, method=method)
    assert len(many) == 3
    for it, got in zip(items, many, strict=True):
        if isinstance(it, dict):
            single = decide(it["question"], it["options"], context=it["context"], model=clean, method=method)
        else:
            single = decide(it[0], it[1], context=it[2] if len(it) > 2 else None, model=clean, method=method)
        assert got.index == single.index
        np.testing.assert_allclose(got.scores, single.scores, atol=0.05)
    assert decide_many([], model=clean) == []


@pytest.mark.parametrize("features", [INNER, FINAL], ids=["inner-layer", "final-norm"])
def test_pointer_decide_many_is_decide(clean: Model, features: FeatureSpec) -> None:
    """decide_many gives exactly what decide gives, question by question (the default path)."""
    load_decision_adapter(clean, _random_adapter(clean, seed=3, features=features))
    items = [
        {"question": Q_SENT, "options": ["negative", "positive"], "context": REVIEW_POS},
        {"question": "Which animal barks?", "options": ["cat", "dog", "fish"]},
        {"question": "Is water wet?", "options": ["no", "yes"], "context": "Water is a liquid."},
    ]
    many = decide_many(items, model=clean, method="pointer")
    for it, got in zip(items, many, strict=True):
        single = decide(it["question"], it["options"], context=it.get("context"), model=clean, method="pointer")
        assert got.logits == single.logits
    packed = decide_many(items, model=clean, method="pointer", batched=True)  # several questions per decode
    for got in packed:
        _check_decision(got, got.options, "pointer")


def test_pointer_scores_do_not_depend_on_option_order(clean: Model) -> None:
    load_decision_adapter(clean, _random_adapter(clean, seed=4))
    opts = ["red", "green", "blue"]
    a = decide("Which colour is grass?", opts, model=clean)
    b = decide("Which colour is grass?", opts[1:] + opts[:1], model=clean)
    assert a.method == "pointer"
    np.testing.assert_allclose(a.logits, b.logits[2:] + b.logits[:2], atol=1e-4)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "options"),
    [
        ("Pick one", ["only"]),
        ("Pick one", []),
        ("Pick one", ["a", "a"]),
        ("Pick one", ["a", " a "]),
        ("Pick one", ["a", ""]),
        ("Pick one", ["a", "   "]),
        ("Pick one", ["a", 3]),
        ("Pick one", "ab"),
        (123, ["a", "b"]),
        (None, ["a", "b"]),
        ("   ", ["a", "b"]),
    ],
)
def test_bad_input_is_typed(clean: Model, question: object, options: object) -> None:
    with pytest.raises(InvalidInputError):
        decide(question, options, model=clean, method="cloze")  # type: ignore[arg-type]


def test_unknown_method_and_bad_context(clean: Model) -> None:
    with pytest.raises(InvalidInputError):
        decide("q?", ["a", "b"], model=clean, method="vote")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        decide("q?", ["a", "b"], context=42, model=clean)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        decide_many([{"question": "q?"}], model=clean)
    with pytest.raises(InvalidInputError):
        decide_many("not a list", model=clean)  # type: ignore[arg-type]


def test_more_options_than_labels(clean: Model) -> None:
    opts = [f"option number {i}" for i in range(27)]
    with pytest.raises(InvalidInputError, match="labels"):
        decide("Which one?", opts, model=clean, method="letter")
    load_decision_adapter(clean, _random_adapter(clean))
    d = decide("Which one?", opts, model=clean, method="pointer")  # options are not labelled here
    _check_decision(d, opts, "pointer")


@pytest.mark.parametrize("method", ["cloze", "letter", "pointer"])
def test_options_that_do_not_fit(clean: Model, method: str) -> None:
    load_decision_adapter(clean, _random_adapter(clean))
    long_text = "lorem ipsum dolor sit amet " * 900  # far more than the 4096-token context
    with pytest.raises(ContextOverflowError) as err:
        decide("Which?", ["short", long_text], model=clean, method=method)
    assert err.value.needed > err.value.n_ctx
    with pytest.raises(ContextOverflowError):
        decide("Which?", ["a", "b"], context=long_text, model=clean, method=method)


def test_pointer_without_adapter(clean: Model) -> None:
    with pytest.raises(AdapterError):
        decide("q?", ["a", "b"], model=clean, method="pointer")


# -- adapters -------------------------------------------------------------------------------------


def test_identity_is_stable(model: Model) -> None:
    ident = model_identity(model)
    assert len(ident) == 64 and int(ident, 16) >= 0
    other = load_model(threads=1)
    try:
        assert model_identity(other) == ident
    finally:
        other.close()


@pytest.mark.parametrize(("suffix", "features"), [("", INNER), (".zip", FINAL), (".safetensors", INNER)])
def test_pointer_head_roundtrip(clean: Model, tmp_path: Path, suffix: str, features: FeatureSpec) -> None:
    adapter = _random_adapter(clean, seed=1, features=features)
    path = adapter.save(tmp_path / f"my{suffix or '.dec'}")
    if suffix == ".zip":
        assert zipfile.is_zipfile(path)
    elif suffix == "":
        assert (path / "head.safetensors").is_file()
    back = DecisionAdapter.read(path)
    for name in ("mean", "scale", "weight"):
        np.testing.assert_array_equal(getattr(back.head, name), getattr(adapter.head, name))
    assert back.features == adapter.features
    assert back.prompt == adapter.prompt
    assert back.base_model_id == model_identity(clean)
    assert back.metadata["format"] == "pocket-agent-dec"
    assert back.metadata["marker"] == "\n"
    assert json.loads(back.metadata["training"]) == {"note": "random"}

    q, opts = Q_SENT, ["negative", "positive"]
    load_decision_adapter(clean, adapter)
    direct = decide(q, opts, context=REVIEW_POS, model=clean, method="pointer")
    loaded = load_decision_adapter(clean, path)
    assert get_decision_adapter(clean) is loaded
    again = decide(q, opts, context=REVIEW_POS, model=clean)  # auto -> pointer
    _check_decision(again, opts, "pointer")
    # the inner-layer path is exact; final-norm features shift a little with what the
    # generating context had cached (llama.cpp rounds per batch shape)
    np.testing.assert_allclose(again.logits, direct.logits, atol=1e-4 if features is INNER else 0.5)


def test_adapter_for_another_model_is_rejected(clean: Model, tmp_path: Path) -> None:
    adapter = _random_adapter(clean)
    adapter.base_model_id = "0" * 64
    adapter.base_model_name = "some-other-model"
    path = adapter.save(tmp_path / "other.zip")
    with pytest.raises(AdapterError, match="some-other-model"):
        load_decision_adapter(clean, path)
    assert get_decision_adapter(clean) is None


def test_adapter_rejected_by_a_different_real_model(clean: Model, tiny_gguf: Model, tmp_path: Path) -> None:
    path = _random_adapter(clean).save(tmp_path / "smollm.dec")
    tiny = tiny_gguf  # same vocabulary, other architecture and size
    assert model_identity(tiny) != model_identity(clean)
    with pytest.raises(AdapterError, match="identity"):
        load_decision_adapter(tiny, path)
    assert find_shipped_head(tiny) is None
    assert decide("Pick one", ["a", "b"], model=tiny).method == "cloze"


def _write_lora(path: Path, n_embd: int, seed: int = 0) -> Path:
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 4.0)
    for blk in range(2):
        for name, out_dim in (("attn_q", n_embd), ("attn_v", 192)):
            w.add_tensor(f"blk.{blk}.{name}.weight.lora_a", (rng.standard_normal((4, n_embd)) * 0.5).astype(np.float32))
            w.add_tensor(
                f"blk.{blk}.{name}.weight.lora_b", (rng.standard_normal((out_dim, 4)) * 0.5).astype(np.float32)
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("features", [INNER, FINAL], ids=["inner-layer", "final-norm"])
def test_adapter_with_lora(clean: Model, tmp_path: Path, features: FeatureSpec) -> None:
    plain = _random_adapter(clean, seed=2, features=features)
    q, opts = Q_SENT, ["negative", "positive"]
    load_decision_adapter(clean, plain)
    without = decide(q, opts, context=REVIEW_POS, model=clean, method="pointer")
    prompt = clean.tokenize("The weather today is")
    clean.reset()
    base_logits = clean.eval(prompt, logits="last").logits
    clean.reset()
    with_lora = _random_adapter(clean, seed=2, features=features)
    with_lora.lora_paths = {"llamacpp": _write_lora(tmp_path / "src.gguf", clean.info.n_embd)}
    with_lora.lora_scale = 0.5
    path = with_lora.save(tmp_path / "lora.zip")
    loaded = load_decision_adapter(clean, path)
    assert loaded.lora is not None
    got = decide(q, opts, context=REVIEW_POS, model=clean, method="pointer")
    assert np.abs(np.array(got.logits) - np.array(without.logits)).max() > 1e-4  # the LoRA changed the features
    again = decide(q, opts, context=REVIEW_POS, model=clean, method="pointer")
    np.testing.assert_allclose(again.logits, got.logits, atol=1e-4)
    # generation outside decisions keeps the base model's behaviour
    clean.reset()
    np.testing.assert_allclose(clean.eval(prompt, logits="last").logits, base_logits, atol=1e-3)
    clean.reset()
    unload_decision_adapter(clean)
    assert clean.loras == []


def test_malformed_adapters(clean: Model, tmp_path: Path) -> None:
    with pytest.raises(AdapterError):
        load_decision_adapter(clean, tmp_path / "missing.dec")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError):
        load_decision_adapter(clean, tmp_path / "empty")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(AdapterError):
        load_decision_adapter(clean, junk)
    # a head whose size does not match the model's hidden size
    adapter = _random_adapter(clean)
    adapter.n_embd = 99
    with pytest.raises(AdapterError):
        load_decision_adapter(clean, adapter)
    # declares a LoRA file that is not there
    good = _random_adapter(clean)
    folder = good.save(tmp_path / "lora.dec")
    meta_adapter = DecisionAdapter.read(folder)
    meta_adapter.lora_paths = {"llamacpp": tmp_path / "nope.gguf"}
    meta_adapter.lora_paths["llamacpp"].write_bytes(b"x")
    out = meta_adapter.save(tmp_path / "with-lora.dec")
    (out / "lora.gguf").unlink()
    with pytest.raises(AdapterError, match="lora"):
        load_decision_adapter(clean, out)


@pytest.mark.slow
def test_shipped_head_is_used_out_of_the_box() -> None:
    m = load_model(default_model_path(), threads=1)
    try:
        path = find_shipped_head(m)
        assert path is not None, "no shipped head matches the embedded default model"
        d = decide(Q_SENT, ["negative", "positive"], context=REVIEW_POS, model=m)
        _check_decision(d, ["negative", "positive"], "pointer")
        assert get_decision_adapter(m) is not None
        info = get_decision_adapter(m).info()  # type: ignore[union-attr]
        assert info["training"]["data"]
    finally:
        m.close()


# -- training --------------------------------------------------------------------------------------


def _sst2(n_train: int, n_test: int) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    lines = (dev_data("mcq") / "sst2.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(x) for x in lines if x.strip()]
    perm = np.random.default_rng(123).permutation(len(rows))
    return [rows[i] for i in perm[:n_train]], [rows[i] for i in perm[n_train : n_train + n_test]]


def test_training_beats_chance_on_sst2(clean: Model, tmp_path: Path) -> None:
    train, test = _sst2(64, 40)
    res = train_head(train, clean, training=HeadTraining(rotations=0, compare=(), val_fraction=0.15, seed=0))
    assert res.n_train + res.n_val == 64
    assert 0.0 <= res.val_accuracy <= 1.0
    path = res.adapter.save(tmp_path / "sst2.zip")
    load_decision_adapter(clean, path)
    got = decide_many(test, model=clean, method="pointer")
    accuracy = float(np.mean([d.index == r["answer"] for d, r in zip(got, test, strict=True)]))
    majority = max(np.mean([r["answer"] == 1 for r in test]), np.mean([r["answer"] == 0 for r in test]))
    assert accuracy > max(0.6, majority), accuracy


def test_training_rejects_bad_examples(clean: Model, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError):
        train_head([{"question": "q", "options": ["a", "b"], "answer": 5}] * 20, clean)
    with pytest.raises(InvalidInputError):
        train_head([{"question": "q", "options": ["a", "b"], "answer": "c"}] * 20, clean)
    with pytest.raises(InvalidInputError):
        train_head([{"question": "q", "options": ["a", "b"], "answer": 0}] * 3, clean)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "options": ["a", "b"], "answer": 0}\nnot json\n', encoding="utf-8")
    with pytest.raises(InvalidInputError, match=":2"):
        load_examples(bad)


# -- command line ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_decide_and_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf = str(default_model_path())
    rc = cli_main(
        [
            "decide",
            "Which is a colour?",
            "-o",
            "blue",
            "-o",
            "table",
            "--model",
            gguf,
            "--threads",
            "1",
            "--method",
            "cloze",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"] in ("blue", "table") and out["method"] == "cloze"
    rc = cli_main(["decide", "Pick", "-o", "same", "-o", "same", "--model", gguf, "--threads", "1"])
    assert rc == 2

    train, _ = _sst2(14, 0)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    out_path = tmp_path / "cli.zip"
    rc = cli_main(
        [
            "decide",
            "train",
            str(data),
            "-o",
            str(out_path),
            "--model",
            gguf,
            "--threads",
            "1",
            "--rotations",
            "0",
            "--no-compare",
        ]
    )
    assert rc == 0
    assert out_path.is_file()
    assert DecisionAdapter.read(out_path).base_model_id


def test_decide_refuses_generation_options_it_cannot_use() -> None:
    from pocket_agent import Limits, Sampling, decide, decide_many
    from pocket_agent.errors import InvalidInputError
    from pocket_agent.runtime import ScriptedModel

    model = ScriptedModel(["x"])
    with pytest.raises(InvalidInputError, match="sampling cannot apply"):
        decide("Is it?", ["no", "yes"], model=model, sampling=Sampling(temperature=0.7))
    with pytest.raises(InvalidInputError, match="limits cannot apply"):
        decide_many([("Is it?", ["no", "yes"])], model=model, limits=Limits(max_tokens=4))
