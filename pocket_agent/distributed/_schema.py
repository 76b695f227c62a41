"""Ship an extraction schema to worker processes by value.

A Pydantic class is pickled by value (its module's code travels with it), so a class
defined in ``__main__``, a notebook or a test module works on workers that cannot import
it. Its JSON Schema travels beside it: if the class cannot be rebuilt on a worker, the
worker extracts against that schema instead (same prompt, same grammar, same output JSON;
only validators the grammar cannot express are lost).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from pydantic import BaseModel

from ..errors import InvalidInputError, SchemaError
from ..grammars import close_objects

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShippedSchema:
    """A schema in a form that pickles anywhere: JSON Schema text plus, for a Pydantic
    class, the class pickled by value."""

    json_schema: str
    class_blob: bytes | None = None
    class_name: str | None = None

    @classmethod
    def of(cls, schema: Any) -> ShippedSchema:
        """Pack a Pydantic model class or a JSON Schema dict; bad schemas raise here, on the driver."""
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            try:
                js = close_objects(schema.model_json_schema())
            except Exception as exc:
                raise SchemaError(f"{schema.__name__} has no JSON Schema: {exc}") from exc
            return cls(json.dumps(js), _pickle_by_value(schema), f"{schema.__module__}.{schema.__qualname__}")
        if isinstance(schema, Mapping):
            js = dict(schema)
            try:
                jsonschema.validators.validator_for(js).check_schema(js)
            except jsonschema.SchemaError as exc:
                raise SchemaError(
                    f"Invalid JSON Schema: {exc.message} (at {'/'.join(map(str, exc.path)) or 'root'})"
                ) from exc
            try:
                return cls(json.dumps(js))
            except (TypeError, ValueError) as exc:
                raise SchemaError(f"The JSON Schema must be plain JSON data: {exc}") from exc
        raise InvalidInputError(
            f"schema must be a Pydantic model class or a JSON Schema dict, got {type(schema).__name__}."
        )

    def load(self) -> Any:
        """The schema to pass to ``extract``: the class when it can be rebuilt here, else the JSON Schema."""
        if self.class_blob is not None:
            from ray import cloudpickle

            try:
                loaded = cloudpickle.loads(self.class_blob)
            except Exception as exc:  # any failure to rebuild the class: fall back to its schema
                log.warning("Cannot rebuild %s on this worker (%s); using its JSON Schema.", self.class_name, exc)
            else:
                if isinstance(loaded, type) and issubclass(loaded, BaseModel):
                    return loaded
        return json.loads(self.json_schema)


def _pickle_by_value(schema: type[BaseModel]) -> bytes | None:
    """``schema`` pickled with its module's code, or ``None`` when it does not pickle."""
    from ray import cloudpickle as _cloudpickle

    cloudpickle: Any = _cloudpickle  # untyped module

    module = sys.modules.get(schema.__module__)
    by_value = module is not None and schema.__module__ != "__main__"  # __main__ is always by value
    if by_value:
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:
            by_value = False
    try:
        return bytes(cloudpickle.dumps(schema))
    except Exception as exc:  # an unpicklable class still extracts, against its JSON Schema
        log.warning("Cannot pickle %s (%s); workers will use its JSON Schema.", schema.__qualname__, exc)
        return None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)
