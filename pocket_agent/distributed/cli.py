"""``pocket-agent extract --many in.jsonl --ray``: the JSONL extraction on a Ray cluster.

The lines are read here, extracted by an actor pool (local Ray, or the cluster at
``$RAY_ADDRESS``), and written back in input order in the same format as the
single-process ``--many`` path, with a progress bar on stderr and the same summary line
at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from .._cli_common import EXIT_FAILED, EXIT_OK, open_output, row_error, summary_line
from ..errors import InvalidInputError
from ..progress import DocumentProgress
from .datasets import extract_dataset, import_ray

_TEXT = "text"
_INDEX = "index"


def read_rows(path: Path) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """The documents of a JSONL file (each line a JSON string or an object with "text"),
    and the output rows of lines that cannot be documents, both keyed by the line's index
    among the non-blank lines (the index the single-process ``--many`` path reports)."""
    if not path.is_file():
        raise InvalidInputError(f"--many input not found: {path}")
    rows: list[dict[str, Any]] = []
    failed: dict[int, dict[str, Any]] = {}
    index = 0
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as exc:
                failed[index] = _error_row(index, f"line {n} is not valid JSON: {exc}", InvalidInputError.__name__)
            else:
                if isinstance(doc, dict) and _TEXT not in doc:
                    failed[index] = _error_row(index, f"line {n} has no 'text' field", InvalidInputError.__name__)
                else:
                    rows.append({_INDEX: index, _TEXT: doc[_TEXT] if isinstance(doc, dict) else doc})
            index += 1
    return rows, failed


def _error_row(index: int, error: str, error_type: str) -> dict[str, Any]:
    return {"index": index, "ok": False, "error": error, "error_type": error_type}


def extract_many_on_ray(args: argparse.Namespace, schema: Any) -> int:
    """Run ``extract --many --ray``; exit status 1 when any document failed (the summary line says so)."""
    if not args.many:
        raise InvalidInputError("--ray runs --many INPUT.jsonl on a Ray cluster; give --many.")
    rows, failed = read_rows(Path(args.many))
    ray = import_ray()
    started = not ray.is_initialized()
    if started:  # RAY_ADDRESS (an existing cluster) if set, else a local one
        ray.init(**({} if os.environ.get("RAY_ADDRESS") else {"include_dashboard": False}), logging_level="warning")
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # our bar instead of Ray Data's log lines
    warnings.filterwarnings("ignore", category=UserWarning, module=r"ray\.data\..*")
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # ours instead: one bar counting documents
        ctx.execution_options.preserve_order = True  # written in input order as they arrive
        threads = args.threads or 1
        actors = args.actors or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
        options: dict[str, Any] = {} if args.max_tokens is None else {"max_tokens": args.max_tokens}
        if args.adapter != "auto":
            options["adapter"] = None if args.adapter.lower() == "none" else str(Path(args.adapter).resolve())
        out = open_output(args.out)
        bar = DocumentProgress(len(rows) + len(failed), sys.stderr.isatty(), f"on {actors} actor(s)")
        try:
            results: Iterable[dict[str, Any]] = ()
            if rows:
                ds = ray.data.from_items(rows, override_num_blocks=1)
                results = extract_dataset(
                    ds, schema, model=args.model, actors=actors, threads_per_actor=threads, **options
                ).iter_rows()
            next_index = 0
            for res in results:
                while next_index in failed:  # unreadable lines, in their place
                    _write(out, failed.pop(next_index), bar)
                    next_index += 1
                row: dict[str, Any] = {"index": res[_INDEX], "ok": res["error_type"] is None}
                if row["ok"]:
                    row["value"] = json.loads(res["value"])
                else:
                    row["error"] = row_error(res["error_type"], res["error"])
                    row["error_type"] = res["error_type"]
                _write(out, row, bar)
                next_index = res[_INDEX] + 1
            for index in sorted(failed):
                _write(out, failed[index], bar)
        finally:
            bar.close()
            if out is not sys.stdout:
                out.close()
    finally:
        if started:
            ray.shutdown()
    print(summary_line("extract", bar.done, bar.failed, args.out), file=sys.stderr)
    return EXIT_FAILED if bar.failed else EXIT_OK


def _write(out: TextIO, row: dict[str, Any], bar: DocumentProgress) -> None:
    out.write(json.dumps(row, ensure_ascii=False) + "\n")
    out.flush()
    bar.update(bool(row["ok"]))
