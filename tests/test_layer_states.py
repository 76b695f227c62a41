"""Inner-layer hidden states from llama.cpp (Model.layer_states) on real models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import chat_ids

from pocket_agent.errors import AdapterError, ContextOverflowError, TokenError
from pocket_agent.runtime import LoraAdapter, Model, StatesRequest


def _prompt(model: Model, text: str) -> list[int]:
    return chat_ids(model, text)


def test_capability_and_layer_count(smollm: Model, tiny_gguf: Model) -> None:
    assert smollm.capabilities.layer_states
    assert smollm.info.n_layer == 30
    assert tiny_gguf.info.n_layer >= 2


def test_branch_states_equal_one_sequence_states(fresh_smollm: Model) -> None:
    """A branch read after a shared prefix matches the same tokens read as one plain sequence."""
    m = fresh_smollm
    prefix = _prompt(m, "Is the sky blue on a clear day?")
    branches = [m.tokenize(" yes\n"), m.tokenize(" no, never\n")]
    [got] = m.layer_states([StatesRequest(prefix, branches, [len(prefix) - 1])], layer=17)
    assert got.prefix.shape == (1, m.info.n_embd)
    assert [b.shape[0] for b in got.branches] == [len(b) for b in branches]
    for k, br in enumerate(branches):
        whole = prefix + br
        positions = list(range(len(prefix), len(whole)))
        [ref] = m.layer_states([StatesRequest(whole, [], positions)], layer=17)
        scale = float(np.abs(ref.prefix).max())
        assert float(np.abs(got.branches[k] - ref.prefix).max()) < 0.02 * scale
    # the two branches differ: each sees only itself after the prefix
    assert not np.allclose(got.branches[0][-1], got.branches[1][-1])


def test_requests_together_match_requests_alone(fresh_smollm: Model) -> None:
    m = fresh_smollm
    reqs = [
        StatesRequest(_prompt(m, q), [m.tokenize(" " + o + "\n") for o in opts])
        for q, opts in [("Pick a colour.", ["red", "green"]), ("Is water wet?", ["yes", "no", "maybe"])]
    ]
    together = m.layer_states(reqs, layer=12)
    for req, t in zip(reqs, together, strict=True):
        [alone] = m.layer_states([req], layer=12)
        for a, b in zip(alone.branches, t.branches, strict=True):
            assert float(np.abs(a - b).max()) < 0.02 * float(np.abs(a).max())


def test_repeatable_and_depth_matters(fresh_smollm: Model) -> None:
    m = fresh_smollm
    req = StatesRequest(_prompt(m, "Name a fruit."), [m.tokenize(" apple\n")])
    a = m.layer_states([req], layer=10)[0].branches[0]
    b = m.layer_states([req], layer=10)[0].branches[0]
    np.testing.assert_array_equal(a, b)
    deeper = m.layer_states([req], layer=20)[0].branches[0]
    assert not np.allclose(a, deeper)
    again = m.layer_states([req], layer=10)[0].branches[0]  # base recomputed for the shallower read
    np.testing.assert_array_equal(a, again)


def test_generation_cache_untouched(fresh_smollm: Model) -> None:
    m = fresh_smollm
    ids = _prompt(m, "Say hello.")
    m.eval(ids[:-1], logits="none")
    before = m.eval(ids[-1:], logits="last").logits
    cached = m.cached_tokens
    m.layer_states([StatesRequest(ids, [m.tokenize(" hi\n")])], layer=15)
    assert m.cached_tokens == cached
    m.rollback(len(ids) - 1)
    after = m.eval(ids[-1:], logits="last").logits
    np.testing.assert_array_equal(after, before)


def test_other_architecture(tiny_gguf: Model) -> None:
    m = tiny_gguf
    ids = m.tokenize("hello world, this is a test")
    [st] = m.layer_states([StatesRequest(ids, [], [0, len(ids) - 1])], layer=0)
    assert st.prefix.shape == (2, m.info.n_embd)
    assert np.isfinite(st.prefix).all()


def test_bad_requests_are_typed_errors(smollm: Model) -> None:
    ids = smollm.tokenize("hello")
    with pytest.raises(TokenError, match="layer must be"):
        smollm.layer_states([StatesRequest(ids, [], [0])], layer=29)  # the last block: use eval(hidden=True)
    with pytest.raises(TokenError, match="layer must be"):
        smollm.layer_states([StatesRequest(ids, [], [0])], layer=-1)
    with pytest.raises(TokenError, match="prefix_positions"):
        smollm.layer_states([StatesRequest(ids, [], [len(ids)])], layer=3)
    with pytest.raises(TokenError, match="asks for no states"):
        smollm.layer_states([StatesRequest(ids)], layer=3)
    with pytest.raises(TokenError):
        smollm.layer_states([StatesRequest([10**9], [], [0])], layer=3)
    with pytest.raises(ContextOverflowError):
        smollm.layer_states([StatesRequest(ids * (smollm.n_ctx + 1), [], [0])], layer=3)
    # a LoRA handle this model did not open is refused before it reaches C
    stray = LoraAdapter(path=Path("x.gguf"), scale=1.0, handle=None)
    with pytest.raises(AdapterError, match="open_lora"):
        smollm.layer_states([StatesRequest(ids, [], [0])], layer=3, loras=[(stray, 1.0)])


def test_more_branches_than_sequences(fresh_smollm: Model) -> None:
    """Requests with more branches than the reader's sequences are split, not refused."""
    m = fresh_smollm
    prefix = _prompt(m, "Pick a number.")
    branches = [m.tokenize(f" {i}\n") for i in range(20)]
    [st] = m.layer_states([StatesRequest(prefix, branches, [len(prefix) - 1])], layer=8)
    assert len(st.branches) == 20 and st.prefix.shape[0] == 1
    [first] = m.layer_states([StatesRequest(prefix, branches[:1])], layer=8)
    np.testing.assert_allclose(
        st.branches[0], first.branches[0], rtol=0, atol=0.02 * float(np.abs(first.branches[0]).max())
    )
