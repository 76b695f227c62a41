"""Tools and agents: typed tool definitions, a tool-call format whose calls are always
well-formed (one grammar per assistant turn), and the :class:`Agent` loop.

```python
from pocket_agent.tools import Agent, tool

@tool
def add(a: float, b: float) -> float:
    \"\"\"Add two numbers.\"\"\"
    return a + b

result = Agent(tools=[add]).run("What is 2 + 3?")
print(result.final, [s.tool_calls for s in result.steps])
```
"""

from ..errors import AgentError, MaxStepsExceeded
from .agent import Agent, AgentEvent, RunResult, Step, ToolResult
from .format import ToolCall, ToolChoice, build_grammar, parse_turn
from .schema import normalize_schema, parse_docstring
from .tool import Tool, as_tool, tool

__all__ = [
    "Agent",
    "AgentError",
    "AgentEvent",
    "MaxStepsExceeded",
    "RunResult",
    "Step",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolResult",
    "as_tool",
    "build_grammar",
    "normalize_schema",
    "parse_docstring",
    "parse_turn",
    "tool",
]
