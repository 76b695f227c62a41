"""A documents-done bar on stderr (tqdm), shared by ``extract_many`` and ``extract --many --ray``."""

from __future__ import annotations

import sys
from typing import Any


class DocumentProgress:
    """Documents done and failed: a tqdm bar on stderr when ``enabled`` (nothing is drawn, and
    tqdm is not imported, otherwise). ``where`` is added after the counts (``"on 2 actors"``)."""

    def __init__(self, total: int | None, enabled: bool, where: str = "") -> None:
        self.total = total
        self.done = 0
        self.failed = 0
        self._where = f", {where}" if where else ""
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="doc", file=sys.stderr, dynamic_ncols=True, postfix=self._postfix())

    def _postfix(self) -> str:
        return f"{self.failed} failed{self._where}"

    def update(self, ok: bool) -> None:
        """Count one document, failed unless ``ok``."""
        self.done += 1
        self.failed += 0 if ok else 1
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        """Leave the bar's last state on its line."""
        if self._bar is not None:
            self._bar.close()
