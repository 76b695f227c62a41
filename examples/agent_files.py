"""An agent that searches a folder of notes with file tools.

The example writes a few text files into a temporary folder, then gives the agent three
tools bound to that folder: list the files, search them for a word, read one file. Paths
cannot leave the folder.

    python examples/agent_files.py "Which file mentions the budget?"
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from pocket_agent import Agent, Limits, Tool, tool

NOTES = {
    "meeting.txt": "Team meeting on Monday. We agreed the budget for Q3 is 12,000 EUR.\nAction: Ana books the room.",
    "travel.txt": "Flight to Lisbon on 14 May, hotel near the river. Taxi from the airport.",
    "recipes/soup.txt": "Tomato soup: tomatoes, onion, garlic, olive oil. Simmer 20 minutes.",
}
MAX_MATCHES = 20


def make_file_tools(root: Path) -> list[Tool]:
    """Tools that list, search and read text files under ``root`` (and nowhere else)."""
    root = root.resolve()

    def inside(name: str) -> Path:
        path = (root / name).resolve()
        if root not in path.parents and path != root:
            raise ValueError(f"{name!r} is outside the notes folder")
        return path

    @tool
    def list_files() -> list[str]:
        """List the text files in the notes folder."""
        return sorted(str(p.relative_to(root)) for p in root.rglob("*.txt"))

    @tool
    def search_files(query: str) -> list[str]:
        """Find lines containing a word or phrase in the notes (case-insensitive).

        Args:
            query: the word or phrase to look for.
        """
        hits = []
        for p in sorted(root.rglob("*.txt")):
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if query.lower() in line.lower():
                    hits.append(f"{p.relative_to(root)}:{n}: {line}")
        return hits[:MAX_MATCHES] or [f"no line contains {query!r}"]

    @tool
    def read_file(name: str) -> str:
        """Read one file of the notes folder.

        Args:
            name: the file's path relative to the notes folder, e.g. "meeting.txt".
        """
        return inside(name).read_text(encoding="utf-8")

    return [list_files, search_files, read_file]


def write_notes(root: Path) -> None:
    for name, text in NOTES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")


def main(task: str) -> None:
    with tempfile.TemporaryDirectory(prefix="pocket-agent-notes-") as tmp:
        root = Path(tmp)
        write_notes(root)
        agent = Agent(
            tools=make_file_tools(root),
            instructions="Answer questions about the user's notes. Search or read the files first.",
            tool_choice="required",
            limits=Limits(max_steps=4, max_result_chars=800),
        )
        result = agent.run(task)
        for step in result.steps:
            for call, res in zip(step.tool_calls, step.results, strict=True):
                print(f"{call.name}({call.arguments}) -> {res.content[:200]}")
        print("answer:", result.final)


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "Which file mentions the budget?")
