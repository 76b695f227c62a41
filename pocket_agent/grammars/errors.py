"""Errors the grammar matcher raises while generation drives it (defined in pocket_agent.errors).

Compile-time problems use :class:`pocket_agent.errors.SchemaError` and
:class:`pocket_agent.errors.UnsupportedSchemaError`.
"""

from __future__ import annotations

from ..errors import ConstraintError, TokenRejectedError

__all__ = ["ConstraintError", "TokenRejectedError"]
