"""Grounded JSON: string values that must be verbatim spans of a source text.

A small model asked to "copy the invoice number" invents one as readily as it copies it.
:func:`grounded_grammar` turns a JSON Schema into an llguidance Lark grammar in which each
*grounded* string is constrained to a contiguous span of a source text (llguidance's
``%regex {"substring_chunks": ...}``), and each grounded number to one of the numbers
printed in it, while every other value keeps its JSON Schema constraint (``%json``).

Which values are grounded (:func:`is_grounded`):

* a string schema with no ``enum``, ``const``, ``pattern`` or ``format`` is grounded,
  unless it says ``"x-grounded": false`` (Pydantic:
  ``Field(json_schema_extra={"x-grounded": False})``);
* a ``number``/``integer`` schema is grounded only when ``numbers=True`` is asked for or
  it says ``"x-grounded": true``;
* ``"x-grounded": true`` on a string with a ``pattern``/``format`` is ignored (the two
  constraints are not combined);
* a grounded string that holds a date, a time of day, an e-mail address, a web address or a
  phone number (:func:`span_kind`: its property name or ``title`` has the word "date",
  "time", "email", "url"/"website", "phone"/"tel"/"fax", as in ``invoice_date``,
  ``startTime``, ``contact_email``, or the Chinese word ``日期``, ``时间``, ``邮箱``, ``网址``,
  ``电话``; or it says ``"x-grounded": "date"`` etc.) is narrowed to the values of that kind
  the source prints (:data:`KIND_OPTIONS`: ``25/12/2018``, ``05 MAR 2018``, ``13:15``,
  ``9 PM``, ``bob@x.com``, ``www.x.my``, ``016-7867868``), as printed (a date without the
  time after it); a source that prints none keeps the plain span, and
  ``"x-grounded": "span"`` keeps the plain span always;
* a string of ``format: date`` (Pydantic ``datetime.date``) is one of the dates the source
  prints, written in ISO 8601 (:func:`iso_date_options`: ``25/12/2018`` -> ``2018-12-25``;
  ``05/02/18`` reads day first unless the source's other dates or ``"x-date-order": "mdy"``
  say otherwise); a source that prints none keeps the plain JSON Schema constraint;
* a string ``enum`` whose values the source names (:func:`names_value`: whole words, any
  case, or a word of four letters or more that begins the value, "fahr" for
  ``fahrenheit``) is narrowed to the named values when it names some but not all;
  ``"x-grounded": false`` keeps it whole. An optional property narrowed to one value is
  written (it becomes required), unless a sibling property's enum offers that value too.

How a span is written:

* the source is read as words, punctuation and single spaces: every run of whitespace
  (line breaks included) becomes one space, so a value may span lines ("12 Harbour
  Road, Leeds") and never holds a line break;
* a span starts and ends on a word or punctuation character (no surrounding spaces)
  and is not empty; ``maxLength``/``minLength`` still apply;
* the text is JSON-escaped chunk by chunk, so quotes and backslashes in the source come
  out as valid JSON escapes of the same characters.

A grounded number is one of the numbers printed in the source, written as a JSON number
(``1,234.50`` becomes ``1234.50``; a ``-`` directly before the digits is kept), among
those within the schema's bounds; when the source prints none that fit, the value falls
back to its plain JSON Schema constraint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GROUNDED_KEY = "x-grounded"
"""Schema keyword that switches grounding on (``true``) or off (``false``) for a value, or
names the kind of span a string holds (``"date"``, ``"span"``: see :data:`SPAN_KINDS`)."""

SPAN_KINDS = ("date", "time", "email", "url", "phone", "amount", "identifier", "span")
"""String values of :data:`GROUNDED_KEY`: ``"date"`` (and the other kinds) narrows a grounded
string to the values of that kind the source prints, ``"span"`` keeps any span even for a
field named like one of them."""

_UNGROUNDABLE = ("enum", "const", "pattern", "format")
HAN_CHARS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
"""Chinese characters (CJK ideographs), as a regex character-class body."""
_CJK_CHARS = "\u3040-\u30ff" + HAN_CHARS  # and Japanese kana
_CHUNK = re.compile(rf"[{_CJK_CHARS}]|[^\W{_CJK_CHARS}]+|\s+|[^\w\s]", re.UNICODE)
"""Words, single spaces and punctuation, and each CJK character on its own: Chinese and Japanese
write no spaces between words, so a span may start and end at any character (王小明 in
尊敬的王小明先生)."""
IDENTIFIER_DIGITS = 8
"""A number printed as this many digits or more, with no separator or decimals, is read as an
identifier (phone, barcode, account number), not a quantity."""
_IDENTIFIER = re.compile(rf"-?\d{{{IDENTIFIER_DIGITS},}}")
# Digits may touch CJK characters (``金额58.80元``), not Latin letters or other digits.
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.,])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![A-Za-z0-9_])")
_QUANTITY = re.compile(r"(?<![A-Za-z0-9_.,])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])")


@dataclass(frozen=True)
class Layout:
    """JSON separators of the generated text (``extract`` writes compact JSON)."""

    item_separator: str = ","
    key_separator: str = ":"

    def guidance(self) -> dict[str, Any]:
        return {
            "whitespace_flexible": False,
            "item_separator": self.item_separator,
            "key_separator": self.key_separator,
        }


COMPACT = Layout()


def normalize_space(text: str) -> str:
    """``text`` with every whitespace run as one space, trimmed (how spans are read)."""
    return " ".join(text.split())


def span_chunks(text: str) -> list[str]:
    """The chunks a grounded span is made of, JSON-escaped: words, single punctuation
    characters, single CJK characters and single spaces of the whitespace-normalised ``text``."""
    out = []
    for piece in _CHUNK.findall(normalize_space(text)):
        out.append(json.dumps(piece, ensure_ascii=False)[1:-1])
    return out


def number_options(text: str, *, integer: bool = False, quantities: bool = False, units: bool = False) -> list[str]:
    """The numbers printed in ``text`` as JSON number texts, in order of first appearance.

    Thousands separators are dropped, leading zeros removed (``007`` -> ``7``); decimals are
    kept as printed (``9.00``). With ``integer`` only numbers printed without decimals count.
    With ``quantities``, runs of :data:`IDENTIFIER_DIGITS` or more digits printed without
    separators or decimals (phone, barcode, registration numbers) are left out. With
    ``units``, a number may be followed by letters (``5m``, ``300K``, ``3x``), as requests
    write them; documents' codes (``12AB``) stay out without it.
    """
    seen: dict[str, None] = {}
    for m in (_QUANTITY if units else _NUMBER).finditer(text):
        if quantities and _IDENTIFIER.fullmatch(m.group(0)):
            continue
        raw = m.group(0).replace(",", "")
        neg = raw.startswith("-")
        body = raw[1:] if neg else raw
        whole, _, frac = body.partition(".")
        if integer and frac:
            continue
        whole = whole.lstrip("0") or "0"
        lit = ("-" if neg else "") + whole + ("." + frac if frac else "")
        if lit in ("-0", "-0." + frac):
            lit = lit[1:]
        seen.setdefault(lit, None)
    return list(seen)


_NUMBER_WORDS = re.compile(
    r"(?<!\w)(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen"
    r"|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundreds?"
    r"|thousands?|millions?|billions?|dozens?|half|quarter|twice|double|triple|pair|couple|first|second|third"
    r"|fourth|fifth|sixth|seventh|eighth|ninth|tenth|weeks?|fortnight|decades?|century|centuries)(?!\w)",
    re.IGNORECASE,
)
_CJK_NUMERALS = re.compile("[〇零一二两三四五六七八九十百千万亿半]")


_PREFIX_CHARS = 4
"""A word this long or longer that begins an enum value names it ("fahr" -> fahrenheit)."""


def names_value(value: str, text: str) -> bool:
    """Whether ``text`` names the enum ``value``: the value as a whole word (any case,
    ``_`` and ``-`` read as spaces), or a word of at least :data:`_PREFIX_CHARS` letters
    that the value begins with ("in fahr" names ``fahrenheit``)."""
    forms = {value, re.sub(r"[_-]+", " ", value)}
    if any(re.search(rf"(?<!\w){re.escape(f)}(?!\w)", text, re.IGNORECASE) for f in forms if f.strip()):
        return True
    low = value.lower()
    return any(len(w) >= _PREFIX_CHARS and low.startswith(w.lower()) for w in re.findall(r"[^\W\d_]+", text))


def states_number(text: str) -> bool:
    """Whether ``text`` states a number: digits of any script, an English number word or
    ordinal ("five", "twice", "third"), a word that stands for a count ("week", "dozen",
    "century"), or a CJK numeral. Generous on purpose: it answers "could a number come
    from here?", and a false "no" costs a tool call."""
    return bool(re.search(r"\d", text) or _NUMBER_WORDS.search(text) or _CJK_NUMERALS.search(text))


_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_ORDINAL = r"(?:st|nd|rd|th)?"
_LATIN_EDGES = (r"(?<![\w./-])", r"(?![\w/]|[.-]\d)")
_DAY_MONTH_YEAR = re.compile(r"(\d{1,2})([/.-])(\d{1,2})\2(\d{4}|\d{2})")
_YEAR_MONTH_DAY = re.compile(r"(\d{4})([/.-])(\d{1,2})\2(\d{1,2})")
_DATE_SHAPES = [
    re.compile(_LATIN_EDGES[0] + body + _LATIN_EDGES[1], re.IGNORECASE)
    for body in (
        _DAY_MONTH_YEAR.pattern,
        _YEAR_MONTH_DAY.pattern,
        rf"\d{{1,2}}{_ORDINAL}[ -]?{_MONTH}[ ,-]{{0,2}}(?:\d{{4}}|\d{{2}})",
        rf"{_MONTH} ?\d{{1,2}}{_ORDINAL},? ?\d{{4}}",
    )
]
_CJK_DATE = re.compile(r"(?<!\d)\d{4} ?年 ?\d{1,2} ?月 ?\d{1,2} ?[日号]")
_MAX_DAY, _MAX_MONTH = 31, 12


def _plausible_date(text: str) -> bool:
    """Whether an all-digit date's day and month are in range (``25/12/2018``: day 25,
    month 12; either order, as day-first and month-first both occur)."""
    m = _DAY_MONTH_YEAR.fullmatch(text)
    if m:
        a, b = int(m.group(1)), int(m.group(3))
        return 1 <= min(a, b) <= _MAX_MONTH and max(a, b) <= _MAX_DAY
    m = _YEAR_MONTH_DAY.fullmatch(text)
    if m:
        return 1 <= int(m.group(3)) <= _MAX_MONTH and 1 <= int(m.group(4)) <= _MAX_DAY
    return True


def date_options(text: str) -> list[str]:
    """The dates printed in ``text`` (whitespace read as single spaces), as printed, in
    order of first appearance: day/month/year and year/month/day with ``/``, ``.`` or ``-``,
    day and month name (``05 MAR 2018``, ``30 DEC 17``), month name and day (``Dec 5,
    2018``) and ``2018年12月25日``. A time after the date is not part of it; numbers out of
    a day's or month's range (phone or reference numbers) are not dates."""
    flat = normalize_space(text)
    found: list[tuple[int, str]] = []
    for shape in (*_DATE_SHAPES, _CJK_DATE):
        found.extend((m.start(), m.group(0)) for m in shape.finditer(flat) if _plausible_date(m.group(0)))
    seen: dict[str, None] = {}
    for _, value in sorted(found):
        seen.setdefault(value, None)
    return list(seen)


_MONTH_NUMBER = {
    m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
}
_TWO_DIGIT_PIVOT = 70
"""A two-digit year below this is 20xx, from it 19xx (``18`` -> 2018, ``95`` -> 1995)."""


def _year(digits: str) -> int:
    y = int(digits)
    if len(digits) == 2:
        return 2000 + y if y < _TWO_DIGIT_PIVOT else 1900 + y
    return y


def _readings(printed: str) -> tuple[list[tuple[int, int, int]], str | None]:
    """(year, month, day) readings of a printed date, and for an all-digit day/month/year
    date which order it shows: ``"dmy"`` or ``"mdy"`` when a part over 12 settles it,
    ``None`` when it cannot (``05/02/18`` reads both ways)."""
    m = _DAY_MONTH_YEAR.fullmatch(printed)
    if m:
        a, b, y = int(m.group(1)), int(m.group(3)), _year(m.group(4))
        if a > _MAX_MONTH:
            return [(y, b, a)], "dmy"
        if b > _MAX_MONTH:
            return [(y, a, b)], "mdy"
        return ([(y, b, a), (y, a, b)] if a != b else [(y, a, a)]), None
    m = _YEAR_MONTH_DAY.fullmatch(printed)
    if m:
        return [(int(m.group(1)), int(m.group(3)), int(m.group(4)))], None
    digits = re.findall(r"\d+", printed)
    month = re.search(r"[^\W\d_]{3}", printed)
    if "年" in printed and len(digits) == 3:
        return [(int(digits[0]), int(digits[1]), int(digits[2]))], None
    if month is not None and len(digits) == 2 and month.group(0).lower() in _MONTH_NUMBER:
        mon = _MONTH_NUMBER[month.group(0).lower()]
        return [(_year(digits[1]), mon, int(digits[0]))], None  # "05 MAR 2018", "Mar 5, 2018"
    return [], None


DATE_ORDER_KEY = "x-date-order"
"""Schema keyword of a ``format: date`` string: how to read an all-digit date whose day and
month are both 12 or less, ``"dmy"`` (``05/02/18`` is 5 February) or ``"mdy"`` (2 May)."""
DATE_ORDERS = ("dmy", "mdy")


def iso_date_options(text: str, *, order: str | None = None) -> list[str]:
    """The dates printed in ``text`` (:func:`date_options`) as ISO 8601 dates
    (``2018-12-25``), for fields of ``format: date`` (Pydantic ``datetime.date``).

    Two-digit years are 20xx below 70, else 19xx. A day/month/year date whose day and month
    are both 12 or less reads by ``order`` (``"dmy"`` or ``"mdy"``) when given, else the way
    the document's other all-digit dates show it (a part over 12 settles their order), else
    day first, as most of the world writes dates. Readings that are no calendar date
    (``31/02/2018``) are dropped."""
    import datetime

    parsed = [_readings(d) for d in date_options(text)]
    if order is None:
        shown = {o for _, o in parsed if o is not None}
        order = shown.pop() if len(shown) == 1 else "dmy"
    seen: dict[str, None] = {}
    for readings, _ in parsed:
        if len(readings) == 2:  # (day first, month first)
            readings = [readings[0] if order == "dmy" else readings[1]]
        for y, mon, day in readings:
            try:
                seen.setdefault(datetime.date(y, mon, day).isoformat(), None)
            except ValueError:
                continue
    return list(seen)


_MERIDIEM = r"(?:[AaPp]\.[Mm]\.?|[AaPp][Mm]\b)"  # "p.m." keeps its dots, "pm." ends a sentence
_TIME = re.compile(
    rf"(?<![\w:.])(?:(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?: ?{_MERIDIEM})?"
    rf"|(?:1[0-2]|0?[1-9]) ?{_MERIDIEM})(?![\w:])"
)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_URL = re.compile(r"(?<![\w/])(?:https?://|www\.)[^\s<>\"'`]+", re.IGNORECASE)
_PHONE_RUN = re.compile(r"(?<![\w+.,/-])\+?\(?\d{1,12}\)?(?:[ -]\(?\d{1,12}\)?)*(?![\w.,/]?\d)")
_PHONE_DIGITS = (7, 15)
_TRAILING_PUNCTUATION = ".,;:!?)]}'\""


def time_options(text: str) -> list[str]:
    """Times of day printed in ``text``: ``13:15``, ``8:13:39 PM``, ``9 PM`` (``9.30`` is not
    one: a dot reads as a decimal point); as printed, in order of first appearance."""
    return _unique(m.group(0) for m in _TIME.finditer(text))


def email_options(text: str) -> list[str]:
    """E-mail addresses printed in ``text`` (a sentence's final period left out)."""
    return _unique(m.group(0).rstrip(".") for m in _EMAIL.finditer(text))


def url_options(text: str) -> list[str]:
    """Web addresses printed in ``text`` (``https://...``, ``www....``), closing punctuation left out."""
    return _unique(m.group(0).rstrip(_TRAILING_PUNCTUATION) for m in _URL.finditer(text))


def phone_options(text: str) -> list[str]:
    """Phone numbers printed in ``text``: runs of digit groups joined by single spaces or
    hyphens (``+60 3-5121 3881``, ``(555) 123-4567``, ``016-7867868``, ``0351213881``) with 7
    to 15 digits; every such prefix of a longer run is a candidate (a run may go on into the
    next number), and the digits of a date never join one."""
    for date in date_options(text):  # a date's digit groups never join a phone number
        text = text.replace(date, " ; ")
    out: list[str] = []
    for m in _PHONE_RUN.finditer(text):
        run = m.group(0)
        cuts = [g.end() for g in re.finditer(r"\d\)?(?=[ -]|$)", run)]
        for end in cuts:
            piece = run[:end]
            digits = sum(c.isdigit() for c in piece)
            if _PHONE_DIGITS[0] <= digits <= _PHONE_DIGITS[1]:
                out.append(piece)
    return _unique(out)


def amount_options(text: str) -> list[str]:
    """The amounts ``text`` prints, as their numbers (``RM 1,234.50`` -> ``1234.50``): what a
    money field typed ``str`` holds: the printed money (:func:`money_options`). A required field
    where the text prints none holds one of its numbers instead."""
    return money_options(text)


_CURRENCY = (
    r"(?i)(?<![a-z])(?:rm|usd|eur|gbp|cny|rmb|jpy|hkd|sgd|aud|cad|chf|inr|dollars?|euros?|pounds?|yuan|yen|cents?"
    r"|bucks)(?![a-z])|[$€£¥₹]|元|块|美元|欧元|英镑|日元|人民币|港币"
)
_MONEY_AFTER_CUE = re.compile(_CURRENCY)
_MONEY_BEFORE_CUE = re.compile(
    _CURRENCY + r"|(?i:(?<![a-z])(?:total|amount|price|cost|costs|subtotal|tax|vat|gst|fee|fees|balance|paid"
    r"|charged?|refund(?:ed)?|deposit|rent|sum)(?![a-z]))|合计|金额|总计|总额|价格|费用|总价|价钱|实收|应付|实付|税|找零|退款"
)
_MONEY_BEFORE, _MONEY_AFTER = 16, 10  # how far a cue may stand before / after its number, in its sentence
_CLAUSE_END = re.compile(r"[.,;!?\n。，、；！？]")
_CLOCK, _CLOCK_BEFORE = re.compile(r"[:：]\d"), re.compile(r"\d[:：]$")  # 10:30 is a time


def money_options(text: str) -> list[str]:
    """The numbers ``text`` prints as money, as JSON number texts: a number with two decimals
    (``28.50``), or one with a money word, currency code or sign beside it in its clause (``Total
    65``, ``$20``, ``30 euros``, ``合计：11``, ``58元``). A phone number's digits, a time, a table
    number or a year are not money; a note that prints none has no amount to give."""
    seen: dict[str, None] = {}
    for m in _QUANTITY.finditer(text):
        if _IDENTIFIER.fullmatch(m.group(0)) or _CLOCK.match(text, m.end()) or _CLOCK_BEFORE.search(text, 0, m.start()):
            continue
        before = text[max(0, m.start() - _MONEY_BEFORE) : m.start()]
        before = _CLAUSE_END.split(before)[-1]
        after = _CLAUSE_END.split(text[m.end() : m.end() + _MONEY_AFTER])[0]
        cents = re.fullmatch(r"-?[\d,]+\.\d\d", m.group(0)) is not None
        if cents or _MONEY_BEFORE_CUE.search(before) or _MONEY_AFTER_CUE.search(after):
            seen.update(dict.fromkeys(number_options(m.group(0), quantities=True)))
    return list(seen)


_IDENT_TOKEN = re.compile(r"(?<![\w#-])#?[A-Za-z0-9][A-Za-z0-9_./-]*\d[A-Za-z0-9_./-]*|(?<![\w#-])#?\d[A-Za-z0-9_./-]*")


def identifier_options(text: str) -> list[str]:
    """The codes ``text`` prints: tokens of letters, digits and ``-_./`` holding a digit, at least
    three characters (``INV-2041``, ``TD01167104``, ``#A-77``), without a trailing dot; not a
    date or part of one, a price or a number under 1000."""
    dates = date_options(text)
    out = (m.group(0).rstrip("./-") for m in _IDENT_TOKEN.finditer(text))
    out = (v for v in out if not any(v in d for d in dates))  # the year of "1 March 2024"
    return _unique(
        v for v in out if len(v.lstrip("#")) >= 3 and not _plausible_any_date(v) and not _AMOUNT.fullmatch(v)
    )


_AMOUNT = re.compile(r"\d+[.,]\d{1,2}|\d{1,3}")
"""A price (``5.60``) or a small count is not a code."""


def _plausible_any_date(value: str) -> bool:
    return any(p.fullmatch(value) for p in _DATE_SHAPES)


def _unique(values: Any) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


_KIND_WORDS: dict[str, frozenset[str]] = {
    "date": frozenset({"date", "dates", "dated"}),
    "time": frozenset({"time", "times"}),
    "email": frozenset({"email", "emails"}),
    "url": frozenset({"url", "urls", "website", "homepage", "uri", "link", "links"}),
    "phone": frozenset({"phone", "phones", "telephone", "tel", "mobile", "fax", "cellphone"}),
    "amount": frozenset(
        {"total", "amount", "price", "cost", "subtotal", "tax", "vat", "gst", "fee", "fees", "balance", "sum"}
    ),
    "identifier": frozenset({"id", "no", "number", "num", "ref", "reference", "sku", "iban", "serial"}),
}
_KIND_CJK = {
    "date": ("日期",),
    "time": ("时间", "時間"),
    "email": ("邮箱", "邮件"),
    "url": ("网址",),
    "phone": ("电话", "手机"),
    "amount": ("金额", "合计", "总计", "总额", "价格", "费用", "总价", "价钱"),
    "identifier": ("编号", "单号", "号码", "代码"),
}
_KIND_ORDER = ("date", "time", "email", "url", "phone", "identifier", "amount")
_SURE_KINDS = frozenset({"date", "time", "email", "url", "phone", "amount"})
"""Kinds whose values the text cannot state without printing one the recognisers find."""
"""The order names are read in: ``tax_id`` is an identifier, ``tax`` an amount."""
_DURATION_WORDS = frozenset(
    {"zone", "zones", "travel", "processing", "lead", "elapsed", "wait", "waiting", "cooking", "prep", "response"}
)
"""Words that make a name with "time" a time zone or a duration, not a time of day."""
KIND_OPTIONS = {
    "date": date_options,
    "time": time_options,
    "email": email_options,
    "url": url_options,
    "phone": phone_options,
    "amount": amount_options,
    "identifier": identifier_options,
}
"""For each kind of span, the function that finds its candidates in a source text."""


def _name_words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^0-9A-Za-z]+", spaced) if w]


def span_kind(name: str | None, node: Mapping[str, Any]) -> str | None:
    """The kind of value a grounded string holds, from ``"x-grounded"`` (one of
    :data:`SPAN_KINDS`; ``"span"``: none) or else its property name or ``title``: a word
    "date", "time" (not with "zone" or a duration's word such as "travel"), "email",
    "url"/"website"/"link", "phone"/"tel"/"mobile"/"fax", an identifier ("id", "number",
    "no", "code", "ref", not "number of"), an amount ("total", "amount", "price", "tax",
    ...), or the Chinese word for one of them (``日期``, ``时间``, ``邮箱``, ``网址``, ``电话``,
    ``编号``, ``金额``, ...). ``None``: a plain span."""
    flag = node.get(GROUNDED_KEY)
    if flag in SPAN_KINDS:
        return None if flag == "span" else str(flag)
    labels = [x for x in (name, node.get("title")) if isinstance(x, str)]
    for kind in _KIND_ORDER:
        words = _KIND_WORDS[kind]
        for label in labels:
            found = set(_name_words(label))
            if kind == "email" and "e" in found and "mail" in found:
                return kind
            if kind == "identifier" and "of" in found:  # number_of_guests is a count
                continue
            if words & found and not (kind == "time" and found & _DURATION_WORDS):
                return kind
            if any(w in label for w in _KIND_CJK[kind]):
                return kind
    return None


def in_bounds(value: float, node: Mapping[str, Any]) -> bool:
    """Whether ``value`` meets the schema's ``minimum``/``maximum``/``exclusive*``/``multipleOf``."""
    lo, hi = node.get("minimum"), node.get("maximum")
    xlo, xhi = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if isinstance(lo, (int, float)) and value < lo:
        return False
    if isinstance(hi, (int, float)) and value > hi:
        return False
    if isinstance(xlo, (int, float)) and not isinstance(xlo, bool) and value <= xlo:
        return False
    if isinstance(xhi, (int, float)) and not isinstance(xhi, bool) and value >= xhi:
        return False
    mult = node.get("multipleOf")
    if isinstance(mult, (int, float)) and mult > 0:
        q = value / mult
        if abs(q - round(q)) > 1e-9:
            return False
    return True


def _types(node: Mapping[str, Any]) -> set[str]:
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def is_grounded(node: Mapping[str, Any], *, strings: bool = True, numbers: bool = False) -> bool:
    """Whether a (resolved) value schema is grounded under the given defaults."""
    flag = node.get(GROUNDED_KEY)
    if flag is False:
        return False
    types = _types(node)
    if len(types) != 1 or any(k in node for k in _UNGROUNDABLE):
        return False
    if types == {"string"}:
        return strings or flag is True or flag in SPAN_KINDS
    if types & {"number", "integer"}:
        return numbers or flag is True
    return False


ABSENT = "<absent>"
"""What :meth:`_Builder.value` gives for a value the text does not state where ``null`` may
stand instead: the branch is left out, so only ``null`` (or the other branches) remain."""


class _Builder:
    """Walks the schema and writes the Lark rules; ``None`` from :meth:`value` means the
    subschema holds nothing grounded (it is then embedded whole as ``%json``)."""

    def __init__(
        self, root: Mapping[str, Any], text: str, strings: bool, numbers: bool, layout: Layout, prefix: str = "g"
    ) -> None:
        self.root = root
        self.prefix = prefix
        self.text = text
        self.strings = strings
        self.numbers = numbers
        self.layout = layout
        self.rules: list[str] = []
        self.terminals: dict[str, str] = {}
        self.count = 0
        self.chunks: list[str] | None = None
        self.grounded = 0
        self.defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root.get(k), Mapping)}
        self._active: set[str] = set()
        self.single_named: dict[str, str] = {}  # rule of an enum narrowed to one value -> the value

    # -- helpers ---------------------------------------------------------------------------

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{self.prefix}_{stem}_{self.count}"

    def resolve(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        seen = 0
        while isinstance(node.get("$ref"), str) and seen < 32:
            ref = node["$ref"]
            if not ref.startswith("#/"):
                return node
            cur: Any = self.root
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(cur, Mapping) or part not in cur:
                    return node
                cur = cur[part]
            if not isinstance(cur, Mapping):
                return node
            extra = {k: v for k, v in node.items() if k != "$ref"}
            node = {**cur, **extra}
            seen += 1
        return node

    def json_rule(self, node: Mapping[str, Any]) -> str:
        doc = dict(node)
        for k, v in self.defs.items():
            doc.setdefault(k, v)
        doc["x-guidance"] = {**self.layout.guidance(), **dict(doc.get("x-guidance") or {})}
        name = self.name("j")
        self.rules.append(f"{name}: %json " + json.dumps(doc, ensure_ascii=False))
        return name

    @staticmethod
    def lit(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)

    # -- grounded leaves ---------------------------------------------------------------------

    def span_terminal(self, node: Mapping[str, Any]) -> str | None:
        if self.chunks is None:
            self.chunks = span_chunks(self.text)
        if not self.chunks:
            return None
        lo = node.get("minLength")
        hi = node.get("maxLength")
        lo_i = int(lo) if isinstance(lo, int) and lo > 0 else 1
        if lo_i > len(normalize_space(self.text)):
            return None  # no span is that long: the value cannot come from the text
        key = f"{lo_i}:{hi}"
        if key in self.terminals:
            return self.terminals[key]
        name = f"{self.prefix.upper()}_SPAN_{len(self.terminals)}"
        # the span itself; then: no space at either end, and the length bounds
        body = "%regex " + json.dumps({"substring_chunks": self.chunks}, ensure_ascii=False)
        edges = r"/[^ ]|[^ ](?s:.*)[^ ]/"
        parts = [f"{name}_RAW: {body}", f"{name}_EDGE: {edges}"]
        bound = ""
        if lo_i > 1 or isinstance(hi, int):
            upper = str(hi) if isinstance(hi, int) else ""
            parts.append(f"{name}_LEN: /(?s:.){{{lo_i},{upper}}}/")
            bound = f" & {name}_LEN"
        parts.append(f'{name}: "\\"" ({name}_RAW & {name}_EDGE{bound}) "\\""')
        self.rules.extend(parts)
        self.terminals[key] = name
        return name

    def string_choices(self, stem: str, values: Sequence[str]) -> str:
        """A rule that is one of ``values``, each written as a JSON string."""
        name = self.name(stem)
        self.rules.append(f"{name}: " + " | ".join(self.lit(json.dumps(v, ensure_ascii=False)) for v in values))
        return name

    def kind_rule(self, kind: str, node: Mapping[str, Any], *, required: bool = True) -> str | None:
        """A string of a kind (:func:`span_kind`): one of the values of that kind the text
        prints, within the length bounds; ``None`` when it prints none. A ``required`` amount
        where the text prints no money is one of its printed numbers."""
        lo, hi = node.get("minLength"), node.get("maxLength")
        text = normalize_space(self.text)
        values = KIND_OPTIONS[kind](text)
        if not values and kind == "amount" and required:
            values = number_options(text, quantities=True)
        opts = [
            v for v in values if not (isinstance(lo, int) and len(v) < lo) and not (isinstance(hi, int) and len(v) > hi)
        ]
        return self.string_choices(kind, opts) if opts else None

    def iso_date_rule(self, node: Mapping[str, Any]) -> str | None:
        """A ``format: date`` string: one of the printed dates, written in ISO 8601."""
        order = node.get(DATE_ORDER_KEY)
        opts = iso_date_options(self.text, order=order if order in DATE_ORDERS else None)
        return self.string_choices("isodate", opts) if opts else None

    def number_rule(self, node: Mapping[str, Any]) -> str | None:
        integer = "integer" in _types(node)
        opts = [o for o in number_options(self.text, integer=integer) if in_bounds(float(o), node)]
        if not opts:
            return None
        name = self.name("num")
        self.rules.append(f"{name}: " + " | ".join(self.lit(o) for o in opts))
        return name

    def unstated_number(self, node: Mapping[str, Any], key: str | None) -> bool:
        """A number field the text cannot fill: it prints no number at all, or, for an amount
        (:func:`span_kind`), no money (:func:`money_options`)."""
        types = _types(node)
        if not types or not types <= {"number", "integer"} or node.get(GROUNDED_KEY) is False:
            return False
        if any(k in node for k in ("enum", "const")):
            return False
        if not number_options(self.text, quantities=True):
            return True
        return span_kind(key, {"type": "string", **{k: v for k, v in node.items() if k != "type"}}) == "amount" and (
            not money_options(self.text)
        )

    # -- structure ---------------------------------------------------------------------------

    def value(self, raw: Mapping[str, Any], key: str | None = None, *, absent_ok: bool = False) -> str | None:
        """The rule for a value; ``key`` is the property name that holds it, if any. With
        ``absent_ok`` (a branch beside ``null``), a string of a kind the text does not print
        gives :data:`ABSENT` instead of a span: the text does not state it, so it is null."""
        ref = raw.get("$ref")
        if isinstance(ref, str):
            if ref in self._active:  # recursive schema: keep the rest as plain JSON
                return None
            self._active.add(ref)
            try:
                return self._value(self.resolve(raw), key, absent_ok)
            finally:
                self._active.discard(ref)
        return self._value(raw, key, absent_ok)

    def named_choices(self, node: Mapping[str, Any]) -> str | None:
        """A string ``enum`` narrowed to the values the text names, when it names some but not all."""
        values = node.get("enum")
        if not self.strings or node.get(GROUNDED_KEY) is False or not isinstance(values, list):
            return None
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            return None
        named = [v for v in values if names_value(v, self.text)]
        if not named or len(named) == len(values):
            return None
        name = self.string_choices("named", named)
        if len(named) == 1:
            self.single_named[name] = named[0]
        return name

    def _value(self, node: Mapping[str, Any], key: str | None = None, absent_ok: bool = False) -> str | None:
        named = self.named_choices(node)
        if named is not None:
            self.grounded += 1
            return named
        if self.strings and _types(node) == {"string"} and node.get("format") == "date":
            if node.get(GROUNDED_KEY) is False or any(k in node for k in ("enum", "const", "pattern")):
                return None
            rule = self.iso_date_rule(node) or (ABSENT if absent_ok else None)
            if rule is not None:
                self.grounded += 1
            return rule
        if absent_ok and self.strings and self.unstated_number(node, key):
            return ABSENT
        if is_grounded(node, strings=self.strings, numbers=self.numbers):
            types = _types(node)
            if types != {"string"}:
                rule = self.number_rule(node) or (ABSENT if absent_ok else None)
            else:
                kind = span_kind(key, node)
                rule = self.kind_rule(kind, node, required=not absent_ok) if kind else None
                if rule is None:
                    # a kind the text never prints (no e-mail address for "email") is absent; an
                    # identifier may be a word ("alice"), so it falls back to a span
                    rule = ABSENT if kind in _SURE_KINDS and absent_ok else self.span_terminal(node)
            if rule is not None:
                self.grounded += 1
            return rule
        for combinator in ("anyOf", "oneOf"):
            branches = node.get(combinator)
            plain = set(node) <= {combinator, "title", "description", "default", GROUNDED_KEY, DATE_ORDER_KEY}
            if isinstance(branches, list) and plain:
                return self.alternatives(branches, node, key)
        types = _types(node)
        if types == {"object"} or (not types and "properties" in node):
            return self.obj(node)
        if types == {"array"}:
            return self.array(node, key)
        return None

    def alternatives(self, branches: Sequence[Any], parent: Mapping[str, Any], key: str | None = None) -> str | None:
        if any(not isinstance(b, Mapping) for b in branches):
            return None
        inherit = {k: parent[k] for k in (GROUNDED_KEY, DATE_ORDER_KEY, "title") if k in parent}
        nullable = any(_types(self.resolve(b)) == {"null"} for b in branches)
        rendered = [self.value({**inherit, **b}, key, absent_ok=nullable) for b in branches]
        kept = [(r, b) for r, b in zip(rendered, branches, strict=True) if r != ABSENT]
        if all(r is None for r, _ in kept) and len(kept) == len(branches):
            return None
        alts = [r if r is not None else self.json_rule(b) for r, b in kept]
        name = self.name("alt")
        self.rules.append(f"{name}: " + " | ".join(alts))
        return name

    def obj(self, node: Mapping[str, Any]) -> str | None:
        props = node.get("properties")
        if not isinstance(props, Mapping) or not props:
            return None
        if node.get("additionalProperties", False) is not False or any(
            k in node for k in ("patternProperties", "allOf", "if", "dependentRequired", "dependentSchemas", "not")
        ):
            return None
        if "minProperties" in node or "maxProperties" in node or "unevaluatedProperties" in node:
            return None
        required = set(node.get("required") or [])
        items = []
        any_grounded = False
        for key, sub in props.items():
            if not isinstance(sub, Mapping):
                return None
            r = self.value(sub, str(key))
            any_grounded = any_grounded or r is not None
            items.append((key, sub, r))
        if not any_grounded:
            return None
        # An optional enum the text names exactly one value of is written: "in Celsius" asks
        # for unit=celsius. Not when a sibling offers the same value (from_unit/to_unit).
        for key, _, r in items:
            chosen = self.single_named.get(r or "")
            if chosen is not None and key not in required:
                siblings = [s for k, s, _ in items if k != key]
                if not any(isinstance(s.get("enum"), list) and chosen in s["enum"] for s in siblings):
                    required.add(key)
        sep, ksep = self.lit(self.layout.item_separator), self.lit(self.layout.key_separator)
        members = []
        for key, sub, r in items:
            rule = r if r is not None else self.json_rule(sub)
            members.append((f"{self.lit(json.dumps(key, ensure_ascii=False))} {ksep} {rule}", key in required))
        name = self.name("obj")
        # body_i: the members from i on, each preceded by the separator
        tails = [self.name("tail") for _ in members]
        for i, (m, req) in enumerate(members):
            rest = f" {tails[i + 1]}" if i + 1 < len(members) else ""
            part = f"{sep} {m}" if req else f"({sep} {m})?"
            self.rules.append(f"{tails[i]}: {part}{rest}")
        # the first member present: every member before it optional
        starts = []
        for i, (m, req) in enumerate(members):
            rest = f" {tails[i + 1]}" if i + 1 < len(members) else ""
            starts.append(f"{m}{rest}")
            if req:
                break
        else:
            starts.append("")
        body = " | ".join(f'"{{" {s} "}}"' if s else '"{" "}"' for s in starts)
        self.rules.append(f"{name}: {body}")
        return name

    def array(self, node: Mapping[str, Any], key: str | None = None) -> str | None:
        items = node.get("items")
        if not isinstance(items, Mapping) or any(
            k in node for k in ("prefixItems", "contains", "uniqueItems", "unevaluatedItems")
        ):
            return None
        inner = self.value(items, key)  # dates: list[date]-like fields hold dates too
        if inner is None:
            return None
        lo = node.get("minItems", 0)
        hi = node.get("maxItems")
        lo_i = int(lo) if isinstance(lo, int) else 0
        sep = self.lit(self.layout.item_separator)
        name = self.name("arr")
        more_lo = max(lo_i - 1, 0)
        more_hi = "" if not isinstance(hi, int) else str(max(hi - 1, 0))
        seq = f"{inner} ({sep} {inner}){{{more_lo},{more_hi}}}"
        if isinstance(hi, int) and hi == 0:
            self.rules.append(f'{name}: "[" "]"')
        elif lo_i == 0:
            self.rules.append(f'{name}: "[" ({seq})? "]"')
        else:
            self.rules.append(f'{name}: "[" {seq} "]"')
        return name


def grounded_grammar(
    schema: Mapping[str, Any],
    text: str,
    *,
    strings: bool = True,
    numbers: bool = False,
    layout: Layout | None = None,
) -> str | None:
    """An llguidance Lark grammar for ``schema`` whose grounded values come from ``text``.

    Returns ``None`` when nothing in the schema is grounded (or the text has no words),
    so the caller keeps its plain (cached) JSON Schema grammar. ``strings``/``numbers`` are
    the defaults for plain strings and numbers; ``"x-grounded"`` on a value overrides them.
    ``layout`` defaults to the separators in the schema's top-level ``x-guidance`` (else
    compact ``,`` and ``:``).
    Objects must be closed (``additionalProperties: false``) to be walked; anything the
    walker does not handle is embedded as ``%json`` with its usual constraint.
    """
    if layout is None:
        opts = schema.get("x-guidance")
        opts = opts if isinstance(opts, Mapping) else {}
        layout = Layout(str(opts.get("item_separator", ",")), str(opts.get("key_separator", ":")))
    b = _Builder(schema, text, strings, numbers, layout)
    top = b.value(schema)
    if top is None or b.grounded == 0:
        return None
    head = "%llguidance {}\n" + f"start: {top}\n"
    return head + "\n".join(b.rules) + "\n"


def grounded_rules(
    schema: Mapping[str, Any],
    text: str,
    *,
    prefix: str,
    strings: bool = True,
    numbers: bool = False,
    layout: Layout = COMPACT,
) -> tuple[str, list[str]] | None:
    """The rules of :func:`grounded_grammar` without a ``start``, to embed in a larger
    grammar: ``(top rule name, rule lines)``; names start with ``prefix`` (a lowercase
    identifier unique in the host grammar). ``None`` when nothing is grounded."""
    b = _Builder(schema, text, strings, numbers, layout, prefix)
    top = b.value(schema)
    if top is None or b.grounded == 0:
        return None
    return top, b.rules


def grounded_values(schema: Mapping[str, Any], data: Any, *, strings: bool = True) -> list[tuple[str, str]]:
    """``(path, value)`` of every grounded string in ``data`` (for checks and tests)."""
    b = _Builder(schema, "", strings, False, COMPACT)
    out: list[tuple[str, str]] = []

    def walk(node: Mapping[str, Any], value: Any, path: str) -> None:
        node = b.resolve(node)
        if isinstance(value, str) and is_grounded(node, strings=strings):
            out.append((path, value))
            return
        for key in ("anyOf", "oneOf"):
            for br in node.get(key) or []:
                if isinstance(br, Mapping):
                    walk(br, value, path)
        if isinstance(value, dict) and isinstance(node.get("properties"), Mapping):
            for k, v in value.items():
                sub = node["properties"].get(k)
                if isinstance(sub, Mapping):
                    walk(sub, v, f"{path}/{k}")
        if isinstance(value, list) and isinstance(node.get("items"), Mapping):
            for i, v in enumerate(value):
                walk(node["items"], v, f"{path}/{i}")

    walk(schema, data, "#")
    return out
