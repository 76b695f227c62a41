"""Grounded extraction: values copied verbatim from the document, on real models.

The grammar-level properties are checked exhaustively on random documents (what the
compiled grammar accepts); the generation-level ones run the real models.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from pocket_agent import extract, extract_many, extract_stream
from pocket_agent.errors import InvalidInputError
from pocket_agent.grammars import Lark, compile_grammar
from pocket_agent.grammars.grounding import (
    amount_options,
    date_options,
    email_options,
    grounded_grammar,
    grounded_values,
    identifier_options,
    is_grounded,
    iso_date_options,
    normalize_space,
    number_options,
    phone_options,
    span_chunks,
    span_kind,
    time_options,
    url_options,
)
from pocket_agent.grounding import Extraction, whole_words, widen_words
from pocket_agent.runtime import Model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Card(BaseModel):
    name: str = Field(description="the person's name")
    city: str = Field(description="the city")
    code: str = Field(default="", pattern=r"^[A-Z]{2}$", description="a two-letter code")
    note: str = Field(description="free comment", json_schema_extra={"x-grounded": False})
    age: int = Field(description="age in years")


def _schema() -> dict[str, Any]:
    from pocket_agent.grammars import close_objects

    return close_objects(Card.model_json_schema())  # type: ignore[no-any-return]


def test_which_fields_are_grounded() -> None:
    props = _schema()["properties"]
    assert is_grounded(props["name"]) and is_grounded(props["city"])
    assert not is_grounded(props["code"])  # pattern
    assert not is_grounded(props["note"])  # opted out
    assert not is_grounded(props["age"])  # numbers only on request
    assert is_grounded(props["age"], numbers=True)
    assert not is_grounded({"type": "string", "enum": ["a"]})
    assert not is_grounded({"type": "string", "format": "date"})


def test_chunks_are_json_escaped_and_whitespace_normalised() -> None:
    doc = 'He said "hi"\\there\n\n  next\tline'
    chunks = span_chunks(doc)
    assert "".join(chunks) == json.dumps(normalize_space(doc))[1:-1]
    assert "\\n" not in "".join(chunks)
    assert number_options("TOTAL 1,234.50 and 007 and -3 but INV-2041 x9") == ["1234.50", "7", "-3", "2041"]
    assert number_options("9.00 and 12", integer=True) == ["12"]


def test_nothing_grounded_means_no_special_grammar() -> None:
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "additionalProperties": False}
    assert grounded_grammar(schema, "some text") is None
    assert grounded_grammar(_schema(), "   ") is None


def test_date_options_are_the_printed_dates_without_times_or_phone_numbers() -> None:
    doc = (
        "Tel 03-3279 1851, ref 13/13/2018, v1.2.30\nDATE: 25/12/2018 8:13:39 PM\npaid 2018-12-26 10:00;"
        " due Dec. 5th, 2019 or 05 MAR\n 2018, 30-dec-17, 2018年12月25日下午, again 25/12/2018"
    )
    assert date_options(doc) == [
        "25/12/2018",
        "2018-12-26",
        "Dec. 5th, 2019",
        "05 MAR 2018",
        "30-dec-17",
        "2018年12月25日",
    ]
    assert date_options("TOTAL 12.50 QTY 3 TEL 016-7867868") == []


@pytest.mark.parametrize(
    ("name", "node", "holds"),
    [
        ("date", {}, True),
        ("invoice_date", {}, True),
        ("dueDate", {}, True),
        ("开票日期", {}, True),
        ("when", {"title": "Date of birth"}, True),
        ("when", {"x-grounded": "date"}, True),
        ("date", {"x-grounded": "span"}, False),
        ("update", {}, False),
        ("candidate", {}, False),
        (None, {}, False),
    ],
)
def test_which_strings_hold_dates(name: str | None, node: dict[str, Any], holds: bool) -> None:
    assert (span_kind(name, node) == "date") is holds


@pytest.mark.parametrize(
    ("name", "node", "kind"),
    [
        ("start_time", {}, "time"),
        ("time_zone", {}, None),
        ("travel_time", {}, None),
        ("email_address", {}, "email"),
        ("e_mail", {}, "email"),
        ("contactEmail", {}, "email"),
        ("website", {}, "url"),
        ("phone_number", {}, "phone"),
        ("fax", {}, "phone"),
        ("联系电话", {}, "phone"),
        ("who", {"x-grounded": "email"}, "email"),
        ("email", {"x-grounded": "span"}, None),
        ("mailing_address", {}, None),
        ("title", {}, None),
        ("total", {}, "amount"),
        ("amount_due", {}, "amount"),
        ("金额", {}, "amount"),
        ("invoice_number", {}, "identifier"),
        ("order_id", {}, "identifier"),
        ("tax_id", {}, "identifier"),  # an identifier before an amount
        ("订单编号", {}, "identifier"),
        ("number_of_guests", {}, None),  # a count, not a code
    ],
)
def test_which_strings_hold_which_kind(name: str, node: dict[str, Any], kind: str | None) -> None:
    assert span_kind(name, node) == kind


def test_kind_options_are_what_the_text_prints() -> None:
    text = (
        "TEL: +60 3-5121 3881 / 016-7867868 FAX (555) 123-4567 on 25/12/2018 8:13:39 PM, doors 9 PM, at 13:15."
        " Mail bob.x@mail.co.uk. See https://ex.com/a?b=1). or www.shop.my, total 12.50 qty 3 2018-12-25"
    )
    assert time_options(text) == ["8:13:39 PM", "9 PM", "13:15"]
    request = "Tenet at 5 pm and No Time To Die at 7:30 pm. Opens 9 a.m., 10.30"
    assert time_options(request) == ["5 pm", "7:30 pm", "9 a.m."]
    assert email_options(text) == ["bob.x@mail.co.uk"]
    assert url_options(text) == ["https://ex.com/a?b=1", "www.shop.my"]
    phones = phone_options(text)
    assert {"+60 3-5121 3881", "016-7867868", "(555) 123-4567"} <= set(phones)
    assert not any("2018" in p or "12.50" in p for p in phones)  # dates and amounts are not phones


def test_amounts_and_identifiers_are_what_the_text_prints() -> None:
    text = "Invoice No: INV-2041 dated 2024-03-01. Order #A-77, 3 items, tel 555-1234. Total RM 1,234.50"
    assert amount_options(text) == ["1234.50"]  # money: not the count, the year or the phone's digits
    ids = identifier_options(text)
    assert {"INV-2041", "#A-77"} <= set(ids)
    assert not {"2024-03-01", "3", "1,234.50", "1234.50"} & set(ids)  # dates, counts and prices are not codes


@pytest.mark.parametrize(
    ("text", "money"),
    [
        ("Call Anita back, her number is 555-0142.", []),
        ("Pick up Lily at 5:15 PM on June 4, 2026. Table 7.", []),
        ("Order ID: 113-4478291-5562210", []),
        ("paid $20 at 10:30", ["20"]),
        ("The fee is 30 euros, due in 2 weeks", ["30"]),
        ("2x Water      4.00\nTotal EUR     28.50\nTel. 06 4567 8910", ["4.00", "28.50"]),
        ("合计：11.50\n2026-03-04 08:12", ["11.50"]),
        ("退款金额58.8元已到账", ["58.8"]),
    ],
)
def test_money_is_a_number_printed_as_money(text: str, money: list[str]) -> None:
    from pocket_agent.grammars.grounding import money_options

    assert money_options(text) == money


def test_numbers_may_touch_chinese_characters_not_latin_letters() -> None:
    assert number_options("合计11.50元，共3件") == ["11.50", "3"]
    assert number_options("code 12AB and A7") == []


def test_an_optional_number_the_text_cannot_fill_is_null() -> None:
    from typing import Optional

    from pocket_agent.grammars import close_objects
    from pocket_agent.runtime import ScriptedModel

    class Note(BaseModel):
        person: str
        amount: Optional[float] = None  # noqa: UP045 (the spelling users write)
        guests: Optional[int] = None  # noqa: UP045
        fee: Optional[str] = None  # noqa: UP045

    schema = close_objects(Note.model_json_schema())
    model = ScriptedModel(["x"])

    def grammar(doc: str) -> object:
        return compile_grammar(Lark(grounded_grammar(schema, doc) or ""), model)

    # no number at all: every optional number is null; a phone's digits are no amount or fee
    g = grammar("Our cat knocked the plant off the windowsill again, Anna.")
    assert g.accepts_text('{"person":"Anna","amount":null,"guests":null,"fee":null}')
    assert not g.accepts_text('{"person":"Anna","amount":1.5,"guests":null,"fee":null}')
    g = grammar("Call Anna back, her number is 555-0142.")
    assert not g.accepts_text('{"person":"Anna","amount":555,"guests":null,"fee":null}')
    assert not g.accepts_text('{"person":"Anna","amount":null,"guests":null,"fee":"555"}')
    assert g.accepts_text('{"person":"Anna","amount":null,"guests":555,"fee":null}')  # a count may be any number
    g = grammar("Anna paid the 30 euros fee for 4 guests.")
    assert g.accepts_text('{"person":"Anna","amount":30,"guests":4,"fee":"30"}')


def test_a_nullable_field_of_a_kind_the_text_never_prints_can_only_be_null() -> None:
    from typing import Optional

    from pocket_agent.grammars import close_objects
    from pocket_agent.runtime import ScriptedModel

    class Contact(BaseModel):
        name: str
        email: Optional[str] = None  # noqa: UP045 (the spelling users write)
        invoice_number: Optional[str] = None  # noqa: UP045
        total: str

    schema = close_objects(Contact.model_json_schema())
    model = ScriptedModel(["x"])
    doc = "Thanks for lunch, Anna. See you Friday."
    g = compile_grammar(Lark(grounded_grammar(schema, doc) or ""), model)
    ok = {"name": "Anna", "email": None, "invoice_number": None, "total": "Friday"}
    assert g.accepts_text(json.dumps(ok, separators=(",", ":")))
    assert not g.accepts_text(json.dumps({**ok, "email": "Anna"}, separators=(",", ":")))
    # an identifier may be a word ("alice"): with no code printed it falls back to a span
    assert g.accepts_text(json.dumps({**ok, "invoice_number": "Friday"}, separators=(",", ":")))
    # where the text prints one, the field holds it (or null)
    doc2 = "Invoice INV-77A from anna@x.io, total 12.50"
    g2 = compile_grammar(Lark(grounded_grammar(schema, doc2) or ""), model)
    full = {"name": "Invoice", "email": "anna@x.io", "invoice_number": "INV-77A", "total": "12.50"}
    assert g2.accepts_text(json.dumps(full, separators=(",", ":")))
    assert not g2.accepts_text(json.dumps({**full, "total": "Invoice"}, separators=(",", ":")))


def test_typed_fields_take_the_printed_values_on_the_default_model(smollm: Model) -> None:
    class Contact(BaseModel):
        name: str
        email: str
        phone: str
        time: str = Field(description="when the call is booked")

    doc = "Call booked with Rosa Kowalski at 13:15 on 2 May.\nrosa@swift.io, mobile 016-7867868, ext 12"
    out = extract(doc, Contact, model=smollm, max_tokens=96)
    assert (out.email, out.phone, out.time) == ("rosa@swift.io", "016-7867868", "13:15")


def test_a_date_field_is_narrowed_to_the_printed_dates(smollm: Model) -> None:
    doc = "SHOP 12 Main St\nDATE: 25/12/2018 8:13 PM\nTEL 03-3279 1851\nprinted 2018-12-26"

    def grammar(node: dict[str, Any], name: str = "date") -> Any:
        schema = {"type": "object", "properties": {name: node}, "required": [name], "additionalProperties": False}
        return compile_grammar(Lark(grounded_grammar(schema, doc) or ""), smollm)

    def accepts(g: Any, name: str, value: str) -> bool:
        return bool(g.accepts_text(json.dumps({name: value}, separators=(",", ":"))))

    dated = grammar({"type": "string"})
    assert accepts(dated, "date", "25/12/2018") and accepts(dated, "date", "2018-12-26")
    for wrong in ("25/12/2018 8:13 PM", "8:13", "03-3279 1851", "SHOP 12 Main St"):
        assert not accepts(dated, "date", wrong)
    assert not accepts(grammar({"type": "string", "maxLength": 8}), "date", "25/12/2018")  # none fits: refused
    plain = grammar({"type": "string", "x-grounded": "span"})
    assert accepts(plain, "date", "25/12/2018 8:13 PM") and accepts(plain, "date", "SHOP 12")
    named_other = grammar({"type": "string"}, name="shop")
    assert accepts(named_other, "shop", "SHOP 12 Main St")
    # a document that prints no date keeps the plain span
    undated = {"type": "object", "properties": {"date": {"type": "string"}}, "additionalProperties": False}
    g = compile_grammar(Lark(grounded_grammar(undated, "see you next Friday") or ""), smollm)
    assert accepts(g, "date", "next Friday")


def test_extract_copies_the_printed_date_on_the_default_model(smollm: Model) -> None:
    class Receipt(BaseModel):
        shop: str
        date: str = Field(description="the date of the receipt")
        dates_seen: list[str] = Field(default_factory=list, max_length=2)

    doc = "KEDAI RUNCIT ALI\nNO. 5 JALAN SAGU\n25/12/2018 8:13:39 PM\nCASHIER 12\nTEL 016-7867868\nTOTAL 9.00"
    out = extract(doc, Receipt, model=smollm, max_tokens=96)
    assert out.date == "25/12/2018"  # the only date printed, without its time
    assert all(d == "25/12/2018" for d in out.dates_seen)


def test_iso_dates_read_the_printed_dates() -> None:
    doc = "2018-12-25 05 MAR 2018 Dec. 5th, 2019 30-dec-17 2018年11月25日 31/02/2018 1/2/95"
    assert iso_date_options(doc) == ["2018-12-25", "2018-03-05", "2019-12-05", "2017-12-30", "2018-11-25", "1995-02-01"]
    assert iso_date_options("05/02/18") == ["2018-02-05"]  # day first by default
    assert iso_date_options("05/02/18", order="mdy") == ["2018-05-02"]
    assert iso_date_options("printed 12/28/2017, due 05/02/18") == ["2017-12-28", "2018-05-02"]  # the document's order
    assert iso_date_options("no dates, 13/13/2018") == []


def test_a_date_typed_field_is_a_printed_date_in_iso_form(smollm: Model) -> None:
    import datetime

    class Receipt(BaseModel):
        shop: str
        date: datetime.date
        due: datetime.date | None = Field(default=None, json_schema_extra={"x-date-order": "mdy"})

    doc = "KEDAI RUNCIT ALI\nNO. 5 JALAN SAGU\nDATE 09/01/2019 8:13:39 PM\nCASHIER 12\nTOTAL 9.00"
    schema = Receipt.model_json_schema()
    g = compile_grammar(Lark(grounded_grammar({**schema, "additionalProperties": False}, doc) or ""), smollm)
    head = '{"shop":"KEDAI RUNCIT ALI","date":'
    assert g.accepts_text(head + '"2019-01-09"}') and g.accepts_text(head + '"2019-01-09","due":"2019-09-01"}')
    assert not g.accepts_text(head + '"2019-09-01"}') and not g.accepts_text(head + '"2019-01-10"}')
    out = extract(doc, Receipt, model=smollm, max_tokens=96)
    assert out.date == datetime.date(2019, 1, 9)  # the only date printed, read day first
    assert out.due in (None, datetime.date(2019, 9, 1))
    # no printed date: the plain format constraint (a valid ISO date), no failure
    undated = extract("KEDAI RUNCIT ALI, see you next Friday", Receipt, model=smollm, max_tokens=96)
    assert isinstance(undated.date, datetime.date)


WORDS = st.lists(
    st.sampled_from(["ACME", "Ltd", "INV-2041", "Leeds", '"quoted"', "back\\slash", "€uro", "12.50", ",", "."]),
    min_size=1,
    max_size=12,
)
SEPS = st.lists(st.sampled_from([" ", "\n", "  ", "\t", ", "]), min_size=12, max_size=12)


def _doc(words: list[str], seps: list[str]) -> str:
    return "".join(w + s for w, s in zip(words, seps, strict=False)).strip()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=WORDS, seps=SEPS, probe=st.text(alphabet='AIL"\\ .,0-5€', min_size=1, max_size=12))
def test_grammar_accepts_exactly_the_spans_of_the_document(
    smollm: Model, words: list[str], seps: list[str], probe: str
) -> None:
    doc = _doc(words, seps)
    schema = {
        "type": "object",
        "properties": {"v": {"type": "string"}},
        "required": ["v"],
        "additionalProperties": False,
    }
    g = compile_grammar(Lark(grounded_grammar(schema, doc) or ""), smollm)
    norm = normalize_space(doc)
    out = json.dumps({"v": probe}, ensure_ascii=False, separators=(",", ":"))
    if g.accepts_text(out):
        assert probe in norm and probe == probe.strip()
    # every word-aligned span is accepted, whatever quotes and backslashes it holds
    chunks = [json.loads('"' + c + '"') for c in span_chunks(doc)]
    for i in range(0, len(chunks), 3):
        span = "".join(chunks[i : i + 4]).strip()
        if span:
            assert g.accepts_text(json.dumps({"v": span}, ensure_ascii=False, separators=(",", ":")))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=WORDS, seps=SEPS)
def test_extracted_grounded_fields_never_hold_text_absent_from_the_document(
    tiny_gguf: Model, words: list[str], seps: list[str]
) -> None:
    doc = _doc(words, seps)

    class Two(BaseModel):
        a: str
        b: list[str] = Field(max_length=3)

    out = extract(doc, Two, model=tiny_gguf, max_tokens=96)
    schema = Two.model_json_schema()
    values = grounded_values(schema, out.model_dump())
    assert len(values) >= 1
    for _, v in values:
        assert v and v in normalize_space(doc)


def _invoice() -> tuple[str, type[BaseModel]]:
    """The quick start's own TEXT (read, not run) and its schema."""
    tree = ast.parse((EXAMPLES / "extract_invoice.py").read_text(encoding="utf-8"))
    text = next(
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "TEXT" for t in n.targets)
        and isinstance(n.value, ast.Constant)
    )
    sys.path.insert(0, str(EXAMPLES))
    try:
        from invoice_schema import Invoice
    finally:
        sys.path.remove(str(EXAMPLES))
    return str(text), Invoice


def test_quick_start_invoice_on_the_default_model(smollm: Model) -> None:
    text, invoice_cls = _invoice()
    inv = extract(text, invoice_cls, model=smollm).model_dump()
    # right since grounding and the json.dumps layout (before: total=19.9)
    assert inv["seller"] == "ACME Tools Ltd"
    assert inv["date"] == "1 March 2024"
    assert inv["total"] == pytest.approx(44.30)
    assert inv["currency"] == "EUR"
    # grounded: at worst a wrong span of the document, never an invented number
    assert inv["invoice_number"] in normalize_space(text)


def test_quick_start_invoice_number_is_right_on_the_default_model(smollm: Model) -> None:
    # With the shipped extraction LoRA the model writes '2041' (a span cut inside 'INV-2041');
    # widening grounded strings to whole words makes it the document's invoice number.
    text, invoice_cls = _invoice()
    assert extract(text, invoice_cls, model=smollm).invoice_number == "INV-2041"


@pytest.mark.parametrize(
    ("value", "text", "expected"),
    [
        ("2041", "Invoice INV-2041 from ACME", "INV-2041"),  # cut at the left
        ("INV-20", "Invoice INV-2041 from ACME", "INV-2041"),  # cut at the right
        ("2017", "Date: 29-10-2017 12:01", "29-10-2017"),
        ("bob", "contact:bob@x.com today", "bob@x.com"),  # ':' is not part of a word
        ("Smith", "Signed, John Smith.", "Smith"),  # whole already: sentence punctuation stays out
        ("Smi", "Signed, John Smith.", "Smith"),  # the widened part never ends on a joiner
        ("ACME", "ACME-1 and ACME", "ACME"),  # whole words somewhere: kept
        ("京西", "北京西路店 2024年", "京西"),  # no spaces between CJK words: never widened
        ("café", "Le café-bar ouvre", "café-bar"),
        ("absent", "nothing here", "absent"),
        ("", "anything", ""),
    ],
)
def test_grounded_strings_are_widened_to_whole_words(value: str, text: str, expected: str) -> None:
    assert whole_words(value, text) == expected


def test_widening_rewrites_top_level_grounded_fields_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "number": {"type": "string"},
            "short": {"type": "string", "maxLength": 5},
            "kept": {"type": "string", "x-grounded": False},
            "code": {"type": "string", "pattern": "^[0-9]+$"},
            "total": {"type": "number"},
        },
    }
    text = 'Invoice INV-2041, ref "Q-77", code 12345 total 44.30'
    raw = json.dumps({"number": "2041", "short": "2041", "kept": "2041", "code": "2345", "total": 44.3})
    out, changed = widen_words(raw, schema, text)
    assert json.loads(out) == {"number": "INV-2041", "short": "2041", "kept": "2041", "code": "2345", "total": 44.3}
    assert changed == ["number"]
    quoted, _ = widen_words(json.dumps({"number": "77"}), schema, text)
    assert json.loads(quoted) == {"number": "Q-77"}  # escaped back into JSON
    assert widen_words("not json", schema, text) == ("not json", [])


@settings(max_examples=200, deadline=None)
@given(words=WORDS, seps=SEPS, cut=st.tuples(st.integers(0, 40), st.integers(1, 20)))
def test_a_widened_value_is_a_span_of_the_document_around_the_original(
    words: list[str], seps: list[str], cut: tuple[int, int]
) -> None:
    norm = normalize_space(_doc(words, seps))
    value = norm[cut[0] : cut[0] + cut[1]].strip()
    wider = whole_words(value, norm)
    assert wider in norm and value in wider
    assert whole_words(wider, norm) == wider  # widening twice changes nothing


def test_grounding_can_be_turned_off_and_confidence_is_opt_in(smollm: Model) -> None:
    text = "Order 7781 from Bob Stone, Paris. Note: leave at door."

    class Order(BaseModel):
        customer: str
        city: str

    got = extract(text, Order, model=smollm, confidence=True)
    assert isinstance(got, Extraction)
    assert set(got.confidence) == {"customer", "city"}
    assert all(0.0 < v <= 1.0 for v in got.confidence.values())
    assert got.value.customer in normalize_space(text) and got.value.city in normalize_space(text)
    assert got.uncertain(1.01) == ["customer", "city"]
    plain = extract(text, Order, model=smollm, grounded=False)
    assert isinstance(plain, Order)
    with pytest.raises(InvalidInputError):
        extract(text, Order, model=smollm, grounded="sometimes")  # type: ignore[call-overload]
    outs = list(extract_many([text], Order, model=smollm))
    assert outs[0].ok and outs[0].value.city in normalize_space(text)
    last = list(extract_stream(text, Order, model=smollm))[-1]
    assert last.customer in normalize_space(text)


def test_grounded_numbers_are_printed_numbers(smollm: Model) -> None:
    text = "Paid 12.50 for 3 items on 2024-05-01."

    class Paid(BaseModel):
        amount: float
        items: int

    got = extract(text, Paid, model=smollm, grounded="all")
    assert got.amount in (12.5, 3.0, 2024.0, 5.0, 1.0)
    assert got.items in (3, 2024, 5, 1)


def test_identifier_digit_runs_are_not_quantities() -> None:
    text = "Tel 0123456789 total 1,234,567.00, GST 12345678, qty 007, paid 44.30"
    assert number_options(text) == ["123456789", "1234567.00", "12345678", "7", "44.30"]
    assert number_options(text, quantities=True) == ["1234567.00", "7", "44.30"]


class Bill(BaseModel):
    shop: str
    total: float = Field(description="the total amount paid")


BILL = "KEDAI MAJU\nTel 0123456789\n2 x TEH 4.40\n1 x ROTI 1.20\nTOTAL 5.60\nCASH 10.00\nCHANGE 4.40"


def test_number_fields_are_printed_numbers_chosen_by_the_model(smollm: Model) -> None:
    """By default a number field ends up one of the quantities the document prints (whatever
    the greedy digits were), and the choice reports a probability."""
    got = extract(BILL, Bill, model=smollm, confidence=True)
    assert isinstance(got, Extraction)
    printed = {float(o) for o in number_options(BILL, quantities=True)}
    assert got.value.total in printed
    assert 0.0 < got.confidence["total"] <= 1.0
    assert json.loads(got.raw)["total"] == got.value.total  # raw is the chosen text
    for out in extract_many([BILL, BILL], Bill, model=smollm):
        assert out.ok and out.value.total == got.value.total  # every path makes the same choice
    assert list(extract_stream(BILL, Bill, model=smollm))[-1] == got.value


def test_number_choice_respects_bounds_and_opt_outs(smollm: Model) -> None:
    class Big(BaseModel):
        total: float = Field(ge=1000)  # nothing printed is in bounds: the generated value stays

    class Free(BaseModel):
        total: float = Field(json_schema_extra={"x-grounded": False})

    assert extract(BILL, Big, model=smollm).total == extract(BILL, Big, model=smollm, grounded=False).total
    assert extract(BILL, Free, model=smollm).total == extract(BILL, Free, model=smollm, grounded=False).total


def test_choose_numbers_replaces_an_unprinted_value(smollm: Model) -> None:
    from pocket_agent.extraction import build_messages
    from pocket_agent.generate import render_prompt
    from pocket_agent.grounding import choose_numbers

    schema = Bill.model_json_schema()
    prompt = render_prompt(smollm, build_messages(BILL, schema))
    raw, chosen = choose_numbers(smollm, prompt, '{"shop": "KEDAI MAJU", "total": 999.99}', schema, BILL)
    value = json.loads(raw)
    assert value["shop"] == "KEDAI MAJU" and set(chosen) == {"total"}
    assert value["total"] in {float(o) for o in number_options(BILL, quantities=True)}
    # the same call again: the same choice (the cache left behind does not change scores)
    assert choose_numbers(smollm, prompt, '{"shop": "KEDAI MAJU", "total": 999.99}', schema, BILL)[0] == raw


UNIT = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]}},
    "required": ["unit"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ("Weather in Boston in Fahrenheit please", {"fahrenheit"}),
        ("celsius or kelvin, not decided", {"celsius", "kelvin"}),
        ("London, UK in fahr", {"fahrenheit"}),  # a word of 4+ letters that begins the value
        ("no unit named here, fah is too short to name one", {"celsius", "fahrenheit", "kelvin"}),
        ("celsius, fahrenheit and kelvin", {"celsius", "fahrenheit", "kelvin"}),
    ],
)
def test_an_enum_the_text_names_is_narrowed_to_the_named_values(smollm: Model, text: str, allowed: set[str]) -> None:
    lark = grounded_grammar(UNIT, text)
    if allowed == {"celsius", "fahrenheit", "kelvin"}:
        assert lark is None  # nothing narrowed: the plain schema grammar is used
        return
    assert lark is not None
    g = compile_grammar(Lark(lark), smollm)
    for unit in ("celsius", "fahrenheit", "kelvin"):
        assert g.accepts_text(json.dumps({"unit": unit}, separators=(",", ":"))) == (unit in allowed)
    opted_out = {**UNIT, "properties": {"unit": {**UNIT["properties"]["unit"], "x-grounded": False}}}
    assert grounded_grammar(opted_out, text) is None
    assert grounded_grammar(UNIT, text, strings=False) is None


def test_a_printed_number_the_model_wrote_is_kept(smollm: Model) -> None:
    from pocket_agent.grounding import choose_numbers

    raw = '{"shop": "KEDAI MAJU", "total": 4.40}'
    assert choose_numbers(smollm, [1, 2, 3], raw, Bill.model_json_schema(), BILL) == (raw, {})


@pytest.mark.parametrize(
    ("value", "text", "named"),
    [
        ("fahrenheit", "weather in London in fahr", True),
        ("Fahrenheit", "in FAHRENHEIT please", True),
        ("social_security", "remove their social security numbers", True),
        ("celsius", "in fahr", False),
        ("fahrenheit", "fah", False),  # too short to stand for the value
        ("metric", "metrics dashboard", False),  # a longer word is not the value
    ],
)
def test_names_value(value: str, text: str, named: bool) -> None:
    from pocket_agent.grammars.grounding import names_value

    assert names_value(value, text) == named


def test_an_optional_enum_named_once_is_written(smollm: Model) -> None:
    """'in Celsius' asks for unit=celsius: the optional property becomes required. Two
    properties offering the same value (from/to) stay optional: the text cannot say which."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    text = "Weather in Mariposa, CA, with the temperature in Celsius"
    lark = grounded_grammar(schema, text)
    assert lark is not None
    g = compile_grammar(Lark(lark), smollm)
    assert g.accepts_text('{"city":"Mariposa, CA","unit":"celsius"}')
    assert not g.accepts_text('{"city":"Mariposa, CA"}')
    assert not g.accepts_text('{"city":"Mariposa, CA","unit":"fahrenheit"}')
    both = {
        "type": "object",
        "properties": {
            "from_unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]},
            "to_unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]},
        },
        "additionalProperties": False,
    }
    g2 = compile_grammar(Lark(grounded_grammar(both, "Convert 30 degrees to celsius") or ""), smollm)
    assert g2.accepts_text('{"to_unit":"celsius"}') and g2.accepts_text("{}")


@pytest.mark.parametrize(
    ("text", "states"),
    [
        ("Find the fastest route from New York to Boston.", False),
        ("What's the mass of an electron?", False),
        ("Calculate the factorial of 5", True),
        ("dividends for the last five years", True),
        ("air quality for the next week", True),
        ("上海三天的天气", True),
        ("٣ items", True),  # digits of any script
    ],
)
def test_states_number(text: str, states: bool) -> None:
    from pocket_agent.grammars.grounding import states_number

    assert states_number(text) == states


def test_number_options_with_units_read_numbers_glued_to_units() -> None:
    text = "a triangle with base 5m and height 3.5m, $200,000 at 3% for x = -2 to 3x^2; code 12AB"
    plain = number_options(text)
    assert "5" not in plain and "12" not in plain and "200000" in plain
    assert number_options(text, units=True) == ["5", "3.5", "200000", "3", "-2", "2", "12"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("尊敬的王小明先生", "王小明"),
        ("李华女士", "李华"),
        ("Dear Dr. Anna Berg", "Anna Berg"),
        ("Mr. Smith,", "Smith"),
        ("Dr.", "Dr."),  # nothing would be left: kept
        ("Anna", "Anna"),
    ],
)
def test_names_lose_their_greetings_and_titles(value: str, expected: str) -> None:
    from pocket_agent.grounding import without_titles

    assert without_titles(value) == expected


def test_which_fields_hold_a_persons_name() -> None:
    from pocket_agent.grounding import is_person_field

    assert all(map(is_person_field, ["name", "recipient", "contact_person", "customerName", "收件人", "姓名"]))
    assert not any(map(is_person_field, ["company_name", "file_name", "email", "title", "金额"]))


def test_optional_strings_are_grounded_strings_too() -> None:
    from pocket_agent.grounding import nullable_fields, string_node, widen_words

    class Card(BaseModel):
        recipient: str | None = None
        invoice_number: str | None = None
        total: float

    schema = Card.model_json_schema()
    assert nullable_fields(schema) == {"recipient", "invoice_number"}
    assert string_node(schema["properties"]["recipient"]) == {"title": "Recipient", "type": "string"}
    assert string_node(schema["properties"]["total"]) is None
    raw = '{"recipient": "尊敬的王小明先生", "invoice_number": "2041", "total": 3}'
    out, changed = widen_words(raw, schema, "尊敬的王小明先生：发票 INV-2041 已开具。")
    assert json.loads(out) == {"recipient": "王小明", "invoice_number": "INV-2041", "total": 3}
    assert changed == ["recipient", "invoice_number"]


def test_objects_close_only_where_closing_keeps_instances() -> None:
    from pocket_agent.grammars import close_objects

    open_schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    assert close_objects(open_schema)["additionalProperties"] is False
    needs_more = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}
    assert "additionalProperties" not in close_objects(needs_more)  # closing would accept nothing
