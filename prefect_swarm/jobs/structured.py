"""Structured output: a response schema sent as OpenAI ``response_format``, answers checked against it.

A job's ``response_schema`` is a pydantic model given as ``module:Model`` or the path of a JSON
Schema file (an object schema). :class:`ResponseSchema` holds it and knows

- the ``response_format`` to send (``{"type": "json_schema", "json_schema": {name, schema, strict}}``;
  vLLM enforces it with guided decoding),
- the output columns: one typed Arrow column per top-level property (string, int64, float64, bool,
  or a list of those; nested objects and mixed types as JSON text),
- how to check an answer: parsed and validated (pydantic for a model, ``jsonschema`` for a schema
  file); a broken answer raises :class:`~prefect_swarm.jobs.api.InvalidAnswer`, so the runner asks
  again (``schema_retries`` times) and then records the row as an error with the validation message.

:class:`~prefect_swarm.jobs.api.SwarmJob` loads it when a job is given ``response_schema``.

Nothing here runs for a job without a schema.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ValidationError

from prefect_swarm.exceptions import ConfigError, InvalidAnswer

_SCALARS: dict[str, pa.DataType] = {
    "string": pa.string(),
    "integer": pa.int64(),
    "number": pa.float64(),
    "boolean": pa.bool_(),
}
SCHEMA_ERROR_COLUMN = "schema_error"
"""Output column: why the last refused answer was refused, for a row answered validly after retries."""


class ResponseSchema:
    """A response schema (pydantic model or JSON Schema), its response_format, columns and validator."""

    def __init__(self, ref: str, schema: dict[str, Any], model: type[BaseModel] | None = None) -> None:
        self.ref, self.schema, self.model = ref, schema, model
        if schema.get("type", "object") != "object" or not isinstance(schema.get("properties"), dict):
            raise ConfigError(
                f"response_schema {ref}: the schema must describe a JSON object with 'properties' "
                "(one output column per top-level property)."
            )
        self.name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or Path(ref).stem or "response"))[:64]
        self.defs: dict[str, Any] = schema.get("$defs") or schema.get("definitions") or {}
        self.fields: dict[str, pa.DataType] = {}
        self._convert: dict[str, Callable[[Any], Any]] = {}
        for key, prop in schema["properties"].items():
            typ = self.arrow_type(prop)
            self.fields[key] = typ
            self._convert[key] = _same if self._typed(prop) else _as_json_text
        self._check = self._pydantic_check if model is not None else self._jsonschema_check()

    # ------------------------------------------------------------------ load
    @staticmethod
    def file_of(ref: str) -> Path | None:
        """The JSON Schema file ``ref`` names (a ``.json`` name, or any file that exists), else None
        (``module:Model``)."""
        path = Path(ref).expanduser()
        return path if path.suffix == ".json" or path.exists() else None

    @classmethod
    def load(cls, ref: str) -> ResponseSchema:
        """A schema from ``module:Model`` (a pydantic model) or a JSON Schema file; ConfigError when neither."""
        path = cls.file_of(ref)
        if path is not None:
            try:
                schema = json.loads(path.read_text())
            except FileNotFoundError as exc:
                raise ConfigError(f"response_schema {ref}: the file does not exist.") from exc
            except ValueError as exc:
                raise ConfigError(f"response_schema {ref}: the file is not JSON ({exc}).") from exc
            if not isinstance(schema, dict):
                raise ConfigError(f"response_schema {ref}: the file holds no JSON Schema object.")
            return cls(ref, schema)
        module_name, _, attr = ref.partition(":")
        if not attr:
            raise ConfigError(
                f"response_schema {ref!r} is neither an existing JSON Schema file nor 'module:Model' "
                "(a pydantic model importable in the job process)."
            )
        try:
            model = getattr(importlib.import_module(module_name), attr, None)
        except ImportError as exc:
            raise ConfigError(f"response_schema {ref}: cannot import module '{module_name}' ({exc}).") from exc
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ConfigError(f"response_schema {ref}: '{attr}' is not a pydantic model in module '{module_name}'.")
        return cls(ref, model.model_json_schema(), model)

    # ------------------------------------------------------------------ what is sent, what comes out
    def response_format(self) -> dict[str, Any]:
        """The OpenAI ``response_format`` of a request."""
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema, "strict": True}}

    def arrow_type(self, prop: dict[str, Any]) -> pa.DataType:
        """Arrow type of a property: scalars typed, lists of scalars as lists, anything else JSON text."""
        kind = self._kind(prop)
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array":
            item = self._kind(self._resolve(prop).get("items") or {})
            if item in _SCALARS:
                return pa.list_(_SCALARS[item])
        return pa.string()

    def _typed(self, prop: dict[str, Any]) -> bool:
        """Whether the property's values go into their column as they are (else as JSON text)."""
        kind = self._kind(prop)
        return kind in _SCALARS or (kind == "array" and self.arrow_type(prop) != pa.string())

    def _kind(self, prop: dict[str, Any]) -> str | None:
        """The property's one JSON type (``string`` for an enum of strings); None when mixed or unknown."""
        prop = self._resolve(prop)
        typ = prop.get("type")
        if isinstance(typ, list):
            kinds = [t for t in typ if t != "null"]
            typ = kinds[0] if len(kinds) == 1 else None
        if typ is None and "enum" in prop and all(isinstance(v, str) for v in prop["enum"]):
            typ = "string"
        return typ if isinstance(typ, str) else None

    def _resolve(self, prop: dict[str, Any]) -> dict[str, Any]:
        """Follow a local ``$ref`` and unwrap ``anyOf: [X, null]`` (an Optional field)."""
        if "$ref" in prop:
            prop = self.defs.get(str(prop["$ref"]).rsplit("/", 1)[-1], {})
        options = prop.get("anyOf") or prop.get("oneOf")
        if options:
            kinds = [o for o in options if o.get("type") != "null"]
            if len(kinds) == 1:
                return self._resolve(kinds[0])
        return prop

    # ------------------------------------------------------------------ check an answer
    def validate(self, text: str | None) -> dict[str, Any]:
        """The answer's top-level fields as column values; InvalidAnswer saying what is wrong."""
        if not text:
            raise InvalidAnswer("the answer is empty; expected a JSON object")
        value = self._check(text)
        return {key: convert(value.get(key)) for key, convert in self._convert.items()}

    def _pydantic_check(self, text: str) -> dict[str, Any]:
        assert self.model is not None
        try:
            return self.model.model_validate_json(text).model_dump(mode="json", by_alias=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(answer)'}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
            )
            raise InvalidAnswer(f"the answer does not match {self.name}: {problems}") from None

    def _jsonschema_check(self) -> Callable[[str], dict[str, Any]]:
        import jsonschema

        validator_cls = jsonschema.validators.validator_for(self.schema)
        try:
            validator_cls.check_schema(self.schema)
        except jsonschema.exceptions.SchemaError as exc:
            raise ConfigError(f"response_schema {self.ref} is not a valid JSON Schema: {exc.message}") from exc
        validator = validator_cls(self.schema)

        def check(text: str) -> dict[str, Any]:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise InvalidAnswer(f"the answer is not JSON: {exc}") from None
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
            if error is not None:
                where = "/".join(map(str, error.absolute_path)) or "(answer)"
                raise InvalidAnswer(f"the answer does not match {self.name}: {where}: {error.message}")
            return dict(value)

        return check


def _same(value: Any) -> Any:
    return value


def _as_json_text(value: Any) -> Any:
    return None if value is None else json.dumps(value, separators=(",", ":"))
