"""The block classes. Each is ``class X(Block, XConfig)``: the config model owns every field.

A block adds only Prefect metadata (type name, slug, documentation URL), the conversion to the
plain config model (:meth:`to_config`) and the inverse (:meth:`from_config`). Nothing else may
declare a field here except ``SwarmSpec.backend``, whose type is the union of backend *blocks*
(so the UI offers a saved backend block) instead of the union of backend configs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from prefect.blocks.core import Block
from pydantic import BaseModel, Field, model_validator

from prefect_swarm.config import LeptonConfig, LocalConfig, SlurmConfig, SwarmConfig

DOCS_URL = "https://github.com/prefect-swarm/prefect-swarm/blob/main/docs/blocks.md"
LOGO_URL = "https://raw.githubusercontent.com/prefect-swarm/prefect-swarm/main/prefect_swarm/blocks/logo.png"
"""Where the UI fetches the block logo: the ``logo.png`` shipped beside this module."""


def _drop_block_slug(cls: type, data: Any) -> Any:
    # Block.model_dump() adds 'block_type_slug' (to pick a union member on load); the config
    # models forbid unknown keys, so drop it before validation.
    if isinstance(data, dict) and "block_type_slug" in data:
        return {k: v for k, v in data.items() if k != "block_type_slug"}
    return data


def _field_values(model: BaseModel, config_cls: type[BaseModel]) -> dict[str, Any]:
    return {name: getattr(model, name) for name in config_cls.model_fields}


class _ConfigBlock:
    """Conversions between a backend block and its config model (``config_model``)."""

    config_model: ClassVar[type[BaseModel]]

    def to_config(self) -> Any:
        """The plain config model (validated again; secrets stay SecretStr)."""
        return self.config_model.model_validate(_field_values(self, self.config_model))  # type: ignore[arg-type]

    @classmethod
    def from_config(cls, cfg: BaseModel) -> Self:
        """A block holding ``cfg``'s values."""
        return cls.model_validate(_field_values(cfg, cls.config_model))  # type: ignore[attr-defined,no-any-return]


class LocalBackend(_ConfigBlock, Block, LocalConfig):
    """Run a swarm's replicas as processes on the machine running the flow.

    Example:
        ```python
        from prefect_swarm.blocks import LocalBackend
        backend = LocalBackend.load("BLOCK_NAME")
        ```
    """

    _block_type_name = "Swarm Local Backend"
    _block_type_slug = "swarm-local-backend"
    _documentation_url = DOCS_URL  # type: ignore[assignment]  # Block accepts a str URL
    _logo_url = LOGO_URL  # type: ignore[assignment]
    config_model: ClassVar[type[BaseModel]] = LocalConfig

    _strip = model_validator(mode="before")(_drop_block_slug)


class SlurmBackend(_ConfigBlock, Block, SlurmConfig):
    """Run a swarm's replicas as one Slurm job array behind an nginx load balancer.

    Example:
        ```python
        from prefect_swarm.blocks import SlurmBackend
        backend = SlurmBackend.load("BLOCK_NAME")
        ```
    """

    _block_type_name = "Swarm Slurm Backend"
    _block_type_slug = "swarm-slurm-backend"
    _documentation_url = DOCS_URL  # type: ignore[assignment]  # Block accepts a str URL
    _logo_url = LOGO_URL  # type: ignore[assignment]
    config_model: ClassVar[type[BaseModel]] = SlurmConfig

    _strip = model_validator(mode="before")(_drop_block_slug)


class LeptonBackend(_ConfigBlock, Block, LeptonConfig):
    """Run a swarm as an endpoint (and jobs as batch jobs) on NVIDIA DGX Cloud Lepton.

    The workspace token is a secret: the API and UI show it masked.

    Example:
        ```python
        from prefect_swarm.blocks import LeptonBackend
        backend = LeptonBackend.load("BLOCK_NAME")
        ```
    """

    _block_type_name = "Swarm Lepton Backend"
    _block_type_slug = "swarm-lepton-backend"
    _documentation_url = DOCS_URL  # type: ignore[assignment]  # Block accepts a str URL
    _logo_url = LOGO_URL  # type: ignore[assignment]
    config_model: ClassVar[type[BaseModel]] = LeptonConfig

    _strip = model_validator(mode="before")(_drop_block_slug)


BackendBlock = LocalBackend | SlurmBackend | LeptonBackend
"""Any backend block."""

BACKEND_BLOCKS: dict[str, type[LocalBackend] | type[SlurmBackend] | type[LeptonBackend]] = {
    "local": LocalBackend,
    "slurm": SlurmBackend,
    "lepton": LeptonBackend,
}
"""Backend ``type`` -> block class."""


def backend_block_for(cfg: LocalConfig | SlurmConfig | LeptonConfig) -> BackendBlock:
    """The backend block holding a backend config's values."""
    return BACKEND_BLOCKS[cfg.type].from_config(cfg)  # type: ignore[arg-type]


class SwarmSpec(Block, SwarmConfig):
    """A named swarm: model, replicas, engine and a backend block.

    A flow's ``swarm`` parameter may name a saved SwarmSpec; secrets (api_key, the Lepton token)
    stay in the block and never become flow parameters.

    Example:
        ```python
        from prefect_swarm.blocks import SwarmSpec
        cfg = SwarmSpec.load("BLOCK_NAME").to_config()
        ```
    """

    _block_type_name = "Swarm Spec"
    _block_type_slug = "swarm-spec"
    _documentation_url = DOCS_URL  # type: ignore[assignment]  # Block accepts a str URL
    _logo_url = LOGO_URL  # type: ignore[assignment]
    config_model: ClassVar[type[BaseModel]] = SwarmConfig

    backend: LocalBackend | SlurmBackend | LeptonBackend = Field(  # type: ignore[assignment]
        default_factory=LocalBackend,
        description=SwarmConfig.model_fields["backend"].description,
    )

    _strip = model_validator(mode="before")(_drop_block_slug)

    def to_config(self) -> SwarmConfig:
        """The plain SwarmConfig (validated again, secrets included)."""
        data = _field_values(self, SwarmConfig)
        data["backend"] = self.backend.to_config()
        return SwarmConfig.model_validate(data)

    @classmethod
    def from_config(cls, cfg: SwarmConfig) -> SwarmSpec:
        """A block (with an inline backend block) holding ``cfg``'s values."""
        data = _field_values(cfg, SwarmConfig)
        data["backend"] = backend_block_for(cfg.backend)
        return cls.model_validate(data)
