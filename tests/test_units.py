"""Units of stated quantities and of parameter descriptions (pocket_agent.grammars.units)."""

from __future__ import annotations

import pytest

from pocket_agent.grammars.units import can_hold, parameter_dimension, stated_dimensions


@pytest.mark.parametrize(
    ("text", "dimensions"),
    [
        ("base 10 meters and height 5 meters", ["length", "length"]),
        ("a velocity of 5 m/s", ["speed"]),
        ("g = 9.8 m/s^2", ["acceleration"]),
        ("3 kg of water by 4 degrees Celsius", ["mass", "temperature"]),
        ("a $200,000 loan at 5% for 30 years", ["currency", None, "time"]),
        ("10m then 5s", ["length", "time"]),
        ("a ninety dollar transfer", ["currency"]),
        ("five kilograms, one of them", ["mass"]),  # "one" alone is not a quantity
        ("the integral of x^3 from 1 to 5", [None, None, None]),
        ("5 in total", [None]),  # "in" is not a unit
    ],
)
def test_stated_dimensions(text: str, dimensions: list[str | None]) -> None:
    assert stated_dimensions(text) == dimensions


@pytest.mark.parametrize(
    ("description", "dimension"),
    [
        ("Weight of the individual in kilograms.", "mass"),
        ("Height of the individual in meters.", "length"),
        ("Distance (km)", "length"),
        ("The initial velocity in meters per second.", "speed"),
        ("Gravity in meters per second squared, default 9.8.", "acceleration"),
        ("The amount, specified in dollars.", "currency"),
        ("The specific heat in J/kg.°C.", None),  # a compound the table lacks
        ("Price in dollars per share", None),
        ("Elapsed time in seconds or in meters", None),  # two dimensions: neither
        ("The year of birth", None),  # a unit word not after "in" or "("
        ("The number of items", None),
    ],
)
def test_parameter_dimension(description: str, dimension: str | None) -> None:
    assert parameter_dimension(description) == dimension


def test_a_number_fits_a_parameter_without_a_unit_or_of_its_dimension() -> None:
    assert not can_hold("base 10 meters and height 5 meters", "mass")
    assert can_hold("base 10 meters and height 5 meters", "length")
    assert can_hold("weight 70 and height 1.8 m", "mass")  # a bare 70 could be kilograms
    assert can_hold("anything at all", None)
    assert not can_hold("no numbers here", "mass")
