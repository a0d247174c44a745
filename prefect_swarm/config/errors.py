"""Turn pydantic and YAML errors into ConfigErrors that name the file, the field path and the fix."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.redaction import redact

SECRET_FIELDS = frozenset({"api_key", "token"})
"""Fields whose offending value is never echoed back in an error message; so are the values of
fields that name a variable (``*_env``: where a key gets pasted by mistake) or a secret (``*_secret``)."""


def _secret_field(loc: tuple[Any, ...]) -> bool:
    return any(str(p) in SECRET_FIELDS or str(p).endswith(("_env", "_secret")) for p in loc)


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation can hold: through Optional, unions, lists and dicts."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, tuple, dict, set, frozenset):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _backend_models() -> dict[str, type[BaseModel]]:
    from prefect_swarm.config.backends import BackendConfig

    union = typing.get_args(BackendConfig)[0]  # Annotated[A | B | ..., Field(discriminator="type")]
    return {m.model_fields["type"].default: m for m in typing.get_args(union)}


def _model_at(root: type[BaseModel], loc: Iterable[Any]) -> type[BaseModel] | None:
    """Walk ``loc`` through nested models (the backend union by its tag, list items by index)."""
    by_tag = _backend_models()
    candidates: list[type[BaseModel]] = [root]
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: same item model
        if isinstance(part, str) and part in by_tag and by_tag[part] in candidates:
            candidates = [by_tag[part]]
            continue
        nxt: list[type[BaseModel]] = []
        for model in candidates:
            info = model.model_fields.get(str(part)) or _by_alias(model, str(part))
            if info is not None:
                nxt += _models_in(info.annotation)
        if not nxt:
            return None
        candidates = nxt
    return candidates[0] if len(candidates) == 1 else None


def _by_alias(model: type[BaseModel], alias: str) -> Any:
    return next((i for i in model.model_fields.values() if i.alias == alias), None)


def _suggest(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    model = _model_at(root, loc[:-1])
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), _field_names(model), n=1, cutoff=0.6)
    if close:
        return f" Did you mean '{close[0]}'?"
    return f" Valid keys here: {', '.join(sorted(_field_names(model)))}."


def _path(loc: tuple[Any, ...]) -> str:
    from prefect_swarm.config.backends import BACKEND_TYPES

    parts = [str(p) for i, p in enumerate(loc) if not (i > 0 and loc[i - 1] == "backend" and p in BACKEND_TYPES)]
    return ".".join(parts) or "(top level)"


def _one(root: type[BaseModel], err: Mapping[str, Any]) -> str:
    from prefect_swarm.config.backends import BACKEND_TYPES

    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{_path(loc)}: unknown key '{loc[-1]}'.{_suggest(root, loc)}"
    if kind == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag")
        return f"{_path(loc)}.type: backend type '{tag}' is not valid; choose one of {', '.join(BACKEND_TYPES)}."
    if kind == "union_tag_not_found":
        return f"{_path(loc)}: missing 'type'; set it to one of {', '.join(BACKEND_TYPES)}."
    if kind == "missing":
        return f"{_path(loc)}: required field is missing."
    got = err.get("input")
    shown = "" if _secret_field(loc) or isinstance(got, dict | list) else f" (got {got!r})"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return redact(f"{_path(loc)}: {msg}{shown}.")  # a URL's user-info, a bearer token: never echoed


def config_error(
    exc: ValidationError,
    root: type[BaseModel],
    source: str | Path | None,
    env_keys: Iterable[str] = (),
) -> ConfigError:
    """Build a ConfigError listing every problem with its field path (and where values came from)."""
    where = f" in {source}" if source else ""
    lines = [f"invalid swarm config{where}:"]
    lines += ["  " + _one(root, e) for e in exc.errors()]
    env_keys = sorted(env_keys)
    if env_keys:
        lines.append(f"  (environment overrides applied: {', '.join(env_keys)})")
    lines.append("Fix the fields above; `prefect-swarm validate -c FILE` checks a config without starting anything.")
    return ConfigError("\n".join(lines))


def invalid_fields(exc: ValueError, root: type[BaseModel], title: str) -> ConfigError:
    """A ConfigError for ``exc`` raised validating a ``root`` (a job spec, say): ``title``, then one line a
    problem with its field path, through the same rule as a swarm config's (no secret echoed)."""
    if isinstance(exc, ValidationError):
        return ConfigError("\n".join([f"{title}:", *("  " + _one(root, e) for e in exc.errors())]))
    return ConfigError(redact(f"{title}: {exc}"))
