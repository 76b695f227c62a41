"""pocket_agent.grammars on the real embedded model (SmolLM2-135M vocabulary, no mocks)."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict

from pocket_agent.errors import InvalidInputError, PocketAgentError, SchemaError, UnsupportedSchemaError
from pocket_agent.grammars import (
    MAX_SCHEMA_DEPTH,
    Choice,
    CompiledGrammar,
    ConstraintError,
    GrammarMatcher,
    JsonSchema,
    Lark,
    Regex,
    TokenRejectedError,
    accepts,
    allowed_tokens,
    apply_mask,
    cache_info,
    clear_cache,
    compile_grammar,
    count_allowed,
    get_tokenizer,
    grammar_for,
    is_allowed,
    new_bitmask,
)
from pocket_agent.runtime import Model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from mask_variants import MASK_VARIANTS, apply_mask_reference


class Item(BaseModel):
    description: str
    quantity: int
    unit_price: float


class Invoice(BaseModel):
    invoice_number: str
    date: str
    vendor: str
    total: float
    paid: bool
    items: list[Item]


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int


class Tree(BaseModel):
    value: int
    children: list[Tree] = []


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


INVOICE = {
    "invoice_number": "INV-7",
    "date": "2024-03-01",
    "vendor": "ACME",
    "total": 12.5,
    "paid": False,
    "items": [{"description": "bolt", "quantity": 5, "unit_price": 2.5}],
}


def compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def ok(c: CompiledGrammar, text: str) -> bool:
    return c.accepts_text(text)


# --- output types ---------------------------------------------------------------------


def test_pydantic_model_accepts_valid_compact_json(smollm: Model) -> None:
    c = compile_grammar(Invoice, smollm)
    assert c.kind == "json"
    assert ok(c, compact(INVOICE))
    assert not ok(c, compact({k: v for k, v in INVOICE.items() if k != "vendor"}))  # required
    assert not ok(c, compact({**INVOICE, "total": "12.5"}))  # wrong type
    assert not ok(c, compact({**INVOICE, "items": [{"description": "x", "quantity": 1.5, "unit_price": 1}]}))
    assert not ok(c, compact(INVOICE)[:-1])  # incomplete


def test_pydantic_objects_are_closed(smollm: Model) -> None:
    c = compile_grammar(Invoice, smollm)
    assert c.spec.schema["additionalProperties"] is False
    assert c.spec.schema["$defs"]["Item"]["additionalProperties"] is False
    assert not ok(c, compact({**INVOICE, "extra": 1}))
    nested_extra = {**INVOICE, "items": [{"description": "b", "quantity": 1, "unit_price": 1.0, "sku": "x"}]}
    assert not ok(c, compact(nested_extra))


def test_allow_extra_and_explicit_extra_config(smollm: Model) -> None:
    c = compile_grammar(Invoice, smollm, allow_extra=True)
    assert ok(c, compact({**INVOICE, "extra": 1}))
    # extra="allow" emits additionalProperties: true, which closing respects
    o = compile_grammar(Open, smollm)
    assert ok(o, '{"a":1,"b":"x"}')


def test_json_schema_dict_is_compiled_as_written(smollm: Model) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 12}, "s": {"type": "string"}},
        "required": ["n"],
    }
    c = compile_grammar(schema, smollm)
    assert ok(c, '{"n":3}') and ok(c, '{"n":12,"s":"x"}')
    assert not ok(c, '{"n":2}') and not ok(c, '{"n":13}') and not ok(c, '{"n":-5}')
    assert ok(c, '{"n":5,"other":[1,2]}')  # open object: JSON Schema semantics
    closed = compile_grammar(schema, smollm, allow_extra=False)
    assert not ok(closed, '{"n":5,"other":[1,2]}')
    assert ok(compile_grammar(JsonSchema(json.dumps(schema)), smollm), '{"n":4}')


def test_property_order_follows_schema(smollm: Model) -> None:
    c = compile_grammar(Item, smollm)
    assert ok(c, '{"description":"a","quantity":1,"unit_price":2}')
    assert not ok(c, '{"quantity":1,"description":"a","unit_price":2}')
    assert list(c.spec.schema["properties"]) == ["description", "quantity", "unit_price"]


def test_compact_whitespace_by_default_flexible_on_request(smollm: Model) -> None:
    pretty = json.dumps({"description": "a", "quantity": 1, "unit_price": 2.0}, indent=2)
    c = compile_grammar(Item, smollm)
    assert not ok(c, pretty)
    assert not ok(c, '{"description": "a", "quantity": 1, "unit_price": 2.0}')
    f = compile_grammar(Item, smollm, whitespace="flexible")
    assert ok(f, pretty)
    with pytest.raises(InvalidInputError):
        compile_grammar(Item, smollm, whitespace="loose")  # type: ignore[arg-type]


def test_type_adapter_types(smollm: Model) -> None:
    c = compile_grammar(list[Item], smollm)
    assert ok(c, '[{"description":"a","quantity":1,"unit_price":2}]') and ok(c, "[]")
    assert not ok(c, '[{"description":"a","quantity":1,"unit_price":2,"x":0}]')
    assert ok(compile_grammar(int, smollm), "-42")
    assert not ok(compile_grammar(int, smollm), "4.2")


def test_regex(smollm: Model) -> None:
    c = compile_grammar(Regex(r"[A-Z]{3}-\d{2,4}"), smollm)
    assert c.kind == "regex"
    assert ok(c, "ABC-12") and ok(c, "XYZ-1234")
    assert not ok(c, "AB-12") and not ok(c, "ABC-12345") and not ok(c, "abc-12")


def test_choice_literal_enum_and_list(smollm: Model) -> None:
    for ot in (Choice(["yes", "no", "not sure"]), ["yes", "no", "not sure"], Literal["yes", "no", "not sure"]):
        c = compile_grammar(ot, smollm)
        assert c.kind == "choice" and c.spec.choices == ("yes", "no", "not sure")
        assert ok(c, "yes") and ok(c, "not sure")
        assert not ok(c, "maybe") and not ok(c, "ye") and not ok(c, '"yes"')
    e = compile_grammar(Color, smollm)
    assert ok(e, "red") and ok(e, "green") and not ok(e, "RED")
    lit = compile_grammar(Literal[1, True, "x"], smollm)
    assert ok(lit, "1") and ok(lit, "true") and ok(lit, "x")
    quoted = compile_grammar(Choice(['say "hi"', "back\\slash", "日本", "two\nlines"]), smollm)
    for text in ['say "hi"', "back\\slash", "日本", "two\nlines"]:
        assert ok(quoted, text)


def test_lark(smollm: Model) -> None:
    c = compile_grammar(Lark('start: "sum(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/'), smollm)
    assert ok(c, "sum(1,22,333)") and not ok(c, "sum()") and not ok(c, "sum(1,)")


def test_free_text_masks_special_tokens_but_allows_eos(smollm: Model) -> None:
    for ot in (None, str):
        c = compile_grammar(ot, smollm)
        assert c.is_free_text
        assert ok(c, "Anything, even {json} or ünïcode.\n")
        ids = set(c.matcher().allowed_tokens().tolist())
        assert set(smollm.vocab.eos_ids) <= ids
        assert not (set(smollm.vocab.special_ids) - set(smollm.vocab.eos_ids)) & ids
        assert len(ids) > 49_000


def test_ambiguous_or_unknown_output_types(smollm: Model) -> None:
    with pytest.raises(InvalidInputError):
        compile_grammar("[0-9]+", smollm)
    with pytest.raises(InvalidInputError):
        compile_grammar(42, smollm)
    with pytest.raises(SchemaError):
        compile_grammar(Choice([]), smollm)


# --- caching ------------------------------------------------------------------------------


def test_second_compile_is_a_cache_hit(smollm: Model) -> None:
    clear_cache()
    first = compile_grammar(Invoice, smollm)
    info = cache_info()
    assert (info.hits, info.misses) == (0, 1)
    again = compile_grammar(Invoice, smollm)
    assert again is first
    assert cache_info().hits == 1
    # an equal schema given as a dict is the same grammar, hence the same compilation
    schema = dict(first.spec.schema)
    assert compile_grammar(schema, smollm) is first
    assert cache_info().hits == 2
    # different options are different grammars
    assert compile_grammar(Invoice, smollm, whitespace="flexible") is not first
    assert cache_info().misses == 2


def test_tokenizer_built_once_per_vocabulary(smollm: Model) -> None:
    assert get_tokenizer(smollm) is get_tokenizer(smollm)
    assert get_tokenizer(smollm).vocab_size == smollm.vocab.size


def test_grammar_spec_without_a_model() -> None:
    spec = grammar_for(Item)
    assert spec.kind == "json" and '"whitespace_flexible":false' in spec.grammar
    assert spec.schema["additionalProperties"] is False
    assert grammar_for(Item) is spec  # memoised for hashable types


# --- typed errors ---------------------------------------------------------------------------


def test_invalid_schema_raises_schema_error(smollm: Model) -> None:
    for bad in ({"type": "strin"}, {"type": "object", "properties": {"a": {"minimum": "3"}}}, {"required": "a"}):
        with pytest.raises(SchemaError) as ei:
            compile_grammar(bad, smollm)
        assert not isinstance(ei.value, UnsupportedSchemaError)
    with pytest.raises(SchemaError):
        compile_grammar(JsonSchema("{not json"), smollm)
    with pytest.raises(SchemaError):
        compile_grammar(False, smollm)
    with pytest.raises(SchemaError, match="does not exist"):
        compile_grammar({"$ref": "#/$defs/missing"}, smollm)


@pytest.mark.parametrize(
    ("schema", "feature", "path"),
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not", "#/properties/a"),
        (
            {"type": "object", "properties": {"b": {"type": "array", "items": {"uniqueItems": True}}}},
            "uniqueItems",
            "#/properties/b/items",
        ),
        ({"properties": {"d": {"type": "string", "format": "zip-code"}}}, "format:zip-code", "#/properties/d"),
        (
            {"$defs": {"x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "$ref": "#/$defs/x"},
            "oneOf",
            "#/$defs/x",
        ),
        ({"properties": {"r": {"$ref": "https://example.com/s.json"}}}, "$ref (remote)", "#/properties/r"),
        ({"properties": {"p": {"type": "string", "pattern": "a(?=b)"}}}, "pattern", "#/properties/p"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if, then", "#"),
    ],
)
def test_unsupported_feature_names_feature_and_path(
    smollm: Model, schema: dict[str, Any], feature: str, path: str
) -> None:
    with pytest.raises(UnsupportedSchemaError) as ei:
        compile_grammar(schema, smollm)
    assert ei.value.feature == feature
    assert ei.value.path == path
    assert feature.split(",")[0].split(":")[0].split(" ")[0] in str(ei.value)


def test_unsupported_features_in_pydantic_are_reported(smollm: Model) -> None:
    class Paths(BaseModel):
        data: bytes  # pydantic: {"type": "string", "format": "binary"}

    with pytest.raises(UnsupportedSchemaError) as ei:
        compile_grammar(Paths, smollm)
    assert ei.value.feature == "format:binary" and ei.value.path == "#/properties/data"


def test_other_grammar_errors(smollm: Model) -> None:
    with pytest.raises(SchemaError) as ei:
        compile_grammar(Regex("a["), smollm)
    assert not isinstance(ei.value, UnsupportedSchemaError)
    with pytest.raises(UnsupportedSchemaError) as ei2:
        compile_grammar(Regex("(a)\\1"), smollm)
    assert ei2.value.feature == "regex: back-references"
    with pytest.raises(SchemaError):
        compile_grammar(Lark("start: undefined_rule"), smollm)
    with pytest.raises(SchemaError, match="accepts no JSON value"):
        compile_grammar({"allOf": [{"type": "string"}, {"type": "integer"}]}, smollm)


def test_recursive_ref_works_and_nesting_limit_is_clear(smollm: Model) -> None:
    c = compile_grammar(Tree, smollm)
    node: dict[str, Any] = {"value": 0, "children": []}
    for i in range(1, 60):
        node = {"value": i, "children": [node, {"value": -i, "children": []}]}
    assert ok(c, compact(node))
    assert not ok(c, compact({"value": 1, "children": [{"value": "x", "children": []}]}))
    # a recursive $ref with nothing concrete accepts nothing: a clear error, no hang
    with pytest.raises(SchemaError, match="accepts no JSON value"):
        compile_grammar(
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, smollm
        )

    def nested(levels: int) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "integer"}
        for _ in range(levels):
            s = {"type": "array", "items": s}
        return s

    # nested(k) is a JSON document k+1 levels deep
    deepest = compile_grammar(nested(MAX_SCHEMA_DEPTH - 1), smollm)
    assert ok(deepest, "[" * (MAX_SCHEMA_DEPTH - 1) + "1" + "]" * (MAX_SCHEMA_DEPTH - 1))
    with pytest.raises(UnsupportedSchemaError) as ei:
        compile_grammar(nested(MAX_SCHEMA_DEPTH), smollm)
    assert ei.value.feature == "schema nesting depth"
    assert ei.value.path is not None and ei.value.path.startswith("#/items/items")
    assert "$ref" in str(ei.value)


def test_errors_are_pocket_agent_errors(smollm: Model) -> None:
    with pytest.raises(PocketAgentError):
        compile_grammar({"not": {}}, smollm)


# --- matcher --------------------------------------------------------------------------------


class Person(BaseModel):
    name: str
    age: int


def test_forced_tokens_for_fixed_keys(smollm: Model) -> None:
    m = compile_grammar(Person, smollm).matcher()
    forced = m.forced_tokens()
    assert m.forced_bytes() == b'{"name":"'
    # whole tokens only: the tail '":"' could merge with the value, so it is left to sampling
    assert smollm.decode(forced) == '{"name'
    assert m.num_consumed == 0  # forced tokens are not consumed until fed
    m.consume_many(forced)
    assert m.forced_tokens() == [] and m.forced_bytes() == b'":"'
    m.consume_many(smollm.tokenize('":"Bob"'))
    after_value = m.forced_tokens()
    assert smollm.decode(after_value) == ',"age'
    assert m.forced_bytes() == b',"age":'
    m.consume_many(after_value)
    m.consume_many(smollm.tokenize('":42}'))
    assert m.is_accepting() and m.forced_tokens() == []


def test_matcher_mask_consume_eos(smollm: Model) -> None:
    c = compile_grammar(Person, smollm)
    m = c.matcher()
    mask = m.compute_mask()
    assert mask.dtype == np.int32 and mask.shape == (c.mask_words,)
    assert m.compute_mask() is mask  # reused buffer
    row = new_bitmask(smollm.vocab.size)
    m.fill_mask(row)
    assert np.array_equal(row, mask)
    first = allowed_tokens(mask, c.vocab_size)
    assert all(smollm.vocab.token_bytes[t].startswith(b"{") for t in first)
    m.consume_many(smollm.tokenize('{"name":"Ann","age":7}'))
    # the closing brace ends the grammar: only EOS can follow
    assert m.is_accepting() and m.is_stopped()
    assert set(m.allowed_tokens().tolist()) == set(smollm.vocab.eos_ids)
    assert m.forced_tokens() == []
    digits = compile_grammar(Regex("[0-9]+"), smollm).matcher()
    digits.consume_many(smollm.tokenize("12"))
    assert digits.is_accepting() and not digits.is_stopped()
    allowed = set(digits.allowed_tokens().tolist())
    assert set(smollm.vocab.eos_ids) <= allowed and smollm.tokenize("3")[0] in allowed
    digits.consume(smollm.vocab.eos_ids[0])
    assert digits.is_stopped() and digits.stop_reason() == "EndOfSentence"
    with pytest.raises(InvalidInputError):
        m.fill_mask(np.zeros(c.mask_words, dtype=np.int64))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        m.fill_mask(np.zeros(c.mask_words - 1, dtype=np.int32))


def test_rejected_token_leaves_matcher_usable(smollm: Model) -> None:
    c = compile_grammar(Person, smollm)
    m = c.matcher()
    m.consume_many(smollm.tokenize('{"name":"A'))
    before = m.compute_mask().copy()
    bad = smollm.tokenize("{")[0]
    good_prefix = smollm.tokenize("nn")
    with pytest.raises(TokenRejectedError) as ei:
        m.consume_many([*good_prefix, *smollm.tokenize('","x'), bad])
    assert isinstance(ei.value, ConstraintError)
    assert ei.value.position >= m.num_consumed
    assert np.array_equal(m.compute_mask(), before)  # all or nothing
    with pytest.raises(TokenRejectedError):
        m.consume(smollm.vocab.size + 5)
    n = m.num_consumed
    assert not m.is_error() and m.error() == ""
    m.consume_many(smollm.tokenize('nn","age":1}'))
    assert m.is_accepting() and m.num_consumed > n


def test_rollback_and_reset(smollm: Model) -> None:
    c = compile_grammar(Invoice, smollm)
    m = c.matcher()
    masks = [m.compute_mask().copy()]
    ids = smollm.tokenize(compact(INVOICE))
    for t in ids:
        m.consume(t)
        masks.append(m.compute_mask().copy())
    assert m.is_accepting()
    m.rollback(5)
    assert np.array_equal(m.compute_mask(), masks[len(ids) - 5])
    m.rollback(len(ids) - 5)
    assert m.num_consumed == 0 and np.array_equal(m.compute_mask(), masks[0])
    with pytest.raises(InvalidInputError):
        m.rollback(1)
    m.consume_many(ids[:10])
    clone = m.copy()
    m.reset()
    assert m.num_consumed == 0 and np.array_equal(m.compute_mask(), masks[0])
    assert clone.num_consumed == 10 and np.array_equal(clone.compute_mask(), masks[10])
    assert m.validate(ids) == len(ids) and m.num_consumed == 0
    assert m.is_allowed(ids[0]) and not m.is_allowed(ids[1])
    assert m.try_consume([*ids[:3], smollm.tokenize("{")[0]]) == 3


def test_matcher_copies_are_independent(smollm: Model) -> None:
    c = compile_grammar(Person, smollm)
    a, b = c.matcher(), c.matcher()
    a.consume_many(smollm.tokenize('{"name":"x"'))
    assert b.num_consumed == 0 and isinstance(b, GrammarMatcher)
    assert np.array_equal(b.compute_mask(), c.matcher().compute_mask())


# --- accepts --------------------------------------------------------------------------------


def test_accepts_contract(smollm: Model) -> None:
    text = compact(INVOICE)
    assert accepts(Invoice, text, smollm)
    assert accepts(Invoice, json.dumps(INVOICE, indent=2), smollm)  # any layout
    assert accepts(Invoice, "\n " + text + " \n", smollm)
    assert accepts(Invoice, json.dumps({**INVOICE, "vendor": "Café"}), smollm)  # \u00e9 escape
    assert not accepts(Invoice, compact({**INVOICE, "extra": 1}), smollm)  # closed
    assert not accepts(Invoice, text[:-1], smollm)
    assert not accepts(Invoice, "", smollm)
    schema = Invoice.model_json_schema()
    assert accepts(schema, compact({**INVOICE, "extra": 1}), smollm)  # dicts as written
    assert accepts(schema, text)  # model=None -> default model (the smollm fixture)
    with pytest.raises(UnsupportedSchemaError):
        accepts({"not": {}}, "1", smollm)


# --- masks ------------------------------------------------------------------------------------


def _random_masks(rng: np.random.Generator, vocab: int) -> list[np.ndarray]:
    words = (vocab + 31) // 32
    out = []
    for density in (0.0, 1e-4, 3e-4, 0.001, 0.01, 0.2, 0.5, 0.9, 0.99, 0.999, 1.0):
        bits = rng.random(words * 32) < density
        out.append(np.packbits(bits, bitorder="little").view(np.int32).copy())
    few = np.zeros(words, dtype=np.int32)  # a few tokens clustered in few words
    few[rng.integers(0, words, 3)] = rng.integers(-(2**31), 2**31 - 1, 3, dtype=np.int64).astype(np.int32)
    out.append(few)
    return out


@pytest.mark.parametrize("vocab", [49_152, 1000, 33, 32])
def test_apply_mask_matches_reference(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for mask in _random_masks(rng, vocab):
        logits = rng.standard_normal(vocab).astype(np.float32) * 5
        ref = apply_mask_reference(logits, mask)
        got = apply_mask(logits, mask)
        assert np.array_equal(got, ref)
        assert got is not logits and not np.isneginf(logits).any()  # input untouched
        inplace = logits.copy()
        assert apply_mask(inplace, mask, inplace=True) is inplace
        assert np.array_equal(inplace, ref)
        for name, fn in MASK_VARIANTS.items():
            if vocab % 32 == 0:  # the llguidance kernel needs whole words
                assert np.array_equal(fn(logits, mask), ref), name
        ids = allowed_tokens(mask, vocab)
        assert np.array_equal(ids, np.flatnonzero(np.isfinite(ref)))
        assert count_allowed(mask) >= ids.size
        for t in rng.integers(0, vocab, 5):
            assert is_allowed(mask, int(t)) == bool(np.isfinite(ref[t]))


def test_apply_mask_logits_longer_than_mask() -> None:
    rng = np.random.default_rng(1)
    mask = np.full(2, -1, dtype=np.int32)  # 64 tokens allowed
    logits = rng.standard_normal(80).astype(np.float32)
    out = apply_mask(logits, mask)
    assert np.isfinite(out[:64]).all() and np.isneginf(out[64:]).all()
    assert np.array_equal(out, apply_mask_reference(logits, mask))
    sparse = np.zeros(2, dtype=np.int32)
    sparse[1] = 1 << 3
    assert np.flatnonzero(np.isfinite(apply_mask(logits, sparse))).tolist() == [35]
    with pytest.raises(InvalidInputError):
        apply_mask(logits.reshape(8, 10), mask)
    with pytest.raises(InvalidInputError):
        apply_mask(logits, mask.astype(np.int64))


def test_apply_mask_on_real_masks(smollm: Model) -> None:
    c = compile_grammar(Invoice, smollm)
    m = c.matcher()
    rng = np.random.default_rng(0)
    for t in smollm.tokenize(compact(INVOICE)):
        mask = m.compute_mask()
        logits = rng.standard_normal(smollm.vocab.size).astype(np.float32)
        out = apply_mask(logits, mask)
        assert np.array_equal(out, apply_mask_reference(logits, mask))
        assert np.isfinite(out[t])
        m.consume(t)


def test_constraint_error_type() -> None:
    assert issubclass(TokenRejectedError, ConstraintError)
    assert issubclass(ConstraintError, PocketAgentError)


def test_end_bias_moves_only_the_choice_to_end(smollm: Model) -> None:
    """``end_bias`` shifts the end-of-sequence logits where the grammar allows ending, and
    nothing else: strongly negative, the output goes on as far as the grammar lets it; strongly
    positive, it ends at the first place it may."""
    from pocket_agent import Sampling
    from pocket_agent.generate import stream_tokens

    grammar = compile_grammar(Lark('start: "call" ("\\n" "call"){0,3}'), smollm)
    ids = smollm.tokenize("List the calls:\n")

    def text(bias: float, speculate: bool = False) -> str:
        sampling = Sampling(speculate=speculate)
        return "".join(ev.text for ev in stream_tokens(smollm, ids, grammar=grammar, sampling=sampling, end_bias=bias))

    assert text(-1e4) == "\n".join(["call"] * 4)
    assert text(1e4) == "call"
    assert text(0.0) in {"\n".join(["call"] * k) for k in range(1, 5)}
    for bias in (-1e4, 1e4, 0.0):  # drafts are verified under the same bias
        assert text(bias, speculate=True) == text(bias)
