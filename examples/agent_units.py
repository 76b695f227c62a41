"""An agent that converts units with a tool (length, mass, volume, temperature, speed).

python examples/agent_units.py "How many kilometers is 26.2 miles?"
"""

from __future__ import annotations

import sys
from typing import Literal

from pocket_agent import Agent, Limits, tool

Unit = Literal[
    "m", "km", "cm", "mm", "mile", "yard", "foot", "inch",
    "kg", "g", "lb", "oz",
    "l", "ml", "gallon",
    "celsius", "fahrenheit", "kelvin",
    "km/h", "m/s", "mph",
]  # fmt: skip

# Factor to the base unit of each dimension.
_FACTORS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "cm": ("length", 0.01),
    "mm": ("length", 0.001),
    "mile": ("length", 1609.344),
    "yard": ("length", 0.9144),
    "foot": ("length", 0.3048),
    "inch": ("length", 0.0254),
    "kg": ("mass", 1.0),
    "g": ("mass", 0.001),
    "lb": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125),
    "l": ("volume", 1.0),
    "ml": ("volume", 0.001),
    "gallon": ("volume", 3.785411784),
    "m/s": ("speed", 1.0),
    "km/h": ("speed", 1000.0 / 3600.0),
    "mph": ("speed", 1609.344 / 3600.0),
}
_TEMPERATURES = ("celsius", "fahrenheit", "kelvin")


def _to_kelvin(value: float, unit: str) -> float:
    if unit == "celsius":
        return value + 273.15
    if unit == "fahrenheit":
        return (value - 32.0) * 5.0 / 9.0 + 273.15
    return value


def _from_kelvin(value: float, unit: str) -> float:
    if unit == "celsius":
        return value - 273.15
    if unit == "fahrenheit":
        return (value - 273.15) * 9.0 / 5.0 + 32.0
    return value


@tool
def convert_units(value: float, from_unit: Unit, to_unit: Unit) -> float:
    """Convert a quantity from one unit to another of the same kind.

    Args:
        value: the quantity to convert.
        from_unit: the unit the value is in.
        to_unit: the unit to convert to.
    """
    if from_unit in _TEMPERATURES or to_unit in _TEMPERATURES:
        if not (from_unit in _TEMPERATURES and to_unit in _TEMPERATURES):
            raise ValueError(f"cannot convert {from_unit} to {to_unit}")
        return round(_from_kelvin(_to_kelvin(value, from_unit), to_unit), 6)
    dim_a, fa = _FACTORS[from_unit]
    dim_b, fb = _FACTORS[to_unit]
    if dim_a != dim_b:
        raise ValueError(f"cannot convert {dim_a} ({from_unit}) to {dim_b} ({to_unit})")
    return round(value * fa / fb, 6)


TOOLS = [convert_units]


def main(task: str) -> None:
    agent = Agent(tools=TOOLS, tool_choice="required", limits=Limits(max_steps=4))
    result = agent.run(task)
    for step in result.steps:
        for call, res in zip(step.tool_calls, step.results, strict=True):
            print(f"{call.name}({call.arguments}) -> {res.content}")
    print("answer:", result.final)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "How many kilometers is 26.2 miles?")
