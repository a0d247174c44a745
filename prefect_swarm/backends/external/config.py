"""The external backend's config model and its entry in the table of backends."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from prefect_swarm.backends.entry import BackendEntry
from prefect_swarm.config.base import EnvName, Seconds
from prefect_swarm.config.cost import Priced


class ExternalConfig(Priced):
    """An OpenAI-compatible endpoint someone else runs (a vLLM server, an inference gateway, a hosted
    provider): no lifecycle (``up`` records it after one real completion, ``down`` forgets it and never
    touches the server); jobs run on this machine. The key comes from an environment variable or a
    Prefect Secret block, never from this file."""

    type: Literal["external"] = Field(default="external", description="Backend discriminator: 'external'.")
    url: str = Field(
        description="Base URL of the endpoint, with or without a trailing /v1 (e.g. http://10.0.0.5:8000 or "
        "https://api.example.com/v1); requests go to <base>/v1/chat/completions and the like."
    )
    api_key_env: EnvName | None = Field(
        default=None,
        description="Environment variable holding the endpoint's API key, read when a request is made "
        "(never written to a state row, a log or a job spec).",
    )
    api_key_secret: str | None = Field(
        default=None,
        description="Name of a Prefect Secret block holding the endpoint's API key (loaded through the "
        "Prefect API by the CLI and the flows).",
    )
    max_concurrency: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Most requests in flight against the endpoint, all of a job's shards together; "
        "default: the job's in-flight loop alone (engine.capacity, else 256).",
    )
    requests_per_minute: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Rate limit: requests a minute, all of a job's shards together (each shard holds its "
        "share); retries count. Default: no limit.",
    )
    tokens_per_minute: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Rate limit: prompt + completion tokens a minute, all of a job's shards together (a "
        "request is counted at its estimate, len(body)/4 + max_tokens, then corrected by the usage its "
        "answer reports). Default: no limit.",
    )
    request_timeout_s: Seconds = Field(
        default=60.0, description="Timeout of the readiness completion and of `status`'s look at /v1/models."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"'{value}' is not an http(s) URL; give the endpoint's base URL, e.g. http://HOST:8000")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError(
                f"'{parts.scheme}://{parts.hostname}...' carries credentials, a query or a fragment; give the plain "
                "base URL and put the key in the variable named by api_key_env or in a Secret block (api_key_secret)"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_key_source(self) -> ExternalConfig:
        if self.api_key_env and self.api_key_secret:
            raise ValueError("give api_key_env or api_key_secret, not both: the key has one source")
        if self.cost.max_gpu_hours is not None:
            raise ValueError(
                "cost.max_gpu_hours: an external swarm holds no GPUs of ours; cap its bill with cost.max_cost_usd "
                "and the provider's token prices (cost.input_usd_per_million, cost.output_usd_per_million)"
            )
        if self.cost.max_cost_usd is not None and not self.cost.token_priced:
            raise ValueError(
                "cost.max_cost_usd: an external swarm's bill is its tokens; set cost.input_usd_per_million "
                "(and output_usd_per_million) so the cap can be held"
            )
        return self

    @property
    def base_url(self) -> str:
        """The URL without a trailing ``/v1`` (requests add ``/v1/...`` themselves)."""
        return self.url.removesuffix("/v1")


def _key_block(backend: ExternalConfig) -> str | None:
    return backend.api_key_secret


ENTRY = BackendEntry(
    config=ExternalConfig,
    serving="prefect_swarm.backends.external.serving:ExternalServing",
    compute="prefect_swarm.backends.external.compute:ExternalCompute",
    title="External",
    summary="Use an OpenAI-compatible endpoint someone else runs (a vLLM server, a gateway, a hosted provider).",
    holds_gpus=False,
    client_limits=True,
    key_block=_key_block,
)
"""The external backend in the table of backends."""
