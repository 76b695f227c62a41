"""A user's script, checked by mypy against the installed package (tests/test_typing.py): the
types flow from the schema and the agent's ``output`` to what the calls return. Never run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from typing_extensions import assert_type

from pocket_agent import Agent, ExtractOutcome, RunResult, extract, extract_many, tool


class Invoice(BaseModel):
    invoice_number: str
    total: float


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def check() -> None:
    invoice = extract("Invoice INV-1, total 3.50", schema=Invoice)
    assert_type(invoice, Invoice)
    print(invoice.total + 1.0)

    outcomes = extract_many(["a", "b"], Invoice)
    assert_type(outcomes, Iterator[ExtractOutcome[Invoice]])
    for outcome in outcomes:
        if outcome.value is not None:
            assert_type(outcome.value, Invoice)
            print(outcome.value.invoice_number.upper())

    as_dicts = extract_many(["a"], {"type": "object"})
    assert_type(as_dicts, Iterator[ExtractOutcome[Any]])

    text_agent = Agent(tools=[add])
    assert_type(text_agent, Agent[str])
    result = text_agent.run("What is 1 + 2?")
    assert_type(result, RunResult[str])
    print(result.final.strip())

    typed_agent = Agent(tools=[add], output=Invoice)
    assert_type(typed_agent.run("...").final, Invoice)

    lookup = Agent(tools=[add], answer="result")
    assert_type(lookup.run("1 + 2").final, Any)
