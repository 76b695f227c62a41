"""An agent with a calculator tool: arithmetic is evaluated safely (an AST walk, no eval).

python examples/agent_calculator.py "What is 12.5 * (3 + 4)?"
pocket-agent run "What is 2 ** 10?" --tools examples/agent_calculator.py:TOOLS
"""

from __future__ import annotations

import ast
import math
import operator
import sys
from collections.abc import Callable
from typing import Any

from pocket_agent import Agent, Limits, tool

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "log": math.log,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_EXPONENT = 1000


def safe_eval(expression: str) -> float:
    """Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, a few math
    functions (sqrt, abs, round, log, exp, sin, cos, tan) and constants (pi, e)."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
        ):
            return _FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")

    tree = ast.parse(expression.replace("^", "**"), mode="eval")
    return float(ev(tree))


@tool
def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: the arithmetic to compute, e.g. "12.5 * (3 + 4)" or "sqrt(2) / 2".
    """
    return safe_eval(expression)


TOOLS = [calculate]


def main(task: str) -> None:
    agent = Agent(
        tools=TOOLS,
        instructions="Use the calculate tool for any arithmetic, then answer with the result.",
        tool_choice="required",  # the first turn must call the calculator; later turns may answer
        limits=Limits(max_steps=4),
    )
    result = agent.run(task)
    for step in result.steps:
        for call, res in zip(step.tool_calls, step.results, strict=True):
            print(f"{call.name}({call.arguments}) -> {res.content}")
    print("answer:", result.final)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "What is 12.5 * (3 + 4)?")
