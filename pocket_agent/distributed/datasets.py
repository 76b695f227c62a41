"""``extract_dataset`` and ``decide_dataset``: pocket_agent over a Ray Data ``Dataset``.

Each actor of a Ray Data actor pool loads one model (MNN allows only one per process) and
runs ``extract_many`` / ``decide_many`` over its batches; the pool spreads the batches
over every CPU of the cluster. Nothing here is a scheduler of its own.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..decision import decide_many
from ..errors import BackendUnavailableError, InvalidInputError
from ..extraction import extract_many
from ..runtime import Model
from ._schema import ShippedSchema

if TYPE_CHECKING:
    from types import ModuleType

    from ray.data import Dataset

    from ._workers import WorkerSpec

# Documents per batch, and per block after the streaming repartition: small, so work spreads
# over every actor and the tail is short; a batch is one extract_many call in one actor.
DEFAULT_BATCH_SIZE = 8

INSTALL_HINT = "pip install 'pocket-agent-mnn[ray]'"


def import_ray() -> ModuleType:
    """``ray`` with Ray Data, or :class:`BackendUnavailableError` saying how to install it."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise BackendUnavailableError(f"Ray Data is not installed ({exc}); install it with `{INSTALL_HINT}`.") from exc
    return ray


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def _check_options(fn: Callable[..., Any], options: Mapping[str, Any], reserved: Collection[str]) -> dict[str, Any]:
    """``options`` if every key is a keyword of ``fn`` that the caller may set."""
    allowed = [
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in reserved
    ]
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise InvalidInputError(
            f"{fn.__name__} has no option {', '.join(map(repr, unknown))}; the options it takes here are: "
            f"{', '.join(allowed)}."
        )
    return dict(options)


def _worker_spec(model: Any, threads: Any, model_options: Mapping[str, Any] | None) -> WorkerSpec:
    """What each actor loads. A path that exists here is made absolute; one that does not
    is passed on as given (it may exist only on the worker nodes)."""
    if isinstance(model, Model):
        raise InvalidInputError(
            "A loaded Model cannot travel to other processes; pass its path (model.info.path) so each "
            "actor loads its own copy."
        )
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise InvalidInputError(f"model must be a path or None, got {type(model).__name__}.")
    path: str | None = None
    if model is not None:
        p = Path(model).expanduser()
        path = str(p.resolve()) if p.exists() else str(model)
    opts = dict(model_options or {})
    if "threads" in opts:
        raise InvalidInputError("Set the threads of each actor with threads_per_actor=, not in model_options.")
    from ._workers import WorkerSpec

    return WorkerSpec(model=path, threads=_positive_int("threads_per_actor", threads), model_options=opts)


def _pool_size(ray: ModuleType, actors: Any, threads_per_actor: int) -> int:
    """``actors``, or by default as many actors as the cluster has CPUs for."""
    if actors is not None:
        return _positive_int("actors", actors)
    if not ray.is_initialized():
        ray.init()  # what Ray Data would do: RAY_ADDRESS if set, else a local cluster
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, cpus // threads_per_actor)


def _blocks(ds: Dataset, batch: int, actors: int, rebalance: bool) -> tuple[Dataset, int]:
    """The input as the actors should see it, and the rows per batch.

    Ray Data hands each block to one actor, and starts the actors before any upstream task
    (a read, a map): when the actors hold every CPU, such a task never runs and the job
    hangs (ray-project/ray#44687). ``rebalance`` runs the upstream part now and cuts it
    into blocks of ``batch`` rows (fewer when there are fewer rows than ``actors`` full
    batches), held in the object store, so the actors get every CPU and each gets work.
    """
    if not rebalance:
        return ds, batch
    whole = ds.materialize()
    rows = whole.count()
    per_block = max(1, min(batch, -(-rows // actors)))
    split: Dataset = whole.repartition(target_num_rows_per_block=per_block).materialize()
    return split, per_block


def extract_dataset(
    ds: Dataset,
    schema: Any,
    *,
    text_column: str = "text",
    model: str | os.PathLike[str] | None = None,
    actors: int | None = None,
    threads_per_actor: int = 1,
    batch_size: int = DEFAULT_BATCH_SIZE,
    model_options: Mapping[str, Any] | None = None,
    rebalance: bool = True,
    **extract_options: Any,
) -> Dataset:
    """Extract ``schema`` from the ``text_column`` of every row of a Ray Data ``Dataset``.

    Returns a lazy ``Dataset`` with every input row and its columns, plus ``value`` (the
    extracted object as JSON text, or null), ``error`` (the message, or null) and
    ``error_type`` (the pocket_agent error's class name, e.g. ``InvalidInputError``,
    ``ContextOverflowError``, ``OutputBudgetExceeded``). A bad row (empty, not a string,
    null, too long for the context) becomes an error row; it never drops a row or fails the
    job. Columns named ``value``, ``error`` or ``error_type`` in the input are replaced.

    Args:
        ds: the documents.
        schema: a Pydantic model class or a JSON Schema dict. A class is shipped to the
            workers by value (a class from ``__main__`` or a test module works); if a
            worker cannot rebuild it, that worker extracts against the class's JSON Schema
            (same output; only validators the grammar cannot express are skipped).
        text_column: the column holding the documents.
        model: a model path every worker node can read (``.gguf`` or an MNN build), or
            ``None`` for each worker's default (``$POCKET_AGENT_MODEL`` or the embedded
            model, which then must be installed on every node).
        actors: how many actors (one model each); default: the cluster's CPUs divided by
            ``threads_per_actor``, counted when this is called.
        threads_per_actor: CPU threads of each model, and the CPUs each actor reserves.
            Given explicitly because inside an actor the CPU affinity still shows every core.
        batch_size: documents per ``extract_many`` call.
        model_options: further ``load_model`` arguments for each actor (``n_ctx``, ...).
        rebalance: run the input's upstream part (reads, maps) when this is called and
            keep it in the object store (spilled to disk when larger) as blocks of
            ``batch_size`` rows (fewer when there are not enough rows to give every actor
            a full batch), so every actor gets work and the actors may hold every CPU.
            ``False`` streams the input instead: then give it at least as many blocks as
            actors, and leave CPUs free for its reads (Ray Data starts the actors first and
            hangs when they hold every CPU a pending read needs).
        extract_options: passed to ``extract_many`` (``max_tokens``, ``sampling``,
            ``limits``, ``instructions``, ``examples``, ``retries``); each must pickle.

    Raises:
        BackendUnavailableError: Ray Data is not installed.
        InvalidInputError, SchemaError: a bad argument or schema, before anything runs.
    """
    ray = import_ray()
    from ._workers import ExtractWorker

    if not isinstance(ds, ray.data.Dataset):
        raise InvalidInputError(f"ds must be a ray.data.Dataset, got {type(ds).__name__}.")
    if not isinstance(text_column, str) or not text_column:
        raise InvalidInputError(f"text_column must be a column name, got {text_column!r}.")
    options = _check_options(extract_many, extract_options, reserved={"model", "progress"})
    shipped = ShippedSchema.of(schema)
    spec = _worker_spec(model, threads_per_actor, model_options)
    kwargs = {"schema": shipped, "text_column": text_column, "extract_options": options}
    return _map_on_pool(ray, ds, ExtractWorker, spec, kwargs, actors, batch_size, rebalance)


def decide_dataset(
    ds: Dataset,
    *,
    question_column: str = "question",
    options_column: str = "options",
    context_column: str | None = "context",
    model: str | os.PathLike[str] | None = None,
    actors: int | None = None,
    threads_per_actor: int = 1,
    batch_size: int = DEFAULT_BATCH_SIZE,
    model_options: Mapping[str, Any] | None = None,
    rebalance: bool = True,
    **decide_options: Any,
) -> Dataset:
    """Answer the question of every row of a Ray Data ``Dataset`` with ``decide_many``.

    Returns a lazy ``Dataset`` with every input row plus ``choice`` (the chosen option's
    text), ``index`` (its position), ``scores`` (one probability per option), ``error`` and
    ``error_type``; a bad row (missing question, fewer than two options, a prompt too long
    for the context) becomes an error row. Input columns of those names are replaced. A
    missing ``context_column`` means no context. ``decide_options`` go to ``decide_many``
    (``method``, ``batched``); ``model``, ``actors``, ``threads_per_actor``,
    ``batch_size``, ``model_options`` and ``rebalance`` as in :func:`extract_dataset` (the workers
    use the head shipped for the model, as ``decide`` does).
    """
    ray = import_ray()
    from ._workers import DecideWorker

    if not isinstance(ds, ray.data.Dataset):
        raise InvalidInputError(f"ds must be a ray.data.Dataset, got {type(ds).__name__}.")
    for name, col in (("question_column", question_column), ("options_column", options_column)):
        if not isinstance(col, str) or not col:
            raise InvalidInputError(f"{name} must be a column name, got {col!r}.")
    options = _check_options(decide_many, decide_options, reserved={"model"})
    spec = _worker_spec(model, threads_per_actor, model_options)
    kwargs = {
        "question_column": question_column,
        "options_column": options_column,
        "context_column": context_column,
        "decide_options": options,
    }
    return _map_on_pool(ray, ds, DecideWorker, spec, kwargs, actors, batch_size, rebalance)


def _map_on_pool(
    ray: Any,
    ds: Dataset,
    worker: type,
    spec: Any,
    kwargs: dict[str, Any],
    actors: int | None,
    batch_size: int,
    rebalance: bool,
) -> Dataset:
    """``worker`` (a class UDF that loads one model per actor) over ``ds`` on an actor pool."""
    batch = _positive_int("batch_size", batch_size)
    size = _pool_size(ray, actors, spec.threads)
    blocks, batch = _blocks(ds, batch, size, rebalance)
    mapped: Dataset = blocks.map_batches(
        worker,
        fn_constructor_kwargs={"spec": spec, **kwargs},
        batch_size=batch,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=size),
        num_cpus=spec.threads,
    )
    return mapped
