"""Turn pydantic and YAML errors into ConfigErrors that name the file, the field path and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from prefect_swarm.exceptions import ConfigError


def _field_names(model: type[BaseModel]) -> list[str]:
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append(info.alias or name)
    return names


def _model_at(root: type[BaseModel], loc: Iterable[Any]) -> type[BaseModel] | None:
    """Walk ``loc`` through nested models (and the backend union by its tag) to the model holding it."""
    from prefect_swarm.config.backends import LeptonConfig, LocalConfig, SlurmConfig

    by_tag: dict[str, type[BaseModel]] = {"local": LocalConfig, "slurm": SlurmConfig, "lepton": LeptonConfig}
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, str) and part in by_tag and model not in by_tag.values():
            model = by_tag[part]
            continue
        if model is None:
            return None
        info = model.model_fields.get(str(part))
        if info is None:
            return model if part == list(loc)[-1] else None
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


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

    parts = [str(p) for p in loc if str(p) not in BACKEND_TYPES]
    return ".".join(parts) or "(top level)"


def _one(root: type[BaseModel], err: Any) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{_path(loc)}: unknown key '{loc[-1]}'.{_suggest(root, loc)}"
    if kind == "union_tag_invalid":
        from prefect_swarm.config.backends import BACKEND_TYPES

        tag = err.get("ctx", {}).get("tag")
        return (
            f"{_path(loc)}.type: backend type '{tag}' is not valid; choose one of {', '.join(BACKEND_TYPES)}."
        )
    if kind == "union_tag_not_found":
        return f"{_path(loc)}: missing 'type'; set it to one of local, lepton, slurm."
    if kind == "missing":
        return f"{_path(loc)}: required field is missing."
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    return f"{_path(loc)}: {err['msg']}{shown}."


def config_error(exc: ValidationError, root: type[BaseModel], source: str | Path | None) -> ConfigError:
    """Build a ConfigError listing every problem with its field path."""
    where = f" in {source}" if source else ""
    lines = [f"invalid swarm config{where}:"]
    lines += ["  " + _one(root, e) for e in exc.errors()]
    lines.append("Fix the fields above; `prefect-swarm validate -c FILE` checks a config without starting anything.")
    return ConfigError("\n".join(lines))
