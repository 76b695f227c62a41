"""pocket_agent on Ray Data: the same extraction and decisions from one laptop to a cluster.

``extract_dataset(ds, schema)`` and ``decide_dataset(ds)`` map a Ray Data ``Dataset``
through an actor pool, one model per actor, and add result and error columns to every row.
Needs the ``ray`` extra (``pip install 'pocket-agent-mnn[ray]'``); importing
``pocket_agent`` itself never imports Ray, and this package imports it only when called.
"""

from .datasets import DEFAULT_BATCH_SIZE, decide_dataset, extract_dataset

__all__ = ["DEFAULT_BATCH_SIZE", "decide_dataset", "extract_dataset"]
