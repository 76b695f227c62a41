"""Tasks and tools of ``bench/agent_e2e.py``: agents used as a user would use them.

Tool sets are plain typed Python functions with docstrings over fixed tables (no network,
no clock: "now" is :data:`NOW`), eleven sets of two or three tools each, so picking the
tool by its description matters (the currency set also holds ``calculate``; units has one
converter per dimension). A tool that gets an unknown entity or an invalid value raises
(``ValueError``, ``KeyError``, ``ZeroDivisionError``), which the agents see as an error result.

Tools accept the names a user would write, English or Chinese ("USD", "dollars", "美元";
"Tokyo", "东京"; "2024-03-01", "2024年3月1日"), through the resolvers below; an argument is
right when the tool's own resolver maps it to the expected entity (:class:`Alias`), so
"arguments right" means "the tool understood what was asked".

Each :class:`Task` has an ``id``, a language (``en``/``zh``), a tool set, the user's text,
a kind (``single``: one call; ``multi``: two calls, either independent or the second using
the first's result; ``chitchat``: no call; ``error``: the call is right but the tool
raises), the expected calls in order (arguments: a value, a list of acceptable values,
:class:`Alias`, :class:`Date` or :class:`Expr`; strings compare case-insensitively after
trimming and NFKC, numbers within :func:`close`) and what the final answer must state
(:class:`Num`, :class:`Text`, :class:`Failed`, :class:`NonEmpty`; all must hold).

``check()`` validates the data without a model (``python bench/agent_e2e.py --check``).
"""

from __future__ import annotations

import ast
import datetime as dt
import operator
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# --- normalisation ------------------------------------------------------------------------------


def key(text: str) -> str:
    """``text`` as compared: NFKC, lower case, surrounding quotes/punctuation trimmed, spaces collapsed."""
    s = unicodedata.normalize("NFKC", str(text)).lower()
    s = " ".join(s.split())
    return s.strip(" \"'“”‘’「」『』《》.,;:!?。，；：！？")


def close(value: float, expected: float) -> bool:
    """Numbers agree: within 0.006 (2-decimal rounding) or 0.05% of ``expected``."""
    return abs(float(value) - float(expected)) <= max(0.006, 0.0005 * abs(float(expected)))


def _table(entries: dict[str, Sequence[str]]) -> dict[str, str]:
    """``{canonical: aliases}`` as ``{key(alias): canonical}`` (the canonical name is an alias too)."""
    out: dict[str, str] = {}
    for canonical, aliases in entries.items():
        for alias in (canonical, *aliases):
            out[key(alias)] = canonical
    return out


def _lookup(table: dict[str, str], text: str, what: str) -> str:
    k = key(text)
    if k not in table:
        raise ValueError(f"unknown {what}: {text!r}")
    return table[k]


# --- calculator ---------------------------------------------------------------------------------

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float:
    """An arithmetic expression's value (numbers, + - * / // % ** and parentheses; × ÷ ^ accepted)."""
    s = unicodedata.normalize("NFKC", expression)
    s = s.replace("×", "*").replace("÷", "/").replace("^", "**").strip().rstrip("=?？ ")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return float(_OPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](ev(node.operand)))
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    try:
        tree = ast.parse(s, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return ev(tree)


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: the arithmetic expression, e.g. "17 * 23" or "(4 + 6) / 2".
    """
    return round(evaluate(expression), 6)


def percent_of(percent: float, value: float) -> float:
    """Compute a percentage of a value (15 percent of 80 is 12).

    Args:
        percent: the percentage, e.g. 15 for 15%.
        value: the value to take the percentage of.
    """
    return round(percent * value / 100, 6)


# --- currency -----------------------------------------------------------------------------------

RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 150.0, "CNY": 7.2, "CHF": 0.88, "CAD": 1.36, "AUD": 1.52}
CURRENCIES = _table(
    {
        "USD": ["dollar", "dollars", "us dollar", "us dollars", "$", "美元", "美金"],
        "EUR": ["euro", "euros", "€", "欧元"],
        "GBP": ["pound", "pounds", "british pound", "british pounds", "pound sterling", "£", "英镑"],
        "JPY": ["yen", "japanese yen", "日元", "日币"],
        "CNY": ["rmb", "yuan", "renminbi", "chinese yuan", "人民币", "元"],
        "CHF": ["swiss franc", "swiss francs", "franc", "francs", "瑞士法郎"],
        "CAD": ["canadian dollar", "canadian dollars", "加元", "加拿大元"],
        "AUD": ["australian dollar", "australian dollars", "澳元"],
    }
)


def currency_code(name: str) -> str:
    """The ISO code of a currency name or code ("dollars", "美元" -> "USD")."""
    return _lookup(CURRENCIES, name, "currency")


def convert_currency(amount: float, src: str, dst: str) -> float:
    """Convert an amount of money from one currency to another at today's rate.

    Args:
        amount: the amount of money in the source currency.
        src: the source currency, e.g. "USD".
        dst: the target currency, e.g. "EUR".
    """
    return round(amount / RATES[currency_code(src)] * RATES[currency_code(dst)], 2)


def exchange_rate(src: str, dst: str) -> float:
    """Get today's exchange rate: how much one unit of the source currency is worth in the target currency.

    Args:
        src: the source currency, e.g. "GBP".
        dst: the target currency, e.g. "USD".
    """
    return round(RATES[currency_code(dst)] / RATES[currency_code(src)], 4)


# --- cities: weather and time zones -------------------------------------------------------------

CITIES = _table(
    {
        "Paris": ["巴黎"],
        "London": ["伦敦"],
        "Tokyo": ["东京"],
        "New York": ["new york city", "nyc", "纽约"],
        "Beijing": ["peking", "北京"],
        "Shanghai": ["上海"],
        "Sydney": ["悉尼"],
        "Berlin": ["柏林"],
        "Moscow": ["莫斯科"],
        "Cairo": ["开罗"],
        "Los Angeles": ["la", "洛杉矶"],
        "Dubai": ["迪拜"],
        "Mumbai": ["bombay", "孟买"],
    }
)
WEATHER = {
    "Paris": (18, "cloudy", 70),
    "London": (14, "rainy", 82),
    "Tokyo": (22, "sunny", 60),
    "New York": (25, "sunny", 55),
    "Beijing": (27, "hazy", 40),
    "Shanghai": (24, "light rain", 85),
    "Sydney": (16, "windy", 65),
    "Berlin": (15, "cloudy", 72),
    "Moscow": (5, "snowy", 78),
    "Cairo": (33, "sunny", 20),
}
UTC_OFFSETS = {
    "London": 1.0,
    "Paris": 2.0,
    "Berlin": 2.0,
    "Moscow": 3.0,
    "Cairo": 3.0,
    "Dubai": 4.0,
    "Mumbai": 5.5,
    "Beijing": 8.0,
    "Shanghai": 8.0,
    "Tokyo": 9.0,
    "Sydney": 10.0,
    "New York": -4.0,
    "Los Angeles": -7.0,
}
NOW = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.timezone.utc)


def city_name(name: str) -> str:
    """The canonical name of a known city ("东京" -> "Tokyo")."""
    return _lookup(CITIES, name, "city")


def get_weather(city: str) -> dict[str, Any]:
    """Get the current weather in a city: temperature in degrees Celsius and conditions.

    Args:
        city: the city name, e.g. "Paris".
    """
    name = city_name(city)
    if name not in WEATHER:
        raise ValueError(f"no weather data for {city!r}")
    temp, condition, _ = WEATHER[name]
    return {"city": name, "temperature_c": temp, "condition": condition}


def get_humidity(city: str) -> int:
    """Get the current relative humidity in a city, in percent.

    Args:
        city: the city name, e.g. "London".
    """
    name = city_name(city)
    if name not in WEATHER:
        raise ValueError(f"no weather data for {city!r}")
    return WEATHER[name][2]


def current_time(city: str) -> str:
    """Get the current local time in a city as HH:MM (24-hour clock).

    Args:
        city: the city name, e.g. "Tokyo".
    """
    name = city_name(city)
    local = NOW + dt.timedelta(hours=UTC_OFFSETS[name])
    return local.strftime("%H:%M")


def time_difference(city_a: str, city_b: str) -> float:
    """Get how many hours the local time of city_b is ahead of city_a (negative when behind).

    Args:
        city_a: the first city, e.g. "London".
        city_b: the second city, e.g. "New York".
    """
    return UTC_OFFSETS[city_name(city_b)] - UTC_OFFSETS[city_name(city_a)]


# --- geography ----------------------------------------------------------------------------------

COUNTRIES = _table(
    {
        "France": ["法国"],
        "Germany": ["德国"],
        "Japan": ["日本"],
        "China": ["中国"],
        "Italy": ["意大利"],
        "Spain": ["西班牙"],
        "Canada": ["加拿大"],
        "Australia": ["澳大利亚", "澳洲"],
        "Brazil": ["巴西"],
        "Egypt": ["埃及"],
        "India": ["印度"],
        "Kenya": ["肯尼亚"],
    }
)
CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "China": "Beijing",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Brazil": "Brasilia",
    "Egypt": "Cairo",
    "India": "New Delhi",
    "Kenya": "Nairobi",
}
POPULATION_M = {
    "France": 68.2,
    "Germany": 84.5,
    "Japan": 124.5,
    "China": 1410.0,
    "Italy": 59.0,
    "Spain": 48.6,
    "Canada": 40.1,
    "Australia": 26.6,
    "Brazil": 216.4,
    "Egypt": 112.7,
    "India": 1428.6,
    "Kenya": 55.1,
}


def country_name(name: str) -> str:
    """The canonical name of a known country ("法国" -> "France")."""
    return _lookup(COUNTRIES, name, "country")


def capital_of(country: str) -> str:
    """Get the capital city of a country.

    Args:
        country: the country name, e.g. "France".
    """
    return CAPITALS[country_name(country)]


def population_of(country: str) -> float:
    """Get the population of a country, in millions of people.

    Args:
        country: the country name, e.g. "Japan".
    """
    return POPULATION_M[country_name(country)]


# --- units --------------------------------------------------------------------------------------

LENGTH_M = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mm": 0.001, "mi": 1609.344, "ft": 0.3048, "in": 0.0254, "yd": 0.9144}
LENGTHS = _table(
    {
        "m": ["meter", "meters", "metre", "metres", "米"],
        "km": ["kilometer", "kilometers", "kilometre", "kilometres", "公里", "千米"],
        "cm": ["centimeter", "centimeters", "centimetre", "centimetres", "厘米"],
        "mm": ["millimeter", "millimeters", "millimetre", "millimetres", "毫米"],
        "mi": ["mile", "miles", "英里"],
        "ft": ["foot", "feet", "英尺"],
        "in": ["inch", "inches", "英寸"],
        "yd": ["yard", "yards", "码"],
    }
)
WEIGHT_KG = {"kg": 1.0, "g": 0.001, "lb": 0.45359237, "oz": 0.028349523125}
WEIGHTS = _table(
    {
        "kg": ["kilogram", "kilograms", "kilo", "kilos", "公斤", "千克"],
        "g": ["gram", "grams", "克"],
        "lb": ["lbs", "pound", "pounds", "磅"],
        "oz": ["ounce", "ounces", "盎司"],
    }
)
TEMPERATURES = _table(
    {
        "C": ["celsius", "°c", "degrees celsius", "centigrade", "摄氏度", "摄氏"],
        "F": ["fahrenheit", "°f", "degrees fahrenheit", "华氏度", "华氏"],
        "K": ["kelvin", "kelvins", "开尔文"],
    }
)


def length_unit(name: str) -> str:
    return _lookup(LENGTHS, name, "length unit")


def weight_unit(name: str) -> str:
    return _lookup(WEIGHTS, name, "weight unit")


def temperature_unit(name: str) -> str:
    return _lookup(TEMPERATURES, name, "temperature unit")


def convert_length(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a length or distance between units (m, km, cm, mm, miles, feet, inches, yards).

    Args:
        value: the length in the source unit.
        from_unit: the source unit, e.g. "km".
        to_unit: the target unit, e.g. "miles".
    """
    return round(value * LENGTH_M[length_unit(from_unit)] / LENGTH_M[length_unit(to_unit)], 4)


def convert_weight(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a weight or mass between units (kg, g, pounds, ounces).

    Args:
        value: the weight in the source unit.
        from_unit: the source unit, e.g. "kg".
        to_unit: the target unit, e.g. "pounds".
    """
    return round(value * WEIGHT_KG[weight_unit(from_unit)] / WEIGHT_KG[weight_unit(to_unit)], 4)


def convert_temperature(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a temperature between Celsius, Fahrenheit and Kelvin.

    Args:
        value: the temperature in the source unit.
        from_unit: the source unit, e.g. "Celsius".
        to_unit: the target unit, e.g. "Fahrenheit".
    """
    src, dst = temperature_unit(from_unit), temperature_unit(to_unit)
    celsius = {"C": value, "F": (value - 32) * 5 / 9, "K": value - 273.15}[src]
    out = {"C": celsius, "F": celsius * 9 / 5 + 32, "K": celsius + 273.15}[dst]
    return round(out, 4)


# --- calendar -----------------------------------------------------------------------------------

_DATE_FORMATS = ("%Y-%m-%d", "%Y/%m/%d", "%Y.%m.%d", "%Y年%m月%d日", "%Y年%m月%d号", "%B %d, %Y", "%d %B %Y")
WEEKDAYS_ZH = ["星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"]


def parse_date(text: str) -> dt.date:
    """A date written as 2024-03-01, 2024/03/01, 2024年3月1日 or March 1, 2024."""
    s = unicodedata.normalize("NFKC", str(text)).strip()
    for fmt in _DATE_FORMATS:
        try:
            return dt.datetime.strptime(s, fmt).date()
        except ValueError:
            continue
    raise ValueError(f"not a valid date: {text!r}")


def days_between(start: str, end: str) -> int:
    """Count the days from a start date to an end date (dates as YYYY-MM-DD).

    Args:
        start: the start date, e.g. "2024-01-01".
        end: the end date, e.g. "2024-03-01".
    """
    return (parse_date(end) - parse_date(start)).days


def add_days(date: str, days: int) -> str:
    """Get the date a number of days after a given date (YYYY-MM-DD; negative days go back).

    Args:
        date: the starting date, e.g. "2024-02-10".
        days: how many days to add.
    """
    return (parse_date(date) + dt.timedelta(days=days)).isoformat()


def weekday_of(date: str) -> str:
    """Get the day of the week of a date (YYYY-MM-DD), e.g. "Monday".

    Args:
        date: the date, e.g. "2000-01-01".
    """
    return parse_date(date).strftime("%A")


# --- notes --------------------------------------------------------------------------------------

NOTES = {
    "shopping": "milk, eggs, bread, coffee",
    "meeting": "Project sync on Friday at 10:00 with Dana and Lee.",
    "wifi": "Network: HomeNet, password: sunflower42",
    "books": "To read: Dune, Neuromancer, The Three-Body Problem",
    "购物": "苹果、牛奶、面包",
    "待办": "交电费，预约牙医，给妈妈打电话",
}


def note_name(name: str) -> str:
    """The stored note a name refers to ("Shopping note", "购物笔记" -> its name)."""
    k = key(name)
    k = re.sub(r"^(my |the )", "", k)
    k = re.sub(r"( notes?|笔记|的笔记)$", "", k).strip()
    for stored in NOTES:
        if key(stored) == k:
            return stored
    raise FileNotFoundError(f"no note named {name!r}")


def list_notes() -> list[str]:
    """List the names of all saved notes."""
    return list(NOTES)


def read_note(name: str) -> str:
    """Read the text of a saved note.

    Args:
        name: the note's name, e.g. "shopping".
    """
    return NOTES[note_name(name)]


# --- contacts -----------------------------------------------------------------------------------

CONTACTS = {
    "Alice Chen": ("alice@example.com", "+1-555-0101", []),
    "Bob Smith": ("bob.smith@example.com", "+1-555-0102", []),
    "Dana Lee": ("dana.lee@example.com", "+1-555-0103", []),
    "Carlos Diaz": ("carlos@example.org", "+34-600-123-456", []),
    "王伟": ("wangwei@example.cn", "+86-139-0000-5678", ["wang wei", "王伟先生"]),
    "李娜": ("lina@example.cn", "+86-138-0000-1234", ["li na", "李娜女士"]),
}
PEOPLE = _table(
    {
        name: [*aliases, *([name.split()[0]] if " " in name and name.isascii() else [])]
        for name, (_, _, aliases) in CONTACTS.items()
    }
)


def person(name: str) -> str:
    """The contact a name refers to (full name, first name, or "Alice's")."""
    k = re.sub(r"('s|’s|的)$", "", key(name)).strip()
    if k not in PEOPLE:
        raise ValueError(f"no contact named {name!r}")
    return PEOPLE[k]


def find_email(name: str) -> str:
    """Look up the email address of a contact.

    Args:
        name: the contact's name, e.g. "Alice".
    """
    return CONTACTS[person(name)][0]


def find_phone(name: str) -> str:
    """Look up the phone number of a contact.

    Args:
        name: the contact's name, e.g. "Bob Smith".
    """
    return CONTACTS[person(name)][1]


def send_email(to: str, subject: str, body: str) -> str:
    """Send an email.

    Args:
        to: the recipient's email address.
        subject: the subject line.
        body: the message text.
    """
    address = key(to)
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", address):
        raise ValueError(f"not an email address: {to!r}")
    return f"Email sent to {address} (subject: {subject})."


# --- stocks -------------------------------------------------------------------------------------

STOCKS = {
    "AAPL": (189.5, 1.2),
    "MSFT": (415.2, -0.4),
    "GOOGL": (142.3, 0.8),
    "TSLA": (175.8, -3.1),
    "NVDA": (880.1, 2.7),
    "AMZN": (178.25, 0.5),
    "BABA": (72.4, -1.6),
}
TICKERS = _table(
    {
        "AAPL": ["apple", "apple inc", "苹果", "苹果公司"],
        "MSFT": ["microsoft", "微软"],
        "GOOGL": ["google", "alphabet", "goog", "谷歌"],
        "TSLA": ["tesla", "特斯拉"],
        "NVDA": ["nvidia", "英伟达"],
        "AMZN": ["amazon", "亚马逊"],
        "BABA": ["alibaba", "阿里巴巴"],
    }
)


def ticker(name: str) -> str:
    """The ticker of a listed company's name or ticker ("Tesla" -> "TSLA")."""
    return _lookup(TICKERS, name, "stock")


def stock_price(symbol: str) -> float:
    """Get the latest share price of a stock, in US dollars.

    Args:
        symbol: the stock's ticker symbol or company name, e.g. "AAPL".
    """
    return STOCKS[ticker(symbol)][0]


def price_change(symbol: str) -> float:
    """Get how much a stock's price moved today, in percent (negative when it fell).

    Args:
        symbol: the stock's ticker symbol or company name, e.g. "TSLA".
    """
    return STOCKS[ticker(symbol)][1]


# --- dictionary ---------------------------------------------------------------------------------

LANGUAGES = _table(
    {
        "en": ["english", "英语", "英文"],
        "fr": ["french", "法语", "法文"],
        "es": ["spanish", "西班牙语", "西班牙文"],
        "de": ["german", "德语", "德文"],
        "zh": ["chinese", "mandarin", "中文", "汉语"],
        "ja": ["japanese", "日语", "日文"],
    }
)
WORDS = [
    {"en": "apple", "fr": "pomme", "es": "manzana", "de": "Apfel", "zh": "苹果", "ja": "りんご"},
    {"en": "water", "fr": "eau", "es": "agua", "de": "Wasser", "zh": "水", "ja": "水"},
    {"en": "book", "fr": "livre", "es": "libro", "de": "Buch", "zh": "书", "ja": "本"},
    {"en": "cat", "fr": "chat", "es": "gato", "de": "Katze", "zh": "猫", "ja": "猫"},
    {"en": "friend", "fr": "ami", "es": "amigo", "de": "Freund", "zh": "朋友", "ja": "友達"},
    {"en": "hello", "fr": "bonjour", "es": "hola", "de": "Hallo", "zh": "你好", "ja": "こんにちは"},
    {"en": "thank you", "fr": "merci", "es": "gracias", "de": "danke", "zh": "谢谢", "ja": "ありがとう"},
]
DEFINITIONS = {
    "ephemeral": "lasting for a very short time",
    "ubiquitous": "present, appearing or found everywhere",
    "serendipity": "the chance finding of something good that you were not looking for",
    "benevolent": "kind and meaning to do good",
}


def language_code(name: str) -> str:
    """The code of a language name ("法语", "French" -> "fr")."""
    return _lookup(LANGUAGES, name, "language")


def word_entry(word: str) -> dict[str, str]:
    """The dictionary entry holding ``word`` in any language."""
    k = key(word)
    for entry in WORDS:
        if any(key(w) == k for w in entry.values()):
            return entry
    raise ValueError(f"word not in the dictionary: {word!r}")


def translate_word(word: str, target_language: str) -> str:
    """Translate a single word into another language using the dictionary.

    Args:
        word: the word to translate, in any language, e.g. "apple".
        target_language: the language to translate into, e.g. "French".
    """
    code = language_code(target_language)
    return word_entry(word)[code]


def define_word(word: str) -> str:
    """Look up the meaning of an English word.

    Args:
        word: the English word, e.g. "ephemeral".
    """
    k = key(word)
    if k not in DEFINITIONS:
        raise ValueError(f"no definition for {word!r}")
    return DEFINITIONS[k]


# --- tool sets ----------------------------------------------------------------------------------

TOOLSETS: dict[str, list[Callable[..., Any]]] = {
    "calculator": [calculate, percent_of],
    "currency": [convert_currency, exchange_rate, calculate],
    "weather": [get_weather, get_humidity],
    "geography": [capital_of, population_of],
    "units": [convert_length, convert_weight, convert_temperature],
    "calendar": [days_between, add_days, weekday_of],
    "notes": [list_notes, read_note],
    "contacts": [find_email, find_phone, send_email],
    "stocks": [stock_price, price_change],
    "dictionary": [translate_word, define_word],
    "timezone": [current_time, time_difference],
}

# --- argument matchers ----------------------------------------------------------------------------

RESOLVERS: dict[str, Callable[[str], Any]] = {
    "currency": currency_code,
    "city": city_name,
    "country": country_name,
    "length": length_unit,
    "weight": weight_unit,
    "temperature": temperature_unit,
    "note": note_name,
    "person": person,
    "ticker": ticker,
    "language": language_code,
    "word": lambda w: word_entry(w)["en"],
}


@dataclass(frozen=True)
class Alias:
    """A string the tool's resolver ``kind`` maps to ``canonical`` ("美元" for USD)."""

    kind: str
    canonical: str

    def matches(self, value: Any) -> bool:
        if not isinstance(value, str):
            return False
        try:
            return bool(RESOLVERS[self.kind](value) == self.canonical)
        except (ValueError, KeyError, FileNotFoundError):
            return False

    def example(self) -> str:
        return self.canonical


@dataclass(frozen=True)
class Date:
    """A date string that :func:`parse_date` reads as ``iso``."""

    iso: str

    def matches(self, value: Any) -> bool:
        try:
            return isinstance(value, str) and parse_date(value).isoformat() == self.iso
        except ValueError:
            return False

    def example(self) -> str:
        return self.iso


@dataclass(frozen=True)
class Expr:
    """An arithmetic expression whose value is ``value`` (``text`` is one such expression)."""

    value: float
    text: str

    def matches(self, value: Any) -> bool:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return close(value, self.value)
        try:
            return isinstance(value, str) and close(evaluate(value), self.value)
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            return False

    def example(self) -> str:
        return self.text


def value_matches(value: Any, expected: Any) -> bool:
    """One argument value against one expected value (a matcher, a number or a string)."""
    if hasattr(expected, "matches"):
        return bool(expected.matches(value))
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(value, str):
            try:
                value = float(value.replace(",", ""))
            except ValueError:
                return False
        return isinstance(value, (int, float)) and not isinstance(value, bool) and close(value, expected)
    if isinstance(expected, str):
        return isinstance(value, str) and key(value) == key(expected)
    return bool(value == expected)


def argument_matches(value: Any, expected: Any) -> bool:
    """``expected`` is one acceptable value or a list of them."""
    options = expected if isinstance(expected, list) else [expected]
    return any(value_matches(value, o) for o in options)


def example_value(expected: Any) -> Any:
    """A concrete value the expectation accepts (its first option)."""
    first = expected[0] if isinstance(expected, list) else expected
    return first.example() if hasattr(first, "example") else first


# --- answer requirements --------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\d.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")

FAILURE_CUES = (
    "sorry",
    "unable",
    "can't",
    "cannot",
    "can not",
    "couldn't",
    "could not",
    "not found",
    "no data",
    "not available",
    "unavailable",
    "unknown",
    "not known",
    "not recognized",
    "invalid",
    "not valid",
    "error",
    "failed",
    "fail",
    "don't have",
    "do not have",
    "doesn't exist",
    "does not exist",
    "not exist",
    "no such",
    "not a ",
    "抱歉",
    "对不起",
    "无法",
    "不能",
    "没有",
    "未找到",
    "找不到",
    "不存在",
    "错误",
    "失败",
    "不支持",
    "未知",
    "无效",
)


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text`` (NFKC first; thousands separators and signs read)."""
    s = unicodedata.normalize("NFKC", text)
    return [float(m.group(0).replace(",", "").replace("−", "-")) for m in _NUMBER.finditer(s)]


@dataclass(frozen=True)
class Num:
    """The answer writes ``value`` (any number in it agrees by :func:`close`; signs ignored:
    "fell 3.1%" states -3.1)."""

    value: float

    def holds(self, answer: str, task: Task, tool_texts: Sequence[str]) -> bool:
        return any(close(abs(n), abs(self.value)) for n in numbers_in(answer))

    def check_source(self, tool_texts: Sequence[str]) -> bool:
        return any(close(abs(n), abs(self.value)) for t in tool_texts for n in numbers_in(t))


@dataclass(frozen=True)
class Text:
    """The answer contains one of ``options`` (case-insensitive; ASCII words whole)."""

    options: tuple[str, ...]

    def holds(self, answer: str, task: Task, tool_texts: Sequence[str]) -> bool:
        return any(contains(answer, o) for o in self.options)

    def check_source(self, tool_texts: Sequence[str]) -> bool:
        return any(contains(t, o) for t in tool_texts for o in self.options)


@dataclass(frozen=True)
class Failed:
    """The tool failed: the answer signals failure (one of :data:`FAILURE_CUES`) and writes no
    number that neither the task nor an error message wrote (no invented value)."""

    def holds(self, answer: str, task: Task, tool_texts: Sequence[str]) -> bool:
        if not answer.strip():
            return False
        low = unicodedata.normalize("NFKC", answer).lower().replace("’", "'")
        if not any(cue in low for cue in FAILURE_CUES):
            return False
        allowed = [abs(n) for src in (task.text, *tool_texts) for n in numbers_in(src)]
        return all(any(close(abs(n), a) for a in allowed) for n in numbers_in(answer))

    def check_source(self, tool_texts: Sequence[str]) -> bool:
        return True


@dataclass(frozen=True)
class NonEmpty:
    """Chit-chat: any non-empty answer."""

    def holds(self, answer: str, task: Task, tool_texts: Sequence[str]) -> bool:
        return bool(answer.strip())

    def check_source(self, tool_texts: Sequence[str]) -> bool:
        return True


Requirement = Num | Text | Failed | NonEmpty


def contains(text: str, option: str) -> bool:
    """``option`` occurs in ``text`` (NFKC, case-insensitive; an ASCII word only as a whole word)."""
    t = unicodedata.normalize("NFKC", text).lower()
    o = unicodedata.normalize("NFKC", option).lower()
    if o.isascii() and re.fullmatch(r"[\w@.+\- :']+", o):
        return re.search(r"(?<![a-z0-9])" + re.escape(o) + r"(?![a-z0-9])", t) is not None
    return o in t


# --- tasks ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """An expected call: the tool's name and ``{argument: expectation}`` (every argument listed)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    id: str
    lang: str
    toolset: str
    kind: str
    text: str
    calls: tuple[Call, ...]
    answer: tuple[Requirement, ...]


KINDS = ("single", "multi", "chitchat", "error")


def C(tool_name: str, /, **args: Any) -> Call:  # noqa: N802 - reads as a constructor in the table
    return Call(tool_name, args)


def cur(code: str) -> Alias:
    return Alias("currency", code)


def city(name: str) -> Alias:
    return Alias("city", name)


def country(name: str) -> Alias:
    return Alias("country", name)


def ticker_of(symbol: str) -> Alias:
    return Alias("ticker", symbol)


def lang_of(code: str) -> Alias:
    return Alias("language", code)


def word(en: str) -> Alias:
    return Alias("word", en)


def who(name: str) -> Alias:
    return Alias("person", name)


def note(name: str) -> Alias:
    return Alias("note", name)


def T(*options: str) -> Text:  # noqa: N802
    return Text(tuple(options))


FAIL = (Failed(),)
CHAT = (NonEmpty(),)
SENT = T("sent", "发送", "已发", "发出")

_ROWS: dict[str, list[tuple[str, str, str, str, list[Call], Sequence[Requirement]]]] = {
    # tool set: [(id, language, kind, user text, expected calls, what the answer states), ...]
    "calculator": [
        ("calc-en-1", "en", "single", "What is 17 * 23?",
         [C("calculate", expression=Expr(391, "17 * 23"))],
         [Num(391)]),
        ("calc-en-2", "en", "single", "Calculate (120 + 80) / 4",
         [C("calculate", expression=Expr(50, "(120 + 80) / 4"))],
         [Num(50)]),
        ("calc-en-3", "en", "single", "What is 15% of 80?",
         [C("percent_of", percent=15, value=80)],
         [Num(12)]),
        ("calc-en-4", "en", "single", "How much is 2.5 * 4.2?",
         [C("calculate", expression=Expr(10.5, "2.5 * 4.2"))],
         [Num(10.5)]),
        ("calc-en-5", "en", "single", "A dinner costs 64 dollars. How much is a 20 percent tip?",
         [C("percent_of", percent=20, value=64)],
         [Num(12.8)]),
        ("calc-zh-1", "zh", "single", "计算 345 + 678",
         [C("calculate", expression=Expr(1023, "345 + 678"))],
         [Num(1023)]),
        ("calc-zh-2", "zh", "single", "200的15%是多少？",
         [C("percent_of", percent=15, value=200)],
         [Num(30)]),
        ("calc-zh-3", "zh", "single", "请算一下 (15 - 3) * 12",
         [C("calculate", expression=Expr(144, "(15 - 3) * 12"))],
         [Num(144)]),
        ("calc-en-err", "en", "error", "Calculate 10 / 0",
         [C("calculate", expression=["10 / 0", "10/0"])],
         FAIL),
        ("calc-en-multi", "en", "multi", "What is 12 * 12, and what is 25% of 360?",
         [C("calculate", expression=Expr(144, "12 * 12")), C("percent_of", percent=25, value=360)],
         [Num(144), Num(90)]),
        ("calc-en-chat", "en", "chitchat", "Thanks, that's all!",
         [],
         CHAT),
        ("calc-en-chat2", "en", "chitchat", "Tell me a joke.",
         [],
         CHAT),
    ],
    "currency": [
        ("cur-en-1", "en", "single", "Convert 100 USD to EUR.",
         [C("convert_currency", amount=100, src=cur("USD"), dst=cur("EUR"))],
         [Num(92)]),
        ("cur-en-2", "en", "single", "How many Japanese yen is 50 US dollars?",
         [C("convert_currency", amount=50, src=cur("USD"), dst=cur("JPY"))],
         [Num(7500)]),
        ("cur-en-3", "en", "single", "What's the exchange rate from GBP to USD?",
         [C("exchange_rate", src=cur("GBP"), dst=cur("USD"))],
         [Num(1.2658)]),
        ("cur-en-4", "en", "single", "I have 250 euros. How much is that in British pounds?",
         [C("convert_currency", amount=250, src=cur("EUR"), dst=cur("GBP"))],
         [Num(214.67)]),
        ("cur-zh-1", "zh", "single", "把100美元换成人民币",
         [C("convert_currency", amount=100, src=cur("USD"), dst=cur("CNY"))],
         [Num(720)]),
        ("cur-zh-2", "zh", "single", "500人民币等于多少日元？",
         [C("convert_currency", amount=500, src=cur("CNY"), dst=cur("JPY"))],
         [Num(10416.67)]),
        ("cur-zh-3", "zh", "single", "欧元兑美元的汇率是多少？",
         [C("exchange_rate", src=cur("EUR"), dst=cur("USD"))],
         [Num(1.087)]),
        ("cur-en-err", "en", "error", "Convert 20 US dollars to Martian credits.",
         [C("convert_currency", amount=20, src=cur("USD"), dst=["Martian credits", "Martian credit", "Martian"])],
         FAIL),
        ("cur-en-multi", "en", "multi", "Convert 200 USD to EUR and then add 50 to the result.",
         [
             C("convert_currency", amount=200, src=cur("USD"), dst=cur("EUR")),
             C("calculate", expression=Expr(234, "184 + 50")),
         ],
         [Num(234)]),
        ("cur-en-multi2", "en", "multi", "How much is 100 EUR in USD, and what is the USD to CHF exchange rate?",
         [
             C("convert_currency", amount=100, src=cur("EUR"), dst=cur("USD")),
             C("exchange_rate", src=cur("USD"), dst=cur("CHF")),
         ],
         [Num(108.7), Num(0.88)]),
        ("cur-zh-multi", "zh", "multi", "先把100美元换成欧元，再把结果换成日元",
         [
             C("convert_currency", amount=100, src=cur("USD"), dst=cur("EUR")),
             C("convert_currency", amount=92, src=cur("EUR"), dst=cur("JPY")),
         ],
         [Num(15000)]),
        ("cur-zh-chat", "zh", "chitchat", "你好！",
         [],
         CHAT),
    ],
    "weather": [
        ("wx-en-1", "en", "single", "What's the weather like in Paris?",
         [C("get_weather", city=city("Paris"))],
         [Num(18)]),
        ("wx-en-2", "en", "single", "Is it raining in London right now?",
         [C("get_weather", city=city("London"))],
         [T("rain", "rainy", "raining", "yes")]),
        ("wx-en-3", "en", "single", "How humid is it in Tokyo?",
         [C("get_humidity", city=city("Tokyo"))],
         [Num(60)]),
        ("wx-en-4", "en", "single", "What's the temperature in New York?",
         [C("get_weather", city=city("New York"))],
         [Num(25)]),
        ("wx-zh-1", "zh", "single", "北京今天天气怎么样？",
         [C("get_weather", city=city("Beijing"))],
         [Num(27)]),
        ("wx-zh-2", "zh", "single", "上海的湿度是多少？",
         [C("get_humidity", city=city("Shanghai"))],
         [Num(85)]),
        ("wx-zh-3", "zh", "single", "东京现在多少度？",
         [C("get_weather", city=city("Tokyo"))],
         [Num(22)]),
        ("wx-en-err", "en", "error", "What's the weather in Atlantis?",
         [C("get_weather", city="Atlantis")],
         FAIL),
        ("wx-zh-err", "zh", "error", "霍格沃茨的天气怎么样？",
         [C("get_weather", city=["霍格沃茨", "Hogwarts"])],
         FAIL),
        ("wx-en-multi", "en", "multi", "What's the temperature in Paris and in Berlin?",
         [C("get_weather", city=city("Paris")), C("get_weather", city=city("Berlin"))],
         [Num(18), Num(15)]),
        ("wx-zh-multi", "zh", "multi", "巴黎和伦敦的气温分别是多少？",
         [C("get_weather", city=city("Paris")), C("get_weather", city=city("London"))],
         [Num(18), Num(14)]),
        ("wx-en-chat", "en", "chitchat", "What's your name?",
         [],
         CHAT),
    ],
    "geography": [
        ("geo-en-1", "en", "single", "What is the capital of Australia?",
         [C("capital_of", country=country("Australia"))],
         [T("Canberra")]),
        ("geo-en-2", "en", "single", "What's the capital of Canada?",
         [C("capital_of", country=country("Canada"))],
         [T("Ottawa")]),
        ("geo-en-3", "en", "single", "How many people live in Japan?",
         [C("population_of", country=country("Japan"))],
         [Num(124.5)]),
        ("geo-en-4", "en", "single", "What is the population of Brazil?",
         [C("population_of", country=country("Brazil"))],
         [Num(216.4)]),
        ("geo-zh-1", "zh", "single", "法国的首都是哪里？",
         [C("capital_of", country=country("France"))],
         [T("Paris", "巴黎")]),
        ("geo-zh-2", "zh", "single", "印度有多少人口？",
         [C("population_of", country=country("India"))],
         [Num(1428.6)]),
        ("geo-zh-3", "zh", "single", "意大利的首都是什么？",
         [C("capital_of", country=country("Italy"))],
         [T("Rome", "罗马")]),
        ("geo-en-err", "en", "error", "What is the capital of Wakanda?",
         [C("capital_of", country="Wakanda")],
         FAIL),
        ("geo-en-multi", "en", "multi", "What is the capital of Kenya and what is its population?",
         [C("capital_of", country=country("Kenya")), C("population_of", country=country("Kenya"))],
         [T("Nairobi"), Num(55.1)]),
        ("geo-en-chat", "en", "chitchat", "Hello there!",
         [],
         CHAT),
        ("geo-en-chat2", "en", "chitchat", "Who made you?",
         [],
         CHAT),
    ],
    "units": [
        ("unit-en-1", "en", "single", "Convert 5 km to miles.",
         [C("convert_length", value=5, from_unit=Alias("length", "km"), to_unit=Alias("length", "mi"))],
         [Num(3.1069)]),
        ("unit-en-2", "en", "single", "How many pounds is 70 kg?",
         [C("convert_weight", value=70, from_unit=Alias("weight", "kg"), to_unit=Alias("weight", "lb"))],
         [Num(154.3236)]),
        ("unit-en-3", "en", "single", "What is 100 degrees Fahrenheit in Celsius?",
         [C("convert_temperature", value=100, from_unit=Alias("temperature", "F"), to_unit=Alias("temperature", "C"))],
         [Num(37.7778)]),
        ("unit-en-4", "en", "single", "Convert 12 inches to centimeters.",
         [C("convert_length", value=12, from_unit=Alias("length", "in"), to_unit=Alias("length", "cm"))],
         [Num(30.48)]),
        ("unit-zh-1", "zh", "single", "10公里是多少英里？",
         [C("convert_length", value=10, from_unit=Alias("length", "km"), to_unit=Alias("length", "mi"))],
         [Num(6.2137)]),
        ("unit-zh-2", "zh", "single", "把30摄氏度换算成华氏度",
         [C("convert_temperature", value=30, from_unit=Alias("temperature", "C"), to_unit=Alias("temperature", "F"))],
         [Num(86)]),
        ("unit-zh-3", "zh", "single", "5磅等于多少公斤？",
         [C("convert_weight", value=5, from_unit=Alias("weight", "lb"), to_unit=Alias("weight", "kg"))],
         [Num(2.268)]),
        ("unit-en-err", "en", "error", "Convert 10 parsecs to furlongs.",
         [C("convert_length", value=10, from_unit=["parsecs", "parsec", "pc"], to_unit=["furlongs", "furlong"])],
         FAIL),
        ("unit-en-multi", "en", "multi", "Convert 5 miles to km and 20 pounds to kg.",
         [
             C("convert_length", value=5, from_unit=Alias("length", "mi"), to_unit=Alias("length", "km")),
             C("convert_weight", value=20, from_unit=Alias("weight", "lb"), to_unit=Alias("weight", "kg")),
         ],
         [Num(8.0467), Num(9.0718)]),
        ("unit-zh-chat", "zh", "chitchat", "谢谢，没有别的问题了。",
         [],
         CHAT),
    ],
    "calendar": [
        ("cal-en-1", "en", "single", "How many days are there between 2024-01-01 and 2024-03-01?",
         [C("days_between", start=Date("2024-01-01"), end=Date("2024-03-01"))],
         [Num(60)]),
        ("cal-en-2", "en", "single", "What date is 45 days after 2024-02-10?",
         [C("add_days", date=Date("2024-02-10"), days=45)],
         [T("2024-03-26", "March 26", "26 March", "Mar 26")]),
        ("cal-en-3", "en", "single", "What day of the week was 2000-01-01?",
         [C("weekday_of", date=Date("2000-01-01"))],
         [T("Saturday")]),
        ("cal-en-4", "en", "single", "How many days from 2023-12-25 to 2024-12-25?",
         [C("days_between", start=Date("2023-12-25"), end=Date("2024-12-25"))],
         [Num(366)]),
        ("cal-zh-1", "zh", "single", "2024年1月1日到2024年5月1日之间有多少天？",
         [C("days_between", start=Date("2024-01-01"), end=Date("2024-05-01"))],
         [Num(121)]),
        ("cal-zh-2", "zh", "single", "2025-10-01是星期几？",
         [C("weekday_of", date=Date("2025-10-01"))],
         [T("Wednesday", "星期三", "周三", "礼拜三")]),
        ("cal-zh-3", "zh", "single", "2024-03-01 之后100天是哪一天？",
         [C("add_days", date=Date("2024-03-01"), days=100)],
         [T("2024-06-09", "6月9日", "June 9")]),
        ("cal-en-err", "en", "error", "How many days between 2024-02-30 and 2024-03-05?",
         [C("days_between", start=["2024-02-30"], end=Date("2024-03-05"))],
         FAIL),
        ("cal-en-multi", "en", "multi", "What date is 30 days after 2024-01-15, and what day of the week is that?",
         [C("add_days", date=Date("2024-01-15"), days=30), C("weekday_of", date=Date("2024-02-14"))],
         [T("2024-02-14", "February 14", "14 February", "Feb 14"), T("Wednesday")]),
        ("cal-en-chat", "en", "chitchat", "say hello",
         [],
         CHAT),
    ],
    "notes": [
        ("note-en-1", "en", "single", "What notes do I have?",
         [C("list_notes")],
         [T("shopping"), T("books")]),
        ("note-en-2", "en", "single", "What's on my shopping note?",
         [C("read_note", name=note("shopping"))],
         [T("milk")]),
        ("note-en-3", "en", "single", "Read my note called meeting.",
         [C("read_note", name=note("meeting"))],
         [T("Friday")]),
        ("note-en-4", "en", "single", "What is the password in my wifi note?",
         [C("read_note", name=note("wifi"))],
         [T("sunflower42")]),
        ("note-zh-1", "zh", "single", "读一下我的购物笔记",
         [C("read_note", name=[note("购物"), note("shopping")])],
         [T("牛奶", "milk")]),
        ("note-zh-2", "zh", "single", "我的待办笔记里写了什么？",
         [C("read_note", name=note("待办"))],
         [T("电费", "牙医", "妈妈")]),
        ("note-zh-3", "zh", "single", "列出我所有的笔记",
         [C("list_notes")],
         [T("shopping", "购物")]),
        ("note-en-err", "en", "error", "Read my note called taxes.",
         [C("read_note", name=["taxes", "taxes note", "tax"])],
         FAIL),
        ("note-zh-err", "zh", "error", "打开我的旅行笔记",
         [C("read_note", name=["旅行", "旅行笔记", "travel"])],
         FAIL),
        ("note-en-multi", "en", "multi", "List my notes and then read the books note.",
         [C("list_notes"), C("read_note", name=note("books"))],
         [T("Dune", "Neuromancer")]),
        ("note-en-chat", "en", "chitchat", "Good morning!",
         [],
         CHAT),
    ],
    "contacts": [
        ("con-en-1", "en", "single", "What is Alice's email address?",
         [C("find_email", name=who("Alice Chen"))],
         [T("alice@example.com")]),
        ("con-en-2", "en", "single", "Find Bob Smith's phone number.",
         [C("find_phone", name=who("Bob Smith"))],
         [T("555-0102", "5550102")]),
        ("con-en-3", "en", "single",
         "Send an email to bob.smith@example.com with subject Lunch and body See you at noon.",
         [C("send_email", to="bob.smith@example.com", subject="Lunch", body=["See you at noon", "See you at noon."])],
         [SENT]),
        ("con-en-4", "en", "single", "What's Carlos's phone number?",
         [C("find_phone", name=who("Carlos Diaz"))],
         [T("600-123-456", "600123456", "600 123 456")]),
        ("con-zh-1", "zh", "single", "王伟的邮箱是什么？",
         [C("find_email", name=who("王伟"))],
         [T("wangwei@example.cn")]),
        ("con-zh-2", "zh", "single", "给 lina@example.cn 发一封邮件，主题是会议，内容是明天上午九点开会。",
         [C("send_email", to="lina@example.cn", subject="会议", body=["明天上午九点开会", "明天上午九点开会。"])],
         [SENT]),
        ("con-zh-3", "zh", "single", "李娜的电话号码是多少？",
         [C("find_phone", name=who("李娜"))],
         [T("138-0000-1234", "13800001234", "138 0000 1234")]),
        ("con-en-err", "en", "error", "What's Gandalf's email address?",
         [C("find_email", name=["Gandalf", "Gandalf's"])],
         FAIL),
        ("con-en-multi", "en", "multi",
         "Find Dana's email and send her an email with subject Report and body The report is ready.",
         [
             C("find_email", name=who("Dana Lee")),
             C(
                 "send_email",
                 to="dana.lee@example.com",
                 subject="Report",
                 body=["The report is ready", "The report is ready."],
             ),
         ],
         [SENT]),
        ("con-en-chat", "en", "chitchat", "Thank you so much!",
         [],
         CHAT),
    ],
    "stocks": [
        ("stk-en-1", "en", "single", "What's the current price of AAPL?",
         [C("stock_price", symbol=ticker_of("AAPL"))],
         [Num(189.5)]),
        ("stk-en-2", "en", "single", "How much is Microsoft stock trading at?",
         [C("stock_price", symbol=ticker_of("MSFT"))],
         [Num(415.2)]),
        ("stk-en-3", "en", "single", "How much did TSLA move today?",
         [C("price_change", symbol=ticker_of("TSLA"))],
         [Num(-3.1)]),
        ("stk-en-4", "en", "single", "What is Nvidia's share price?",
         [C("stock_price", symbol=ticker_of("NVDA"))],
         [Num(880.1)]),
        ("stk-zh-1", "zh", "single", "苹果公司的股价是多少？",
         [C("stock_price", symbol=ticker_of("AAPL"))],
         [Num(189.5)]),
        ("stk-zh-2", "zh", "single", "特斯拉今天涨了还是跌了？",
         [C("price_change", symbol=ticker_of("TSLA"))],
         [Num(-3.1)]),
        ("stk-zh-3", "zh", "single", "阿里巴巴现在的股价是多少？",
         [C("stock_price", symbol=ticker_of("BABA"))],
         [Num(72.4)]),
        ("stk-en-err", "en", "error", "What's the stock price of ZZZZ?",
         [C("stock_price", symbol="ZZZZ")],
         FAIL),
        ("stk-en-multi", "en", "multi", "What are the prices of AAPL and MSFT?",
         [C("stock_price", symbol=ticker_of("AAPL")), C("stock_price", symbol=ticker_of("MSFT"))],
         [Num(189.5), Num(415.2)]),
        ("stk-en-chat", "en", "chitchat", "How are you today?",
         [],
         CHAT),
        ("stk-zh-chat", "zh", "chitchat", "再见！",
         [],
         CHAT),
    ],
    "dictionary": [
        ("dict-en-1", "en", "single", "How do you say apple in French?",
         [C("translate_word", word=word("apple"), target_language=lang_of("fr"))],
         [T("pomme")]),
        ("dict-en-2", "en", "single", "Translate the word friend into Spanish.",
         [C("translate_word", word=word("friend"), target_language=lang_of("es"))],
         [T("amigo")]),
        ("dict-en-3", "en", "single", "What does ephemeral mean?",
         [C("define_word", word="ephemeral")],
         [T("short time", "short")]),
        ("dict-en-4", "en", "single", "What is the German word for water?",
         [C("translate_word", word=word("water"), target_language=lang_of("de"))],
         [T("Wasser")]),
        ("dict-zh-1", "zh", "single", "“apple”用法语怎么说？",
         [C("translate_word", word=word("apple"), target_language=lang_of("fr"))],
         [T("pomme")]),
        ("dict-zh-2", "zh", "single", "猫用英语怎么说？",
         [C("translate_word", word=word("cat"), target_language=lang_of("en"))],
         [T("cat")]),
        ("dict-zh-3", "zh", "single", "把“朋友”翻译成德语",
         [C("translate_word", word=word("friend"), target_language=lang_of("de"))],
         [T("Freund")]),
        ("dict-zh-4", "zh", "single", "“水”的西班牙语是什么？",
         [C("translate_word", word=word("water"), target_language=lang_of("es"))],
         [T("agua")]),
        ("dict-zh-err", "zh", "error", "把“你好”翻译成火星语",
         [C("translate_word", word=word("hello"), target_language=["火星语", "Martian"])],
         FAIL),
        ("dict-en-multi", "en", "multi", "Translate cat into French and into German.",
         [
             C("translate_word", word=word("cat"), target_language=lang_of("fr")),
             C("translate_word", word=word("cat"), target_language=lang_of("de")),
         ],
         [T("chat"), T("Katze")]),
        ("dict-zh-chat", "zh", "chitchat", "你是谁？",
         [],
         CHAT),
    ],
    "timezone": [
        ("tz-en-1", "en", "single", "What time is it in Tokyo?",
         [C("current_time", city=city("Tokyo"))],
         [T("21:00", "9:00 pm", "9 pm", "9:00 p.m.")]),
        ("tz-en-2", "en", "single", "What's the time difference between London and New York?",
         [C("time_difference", city_a=city("London"), city_b=city("New York"))],
         [Num(5)]),
        ("tz-en-3", "en", "single", "What time is it now in Los Angeles?",
         [C("current_time", city=city("Los Angeles"))],
         [T("05:00", "5:00 am", "5 am", "5:00 a.m.")]),
        ("tz-zh-1", "zh", "single", "北京现在几点？",
         [C("current_time", city=city("Beijing"))],
         [T("20:00", "8:00 pm", "晚上8", "晚上八")]),
        ("tz-zh-2", "zh", "single", "东京和悉尼的时差是多少？",
         [C("time_difference", city_a=city("Tokyo"), city_b=city("Sydney"))],
         [Num(1)]),
        ("tz-zh-3", "zh", "single", "孟买现在几点了？",
         [C("current_time", city=city("Mumbai"))],
         [T("17:30", "5:30 pm", "下午5:30", "下午五点半")]),
        ("tz-en-err", "en", "error", "What time is it in Gotham City?",
         [C("current_time", city=["Gotham City", "Gotham"])],
         FAIL),
        ("tz-zh-err", "zh", "error", "亚特兰蒂斯现在几点？",
         [C("current_time", city=["亚特兰蒂斯", "Atlantis"])],
         FAIL),
        ("tz-en-multi", "en", "multi", "What time is it in Paris and in Dubai?",
         [C("current_time", city=city("Paris")), C("current_time", city=city("Dubai"))],
         [T("14:00", "2:00 pm", "2 pm"), T("16:00", "4:00 pm", "4 pm")]),
        ("tz-zh-multi", "zh", "multi", "北京和东京现在各是几点？",
         [C("current_time", city=city("Beijing")), C("current_time", city=city("Tokyo"))],
         [T("20:00", "8:00 pm", "晚上8", "晚上八"), T("21:00", "9:00 pm", "晚上9", "晚上九")]),
        ("tz-zh-chat", "zh", "chitchat", "早上好！",
         [],
         CHAT),
    ],
}  # fmt: skip

TASKS: list[Task] = [
    Task(id=i, lang=lang, toolset=ts, kind=kind, text=text, calls=tuple(calls), answer=tuple(answer))
    for ts, rows in _ROWS.items()
    for i, lang, kind, text, calls, answer in rows
]


# --- self-check -------------------------------------------------------------------------------------


def run_expected(task: Task) -> tuple[list[str], str | None]:
    """Run the task's expected calls with example values: the results' texts and the error
    the last call raised (``None`` when none did)."""
    import json

    tools = {f.__name__: f for f in TOOLSETS[task.toolset]}
    texts: list[str] = []
    for call in task.calls:
        kwargs = {k: example_value(v) for k, v in call.args.items()}
        try:
            out = tools[call.name](**kwargs)
        except Exception as exc:
            return texts, f"{type(exc).__name__}: {exc}"
        texts.append(out if isinstance(out, str) else json.dumps(out, ensure_ascii=False))
    return texts, None


def check(tasks: Sequence[Task] = TASKS) -> list[str]:
    """Problems with the task data (empty when it is consistent)."""
    import inspect

    problems: list[str] = []
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        problems.append("duplicate task ids")
    for name, fns in TOOLSETS.items():
        for fn in fns:
            if not (fn.__doc__ or "").strip():
                problems.append(f"{name}.{fn.__name__}: no docstring")
            sig = inspect.signature(fn)
            for p in sig.parameters.values():
                if p.annotation is inspect.Parameter.empty:
                    problems.append(f"{name}.{fn.__name__}: parameter {p.name} has no type")
    for t in tasks:
        where = f"task {t.id}"
        if t.lang not in ("en", "zh") or t.kind not in KINDS or t.toolset not in TOOLSETS:
            problems.append(f"{where}: bad lang/kind/toolset")
            continue
        tools = {f.__name__: f for f in TOOLSETS[t.toolset]}
        want_calls = {"single": (1, 1), "multi": (2, 2), "chitchat": (0, 0), "error": (1, 2)}[t.kind]
        if not want_calls[0] <= len(t.calls) <= want_calls[1]:
            problems.append(f"{where}: {len(t.calls)} calls for kind {t.kind}")
        for c in t.calls:
            if c.name not in tools:
                problems.append(f"{where}: {c.name} is not in tool set {t.toolset}")
                continue
            params = inspect.signature(tools[c.name]).parameters
            if set(c.args) != set(params):
                problems.append(f"{where}: {c.name} arguments {sorted(c.args)} != parameters {sorted(params)}")
            for k, v in c.args.items():
                if not argument_matches(example_value(v), v):
                    problems.append(f"{where}: {c.name}.{k}: the example value does not match its expectation")
        if any(p.startswith(where + ":") for p in problems):
            continue  # the calls cannot be run as written
        texts, error = run_expected(t)
        if t.kind == "error":
            if error is None:
                problems.append(f"{where}: the expected calls ran without error")
            elif len(texts) != len(t.calls) - 1:
                problems.append(f"{where}: a call before the last failed: {error}")
        elif error is not None:
            problems.append(f"{where}: expected calls failed: {error}")
        if t.kind == "chitchat" and t.answer != CHAT:
            problems.append(f"{where}: chit-chat answers are NonEmpty")
        if t.kind == "error" and t.answer != FAIL:
            problems.append(f"{where}: failing-tool answers are Failed")
        for req in t.answer:
            if not req.check_source(texts):
                problems.append(f"{where}: {req} is not in the tool results {texts}")
    return problems
