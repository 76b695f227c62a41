"""The package's shape: layers import only downward, no import cycles, a small public API.

Layers, lowest first (DESIGN.md): the ground (errors, options, usage), runtime, grammars,
the generation loop, the jobs (extraction, tools, decision, convert), the faces (cli,
server, distributed). A module may import its own part and anything below it; the jobs do
not import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pocket_agent

PACKAGE = Path(pocket_agent.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "errors": 0,
    "_version": 0,
    "options": 1,
    "usage": 1,
    "progress": 1,  # the documents-done bar (tqdm)
    "runtime": 2,
    "grammars": 3,
    "_cli_common": 3,  # what every subcommand shares: options, loaders, one-line errors
    "speculation": 3,  # draft tokens for the generation loop: pure token bookkeeping
    "generate": 4,
    "grounding": 4,  # grounded grammars and confidence for extraction
    "batched": 5,  # the generation step run for many prompts at once (lanes)
    "extraction": 6,
    "tools": 6,
    "decision": 6,
    "convert": 6,
    "server": 7,
    "distributed": 7,
    "training": 7,  # adapters trained with torch on top of decision and extraction
    "cli": 8,  # the command line also starts the other faces (pocket-agent serve, extract --ray)
    "__main__": 9,
    "__init__": 10,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part(module: str) -> str:
    """The top-level part of the package a module belongs to (``pocket_agent.tools.agent`` -> ``tools``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(imported module, at module level and not only for type checking)`` for every import."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.body:
                    visit_stmt(sub, False)
                continue
            visit_stmt(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    def visit_stmt(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("pocket_agent"):
                out.append((target, top))
                for alias in node.names:  # "from . import x" imports a submodule
                    candidate = f"{target}.{alias.name}"
                    if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists():
                        out.append((candidate, top))
        elif isinstance(node, ast.Import):
            out.extend((a.name, top) for a in node.names if a.name.startswith("pocket_agent"))
        visit(node, top)

    visit(tree, True)
    return out


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_layers_import_only_downward() -> None:
    wrong = []
    for module, path in _all_modules().items():
        part = _part(module)
        assert part in LAYERS, f"{module}: add its part {part!r} to LAYERS"
        for target, _ in _imports(path):
            other = _part(target)
            if other == part:
                continue
            if LAYERS[other] > LAYERS[part] or (LAYERS[other] == LAYERS[part] and part != "__init__"):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(sorted(wrong))


def test_no_private_imports_across_modules() -> None:
    wrong = []
    for module, path in _all_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:
                for alias in node.names:
                    # private helpers of another module (a private module itself, _cpu, is fine
                    # when imported by name from its own package)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        wrong.append(f"{module}: from {'.' * node.level}{node.module} import {alias.name}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    modules = _all_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, top in _imports(path):
            if top and target in modules and target != module:
                graph[module].add(target)
    # parents import their children when those children are imported; only edges count here
    state: dict[str, int] = {}
    cycle: list[str] = []

    def dfs(node: str, stack: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*stack[stack.index(nxt) :], nxt] if nxt in stack else [node, nxt])
                return True
            if state.get(nxt) is None and dfs(nxt, [*stack, nxt]):
                return True
        state[node] = 2
        return False

    for m in sorted(graph):
        if state.get(m) is None and dfs(m, [m]):
            break
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_public_api_is_what_app_code_uses() -> None:
    exported = set(pocket_agent.__all__)
    for name in ("extract", "extract_many", "extract_stream", "generate", "Agent", "decide", "decide_many"):
        assert name in exported
    for name in ("Sampling", "Limits", "Usage", "Regex", "Choice", "Lark", "load_model", "tool"):
        assert name in exported
    assert not [n for n in exported if n.startswith("_") and n != "__version__"]
    for name in exported:
        assert hasattr(pocket_agent, name), name
    # every error lives in one module
    import pocket_agent.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert cls.__module__ == "pocket_agent.errors"
