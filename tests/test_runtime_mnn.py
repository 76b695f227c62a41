"""The MNN backend on real MNN builds: the tiny fixture and SmolLM2-135M-Instruct converted.

Each model runs in its own process (tests/mnn_worker.py) because pymnn crashes when a
second LLM is created in one process; the worker's exit status also proves that no check
crashed the interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_MNN

# memory="low" (the export default) quantises activations at run time, so a 1-token
# forward and a many-token forward round differently: measured up to ~2.3 on SmolLM2 q4
# and ~0.01 on the tiny fixture. The argmax agrees; rollback is exact.
# MNN quantises activations to int8 per evaluation, so a batch and single tokens round apart:
# on SmolLM2's default build (q4, block 32) up to 3.4 logits, and a near-tie (0.06) may flip
MNN_INCREMENTAL_ATOL = {"tiny": 0.1, "smollm2": 4.0}
MNN_ARGMAX_GAP = {"tiny": 0.0, "smollm2": 0.5}


def run_worker(config: Path, *flags: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mnn_worker.py"), str(config), *flags],
        capture_output=True,
        text=True,
        cwd=ROOT / "tests",
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"MNN worker failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def smollm2_mnn() -> dict[str, Any]:
    from pocket_agent.convert import ensure_default_mnn

    return run_worker(ensure_default_mnn())


@pytest.fixture(scope="module")
def tiny_mnn() -> dict[str, Any]:
    assert TINY_MNN.is_file(), f"fixture missing: {TINY_MNN}"
    return run_worker(TINY_MNN)


@pytest.mark.mnn
def test_smollm2_mnn_answers_paris(smollm2_mnn: dict[str, Any]) -> None:
    assert smollm2_mnn["backend"] == "mnn"
    assert smollm2_mnn["n_vocab"] == 49152
    assert "<|im_end|>" in smollm2_mnn["eos"]
    # which pymnn ran: the pip wheel's version, or a scripts/build_pymnn.sh build on the path
    assert smollm2_mnn["pymnn"].startswith("MNN 3.6"), smollm2_mnn["pymnn"]
    scores = smollm2_mnn["capital_scores"]
    assert max(scores, key=scores.__getitem__) == " Paris", (scores, smollm2_mnn["answer"])


@pytest.mark.mnn
@pytest.mark.parametrize("name", ["tiny", "smollm2"])
@pytest.mark.slow
def test_mnn_cache_semantics(name: str, request: pytest.FixtureRequest) -> None:
    res = request.getfixturevalue("tiny_mnn" if name == "tiny" else "smollm2_mnn")
    assert res["inc_argmax_gap"] <= MNN_ARGMAX_GAP[name]
    assert res["inc_full_argmax_equal"] or name != "tiny"
    assert res["inc_full_maxdiff"] < MNN_INCREMENTAL_ATOL[name]
    assert res["rollback_maxdiff"] == 0.0
    assert res["prefix_reuse_evaluated"] == res["suffix_len"]
    assert res["positions_maxdiff"] < MNN_INCREMENTAL_ATOL[name]


@pytest.mark.mnn
@pytest.mark.parametrize("name", ["tiny", "smollm2"])
@pytest.mark.slow
def test_mnn_tokenizer_and_template(name: str, request: pytest.FixtureRequest) -> None:
    res = request.getfixturevalue("tiny_mnn" if name == "tiny" else "smollm2_mnn")
    assert res["roundtrip"]
    assert res["special_im_end"]
    assert res["plain_im_end_len"] > 1
    assert res["template"] == "chat_template.jinja"


@pytest.mark.mnn
@pytest.mark.parametrize("name", ["tiny", "smollm2"])
@pytest.mark.slow
def test_mnn_misuse_is_typed_not_a_crash(name: str, request: pytest.FixtureRequest) -> None:
    res = request.getfixturevalue("tiny_mnn" if name == "tiny" else "smollm2_mnn")
    assert res["err_empty"] == "TokenError"
    assert res["err_range"] == "TokenError"
    assert res["err_negative"] == "TokenError"
    assert res["err_second_model"] == "ModelStateError"
    assert res["err_overflow"] == "ContextOverflowError"
    assert res["cached_after_overflow"] == 0
    assert res["err_after_close"] == "ModelStateError"
    assert res["err_reload_after_close"] == "ModelStateError"
    assert res["decide_auto_method"] == "cloze"
    assert abs(res["decide_scores_sum"] - 1.0) < 1e-6
    assert res["err_pointer"] == "AdapterError"
    assert res["err_layer_states"] == "ModelStateError"


@pytest.mark.mnn
@pytest.mark.slow
def test_mnn_two_threads_hold_a_one_thread_engine_that_computes_the_same() -> None:
    """MNN fixes its thread count at load and 2 threads collapse beside a busy process, so a
    2-thread model also holds a 1-thread engine on the same weights (pocket_agent.runtime._mnn_engines)."""
    from pocket_agent.convert import ensure_default_mnn

    res = run_worker(ensure_default_mnn(), "--engines")
    assert res["engines"] == 2
    assert res["threads_info"] == "2 (adaptive: MNN)"
    assert res["threads_seen"] == [2, 1, 2]
    # the same weights and graph (measured: the same logits exactly)
    assert res["engines_argmax_equal"]
    assert res["engines_maxdiff"] < MNN_INCREMENTAL_ATOL["smollm2"]
    assert res["same_engine_again_maxdiff"] == 0.0
    assert res["evaluated_after_switch"] == 3  # engine 0 kept its cache while engine 1 ran
    assert res["err_after_close"] == "ModelStateError"


@pytest.mark.parametrize("name", ["smollm2_mnn", "tiny_mnn"])
@pytest.mark.slow
def test_mnn_prompts_take_control_tokens_only_from_the_template(name: str, request: pytest.FixtureRequest) -> None:
    res = request.getfixturevalue(name)
    evil, benign = res["injection_specials"]
    assert res["injection_raw_specials"] >= 4  # the document would forge turns if parsed
    assert evil == benign and len(evil) == 5  # system, user and the generation prompt


def test_mnn_folder_without_build_is_typed(tmp_path: Path) -> None:
    from pocket_agent.errors import ModelLoadError, ModelNotFoundError
    from pocket_agent.runtime import load_model

    (tmp_path / "config.json").write_text(json.dumps({"llm_model": "llm.mnn", "llm_weight": "llm.mnn.weight"}))
    with pytest.raises(ModelNotFoundError, match=r"incomplete: missing llm\.mnn"):
        load_model(tmp_path)
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"not the config\.json of an MNN"):
        load_model(tmp_path / "other.json")
