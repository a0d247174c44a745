"""The block classes. Each is ``class X(_SwarmBlock, XConfig)``: the config model owns every field.

A block adds only Prefect metadata (type name; the slug is derived from it), the conversion to
the plain config model (:meth:`_SwarmBlock.to_config`) and the inverse
(:meth:`_SwarmBlock.from_config`). Nothing else may declare a field here except
``SwarmSpec.backend``, whose type is the union of backend *blocks* (so the UI offers a saved
backend block) instead of the union of backend configs.

The documentation link is Prefect's page on blocks (register, save, load): every field of ours
is described in the block's form itself. No logo URL is registered: Prefect's block-type API
accepts only http(s) URLs and the project publishes none, so the UI shows its default icon; the
logo ships beside this module (:data:`LOGO`) for whoever hosts the package's pages.
"""

from __future__ import annotations

import re
import types
import typing
from abc import ABC
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from prefect.blocks.core import Block
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import ComputedFieldInfo, FieldInfo
from pydantic.json_schema import GenerateJsonSchema

from prefect_swarm.backends.entry import BackendEntry
from prefect_swarm.backends.registry import ENTRIES, entry_of
from prefect_swarm.config import ExternalConfig, LeptonConfig, LocalConfig, SlurmConfig, SwarmConfig

DOCS_URL = "https://docs.prefect.io/v3/concepts/blocks"
"""Prefect's page on blocks: how to register, save and load them."""

LOGO = Path(__file__).with_name("logo.png")
"""The block logo (a 128 px square PNG), shipped as package data."""


_TITLE_WORDS = {
    "api": "API",
    "cpu": "CPU",
    "cpus": "CPUs",
    "gpu": "GPU",
    "gpus": "GPUs",
    "env": "environment",
    "gres": "GRES",
    "mem": "memory",
    "nv": "NV",
    "hf": "HF",
    "id": "ID",
    "ids": "IDs",
    "lb": "LB",
    "qos": "QoS",
    "url": "URL",
    "urls": "URLs",
    "s": "(s)",
    "ms": "(ms)",
    "mb": "(MB)",
    "gb": "(GB)",
}
"""How a word of a field name reads in a title (units in parentheses, acronyms upper case)."""


def field_title(name: str, info: FieldInfo | ComputedFieldInfo | None = None) -> str:
    """The form label of field ``name``: ``gpus_per_replica`` -> "GPUs per replica",
    ``startup_timeout_s`` -> "Startup timeout (s)" (Prefect's default would be "Gpus Per Replica")."""
    words = [_TITLE_WORDS.get(w, w) for w in name.split("_") if w]
    if not words:
        return name
    words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words)


def model_title(name: str) -> str:
    """The form label of a nested config model: ``EngineConfig`` -> "Engine", ``SlurmLBConfig`` ->
    "Slurm LB", ``LeptonMount`` -> "Lepton mount" (pydantic's default is the class name)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]*|[a-z]+|\d+", name.removesuffix("Config"))
    return field_title("_".join(w if w.isupper() and len(w) > 1 else w.lower() for w in words))


class _FormTitles(GenerateJsonSchema):
    """Titles for the fields of nested config models (engine, container, LB, mounts) too: the
    blocks' ``field_title_generator`` reaches only their own fields."""

    def get_title_from_name(self, name: str) -> str:
        return field_title(name)


def _human_model_titles(schema: dict[str, Any]) -> None:
    for name, definition in (schema.get("definitions") or {}).items():
        if "block_type_slug" not in definition and definition.get("title") == name:
            definition["title"] = model_title(name)
        for field, prop in (definition.get("properties") or {}).items():
            # pydantic leaves the title off a field whose type is an (optional) nested model
            prop.setdefault("title", field_title(field))


def _null_first(schema: dict[str, Any]) -> None:
    """An optional field whose default is None lists ``null`` first among its types: the UI's form
    opens on the first type, so an optional nested model (``stage``) would open as an empty object
    whose required fields ("To is required") keep the form from being submitted as it opens."""
    for definition in (schema, *(schema.get("definitions") or {}).values()):
        for prop in (definition.get("properties") or {}).values():
            options = prop.get("anyOf")
            if options and prop.get("default", ...) is None and {"type": "null"} in options:
                prop["anyOf"] = [{"type": "null"}, *(o for o in options if o != {"type": "null"})]


def _drop_block_slug(cls: type, data: Any) -> Any:
    # Block.model_dump() adds 'block_type_slug' (to pick a union member on load); the config
    # models forbid unknown keys, so drop it before validation.
    if isinstance(data, dict) and "block_type_slug" in data:
        return {k: v for k, v in data.items() if k != "block_type_slug"}
    return data


def _field_values(model: BaseModel, config_cls: type[BaseModel]) -> dict[str, Any]:
    return {name: getattr(model, name) for name in config_cls.model_fields}


class _SwarmBlock(Block, ABC):
    """What every prefect-swarm block adds to its config model (``config_model``).

    ``ABC`` among its bases keeps this base class out of Prefect's block registry, which a Prefect
    server registers whole: without it the catalog would offer a "Swarm Block" to create.
    """

    config_model: ClassVar[type[BaseModel]]
    model_config = ConfigDict(field_title_generator=field_title)
    _documentation_url = DOCS_URL  # type: ignore[assignment]  # Block declares HttpUrl; a str URL works

    _strip = model_validator(mode="before")(_drop_block_slug)

    @classmethod
    def model_json_schema(  # type: ignore[override]
        cls,
        by_alias: bool = True,
        ref_template: str = "#/definitions/{model}",
        schema_generator: type[GenerateJsonSchema] = _FormTitles,
        mode: Any = "validation",
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Prefect's block schema, with human titles on nested config models and their fields."""
        schema = super().model_json_schema(by_alias, ref_template, schema_generator, mode, **kwargs)
        _human_model_titles(schema)
        _null_first(schema)
        return schema

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        name = cls.__name__
        cls._code_example = (
            f'```python\nfrom prefect_swarm.blocks import {name}\n\nblock = {name}.load("BLOCK_NAME")\n'
            f"cfg = block.to_config()  # a {cls.config_model.__name__}\n```"
        )

    def to_config(self) -> Any:
        """The plain config model (validated again; secrets stay SecretStr)."""
        return self.config_model.model_validate(_field_values(self, self.config_model))

    @classmethod
    def from_config(cls, cfg: BaseModel) -> Self:
        """A block holding ``cfg``'s values."""
        return cls.model_validate(_field_values(cfg, cls.config_model))


class LocalBackend(_SwarmBlock, LocalConfig):
    """Run a swarm's replicas as processes on the machine running the flow."""

    _block_type_name = "Swarm Local Backend"
    config_model: ClassVar[type[BaseModel]] = LocalConfig


class SlurmBackend(_SwarmBlock, SlurmConfig):
    """Run a swarm's replicas as one Slurm job array behind an nginx load balancer."""

    _block_type_name = "Swarm Slurm Backend"
    config_model: ClassVar[type[BaseModel]] = SlurmConfig


class LeptonBackend(_SwarmBlock, LeptonConfig):
    """Run a swarm as an endpoint (and jobs as batch jobs) on NVIDIA DGX Cloud Lepton.

    The workspace token is a secret: the API and UI show it masked.
    """

    _block_type_name = "Swarm Lepton Backend"
    config_model: ClassVar[type[BaseModel]] = LeptonConfig


class ExternalBackend(_SwarmBlock, ExternalConfig):
    """Use an OpenAI-compatible endpoint someone else runs (a vLLM server, a gateway, a hosted provider).

    No lifecycle: a flow records it after one real completion and never stops it. The key stays in a
    Prefect Secret block (api_key_secret) or an environment variable (api_key_env).
    """

    _block_type_name = "Swarm External Backend"
    config_model: ClassVar[type[BaseModel]] = ExternalConfig


_DECLARED = {cls.config_model: cls for cls in (LocalBackend, SlurmBackend, LeptonBackend, ExternalBackend)}
"""The built-in backends' blocks, declared above for the names users import and the type checker."""


def _made_block(entry: BackendEntry) -> type[_SwarmBlock]:
    """The block of a backend that declares none above: made from its entry (config model, title, summary)."""

    def body(ns: dict[str, Any]) -> None:
        ns.update(
            __module__=__name__,
            __doc__=entry.summary,
            __annotations__={"config_model": "ClassVar[type[BaseModel]]"},
            _block_type_name=f"Swarm {entry.title} Backend",
            config_model=entry.config,
        )

    return types.new_class(entry.block, (_SwarmBlock, entry.config), exec_body=body)


BACKEND_BLOCKS: dict[str, type[_SwarmBlock]] = {
    kind: _DECLARED.get(entry.config) or _made_block(entry) for kind, entry in ENTRIES.items()
}
"""Backend ``type`` -> block class, one per entry of the table of backends."""

if TYPE_CHECKING:
    BackendBlock = LocalBackend | SlurmBackend | LeptonBackend | ExternalBackend
else:
    BackendBlock = typing.Union[tuple(BACKEND_BLOCKS.values())]  # noqa: UP007
"""Any backend block."""


def backend_block_for(cfg: LocalConfig | SlurmConfig | LeptonConfig | ExternalConfig) -> BackendBlock:
    """The backend block holding a backend config's values."""
    return BACKEND_BLOCKS[cfg.type].from_config(cfg)  # type: ignore[return-value]  # one block per entry


class SwarmSpec(_SwarmBlock, SwarmConfig):
    """A named swarm: model, replicas, engine and a backend block.

    A flow's ``swarm`` parameter may name a saved SwarmSpec; secrets (api_key, the Lepton token)
    stay in the block and never become flow parameters.
    """

    _block_type_name = "Swarm Spec"
    config_model: ClassVar[type[BaseModel]] = SwarmConfig

    backend: BackendBlock = Field(
        default_factory=LocalBackend,
        description=SwarmConfig.model_fields["backend"].description,
    )

    def to_config(self) -> SwarmConfig:
        """The plain SwarmConfig (validated again, secrets included)."""
        data = _field_values(self, SwarmConfig)
        data["backend"] = self.backend.to_config()
        return SwarmConfig.model_validate(data)

    @classmethod
    def from_config(cls, cfg: BaseModel) -> Self:
        """A block (with an inline backend block) holding ``cfg``'s values."""
        data = _field_values(cfg, SwarmConfig)
        data["backend"] = backend_block_for(data["backend"])
        return cls.model_validate(data)


def with_secret_key(cfg: SwarmConfig) -> SwarmConfig:
    """``cfg`` with the key of an external swarm loaded from the Prefect Secret block its
    ``backend.api_key_secret`` names (through the Prefect API); ``cfg`` itself when there is none to load.

    The key becomes the swarm's ``api_key`` (a SecretStr: redacted from state rows and plans, passed to
    job processes through their environment only)."""
    from prefect.blocks.system import Secret
    from pydantic import SecretStr

    from prefect_swarm.exceptions import ConfigError

    name = entry_of(cfg.backend).key_block(cfg.backend)
    if not name or cfg.api_key is not None:
        return cfg
    try:
        value = Secret.load(name, _sync=True).get()  # type: ignore[call-arg, union-attr]
    except ValueError as exc:
        raise ConfigError(
            f"backend.api_key_secret: no Secret block '{name}' ({exc}). Create it "
            f"(`prefect block create secret` or Secret(value=...).save('{name}')), or name "
            "an environment variable in backend.api_key_env instead."
        ) from None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"backend.api_key_secret: the Secret block '{name}' holds no string key.")
    return cfg.model_copy(update={"api_key": SecretStr(value)})
