"""What every ``pocket-agent`` subcommand shares: the parser, the model and thread options,
``module:Attr`` / ``file.py:Attr`` references, input files, error lines and exit statuses.

Exit statuses (the top-level ``--help`` lists them too):

* 0: done;
* 1: the run failed: the model could not give a valid result (single document, agent),
  or some documents of a multi-document ``extract`` failed (their rows say why and a
  summary line on stderr counts them);
* 2: bad usage or input: an option, a file, a schema or tools reference, a model path;
  one ``pocket-agent: error: ...`` line on stderr, no traceback;
* 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from .errors import (
    AgentError,
    GenerationError,
    InvalidInputError,
    MaxStepsExceeded,
    OutputBudgetExceeded,
    PocketAgentError,
    SchemaError,
    ToolError,
)

if TYPE_CHECKING:
    from .runtime import Model

PROG = "pocket-agent"
DISTRIBUTION = "pocket-agent-mnn"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_STATUS_HELP = (
    "exit status: 0 done; 1 the run failed (no valid result, or some documents of a multi-document extract "
    "failed: a summary line on stderr counts them); 2 bad usage or input (one 'pocket-agent: error:' line on "
    "stderr); 130 interrupted"
)
MODEL_HELP = (
    "a .gguf file, an MNN build config.json or its folder (default: $POCKET_AGENT_MODEL, else the embedded model)"
)
THREADS_HELP = "CPU threads (default: $POCKET_AGENT_THREADS, else the cores this process may use)"


def version_string() -> str:
    """``pocket-agent <version>``: the installed distribution's version, else the package's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version(DISTRIBUTION)
    except PackageNotFoundError:
        from ._version import __version__ as number
    return f"{PROG} {number}"


class CliParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one stderr line and exit status 2.

    ``add_subparsers`` makes its sub-parsers of the same class, so every subcommand gets it.
    """

    def error(self, message: str) -> NoReturn:
        """Print ``PROG SUBCOMMAND: error: MESSAGE (see ... --help)`` and exit 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def positive_int(text: str) -> int:
    """``argparse`` type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def add_model_options(p: argparse.ArgumentParser, *, positional: bool = False, model_help: str = MODEL_HELP) -> None:
    """The model (``--model/-m``, or an optional first positional) and ``--threads/-t``."""
    if positional:
        p.add_argument("model", nargs="?", default=None, help=model_help)
    else:
        p.add_argument("--model", "-m", default=None, help=model_help)
    p.add_argument("--threads", "-t", type=positive_int, default=None, help=THREADS_HELP)


def open_model(args: argparse.Namespace, *, merge_adapter: str | None = None) -> Model:
    """The model ``args.model`` names with ``args.threads``; without one, ``$POCKET_AGENT_MODEL``
    or the embedded default model (``load_model``'s rule). ``merge_adapter``: a shipped task
    adapter to merge into the weights (``"extract"``)."""
    from .runtime import load_model

    return load_model(args.model, threads=args.threads, merge_adapter=merge_adapter)


def load_reference(spec: str, option: str) -> Any:
    """The attribute ``spec`` names: ``module:Attr`` (importable from the current folder)
    or ``path/to/file.py:Attr``. ``option`` (``--tools``, ``--schema``) is named in errors."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise InvalidInputError(f"{option} must be module:Attr or path/to/file.py:Attr, got {spec!r}.")
    path_like = target.endswith(".py") or "/" in target or os.sep in target
    module = _load_file_module(target, option) if path_like else _import_module(target, option)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InvalidInputError(f"{option} {spec}: {target} defines no {attr!r}; check the name after ':'.") from None


def _load_file_module(target: str, option: str) -> Any:
    path = Path(target)
    if path.suffix != ".py":
        raise InvalidInputError(f"{option}: {path} is not a Python file; give path/to/file.py:Attr or module:Attr.")
    if not path.is_file():
        raise InvalidInputError(f"{option}: file not found: {path}; give an existing .py file or module:Attr.")
    name = f"_pocket_agent_ref_{path.stem}"
    mspec = importlib.util.spec_from_file_location(name, path)
    if mspec is None or mspec.loader is None:
        raise InvalidInputError(f"{option}: cannot load {path} as a Python module.")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module  # so that the classes it defines can be resolved (pydantic, pickling)
    try:
        mspec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed to run: say where, without a traceback
        del sys.modules[name]
        raise InvalidInputError(f"{option}: running {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(target: str, option: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise InvalidInputError(
            f"{option}: cannot import {target!r} ({exc}); give a module importable from the current folder, "
            f"or a path/to/file.py."
        ) from exc
    except Exception as exc:  # the module imported but raised while running
        raise InvalidInputError(f"{option}: importing {target!r} failed: {type(exc).__name__}: {exc}") from exc


def load_schema_option(spec: str, option: str = "--schema") -> Any:
    """A schema option's value: a JSON Schema file (``schema.json``), or a Pydantic class
    named ``module:Class`` or ``path/to/file.py:Class`` (:func:`load_reference`)."""
    path = Path(spec)
    if path.suffix.lower() == ".json" or path.is_file():
        if not path.is_file():
            raise InvalidInputError(f"{option}: schema file not found: {path}")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SchemaError(f"{option}: {path} is not a readable JSON file: {exc}") from exc
    return load_reference(spec, option)


def check_input(path: str, what: str) -> None:
    """Fail before any model is loaded when the input file ``path`` (``-``: stdin) is not there."""
    if path == "-":
        return
    p = Path(path)
    if not p.exists():
        raise InvalidInputError(f"{what} not found: {p}; check the path (or give - to read stdin).")
    if not p.is_file():
        raise InvalidInputError(f"{what} is not a file: {p}.")


def read_input(path: str, what: str) -> str:
    """The text of the input file ``path`` (``-``: stdin), with one-line errors."""
    if path == "-":
        return sys.stdin.read()
    check_input(path, what)
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from exc
    except OSError as exc:
        raise InvalidInputError(f"cannot read {what} {path}: {exc.strerror or exc}.") from exc


def check_output(path: str | None, option: str = "--out") -> None:
    """Fail early when ``path``'s folder does not exist (``None``: stdout)."""
    if path is not None and not Path(path).expanduser().resolve().parent.is_dir():
        raise InvalidInputError(f"{option} {path}: the folder does not exist; create it or pick another path.")


def open_output(path: str | None, option: str = "--out") -> TextIO:
    """``path`` opened for writing (``None``: stdout), with a one-line error."""
    if path is None:
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot write {option} {path}: {exc.strerror or exc}.") from exc


# The library's messages for these point to Python attributes (``.partial``, ``.steps``) and
# ``Limits`` fields; on the command line they are said in terms of options.
_CLI_WORDING = {
    OutputBudgetExceeded.__name__: (
        "--max-tokens ran out before the output was complete; raise --max-tokens or simplify the schema."
    ),
    MaxStepsExceeded.__name__: (
        "the agent used all its steps without a final answer; raise --max-steps or simplify the task."
    ),
}


def one_line(text: str) -> str:
    """``text``'s lines joined into one."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def row_error(error_type: str, message: str) -> str:
    """The ``error`` of a failed document's output row (local and Ray runs alike)."""
    return _CLI_WORDING.get(error_type, one_line(message))


def error_text(exc: PocketAgentError) -> str:
    """``exc``'s message for the stderr error line: one line, in terms of options rather than
    the Python attributes the library's own messages point to."""
    text = row_error(type(exc).__name__, str(exc))
    if isinstance(exc, OutputBudgetExceeded) and exc.partial:
        text += f" The output so far: {exc.partial[-120:]!r}"
    elif isinstance(exc, MaxStepsExceeded):
        text += " The steps so far are printed above."
    return text


def exit_status(exc: PocketAgentError) -> int:
    """1 when the run itself failed (generation, tools, agent), 2 for bad usage or input."""
    return EXIT_FAILED if isinstance(exc, (GenerationError, ToolError, AgentError)) else EXIT_USAGE


def report(message: str) -> None:
    """Print the one ``pocket-agent: error: ...`` line."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)


def run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand: library errors become one stderr line and an exit status."""
    try:
        return int(func(args))
    except PocketAgentError as exc:
        report(error_text(exc))
        return exit_status(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into a command that stopped reading (head)
        sys.stderr.close()
        return EXIT_OK


def summary_line(command: str, total: int, failed: int, out: str | None) -> str:
    """The line a multi-document run ends with: documents done and failed, where the
    failures are, and the exit status they give."""
    line = f"{PROG} {command}: {total} document(s), {total - failed} done, {failed} failed"
    if failed:
        where = out if out is not None else "the output above"
        line += f'; the failed ones are the rows with "ok": false in {where}; exit status {EXIT_FAILED}'
    return line
