"""Flow parameter models, typed so the Prefect UI renders a form.

:class:`JobOptions` is built FROM :class:`prefect_swarm.jobs.spec.JobSpec`'s fields (same types,
defaults, descriptions), minus those the flow owns (input, output, shards, endpoints...), so the
two cannot drift. The flow turns options + its own parameters into the JobSpec.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

from prefect import Flow
from pydantic import BaseModel, ConfigDict, Field, create_model

from prefect_swarm.blocks import SwarmSpec
from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.cost import CostConfig
from prefect_swarm.config.swarm import secretless
from prefect_swarm.jobs.spec import JobSpec, OutputFormat
from prefect_swarm.sizing import size_for_swarm
from prefect_swarm.swarm import Swarm, engine_fingerprint

P = ParamSpec("P")
R = TypeVar("R")

FLOW_OWNED = frozenset(
    {
        "job_id",
        "swarm",
        "input",
        "output",
        "job_dir",
        "shards",
        "model",
        "endpoints",
        "swarm_fingerprint",
        "retry_failed",
        "auto_commit",
        "replica_capacity",
        "replicas_file",
        "parked_file",
        "cache_dir",
        "cache_max_bytes",
    }
)
"""JobSpec fields the flow fills itself (from its parameters or from the swarm)."""


def _options_base() -> type[BaseModel]:
    fields: dict[str, Any] = {
        name: (info.annotation, copy.copy(info))
        for name, info in JobSpec.model_fields.items()
        if name not in FLOW_OWNED
    }
    # the output's name decides the format unless a run says otherwise: a form (or a dump of these
    # options) that always carried 'parquet' would refuse every *.jsonl output
    described = JobSpec.model_fields["output_format"].description
    fields["output_format"] = (OutputFormat | None, Field(default=None, description=described))
    return create_model("JobOptionsBase", __config__=ConfigDict(extra="forbid"), **fields)


class JobOptions(_options_base()):  # type: ignore[misc]
    """What to do with each row: job class and kwargs, concurrency, retries, timeouts, checkpoints."""

    def to_spec(self, *, input: str, output: str, shards: int | None, **flow_fields: Any) -> JobSpec:
        """The JobSpec for these options and the flow's own fields (``shards`` None: left for the swarm
        to size, see :func:`~prefect_swarm.sizing.size_for_swarm`)."""
        data = self.model_dump(exclude_unset=False)
        if data["output_format"] is None:
            del data["output_format"]  # JobSpec takes it from the output's name
        if shards is not None:
            data["shards"] = shards
        return JobSpec.model_validate({**data, "input": input, "output": output, **flow_fields})


def job_options(job: JobOptions | str | dict[str, Any] | None) -> JobOptions:
    """Accept a job kind ('chat', 'module:Class'), a dict of options, or JobOptions."""
    if job is None:
        return JobOptions()
    if isinstance(job, JobOptions):
        return job
    if isinstance(job, str):
        return JobOptions(job=job)
    return JobOptions.model_validate(job)


def run_budget(cfg: SwarmConfig, max_gpu_hours: float | None, max_cost_usd: float | None) -> CostConfig:
    """The budget a flow run holds the swarm to: its ``backend.cost`` with the run's caps (for each cap
    the lower of the swarm's and the run's wins). A cost cap without a price is refused here, before
    any GPU is asked for."""
    return cfg.backend.cost.tightened(max_gpu_hours, max_cost_usd)


def with_budget(swarm: Swarm, budget: CostConfig) -> Swarm:
    """``swarm`` held to ``budget`` for this run: the one budget guard of :mod:`prefect_swarm.launch`
    (the shard watch) reads its config's ``backend.cost``. Only this run's Swarm object changes: the
    swarm's record keeps its own budget (a kept or shared swarm is not capped by this run)."""
    if budget != swarm.cfg.backend.cost:
        backend = swarm.cfg.backend.model_copy(update={"cost": budget})
        swarm.cfg = swarm.cfg.model_copy(update={"backend": backend})
    return swarm


def job_spec(
    cfg: SwarmConfig,
    job: JobOptions | str | dict[str, Any],
    input: str,
    output: str,
    shards: int | None,
    max_failed_fraction: float | None = None,
    concurrency: int | None = None,
) -> JobSpec:
    """The JobSpec for a flow's parameters on swarm ``cfg`` (the commit is the flow's own step);
    the flow's ``max_failed_fraction`` and ``concurrency``, when given, override the job options' ones;
    ``shards`` None and no ``concurrency`` anywhere: sized from the swarm (:func:`size_for_swarm`)."""
    options = job_options(job)
    if max_failed_fraction is not None:
        options = options.model_copy(update={"max_failed_fraction": max_failed_fraction})
    if concurrency is not None:
        options = options.model_copy(update={"concurrency": concurrency})
    spec = options.to_spec(
        input=input,
        output=output,
        shards=shards,
        model=cfg.model_name,
        swarm_fingerprint=engine_fingerprint(cfg),
        auto_commit=False,
    )
    return size_for_swarm(spec, cfg)


# Flow parameter types shared by the flows: constraints the UI form shows and the API enforces when
# a run is created (a bad value is refused there, in one line). Descriptions: the flows' docstrings.
SwarmArg = SwarmSpec | str | dict[str, Any]
"""A saved SwarmSpec block (the UI's run form offers a block picker; the API passes
``{"$ref": {"block_document_id": ...}}``, which Prefect loads into the block), its name
(``swarm-spec/NAME`` or ``NAME``) or a YAML path, or an inline config (a mapping: it stays a
mapping, pydantic's smart union picks the exact type)."""
JobArg = JobOptions | str
InputArg = Annotated[str, Field(min_length=1)]
OutputArg = Annotated[
    str,
    Field(
        min_length=1,
        description="A folder or prefix ending with '/' (a parquet dataset: part files, _manifest.json, "
        "_SUCCESS; the choice for large jobs), or one file: *.parquet, *.jsonl (OpenAI Batch output).",
    ),
]
MAX_SHARDS = 10_000
"""Most shards a flow run maps (one shard task each)."""
TASK_THREADS = MAX_SHARDS + 8
"""Threads of a job flow's task runner: every shard task at once (they wait on their job's one
watcher, see launch.JobWatcher, and cost no scheduler call each), plus the flow's other tasks."""
ShardsArg = Annotated[int | None, Field(ge=1, le=MAX_SHARDS)]
"""None (the default): sized from the swarm (:func:`~prefect_swarm.sizing.size_for_swarm`)."""
ConcurrencyArg = Annotated[int | None, Field(ge=1, le=1_048_576)]
"""Most requests in flight per shard; None (the default): each replica kept full (see JobSpec.concurrency)."""
MaxFailedArg = Annotated[float | None, Field(ge=0.0, le=1.0)]
MaxGpuHoursArg = Annotated[float | None, Field(gt=0.0)]
MaxCostArg = Annotated[float | None, Field(gt=0.0)]


class SwarmFlow(Flow[P, R]):
    """A Prefect flow whose run record never holds a secret: an inline config given as a parameter (a
    swarm's ``api_key``, a backend ``token``) is recorded with those values set to None
    (:func:`~prefect_swarm.config.swarm.secretless`), while this process's run still uses them.
    A run started again from its record (a retry from the UI) then takes the key as a reattach does:
    from ``PREFECT_SWARM_API_KEY`` or the swarm's ``swarm.key``. A saved SwarmSpec block, a Secret
    block or an environment variable is the way to give a deployment's runs a key."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """See :meth:`prefect.Flow.serialize_parameters`; secret values dropped."""
        return {k: secretless(v) for k, v in super().serialize_parameters(parameters).items()}


def swarm_flow(**options: Any) -> Callable[[Callable[P, R]], SwarmFlow[P, R]]:
    """``@flow(**options)`` making a :class:`SwarmFlow`: every flow of the package is one."""

    def make(fn: Callable[P, R]) -> SwarmFlow[P, R]:
        return SwarmFlow(fn, **options)

    return make
