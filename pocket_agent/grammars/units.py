"""Physical dimensions of stated quantities and of the parameters meant to hold them.

"10 meters" can fill a parameter described as "height in meters" or "distance in km", never
one described as "weight in kilograms". :func:`stated_dimensions` reads the dimension of
each number a text states ("10 meters" -> ``"length"``; a bare "10" -> ``None``, which fits
anything) and :func:`parameter_dimension` the one dimension a parameter's description
names ("Weight of the individual in kilograms." -> ``"mass"``).

Both are deliberately narrow: a unit counts only when it is unambiguous ("in" and "pound"
are not units here; a lone "degrees" may be an angle or a temperature), a description
names a unit only after "in" or inside parentheses, and a description that names several
dimensions or a compound this table lacks ("J/kg.°C") names none. Every miss is read as
"could be anything", so the rules only ever drop an option that cannot fit.
"""

from __future__ import annotations

import re

_UNIT_WORDS: dict[str, tuple[str, ...]] = {
    "length": (
        "meters?",
        "metres?",
        "kilometers?",
        "kilometres?",
        "centimeters?",
        "centimetres?",
        "millimeters?",
        "millimetres?",
        "miles?",
        "feet",
        "foot",
        "inch(?:es)?",
        "yards?",
        "km",
        "cm",
        "mm",
        "ft",
        "yd",
        "light[- ]years?",
    ),
    "mass": (
        "kilograms?",
        "grams?",
        "milligrams?",
        "ounces?",
        "tonnes?",
        "tons?",
        "kg",
        "mg",
        "lbs?",
        "oz",
    ),
    "time": (
        "seconds?",
        "minutes?",
        "hours?",
        "days?",
        "weeks?",
        "months?",
        "years?",
        "milliseconds?",
        "secs?",
        "hrs?",
        "ms",
    ),
    "temperature": ("celsius", "fahrenheit", "kelvin", "°c", "°f", "degrees? (?:celsius|fahrenheit)"),
    "speed": (
        "m/s",
        "km/h",
        "kmh",
        "kph",
        "mph",
        "knots?",
        r"(?:meters?|metres?|kilometers?|kilometres?|miles?|feet) (?:per|an|a) (?:second|hour|minute)",
    ),
    "acceleration": (
        r"m/s(?:\^2|²|2)",
        r"(?:meters?|metres?|feet) per second (?:squared|per second)",
    ),
    "area": (
        "m²",
        r"m\^2",
        "km²",
        "acres?",
        "hectares?",
        r"square (?:meters?|metres?|feet|foot|miles?|kilometers?|km|ft|m)",
        "sq ft",
        "sq m",
    ),
    "volume": (
        "liters?",
        "litres?",
        "milliliters?",
        "millilitres?",
        "gallons?",
        "ml",
        "m³",
        r"m\^3",
        r"cubic (?:meters?|metres?|feet|foot|centimeters?|cm|inch(?:es)?)",
    ),
    "currency": ("dollars?", "euros?", "usd", "eur", "gbp", "jpy", "cny", "yen", "yuan", "rmb", "cents?"),
    "energy": ("joules?", "kilojoules?", "kj", "calories?", "kcal", "kwh"),
    "power": ("watts?", "kilowatts?", "kw"),
    "pressure": ("pascals?", "kpa", "atm", "psi"),
    "data": ("bytes?", "kilobytes?", "megabytes?", "gigabytes?", "kb", "mb", "gb", "tb"),
}
"""Unit words (regular expressions, matched lower-cased as whole words) of each dimension."""

# Single letters and symbols that are units only when written right after a number
# ("10m", "5 s", "3 kg"); alone in a description they are too easily something else.
_UNIT_LETTERS: dict[str, tuple[str, ...]] = {
    "length": ("m",),
    "mass": ("g",),
    "time": ("s", "h", "min"),
    "energy": ("j",),
    "power": ("w",),
    "volume": ("l",),
}
_CURRENCY_SIGNS = "$€£¥"

# Compound dimensions come first: "meters per second" is a speed, not a length and a time.
_ORDER = ("acceleration", "speed", "area", "volume", "temperature")


def _alternation(dimensions: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    ordered = [d for d in _ORDER if d in dimensions] + [d for d in dimensions if d not in _ORDER]
    return [(d, p) for d in ordered for p in dimensions[d]]


def _unit_pattern(dimensions: dict[str, tuple[str, ...]], prefix: str) -> tuple[str, dict[str, str]]:
    """One alternation of every unit, each in a named group, and the dimension of each group."""
    parts, names = [], {}
    for i, (dimension, pattern) in enumerate(_alternation(dimensions)):
        names[f"{prefix}{i}"] = dimension
        parts.append(f"(?P<{prefix}{i}>{pattern})")
    return "|".join(parts), names


_WORDS_PATTERN, _WORD_GROUPS = _unit_pattern(_UNIT_WORDS, "w")
_LETTER_PATTERN, _LETTER_GROUPS = _unit_pattern(_UNIT_LETTERS, "l")
_NUMBER_WORD = (
    r"one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|forty"
    r"|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|half|a|an"
)
_NUMBER = rf"(?:\d+(?:[.,]\d+)*|(?<![\w])(?:{_NUMBER_WORD})(?!\w))"
_STATED = re.compile(
    rf"(?P<sign>[{_CURRENCY_SIGNS}])?\s?(?P<number>{_NUMBER})"
    rf"(?:[\s-]?(?:(?P<word>{_WORDS_PATTERN})|(?P<letter>{_LETTER_PATTERN}))(?![\w/²^]))?",
    re.IGNORECASE,
)
_UNIT_AFTER_IN = re.compile(rf"(?:\bin|\()\s*(?:the\s+)?(?:{_WORDS_PATTERN})(?![\w/²^])", re.IGNORECASE)
_COMPOUND = re.compile(r"\w\s*/\s*\w|\bper\b", re.IGNORECASE)


def _dimension_of(match: re.Match[str], groups: dict[str, str]) -> str | None:
    for name, dimension in groups.items():
        if match.group(name) is not None:
            return dimension
    return None


def stated_dimensions(text: str) -> list[str | None]:
    """The dimension of every number ``text`` states, in order: ``"length"`` for "10 meters"
    or "10m", ``"currency"`` for "$20", ``None`` for a number with no unit this module knows
    ("5", "five apples", "20%")."""
    out: list[str | None] = []
    for m in _STATED.finditer(text):
        number = m.group("number")
        if not any(c.isdigit() for c in number) and m.group("word") is None:
            # A number word counts only with a spelled-out unit: "a" and "one" are mostly
            # not quantities, and "a m" is not a length.
            continue
        if m.group("sign"):
            out.append("currency")
        elif m.group("word") is not None:
            out.append(_dimension_of(m, _WORD_GROUPS))
        elif m.group("letter") is not None:
            out.append(_dimension_of(m, _LETTER_GROUPS))
        else:
            out.append(None)
    return out


def parameter_dimension(description: str) -> str | None:
    """The one dimension a parameter's description names with "in <unit>" or "(<unit>)",
    or ``None`` when it names none, several, or a compound unit this module cannot read."""
    one_spaced = re.sub(r"\s+", " ", description)
    found = {_dimension_of(m, _WORD_GROUPS) for m in _UNIT_AFTER_IN.finditer(one_spaced)}
    found.discard(None)
    if len(found) != 1:
        return None
    (dimension,) = found
    if dimension not in ("speed", "acceleration") and _COMPOUND.search(_strip_known(description)):
        return None  # "J/kg.°C", "dollars per share": a unit the table does not hold
    return dimension


def _strip_known(text: str) -> str:
    """``text`` without the compound units the table knows ("km/h", "meters per second")."""
    known = "|".join(p for d in ("speed", "acceleration") for p in _UNIT_WORDS[d])
    return re.sub(known, " ", text, flags=re.IGNORECASE)


def can_hold(text: str, dimension: str | None) -> bool:
    """Whether some number ``text`` states could fill a parameter of ``dimension``: one with
    no known unit, or one of that dimension. Always true for ``dimension=None``."""
    if dimension is None:
        return True
    return any(d is None or d == dimension for d in stated_dimensions(text))
