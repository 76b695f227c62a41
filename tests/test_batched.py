"""Lanes and batched extraction (extract_many(batch=...)) on the embedded default model."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from conftest import THREADS
from pydantic import BaseModel

from pocket_agent import extract, extract_many
from pocket_agent.batched import batch_width
from pocket_agent.errors import InvalidInputError, ModelStateError
from pocket_agent.runtime import Model, load_model
from pocket_agent.runtime.lanes import Lanes, lane_count
from pocket_agent.runtime.scripted import ScriptedModel


class Invoice(BaseModel):
    invoice_number: str
    seller: str
    total: float


DOCS = [
    "ACME Tools Ltd\nInvoice INV-2041\nTOTAL DUE (EUR) 44.30",
    "Bolt & Nut GmbH\nInvoice no. B-778\nAmount payable: 1,250.00 EUR",
    "Green Leaf Cafe\nReceipt R-19\nTotal 7.50",
]


def test_lane_logits_equal_one_sequence(fresh_smollm: Model) -> None:
    model = fresh_smollm
    a = model.tokenize("The invoice number is INV-2041 and the total due is 44.30 EUR.")
    b = model.tokenize("Receipt from the shop on the corner, paid in cash.")
    ref_a = model.prefill(a).logits[-1]
    ref_b = model.prefill(b).logits[-1]
    with model.lock, Lanes(model, 2) as lanes:
        la, ka = lanes.start(a)
        lb, kb = lanes.start(b)
        rows = lanes.step({la: a[ka:], lb: b[kb:]})
    for got, ref in ((rows[la], ref_a), (rows[lb], ref_b)):
        assert int(np.argmax(got)) == int(np.argmax(ref))
        assert float(np.abs(got - ref).max()) < 0.05


@pytest.fixture(scope="module", params=["q8_0", "bf16"])
def smollm_copy(request: pytest.FixtureRequest) -> Iterator[Model]:
    """The default model from its Q8_0 and from its BF16 copy (layout "auto" picks one per CPU)."""
    model = load_model(threads=THREADS, layout=request.param)
    yield model
    model.close()


def test_lanes_fed_unequal_runs_equal_one_sequence_decoding(smollm_copy: Model) -> None:
    """Lanes fed prompts, single tokens and forced runs side by side get, at every step, the
    logits that evaluating each sequence alone with the same feeds gives (llama.cpp computes
    one new token's attention differently from several). Exactly on Q8_0 weights, whose
    integer dot products do not depend on how many rows are multiplied together; on BF16 a
    row alone and a row among several are summed in different orders (measured: logits up to
    ~0.15 apart), so there the same greedy token and a bound."""
    model = smollm_copy
    model.reset()
    bf16 = model.info.extra.get("weights", "").endswith(".bf16.gguf")
    texts = [
        "The invoice number is INV-2041 and the total due is 44.30 EUR. " * 3,
        "Receipt from the shop on the corner, paid in cash. " * 5,
        "Booking confirmed for two nights at the Harbour Hotel. " * 4,
    ]
    prompts = [model.tokenize(t) for t in texts]
    words = model.tokenize(" Thank you for your visit, see you again soon at our shop")
    feeds = [
        [words[0:1], words[0:3], words[0:1]],
        [words[3:5], words[3:4], words[1:2]],
        [words[5:6], words[4:5], words[2:6]],
    ]
    refs: list[list[np.ndarray]] = []
    for i, prompt in enumerate(prompts):
        model.prefill(prompt)
        refs.append([model.eval(step[i]).logits[-1] for step in feeds])
    with model.lock, Lanes(model, 3) as lanes:
        started = [lanes.start(p) for p in prompts]
        lanes.step({lane: p[k:] for (lane, k), p in zip(started, prompts, strict=True)})
        for s, step in enumerate(feeds):
            rows = lanes.step({lane: step[i] for i, (lane, _) in enumerate(started)})
            for i, (lane, _) in enumerate(started):
                if bf16:
                    assert int(np.argmax(rows[lane])) == int(np.argmax(refs[i][s])), f"lane {i}, step {s}"
                    assert float(np.abs(rows[lane] - refs[i][s]).max()) < 0.5, f"lane {i}, step {s}"
                else:
                    np.testing.assert_allclose(rows[lane], refs[i][s], atol=1e-4, err_msg=f"lane {i}, step {s}")


def test_adopted_lane_continues_like_the_main_cache(fresh_smollm: Model) -> None:
    model = fresh_smollm
    toks = model.tokenize("Hello there, this is a test of moving a finished lane. " * 2)
    more = model.tokenize(" And then some more words follow here.")
    model.eval(toks)
    ref = model.eval(more, logits="all").logits
    model.reset()
    with model.lock, Lanes(model, 2) as lanes:
        lanes.share(toks[:12])
        lane, keep = lanes.start(toks)
        assert keep == 12
        lanes.step({lane: toks[keep:]})
        lanes.adopt(lane)
        assert model.cached_tokens == toks
        got = model.eval(more, logits="all").logits
    assert float(np.abs(got - ref).max()) < 0.05


def test_lanes_refuse_what_the_backend_lacks(fresh_smollm: Model) -> None:
    scripted = ScriptedModel(["{}"])
    assert lane_count(scripted) == 0
    assert batch_width(scripted, 4) == 1
    with pytest.raises(ModelStateError):
        Lanes(scripted, 2)
    with pytest.raises(ModelStateError):
        Lanes(fresh_smollm, lane_count(fresh_smollm) + 1)
    with pytest.raises(InvalidInputError):
        list(extract_many(DOCS, Invoice, model=fresh_smollm, batch=0))


def test_batched_extract_many_keeps_order_and_bad_items(fresh_smollm: Model) -> None:
    texts: list[object] = [DOCS[0], "", DOCS[1], 42, DOCS[2]]
    outcomes = list(extract_many(texts, Invoice, model=fresh_smollm, batch=3, max_tokens=80))
    assert [o.index for o in outcomes] == [0, 1, 2, 3, 4]
    assert [o.ok for o in outcomes] == [True, False, True, False, True]
    assert isinstance(outcomes[1].error, InvalidInputError)
    assert isinstance(outcomes[3].error, InvalidInputError)
    for o, doc in zip([outcomes[0], outcomes[2], outcomes[4]], DOCS, strict=True):
        assert isinstance(o.value, Invoice)
        assert o.value.seller in doc  # grounded strings hold text of their own document
        assert o.value.invoice_number in doc


def test_batched_equals_one_by_one_on_the_quick_start_invoices(fresh_smollm: Model) -> None:
    one = [extract(d, Invoice, model=fresh_smollm, max_tokens=80) for d in DOCS]
    many = [o.value for o in extract_many(DOCS, Invoice, model=fresh_smollm, batch=3, max_tokens=80)]
    assert many == one


@pytest.mark.slow
def test_a_document_too_long_for_a_lane_is_extracted_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import pocket_agent.runtime.llamacpp as llamacpp

    monkeypatch.setattr(llamacpp, "LANE_CTX", 200)
    model = load_model(threads=THREADS)
    try:
        long_doc = DOCS[0] + "\n" + "Item: hammer, 1 pc, 9.99\n" * 20
        outcomes = list(extract_many([DOCS[1], long_doc, DOCS[2]], Invoice, model=model, batch=2, max_tokens=80))
        assert [o.ok for o in outcomes] == [True, True, True]
        assert outcomes[1].value == extract(long_doc, Invoice, model=model, max_tokens=80)
    finally:
        model.close()
