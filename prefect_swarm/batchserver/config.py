"""The batch service's config: which swarm serves each model, the upload limits, the runner's pace.

    # batch-service.yaml
    models:
      stub-model: local-stub.yaml        # a swarm config file (relative to this file), or inline:
      other-model: {name: other, model: org/other, backend: {type: external, url: ...}}
    max_file_bytes: 209715200            # OpenAI's limits by default
    max_requests: 50000
    idle_release_s: 300                  # a model's swarm is let go this long after its last batch

A batch's ``model`` (every line's ``body.model``, the same on all lines) picks the swarm; the swarm's
served model name must be that model, since the lines are sent as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.base import StrictModel
from prefect_swarm.exceptions import ConfigError

OPENAI_MAX_FILE_BYTES = 200 * 2**20
"""OpenAI's largest batch input file (200 MB)."""
OPENAI_MAX_REQUESTS = 50_000
"""OpenAI's most requests in one batch."""


class ServiceConfig(StrictModel):
    """The batch service's config file."""

    models: dict[str, str | dict[str, Any]] = Field(
        default_factory=dict,
        description="Model name -> the swarm that serves it: a swarm config file (relative to this file) or "
        "an inline swarm config. Its served model name must be the model.",
    )
    max_file_bytes: int = Field(
        default=OPENAI_MAX_FILE_BYTES, ge=1, description="Largest upload, bytes (refused while it streams)."
    )
    max_requests: int = Field(
        default=OPENAI_MAX_REQUESTS, ge=1, description="Most lines of a batch input file (refused while it streams)."
    )
    idle_release_s: float = Field(
        default=300.0, ge=0, description="A model's swarm is let go this long after its last batch ended."
    )
    poll_s: float = Field(
        default=0.5, gt=0, description="How often the runner looks at the batches in flight (their ledgers)."
    )
    probe_s: float = Field(
        default=10.0,
        gt=0,
        description="How often the runner asks the compute backend (squeue, the Lepton API...) whether a "
        "batch's job processes still run.",
    )
    job: dict[str, Any] = Field(
        default_factory=dict,
        description="JobSpec fields every batch's job gets (checkpoint_seconds, concurrency, shards, max_retries...); "
        "input, output, job and job_id are the service's.",
    )
    prefect_deployment: str | None = Field(
        default=None,
        description="Run each batch as a run of this Prefect deployment (e.g. 'batch-inference/on-demand'), so it "
        "shows in the UI with its history; needs a Prefect API (PREFECT_API_URL). Default: jobs of the service's "
        "own process.",
    )
    prefect_job_variables: dict[str, Any] = Field(
        default_factory=dict, description="Job variables of those runs (the work pool's: env, swarm_home...)."
    )
    max_running_batches: int | None = Field(
        default=None,
        ge=1,
        description="Most batches running at once on one model's swarm; the others wait in 'validating' and start "
        "in fair order between tenants (the tenant with the fewest running goes next). Default: no limit.",
    )
    max_resubmits: int = Field(
        default=3, ge=0, description="Times a batch whose job processes died unfinished is resumed from its checkpoint."
    )


class LoadedService:
    """A service config with each model's swarm config loaded."""

    def __init__(self, cfg: ServiceConfig, swarms: dict[str, SwarmConfig]) -> None:
        self.cfg = cfg
        self.swarms = swarms


def load_service(path: Path | None = None, data: dict[str, Any] | None = None) -> LoadedService:
    """Read the service config (a file, or ``data``) and every model's swarm config; a model whose
    swarm serves another name is refused here, before the service starts."""
    from prefect_swarm.config.errors import invalid_fields
    from prefect_swarm.config.loader import load_config, read_yaml

    raw = read_yaml(path) if path is not None else dict(data or {})
    try:
        cfg = ServiceConfig.model_validate(raw)
    except ValueError as exc:
        raise invalid_fields(exc, ServiceConfig, f"invalid batch service config {path or ''}".strip()) from exc
    _check_job_fields(cfg.job, path)
    base = path.parent if path is not None else Path.cwd()
    swarms: dict[str, SwarmConfig] = {}
    for model, ref in cfg.models.items():
        swarm = load_config(base / ref) if isinstance(ref, str) else load_config(data=ref)
        if swarm.model_name != model:
            raise ConfigError(
                f"batch service config: model '{model}' is served by swarm '{swarm.name}' as '{swarm.model_name}'; "
                f"a batch's lines are sent as they are, so the swarm must serve '{model}'. Set the swarm's "
                f"served_model_name: {model}, or list the model under its served name."
            )
        swarms[model] = swarm
    return LoadedService(cfg, swarms)


RESERVED_JOB_FIELDS = frozenset(
    {"input", "output", "job", "job_id", "job_dir", "output_format", "swarm", "endpoints", "max_failed_fraction"}
)


def _check_job_fields(fields: dict[str, Any], path: Path | None) -> None:
    """Refuse job fields the service sets itself, and fields a JobSpec refuses."""
    from prefect_swarm.config.errors import invalid_fields
    from prefect_swarm.jobs.spec import JobSpec

    taken = sorted(RESERVED_JOB_FIELDS & set(fields))
    if taken:
        raise ConfigError(f"batch service config {path or ''}: job fields {taken} are set by the service; remove them.")
    try:
        JobSpec.model_validate({"input": "in.jsonl", "output": "out.jsonl", **fields})
    except ValueError as exc:
        raise invalid_fields(exc, JobSpec, f"batch service config {path or ''}: invalid 'job' fields") from exc
