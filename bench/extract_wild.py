"""Extraction "in the wild": documents nobody tuned on, schemas a user would write, three systems in one run.

Data (bench/extract_wild_docs.py, written for this benchmark): 108 documents of six kinds, 18 each
(10 English, 8 Chinese): short notes, e-mails, e-mail signatures / business cards, invoices, receipts
and notices (meetings, announcements, appointments). Amounts come with currency symbols, codes and
words and thousands separators, dates in many spellings (2026-03-04, 4 March 2026, 03/04/2026,
2026年3月4日, 3月15日), names behind greetings and honorifics (尊敬的王小明先生 -> 王小明), phone
numbers next to amounts. Many optional fields are absent from the text, and a few documents hold
nothing the schema asks for ("The weather is nice today." read as an invoice): there every optional
field must come back None. A seventh kind, ``sroie``, reads 12 real scanned receipts (OCR text) from
../shared/data/sroie/receipts.jsonl at run time: the file's last 12, as bench/extract.py and the
benches built on it use its first ones (skipped when the folder is missing).

Schemas: one Pydantic model per kind, spelled in several variants (``--variants``):
  float        English field names, money as ``float`` (the headline variant: kind and language tables)
  str          money as ``str``
  decimal      money as ``Decimal``
  constrained  money as ``Annotated[float, Field(ge=0)]``
  zh-names     Chinese field names (``Field(alias="金额")``: the JSON keys the model writes), money
               ``float``; Chinese documents only
Identifiers (invoice and order numbers) are ``str`` everywhere. Kinds without money (contact) run
only ``float`` and ``zh-names``.

Halves: within each (kind, language) cell the documents are ordered by the SHA-256 of their id; the
first half of each cell (rounded up) is ``dev``, the rest ``test``, so each half holds every kind and
language. Tune on dev, report test.

Systems, same model (the embedded SmolLM2-135M-Instruct GGUF), threads, greedy decoding, max_tokens
256 and the same chat prompt (pocket_agent's ``build_messages`` for the schema, the prompt ``extract``
sends):
  ours      ``pocket_agent.extract(text, Model, model=m)``, ``m = load_model(default_model_path(),
            threads=N)`` (the shipped extraction adapter applied at run time, adapter="auto")
  llamacpp  llama-cpp-python ``create_chat_completion(response_format={"type": "json_object",
            "schema": Model.model_json_schema()})`` then ``Model.model_validate_json``
  outlines  ``outlines.Generator(outlines.from_llamacpp(Llama(...)), Model)`` (when importable)
A run of each system on each (document, variant) is timed whole, first-use costs included (schema
compiles, outlines' index per schema), as a user's program would pay them; each system first runs
one document untimed (model load).

Scoring, per field: a field the text does not hold must come back None; one it holds is right when
equal after normalising: strings trimmed, case-folded, whitespace collapsed; money and numbers
equal within 0.005 after parsing (``str``, ``float`` or ``Decimal``; currency symbols, codes and
thousands separators stripped); dates equal as calendar dates when both parse (ISO, 2026/03/04,
2026.03.04, 2026年3月4日, 3月4日, 4 March 2026, Mar 4, 2026; a day-month order the text leaves open
is read both ways; a missing year matches any), else as strings; times equal as hour:minute (the
first time of a range; 3 pm, 15:00, 下午3点, 下午三点); phones equal as digits; currencies equal as
codes ($, US$, USD, dollars -> USD; ¥, 元, 人民币, RMB -> CNY; ...); invoice and order numbers
without a leading '#'. An output that does not validate counts every field of the document wrong.
Reported: present-field accuracy, absent-field None rate, valid-object rate and seconds per
document, overall and per kind, per language and per variant, for each half side by side.

    python bench/extract_wild.py --check
    python bench/extract_wild.py [--n N] [--half dev|test|all] [--threads 2]
        [--systems ours,llamacpp,outlines] [--variants float,str,decimal,constrained,zh-names]
        [--out bench/extract_wild.md] [--details PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import cpu_model, package_versions
from extract_wild_docs import DOCS

ROOT = Path(__file__).resolve().parents[1]
SROIE = ROOT.parent / "shared" / "data" / "sroie" / "receipts.jsonl"
SROIE_DOCS = 12
MAX_TOKENS = 256
KINDS = ("note", "email", "contact", "invoice", "receipt", "notice", "sroie")
LANGS = ("en", "zh")
HALVES = ("dev", "test")
SYSTEMS = ("ours", "llamacpp", "outlines")
VARIANTS = ("float", "str", "decimal", "constrained", "zh-names")
BASE = "float"
MONEY_TYPES: dict[str, Any] = {
    "float": float,
    "str": str,
    "decimal": Decimal,
    "constrained": Annotated[float, Field(ge=0)],
    "zh-names": float,
}

# -- schemas -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One field of a kind's schema: its name, its Chinese name, how it is scored, whether required."""

    name: str
    zh: str
    kind: str  # text, money, date, time, phone, currency, ident
    required: bool = False


SCHEMAS: dict[str, tuple[str, tuple[Spec, ...]]] = {
    "note": (
        "Note",
        (
            Spec("person", "联系人", "text"),
            Spec("date", "日期", "date"),
            Spec("time", "时间", "time"),
            Spec("phone", "电话", "phone"),
            Spec("amount", "金额", "money"),
        ),
    ),
    "email": (
        "Email",
        (
            Spec("sender", "发件人", "text"),
            Spec("recipient", "收件人", "text"),
            Spec("date", "日期", "date"),
            Spec("order_number", "订单号", "ident"),
            Spec("amount", "金额", "money"),
        ),
    ),
    "contact": (
        "Contact",
        (
            Spec("name", "姓名", "text", required=True),
            Spec("email", "邮箱", "text"),
            Spec("phone", "电话", "phone"),
            Spec("company", "公司", "text"),
            Spec("title", "职位", "text"),
        ),
    ),
    "invoice": (
        "Invoice",
        (
            Spec("invoice_number", "发票号码", "ident"),
            Spec("total", "金额", "money", required=True),
            Spec("currency", "币种", "currency"),
            Spec("date", "日期", "date"),
            Spec("due_date", "付款截止日期", "date"),
        ),
    ),
    "receipt": (
        "Receipt",
        (
            Spec("merchant", "商家", "text", required=True),
            Spec("total", "合计", "money", required=True),
            Spec("tax", "税额", "money"),
            Spec("date", "日期", "date"),
            Spec("phone", "电话", "phone"),
        ),
    ),
    "notice": (
        "Notice",
        (
            Spec("recipient", "收件人", "text"),
            Spec("date", "日期", "date"),
            Spec("time", "时间", "time"),
            Spec("place", "地点", "text"),
            Spec("fee", "费用", "money"),
        ),
    ),
    "sroie": (
        "Receipt",
        (
            Spec("company", "公司", "text", required=True),
            Spec("date", "日期", "date", required=True),
            Spec("address", "地址", "text", required=True),
            Spec("total", "合计", "money", required=True),
        ),
    ),
}
GROUNDED_KINDS = frozenset(KINDS) - {"sroie"}  # expected values copied from the text (--check verifies)

_MODELS: dict[tuple[str, str], type[BaseModel]] = {}


def schema_for(kind: str, variant: str) -> type[BaseModel]:
    """The Pydantic model of ``kind`` spelled as ``variant``: what a user would write, e.g.

    class Invoice(BaseModel):
        invoice_number: str | None = None
        total: float                      # str, Decimal, Annotated[float, Field(ge=0)]
        currency: str | None = None
        date: str | None = None
        due_date: str | None = None

    (``zh-names``: the same with ``Field(alias="金额")`` and so on on each field).
    """
    key = (kind, variant)
    if key not in _MODELS:
        title, specs = SCHEMAS[kind]
        fields: dict[str, Any] = {}
        for s in specs:
            ann: Any = MONEY_TYPES[variant] if s.kind == "money" else str
            alias = s.zh if variant == "zh-names" else None
            if s.required:
                fields[s.name] = (ann, Field(alias=alias))
            else:
                fields[s.name] = (ann | None, Field(None, alias=alias))
        _MODELS[key] = create_model(title, **fields)
    return _MODELS[key]


def has_money(kind: str) -> bool:
    return any(s.kind == "money" for s in SCHEMAS[kind][1])


def variants_for(doc: dict[str, Any], wanted: Iterable[str]) -> list[str]:
    """The variants ``doc`` runs: money spellings only where its schema has money, Chinese names only in Chinese."""
    out = []
    for v in wanted:
        if v == "zh-names" and doc["lang"] != "zh":
            continue
        if v not in (BASE, "zh-names") and not has_money(doc["kind"]):
            continue
        out.append(v)
    return out


# -- documents and halves --------------------------------------------------------------------------


def money_string(value: Any) -> str:
    """A label like ``"$8.20"`` or ``"1,234.5"`` as a plain decimal string (``"8.20"``)."""
    number = parse_number(value)
    if number is None:
        raise ValueError(f"not an amount: {value!r}")
    return f"{number:.2f}"


def load_sroie() -> list[dict[str, Any]]:
    """The last ``SROIE_DOCS`` SROIE receipts as documents of kind ``sroie`` ([] without ../shared)."""
    if not SROIE.is_file():
        return []
    rows = [json.loads(line) for line in SROIE.read_text(encoding="utf-8").splitlines() if line.strip()]
    docs = []
    for row in rows[-SROIE_DOCS:]:
        expected = {k: v for k, v in row["expected"].items() if k in ("company", "date", "address", "total")}
        if "total" in expected:
            expected["total"] = money_string(expected["total"])
        docs.append(
            {"id": f"sroie-{row['id']}", "kind": "sroie", "lang": "en", "text": row["text"], "expected": expected}
        )
    return docs


def id_hash(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode("utf-8")).hexdigest()


def assign_halves(docs: list[dict[str, Any]]) -> None:
    """Sets ``doc["half"]``: in each (kind, language) cell, by hash order, the first ceil(n/2) are dev."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        cells.setdefault((d["kind"], d["lang"]), []).append(d)
    for cell in cells.values():
        cell.sort(key=lambda d: id_hash(d["id"]))
        cut = math.ceil(len(cell) / 2)
        for i, d in enumerate(cell):
            d["half"] = "dev" if i < cut else "test"


def all_docs() -> list[dict[str, Any]]:
    docs = [dict(d) for d in DOCS] + load_sroie()
    assign_halves(docs)
    return docs


def expected_of(doc: dict[str, Any]) -> dict[str, Any]:
    """Every scored field of ``doc`` with its expected value (None: absent); required fields the
    document does not hold (nothing to extract) are left out: not scored."""
    out: dict[str, Any] = {}
    for s in SCHEMAS[doc["kind"]][1]:
        value = doc["expected"].get(s.name)
        if value is None and s.required:
            continue
        out[s.name] = value
    return out


def interleaved(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs`` in an order whose every prefix spreads over kinds, languages and halves: round
    robin over the (half, kind, language) cells, each cell in hash order, the languages of
    neighbouring kinds alternating, so ``--n 7`` already touches every kind."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for d in sorted(docs, key=lambda d: id_hash(d["id"])):
        cells.setdefault((d["half"], d["kind"], d["lang"]), []).append(d)
    order = []
    for flip in (0, 1):
        for half in HALVES:
            for k, kind in enumerate(KINDS):
                order.append((half, kind, LANGS[(k + flip) % 2]))
    out = []
    while any(cells.values()):
        for key in order:
            if cells.get(key):
                out.append(cells[key].pop(0))
    return out


# -- normalising and scoring -----------------------------------------------------------------------

_NUMBER = re.compile(r"\d[\d,.'’]*\d|\d")
_CURRENCY = {
    "$": "USD",
    "us$": "USD",
    "usd": "USD",
    "dollar": "USD",
    "dollars": "USD",
    "€": "EUR",
    "eur": "EUR",
    "euro": "EUR",
    "euros": "EUR",
    "£": "GBP",
    "gbp": "GBP",
    "¥": "CNY",
    "￥": "CNY",
    "元": "CNY",
    "人民币": "CNY",
    "人民币元": "CNY",
    "rmb": "CNY",
    "cny": "CNY",
    "₹": "INR",
    "inr": "INR",
    "a$": "AUD",
    "aud": "AUD",
    "chf": "CHF",
    "hk$": "HKD",
    "hkd": "HKD",
    "港币": "HKD",
    "rm": "MYR",
    "myr": "MYR",
}
_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ]
    )
    for m in names
}
_MONTH_RE = "(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DATE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(\d{4})\s*[-/.年]\s*(\d{1,2})\s*[-/.月]\s*(\d{1,2})"), "ymd"),
    (re.compile(r"(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]"), "md"),
    (re.compile(r"(\d{1,2})[-/.](\d{1,2})[-/.](\d{4}|\d{2})(?!\d)"), "either"),
    (re.compile(r"(\d{1,2})(?:st|nd|rd|th)?\s+" + _MONTH_RE + r",?\s+(\d{4})", re.IGNORECASE), "dMy"),
    (re.compile(r"\b" + _MONTH_RE + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})", re.IGNORECASE), "Mdy"),
]
_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_TIME = re.compile(
    r"(上午|早上|中午|下午|晚上)?\s*(\d{1,2}|[零一二两三四五六七八九十]{1,3})\s*"
    r"(?:[:：](\d{2})|[点時时]\s*(半|(\d{1,2})\s*分?)?)?\s*(a\.?\s?m\.?|p\.?\s?m\.?)?",
    re.IGNORECASE,
)

DateKey = tuple[int | None, int, int]


def norm_text(value: Any) -> str:
    return " ".join(str(value).split()).casefold()


def parse_number(value: Any) -> float | None:
    """A number from a returned value: ``int``/``float``/``Decimal`` as is; a string's first number
    with currency symbols, codes and thousands separators (``,`` ``'`` ``’``) stripped."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Decimal)):
        return float(value)
    if not isinstance(value, str):
        return None
    m = _NUMBER.search(value)
    if m is None:
        return None
    s = m.group().replace("'", "").replace("’", "")
    if "," in s and "." in s:  # the later one separates the decimals
        s = s.replace(",", "") if s.rfind(".") > s.rfind(",") else s.replace(".", "").replace(",", ".")
    elif "," in s:
        s = s.replace(",", ".") if re.fullmatch(r"\d+,\d{1,2}", s) else s.replace(",", "")
    elif s.count(".") > 1:
        s = s.replace(".", "")
    negative = m.start() > 0 and value[m.start() - 1] == "-"
    try:
        return -float(s) if negative else float(s)
    except ValueError:
        return None


def numbers_in(text: str) -> list[float]:
    """Every number the text prints, parsed as :func:`parse_number` parses a value."""
    return [n for m in _NUMBER.finditer(text) if (n := parse_number(m.group())) is not None]


def _valid_date(y: int | None, m: int, d: int) -> bool:
    return 1 <= m <= 12 and 1 <= d <= 31


def date_keys(value: str) -> set[DateKey]:
    """The calendar dates the first date in ``value`` can mean: one, two where day and month could
    swap (03/04/2026), none when no date parses; year None when the text gives none."""
    best: tuple[int, int, set[DateKey]] | None = None
    for rank, (pattern, form) in enumerate(_DATE_PATTERNS):
        m = pattern.search(value)
        if m is None or (best is not None and (m.start(), rank) >= best[:2]):
            continue
        g = m.groups()
        keys: set[DateKey] = set()
        if form == "ymd":
            keys = {(int(g[0]), int(g[1]), int(g[2]))}
        elif form == "md":
            keys = {(None, int(g[0]), int(g[1]))}
        elif form == "either":
            y = int(g[2]) + (2000 if len(g[2]) == 2 else 0)
            keys = {(y, int(g[0]), int(g[1])), (y, int(g[1]), int(g[0]))}
        elif form == "dMy":
            keys = {(int(g[2]), _MONTHS[g[1].lower()], int(g[0]))}
        else:
            keys = {(int(g[2]), _MONTHS[g[0].lower()], int(g[1]))}
        keys = {k for k in keys if _valid_date(*k)}
        if keys:
            best = (m.start(), rank, keys)
    return best[2] if best else set()


def _zh_number(s: str) -> int:
    if s.isdigit():
        return int(s)
    if s == "十":
        return 10
    if "十" in s:
        tens, _, ones = s.partition("十")
        return _ZH_DIGITS.get(tens, 1) * 10 + (_ZH_DIGITS[ones] if ones else 0)
    return _ZH_DIGITS[s]


def time_key(value: str) -> tuple[int, int] | None:
    """The first time in ``value`` as (hour 0-23, minute): ``3 pm``, ``15:00``, ``下午3点``, ``下午三点半``."""
    for m in _TIME.finditer(value):
        prefix, hour, minute_colon, after_dian, minute_dian, suffix = m.groups()
        if minute_colon is None and suffix is None and not any(c in m.group() for c in "点时時"):
            continue  # a bare number is no time
        h = _zh_number(hour)
        minute = int(minute_colon) if minute_colon else 30 if after_dian == "半" else int(minute_dian or 0)
        pm = (suffix or "").lower().startswith("p") or prefix in ("下午", "晚上")
        if pm and h < 12:
            h += 12
        elif prefix == "中午" and h < 6:
            h += 12
        elif (suffix or "").lower().startswith("a") and h == 12:
            h = 0
        if h < 24 and minute < 60:
            return (h, minute)
    return None


def currency_code(value: Any) -> str:
    s = norm_text(value)
    return _CURRENCY.get(s, s)


def field_right(kind: str, expected: Any, returned: Any) -> bool:
    """Whether ``returned`` is right for a field of scoring kind ``kind`` (see the module docstring)."""
    if expected is None:
        return returned is None
    if returned is None:
        return False
    if kind == "money":
        got, want = parse_number(returned), parse_number(expected)
        return got is not None and want is not None and abs(got - want) < 0.005
    if norm_text(returned) == norm_text(expected):
        return True
    if kind == "date":
        got_keys, want_keys = date_keys(str(returned)), date_keys(str(expected))
        return any(
            g[1:] == w[1:] and (g[0] is None or w[0] is None or g[0] == w[0]) for g in got_keys for w in want_keys
        )
    if kind == "time":
        got_t = time_key(str(returned))
        return got_t is not None and got_t == time_key(str(expected))
    if kind == "phone":
        digits = re.sub(r"\D", "", str(returned))
        return bool(digits) and digits == re.sub(r"\D", "", str(expected))
    if kind == "currency":
        return currency_code(returned) == currency_code(expected)
    if kind == "ident":
        return norm_text(returned).lstrip("#").strip() == norm_text(expected).lstrip("#").strip()
    return False


def score(doc: dict[str, Any], returned: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per scored field: expected, returned, right. ``returned`` None (no valid object): all wrong."""
    kinds = {s.name: s.kind for s in SCHEMAS[doc["kind"]][1]}
    out = {}
    for name, want in expected_of(doc).items():
        got = None if returned is None else returned.get(name)
        right = returned is not None and field_right(kinds[name], want, got)
        out[name] = {"expected": want, "returned": _jsonable(got), "right": right}
    return out


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


# -- systems ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """One system on one document in one variant."""

    system: str
    variant: str
    doc: dict[str, Any]
    seconds: float
    returned: dict[str, Any] | None
    error: str | None = None
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        d = self.doc
        return {
            "system": self.system,
            "variant": self.variant,
            "id": d["id"],
            "kind": d["kind"],
            "lang": d["lang"],
            "half": d["half"],
            "seconds": round(self.seconds, 4),
            "valid": self.returned is not None,
            "error": self.error,
            "returned": None if self.returned is None else {k: _jsonable(v) for k, v in self.returned.items()},
            "fields": self.fields,
        }


Extractor = Callable[[str, type[BaseModel]], BaseModel]


def messages_for(text: str, schema: type[BaseModel]) -> list[dict[str, str]]:
    """The chat prompt every system gets: the one ``extract`` sends for this schema."""
    from pocket_agent.extraction import build_messages

    return build_messages(text, schema.model_json_schema())


def make_ours(model: Any) -> Extractor:
    import pocket_agent

    def run(text: str, schema: type[BaseModel]) -> BaseModel:
        return pocket_agent.extract(text, schema, model=model, max_tokens=MAX_TOKENS)

    return run


def make_llamacpp(threads: int) -> Extractor:
    import extract as xbench  # bench/extract.py: its llama-cpp-python peer (guarded, one per threads)

    llm = xbench._llama(threads)

    def run(text: str, schema: type[BaseModel]) -> BaseModel:
        out = llm.create_chat_completion(
            messages=messages_for(text, schema),  # type: ignore[arg-type]
            response_format={"type": "json_object", "schema": schema.model_json_schema()},
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
        return schema.model_validate_json(out["choices"][0]["message"]["content"] or "")  # type: ignore[index]

    return run


def make_outlines(threads: int, model: Any) -> Extractor:
    import extract as xbench
    import numba  # noqa: F401 - outlines-core's numpy kernels; without it outlines runs unconstrained
    import outlines

    llm = xbench._llama(threads, use="outlines")
    om = outlines.from_llamacpp(llm)
    generators: dict[type[BaseModel], Any] = {}

    def run(text: str, schema: type[BaseModel]) -> BaseModel:
        if schema not in generators:
            generators[schema] = outlines.Generator(om, schema)
        prompt = model.chat_template.render(messages_for(text, schema), add_generation_prompt=True)
        raw = generators[schema](prompt, max_tokens=MAX_TOKENS, temperature=0.0)
        return schema.model_validate_json(raw)

    return run


def run_one(system: str, extractor: Extractor, doc: dict[str, Any], variant: str) -> Run:
    schema = schema_for(doc["kind"], variant)
    t0 = time.perf_counter()
    error = None
    try:
        obj = extractor(doc["text"], schema)
        returned: dict[str, Any] | None = obj.model_dump()  # by attribute name: the English names
    except Exception as exc:  # an invalid output, a budget overrun, a schema a peer cannot take
        returned, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    run = Run(system, variant, doc, time.perf_counter() - t0, returned, error)
    run.fields = score(doc, returned)
    return run


# -- reports ---------------------------------------------------------------------------------------


@dataclass
class Stats:
    present: int = 0
    present_right: int = 0
    money: int = 0
    money_right: int = 0
    absent: int = 0
    absent_none: int = 0
    runs: int = 0
    valid: int = 0
    seconds: float = 0.0

    def add(self, run: Run) -> None:
        kinds = {s.name: s.kind for s in SCHEMAS[run.doc["kind"]][1]}
        self.runs += 1
        self.valid += run.returned is not None
        self.seconds += run.seconds
        for name, f in run.fields.items():
            if f["expected"] is None:
                self.absent += 1
                self.absent_none += f["right"]
            else:
                self.present += 1
                self.present_right += f["right"]
                if kinds[name] == "money":
                    self.money += 1
                    self.money_right += f["right"]

    @staticmethod
    def ratio(a: int, b: int) -> str:
        return f"{a / b:.2f}" if b else "-"

    def present_acc(self) -> str:
        return self.ratio(self.present_right, self.present)

    def absent_rate(self) -> str:
        return self.ratio(self.absent_none, self.absent)

    def money_acc(self) -> str:
        return self.ratio(self.money_right, self.money)

    def valid_rate(self) -> str:
        return self.ratio(self.valid, self.runs)

    def s_per_doc(self) -> str:
        return f"{self.seconds / self.runs:.2f}" if self.runs else "-"


def stats(runs: Iterable[Run], **where: Any) -> Stats:
    """Totals of the runs matching ``where`` (system, variant, kind, lang, half; a value may be a tuple)."""
    st = Stats()
    for r in runs:
        attrs = {"system": r.system, "variant": r.variant, **r.doc}
        if all(attrs[k] in v if isinstance(v, tuple) else attrs[k] == v for k, v in where.items()):
            st.add(r)
    return st


def tables(runs: list[Run], systems: list[str], halves: list[str], variants: list[str]) -> str:
    """The report's tables, each half side by side."""
    out = []
    cols = [(s, h) for s in systems for h in halves]
    head = "| | " + " | ".join(f"{s} {h}" for s, h in cols) + " |\n|---|" + "---|" * len(cols)

    def line(label: str, cell: Callable[[Stats], str], **where: Any) -> str:
        cells = [cell(stats(runs, system=s, half=h, **where)) for s, h in cols]
        return f"| {label} | " + " | ".join(cells) + " |"

    base = BASE if BASE in variants else variants[0]
    out.append(f"Overall, variant `{base}` (English field names, money `{base}`):\n")
    rows = ["| system | half | docs | present-field accuracy | absent fields: share None | valid objects | s/doc |"]
    rows.append("|---|---|---|---|---|---|---|")
    for s in systems:
        for h in halves:
            st = stats(runs, system=s, half=h, variant=base)
            rows.append(
                f"| {s} | {h} | {st.runs} | {st.present_acc()} | {st.absent_rate()} | {st.valid_rate()} "
                f"| {st.s_per_doc()} |"
            )
    out.append("\n".join(rows))

    def pa(st: Stats) -> str:
        return f"{st.present_acc()} / {st.absent_rate()} ({st.runs})"

    out.append(f"\nPer kind, variant `{base}`; each cell: present-field accuracy / absent None rate (documents):\n")
    out.append(head + "\n" + "\n".join(line(k, pa, variant=base, kind=k) for k in KINDS if stats(runs, kind=k).runs))
    out.append(f"\nPer language, variant `{base}`; same cells:\n")
    out.append(head + "\n" + "\n".join(line(lang, pa, variant=base, lang=lang) for lang in LANGS))
    money_kinds = tuple(k for k in KINDS if has_money(k))

    def cell3(st: Stats) -> str:
        return f"{st.present_acc()} / {st.money_acc()} / {st.absent_rate()} / {st.valid_rate()} ({st.runs})"

    vrows = [line(v, cell3, variant=v, kind=money_kinds) for v in variants if v in MONEY_TYPES and v != "zh-names"]
    if "zh-names" in variants:
        vrows += [line(f"{v} (zh documents)", cell3, variant=v, lang="zh") for v in (base, "zh-names") if v in variants]
    out.append(
        "\nPer variant; each cell: present-field accuracy / money-field accuracy / absent None rate / valid "
        "objects (runs). Money spellings on the kinds with money (all but contact); field names on the Chinese "
        "documents, the English names beside them:\n"
    )
    out.append(head + "\n" + "\n".join(vrows))
    return "\n".join(out)


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return sha.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


# -- --check ---------------------------------------------------------------------------------------

_SELF_TESTS: list[tuple[str, Any, Any, bool]] = [
    ("money", "1728.00", "£1,728.00", True),
    ("money", "1980.00", "CHF 1'980.00", True),
    ("money", "12.50", Decimal("12.5"), True),
    ("money", "12.50", 12.5, True),
    ("money", "845.50", "845.5 USD", True),
    ("money", "845.50", "555-013-2200", False),
    ("date", "2026-03-04", "4 March 2026", True),
    ("date", "2026年3月4日", "2026-03-04", True),
    ("date", "03/04/2026", "2026-04-03", True),
    ("date", "Jan 15, 2026", "2026-01-15", True),
    ("date", "3月15日", "2026-03-15", True),
    ("date", "2026-03-04", "2026-03-05", False),
    ("time", "下午2:00", "14:00", True),
    ("time", "晚上7点", "19:00", True),
    ("time", "下午三点", "3 PM", True),
    ("time", "9 a.m.", "09:00", True),
    ("time", "10:00 am", "10:00 pm", False),
    ("phone", "(415) 555-0139", "415-555-0139", True),
    ("currency", "人民币", "CNY", True),
    ("currency", "$", "USD", True),
    ("ident", "10482", "#10482", True),
    ("text", "王小明", "王小明先生", False),
]


def check() -> int:
    """Validate the data without a model; 0 when every check passes."""
    problems: list[str] = []
    docs = all_docs()
    ids = [d["id"] for d in docs]
    if len(set(ids)) != len(ids):
        problems.append("duplicate document ids")
    for kind, want, got, right in _SELF_TESTS:
        if field_right(kind, want, got) != right:
            problems.append(f"scoring self-test: {kind} {want!r} vs {got!r} should be {right}")
    optional_slots = absent_slots = 0
    for d in docs:
        specs = {s.name: s for s in SCHEMAS[d["kind"]][1]}
        if d["lang"] not in LANGS or d["kind"] not in KINDS:
            problems.append(f"{d['id']}: unknown kind or language")
        unknown = set(d["expected"]) - set(specs)
        if unknown:
            problems.append(f"{d['id']}: fields not in the {d['kind']} schema: {sorted(unknown)}")
        exp = expected_of(d)
        missing_required = [s.name for s in specs.values() if s.required and s.name not in exp]
        if missing_required and any(v is not None for v in exp.values()):
            problems.append(f"{d['id']}: required {missing_required} left out but other fields present")
        flat = " ".join(d["text"].split())
        printed = numbers_in(d["text"])
        for name, value in exp.items():
            s = specs[name]
            if not s.required:
                optional_slots += 1
                absent_slots += value is None
            if value is None:
                continue
            if s.kind == "money":
                if not any(abs(n - parse_number(value)) < 0.005 for n in printed):  # type: ignore[operator]
                    problems.append(f"{d['id']}: {name}={value!r} is not a number the text prints")
            elif d["kind"] in GROUNDED_KINDS and " ".join(str(value).split()) not in flat:
                problems.append(f"{d['id']}: {name}={value!r} does not occur in the text")
            if s.kind == "date" and not date_keys(value):
                problems.append(f"{d['id']}: {name}={value!r} does not parse as a date")
            if s.kind == "time" and time_key(value) is None:
                problems.append(f"{d['id']}: {name}={value!r} does not parse as a time")
        for variant in variants_for(d, VARIANTS):
            schema = schema_for(d["kind"], variant)
            for name, value in exp.items():
                fi = schema.model_fields[name]
                ann = Annotated[(fi.annotation, *fi.metadata)] if fi.metadata else fi.annotation
                try:
                    TypeAdapter(ann).validate_python(value)
                except ValidationError as exc:
                    problems.append(f"{d['id']} [{variant}]: {name}={value!r} invalid: {exc.errors()[0]['msg']}")
            if missing_required:
                continue
            try:
                obj = schema.model_validate({schema.model_fields[k].alias or k: v for k, v in exp.items()})
            except ValidationError as exc:
                problems.append(f"{d['id']} [{variant}]: expected object invalid: {exc.errors()[0]['msg']}")
                continue
            wrong = [k for k, f in score(d, obj.model_dump()).items() if not f["right"]]
            if wrong:
                problems.append(f"{d['id']} [{variant}]: the expected object itself scores wrong on {wrong}")
    for half in HALVES:
        for kind in {d["kind"] for d in docs}:
            for lang in {d["lang"] for d in docs if d["kind"] == kind}:
                if not any(d["half"] == half and d["kind"] == kind and d["lang"] == lang for d in docs):
                    problems.append(f"half {half} has no {kind} document in {lang}")
    own = [d for d in docs if d["kind"] != "sroie"]
    zh_share = sum(d["lang"] == "zh" for d in docs) / len(docs)
    absent_share = absent_slots / max(optional_slots, 1)
    if len(own) < 100:
        problems.append(f"only {len(own)} written documents")
    if zh_share < 0.35:
        problems.append(f"Chinese share {zh_share:.0%} < 35%")
    if absent_share < 0.30:
        problems.append(f"absent optional slots {absent_share:.0%} < 30%")
    print(summary(docs, optional_slots, absent_slots))
    for p in problems:
        print("PROBLEM:", p)
    print("check:", "OK" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


def summary(docs: list[dict[str, Any]], optional_slots: int, absent_slots: int) -> str:
    lines = ["| kind | en | zh | dev | test | variants run |", "|---|---|---|---|---|---|"]
    for kind in KINDS:
        ds = [d for d in docs if d["kind"] == kind]
        if not ds:
            continue
        n = {key: sum(d["lang"] == key or d["half"] == key for d in ds) for key in (*LANGS, *HALVES)}
        vs = sorted({v for d in ds for v in variants_for(d, VARIANTS)}, key=VARIANTS.index)
        lines.append(f"| {kind} | {n['en']} | {n['zh']} | {n['dev']} | {n['test']} | {', '.join(vs)} |")
    runs = {v: sum(v in variants_for(d, VARIANTS) for d in docs) for v in VARIANTS}
    zh = sum(d["lang"] == "zh" for d in docs)
    lines += [
        "",
        f"{len(docs)} documents ({len(docs) - sum(d['kind'] == 'sroie' for d in docs)} written, "
        f"{sum(d['kind'] == 'sroie' for d in docs)} SROIE), {zh} Chinese ({zh / len(docs):.0%}); "
        f"documents per variant: " + ", ".join(f"{v} {n}" for v, n in runs.items()),
        f"optional field slots: {optional_slots}, absent (expected None): {absent_slots} "
        f"({absent_slots / max(optional_slots, 1):.0%}); present field slots: "
        f"{sum(v is not None for d in docs for v in expected_of(d).values())}",
    ]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------


def report_from_details(paths: Sequence[Path], out: Path | None) -> int:
    """The tables of several ``--details`` files side by side, rebuilt from their records (each
    file's systems keep their names; use ``--label`` to tell two runs of ours apart)."""
    docs = {d["id"]: d for d in all_docs()}
    runs: list[Run] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            run = Run(r["system"], r["variant"], docs[r["id"]], r["seconds"], r["returned"], r["error"])
            run.fields = r["fields"]
            runs.append(run)
    systems = list(dict.fromkeys(r.system for r in runs))
    halves = [h for h in HALVES if any(r.doc["half"] == h for r in runs)]
    variants = [v for v in VARIANTS if any(r.variant == v for r in runs)]
    report = tables(runs, systems, halves, variants)
    print(report)
    if out:
        sources = ", ".join(f"`{p.name}`" for p in paths)
        header = (
            "# Extraction in the wild\n\n"
            f"Rebuilt on {time.strftime('%Y-%m-%d')} from the per-run records {sources} "
            f"(`python bench/extract_wild.py --from-details ...`).\n\n"
        )
        out.write_text(header + report + "\n", encoding="utf-8")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="validate the data without a model and exit")
    ap.add_argument("--n", type=int, default=None, help="at most this many documents, spread over kinds and halves")
    ap.add_argument("--half", choices=("dev", "test", "all"), default="all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: " + ", ".join(SYSTEMS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=None, help="the Markdown report (e.g. bench/extract_wild.md)")
    ap.add_argument("--details", type=Path, default=None, help="per-document JSONL: one line per system, variant, doc")
    ap.add_argument(
        "--label", default="ours", help="name the ours system (e.g. ours-main for a run of another checkout)"
    )
    ap.add_argument(
        "--from-details",
        type=Path,
        nargs="+",
        default=None,
        help="print the tables of earlier --details files side by side (no model); with --out, write them",
    )
    args = ap.parse_args()
    if args.check:
        return check()
    if args.from_details:
        return report_from_details(args.from_details, args.out)
    systems = [s for s in args.systems.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    for name, got, allowed in (("system", systems, SYSTEMS), ("variant", variants, VARIANTS)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            ap.error(f"unknown {name}(s) {bad}; choose from {', '.join(allowed)}")
    halves = list(HALVES) if args.half == "all" else [args.half]
    docs = interleaved([d for d in all_docs() if d["half"] in halves])
    if args.n is not None:
        docs = docs[: args.n]
    if not SROIE.is_file():
        print(f"no {SROIE}: the sroie kind is left out", file=sys.stderr)

    from pocket_agent.runtime import default_model_path, load_model

    model = load_model(default_model_path(), threads=args.threads)
    makers: dict[str, Callable[[], Extractor]] = {
        "ours": lambda: make_ours(model),
        "llamacpp": lambda: make_llamacpp(args.threads),
        "outlines": lambda: make_outlines(args.threads, model),
    }
    extractors: dict[str, Extractor] = {}
    not_run: dict[str, str] = {}
    for s in systems:
        try:
            extractors[s] = makers[s]()
            run_one(s, extractors[s], docs[0], variants_for(docs[0], variants)[0])  # warm-up, untimed
        except Exception as exc:  # a peer that is not installed leaves the others' rows
            not_run[s] = f"{type(exc).__name__}: {exc}"
            print(f"{s} cannot run: {not_run[s]}", file=sys.stderr)
            extractors.pop(s, None)
    systems = [s for s in systems if s in extractors]
    jobs = [(d, v) for d in docs for v in variants_for(d, variants)]
    runs: list[Run] = []
    details = args.details.open("w", encoding="utf-8") if args.details else None
    t_start = time.perf_counter()
    try:
        for i, (doc, variant) in enumerate(jobs):
            order = systems[i % len(systems) :] + systems[: i % len(systems)]  # a busy spell falls on all alike
            for s in order:
                run = run_one(s, extractors[s], doc, variant)
                if s == "ours" and args.label != "ours":
                    run.system = args.label
                runs.append(run)
                if details:
                    details.write(json.dumps(run.record(), ensure_ascii=False) + "\n")
                    details.flush()
            print(f"\r{i + 1}/{len(jobs)} runs of each system", end="", file=sys.stderr, flush=True)
    finally:
        print(file=sys.stderr)
        if details:
            details.close()
    systems = [args.label if s == "ours" else s for s in systems]
    report = tables(runs, systems, halves, variants)
    print(report)
    errors: dict[str, dict[str, int]] = {}
    for r in runs:
        if r.error:
            kind = r.error.split(":")[0]
            errors.setdefault(r.system, {}).setdefault(kind, 0)
            errors[r.system][kind] += 1
    notes = [f"- {s}: errors {dict(sorted(e.items()))}" for s, e in errors.items()]
    notes += [f"- {s} not run: {why}" for s, why in not_run.items()]
    if notes:
        print("\n".join(notes))
    if args.out:
        n_docs = len(docs)
        cmd = " ".join(["python bench/extract_wild.py", *sys.argv[1:]])
        args.out.write_text(
            "# Extraction in the wild\n\n"
            f"Generated by `{cmd}` on {time.strftime('%Y-%m-%d')} at commit {git_commit()}, "
            f"{statistics.mean(r.seconds for r in runs) if runs else 0:.2f} s per run on average, "
            f"{time.perf_counter() - t_start:.0f} s in all.\n\n"
            f"- Machine: {cpu_model()}; {args.threads} thread(s) for every system; shared and noisy, so compare "
            "rows of one run (the systems take turns on each document, the order rotating).\n"
            f"- Python {platform.python_version()}; "
            + package_versions(("pocket-agent-mnn", "llama-cpp-python", "llguidance", "outlines", "pydantic"))
            + "\n"
            f"- Model: {default_model_path().name} (the embedded SmolLM2-135M-Instruct), greedy, max_tokens "
            f"{MAX_TOKENS}, the same chat prompt for all (pocket_agent's build_messages). ours: "
            "`extract(text, Model, model=load_model(default_model_path(), threads=N))`, the extraction adapter "
            "applied at run time.\n"
            f"- Data: {n_docs} documents (halves: {', '.join(halves)}; bench/extract_wild_docs.py and the last "
            f"{SROIE_DOCS} SROIE receipts), variants {', '.join(variants)}; the module docstring of "
            "bench/extract_wild.py describes data, halves and scoring.\n\n" + report + "\n" + "\n".join(notes) + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
