"""Every field of the whole config graph (every nested model, every union member) is described."""

from __future__ import annotations

import typing
from types import UnionType
from typing import Any

from pydantic import BaseModel

from prefect_swarm.config import (
    ContainerConfig,
    EngineConfig,
    LeptonConfig,
    LeptonMount,
    LocalConfig,
    SlurmConfig,
    SwarmConfig,
)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        args = args[:1]
    elif typing.get_origin(annotation) not in (typing.Union, UnionType, list, tuple, dict, set, frozenset):
        args = ()
    return [m for arg in args for m in _models_in(arg)]


def walk(root: type[BaseModel]) -> tuple[set[type[BaseModel]], list[str]]:
    """Every model reachable from ``root``, and each field (as Model.field) lacking a description."""
    seen: set[type[BaseModel]] = set()
    missing: list[str] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        if not (model.__doc__ or "").strip():
            missing.append(f"{model.__name__} (class docstring)")
        for name, info in model.model_fields.items():
            if not (info.description or "").strip():
                missing.append(f"{model.__name__}.{name}")
            todo += _models_in(info.annotation)
    return seen, missing


def test_every_config_field_is_described() -> None:
    seen, missing = walk(SwarmConfig)
    assert missing == [], f"fields without a description: {missing}"
    # the walk really went everywhere: every union member and nested model
    assert {
        SwarmConfig,
        EngineConfig,
        LocalConfig,
        SlurmConfig,
        LeptonConfig,
        ContainerConfig,
        LeptonMount,
    } <= seen


def test_walker_catches_an_undescribed_field() -> None:
    from pydantic import Field

    class Inner(BaseModel):
        """Inner."""

        ok: int = Field(0, description="described")
        bare: int = 0

    class Outer(BaseModel):
        """Outer."""

        inner: list[Inner] | None = Field(None, description="nested through list and Optional")

    _, missing = walk(Outer)
    assert missing == ["Inner.bare"]
