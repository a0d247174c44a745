"""Load a SwarmConfig from layered sources.

Precedence, lowest first (documented in the README and tested):

1. built-in defaults (the models' field defaults)
2. the defaults file ``$PREFECT_SWARM_HOME/defaults.yaml``
3. the YAML config file (``-c FILE``)
4. ``PREFECT_SWARM_*`` environment variables naming config fields, nested with ``__``:
   ``PREFECT_SWARM_REPLICAS=4``, ``PREFECT_SWARM_BACKEND__PARTITION=gpu``.
   Values are parsed as YAML scalars/lists (``PREFECT_SWARM_ENGINE__ARGS='[--dtype, float32]'``).
   Variables that are process settings (``PREFECT_SWARM_HOME``...) are not config. Keys under
   the free-form ``env`` mappings keep their case: ``PREFECT_SWARM_ENV__HF_HOME=/data``.
5. CLI flags (``--replicas``, ``--name``...), passed as ``overrides``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prefect_swarm.config.errors import config_error
from prefect_swarm.config.swarm import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.settings import ENV_PREFIX, get_settings


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``top`` over ``base``; nested mappings merge, everything else is replaced.

    A backend mapping whose ``type`` changes replaces the lower one whole, so keys of one
    backend never leak into another.
    """
    out = dict(base)
    for key, value in top.items():
        lower = out.get(key)
        if isinstance(lower, Mapping) and isinstance(value, Mapping):
            if "type" in value and "type" in lower and value["type"] != lower["type"]:
                out[key] = dict(value)
            else:
                out[key] = deep_merge(lower, value)
        else:
            out[key] = value
    return out


def read_yaml(path: Path, *, required: bool = True) -> dict[str, Any]:
    """Read a YAML mapping; errors name the file and the line."""
    if not path.exists():
        if required:
            raise ConfigError(f"config file {path} does not exist. Check the path given to -c/--config.")
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}. Fix the syntax and retry.") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of config keys (name, model, replicas, backend, ...), "
            f"not a {type(data).__name__}."
        )
    return data


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Config values from ``PREFECT_SWARM_<FIELD>[__<SUBFIELD>...]`` variables."""
    environ = os.environ if environ is None else environ
    fields = set(SwarmConfig.model_fields)
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = _env_path(key[len(ENV_PREFIX) :].split("__"))
        if path[0] not in fields:
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if path[0] in ("name", "model", "served_model_name") or tuple(path[:-1]) in _MAPPING_FIELDS:
            value = raw  # strings by nature: "0123" or "true" must not become numbers/booleans
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


_MAPPING_FIELDS = (("env",), ("engine", "env"))
"""Config fields that are free-form mappings: keys below them keep their case (``ENV__HF_HOME``)."""


def _env_path(parts: list[str]) -> list[str]:
    out: list[str] = []
    for part in parts:
        out.append(part if tuple(out) in _MAPPING_FIELDS else part.lower())
    return out


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    data: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    use_defaults_file: bool = True,
) -> SwarmConfig:
    """Build a SwarmConfig from defaults file < YAML (``path`` or ``data``) < environment < ``overrides``."""
    merged: dict[str, Any] = {}
    if use_defaults_file:
        merged = read_yaml(get_settings().defaults_file, required=False)
    source: Path | str | None = None
    if path is not None:
        source = Path(path)
        merged = deep_merge(merged, read_yaml(source))
    if data is not None:
        merged = deep_merge(merged, dict(data))
        source = source or "inline config"
    from_env = env_overrides(environ)
    merged = deep_merge(merged, from_env)
    merged = deep_merge(merged, {k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return SwarmConfig.model_validate(merged)
    except ValidationError as exc:
        env_keys = [ENV_PREFIX + "__".join(p).upper() for p in _leaf_paths(from_env)]
        raise config_error(exc, SwarmConfig, source, env_keys) from None


def _leaf_paths(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out += _leaf_paths(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out
