"""Copy speculation: drafts from the prompt, verified in one evaluation, never change the output.

A scripted model computes the same logits whatever the batch, so there the output with
speculation must equal the output without it token for token, whatever is drafted and
rejected. On the real model a batch rounds slightly differently from a single token; the
documents here are ones where that makes no difference (bench/speculate.md measures the
rate on SROIE receipts).
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from pocket_agent import Limits, Sampling, extract
from pocket_agent.errors import OutputBudgetExceeded
from pocket_agent.generate import GenerationResult, render_prompt, run_generation
from pocket_agent.grammars import compile_grammar
from pocket_agent.runtime import Model, ScriptedModel, load_model
from pocket_agent.speculation import PromptLookup

ON = Sampling(speculate=True)
OFF = Sampling(speculate=False)


# -- the lookup ------------------------------------------------------------------------------------


def test_lookup_copies_what_followed_the_longest_latest_match() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 7, 8], max_draft=4)
    lookup.follow([6, 2, 3])  # ends in 2 3: seen twice, both matching 2 tokens; the latest wins
    assert lookup.propose() == [7, 8, 6, 2]
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 7, 8], max_draft=4)
    lookup.follow([1, 2, 3])  # 1 2 3 matches 3 tokens at the start: longer beats later
    assert lookup.propose() == [4, 5, 9, 2]


def test_lookup_needs_two_matching_tokens_and_adapts_its_length() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], max_draft=16)
    lookup.follow([40, 3])
    assert lookup.propose() == []  # one token alone is not a match
    lookup.follow([40, 3, 4])
    assert lookup.propose() == [*range(5, 19), 40, 3]  # the context goes on into the output
    lookup.feedback(14, 2)
    assert lookup.draft_len == 4  # a rejection shrinks the next draft (not below 4) ...
    lookup.feedback(4, 4)
    assert lookup.draft_len == 8  # ... a full acceptance doubles it
    with pytest.raises(ValueError):
        PromptLookup([1, 2], min_match=1)


# -- exact equality where the arithmetic is exact (scripted model) ---------------------------------

DOC = "Invoice INV-2041 from ACME Trading Ltd, 12 Harbour Road. Total due: 31.50 EUR."


class Invoice(BaseModel):
    number: str
    company: str
    address: str
    total: float


def _generate(model: Model, prompt: str, sampling: Sampling, **kwargs: object) -> GenerationResult:
    ids = render_prompt(model, prompt)
    return run_generation(model, ids, sampling=sampling, **kwargs)  # type: ignore[arg-type]


def _scripted(reply: str) -> ScriptedModel:
    return ScriptedModel([reply])


@pytest.mark.parametrize(
    "reply",  # compact JSON: the layout compile_grammar uses by default
    [
        # copied from the document: drafts accepted
        '{"number":"INV-2041","company":"ACME Trading Ltd","address":"12 Harbour Road","total":31.5}',
        # starts like the document, then leaves it: drafts rejected and rolled back
        '{"number":"INV-2042","company":"ACME Trading Co","address":"12 Harbour Street","total":31.25}',
    ],
)
def test_scripted_constrained_output_is_identical_and_usage_adds_up(reply: str) -> None:
    results = {}
    for name, sampling in (("off", OFF), ("on", ON)):
        model = _scripted(reply)
        grammar = compile_grammar(Invoice, model)
        res = _generate(model, f"Extract the invoice.\n{DOC}", sampling, grammar=grammar)
        assert res.finish_reason == "grammar"
        assert Invoice.model_validate_json(res.text)
        assert res.usage.completion_tokens == len(res.tokens)
        assert res.usage.draft_accepted <= res.usage.draft_tokens
        # the cache holds the prompt and the output (the last token is never evaluated)
        assert model.cached_tokens == render_prompt(model, f"Extract the invoice.\n{DOC}") + res.tokens[:-1]
        results[name] = res
    off, on = results["off"], results["on"]
    assert on.tokens == off.tokens and on.text == off.text == reply
    assert on.usage.forced_tokens == off.usage.forced_tokens
    assert off.usage.draft_tokens == 0
    assert on.usage.draft_accepted > 10
    assert on.usage.decode_calls < off.usage.decode_calls
    if "INV-2042" in reply:
        assert on.usage.draft_accepted < on.usage.draft_tokens  # something was rolled back


def test_scripted_free_text_stop_and_length_are_unchanged() -> None:
    reply = "The invoice is from ACME Trading Ltd, 12 Harbour Road. Total due: 31.50 EUR. Thanks."
    for kwargs in ({"stop": ["Total"]}, {"limits": Limits(max_tokens=40)}, {}):
        out = {}
        for name, sampling in (("off", OFF), ("on", ON)):
            model = _scripted(reply)
            out[name] = _generate(model, f"Who sent this?\n{DOC}", sampling, **kwargs)
        assert out["on"].tokens == out["off"].tokens, kwargs
        assert out["on"].text == out["off"].text, kwargs
        assert out["on"].finish_reason == out["off"].finish_reason, kwargs
        assert out["on"].usage.completion_tokens == len(out["on"].tokens)
    assert out["on"].usage.draft_accepted > 0


def test_scripted_budget_runs_out_at_the_same_place() -> None:
    reply = '{"number":"INV-2041","company":"ACME Trading Ltd","address":"12 Harbour Road","total":31.5}'
    partials = []
    for sampling in (OFF, ON):
        model = _scripted(reply)
        with pytest.raises(OutputBudgetExceeded) as info:
            _generate(
                model,
                f"Extract.\n{DOC}",
                sampling,
                grammar=compile_grammar(Invoice, model),
                limits=Limits(max_tokens=45),
            )
        partials.append((info.value.partial, info.value.tokens))
    assert partials[0] == partials[1]


def test_non_greedy_sampling_drafts_nothing_and_keeps_its_draws() -> None:
    reply = '{"number":"INV-2041","company":"ACME Trading Ltd","address":"12 Harbour Road","total":31.5}'
    out = []
    for speculate in (False, True):
        model = _scripted(reply)
        smp = Sampling(temperature=0.8, seed=3, speculate=speculate)
        out.append(_generate(model, f"Extract.\n{DOC}", smp, grammar=compile_grammar(Invoice, model)))
    assert out[0].tokens == out[1].tokens
    assert out[1].usage.draft_tokens == 0
    assert out[1].usage.decode_calls <= out[0].usage.decode_calls  # forced tokens still ride along


def test_speculate_must_be_a_bool() -> None:
    from pocket_agent.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="speculate"):
        Sampling(speculate="yes")  # type: ignore[arg-type]


# -- the real model ------------------------------------------------------------------------------


class Receipt(BaseModel):
    company: str
    date: str
    total: float


class Person(BaseModel):
    name: str
    city: str
    age: int


CASES = [
    (
        "SUPER SAVE MART SDN BHD\nNo. 3, Jalan Bunga Raya, 43000 Kajang\nDate: 12/03/2019 10:41\n"
        "2 x MILO 1KG 31.80\nTOTAL RM 31.80\nThank you, please come again",
        Receipt,
    ),
    ("Maria Gonzalez, 34, moved from Valencia to Lisbon last spring to work as a nurse.", Person),
    ("Order confirmation from BLUE RIVER BOOKS LTD on 2021-07-04. Amount charged: 18.25 USD.", Receipt),
    (
        "Thank you for shopping at GREEN LEAF ORGANIC MARKET in Petaling Jaya on 15/08/2020 at 3 pm, "
        "total paid 27.90 by card.",
        Receipt,
    ),
]
# the draft after "John Pet" runs on past the name ("erson is 52 ...") and is cut back
REJECTED = ("John Peterson is 52 years old and lives in Denver near the old railway station with his dog.", Person)


@pytest.mark.parametrize(("text", "schema"), CASES)
def test_default_model_gives_the_same_extraction(fresh_smollm: Model, text: str, schema: type[BaseModel]) -> None:
    off = extract(text, schema, model=fresh_smollm, sampling=OFF, retries=0)
    fresh_smollm.reset()
    on = extract(text, schema, model=fresh_smollm, sampling=ON, retries=0)
    assert on == off


def test_default_model_usage_and_cache_after_rejected_drafts(fresh_smollm: Model) -> None:
    text, schema = REJECTED
    assert extract(text, schema, model=fresh_smollm, sampling=OFF, retries=0) == Person(
        name="John Peterson", city="Denver", age=52
    )
    fresh_smollm.reset()
    from pocket_agent.extraction import _prepare, _prompt_ids, _text_grammar, build_messages

    p = _prepare(schema, fresh_smollm, sampling=ON, limits=None, max_tokens=None, retries=0)
    ids = _prompt_ids(p, build_messages(text, p.json_schema), len(text))
    res = run_generation(fresh_smollm, ids, grammar=_text_grammar(p, text), sampling=ON)
    assert Person.model_validate_json(res.text) == Person(name="John Peterson", city="Denver", age=52)
    u = res.usage
    assert u.completion_tokens == len(res.tokens) and u.draft_accepted > 0
    assert u.draft_accepted < u.draft_tokens  # a draft ran past a value's end and was rolled back
    assert fresh_smollm.cached_tokens == ids + res.tokens[:-1]
    # the next extraction on this model equals one on a model that never saw the drafts
    follow_text, follow_schema = CASES[0]
    after = extract(follow_text, follow_schema, model=fresh_smollm, sampling=ON, retries=0)
    other = load_model(fresh_smollm.path, threads=1)
    try:
        assert extract(follow_text, follow_schema, model=other, sampling=ON, retries=0) == after
    finally:
        other.close()
