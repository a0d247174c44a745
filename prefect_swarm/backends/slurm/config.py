"""The Slurm backend's config models and its entry in the table of backends."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, AliasChoices, Field, field_validator, model_validator

from prefect_swarm.backends.entry import BackendEntry
from prefect_swarm.config.base import Count, NonNegativeInt, Port, Seconds, StrictModel
from prefect_swarm.config.cost import Priced
from prefect_swarm.config.slurm_time import check_slurm_time, slurm_seconds

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig


SlurmTime = Annotated[str, AfterValidator(check_slurm_time)]
"""A Slurm wall-time (--time): MM, MM:SS, HH:MM:SS or D-HH:MM:SS."""


SIGNAL_EARLY_S = 60.0
"""Slurm sends a job's ``--signal`` up to this much earlier than asked (its time-limit check is periodic)."""


class ContainerConfig(StrictModel):
    """How a Slurm replica or job step runs inside a container."""

    runtime: Literal["none", "apptainer", "singularity", "pyxis"] = Field(
        default="none",
        description="Container runtime: none (run on the host), apptainer, singularity or pyxis.",
    )
    image: str | None = Field(
        default=None,
        description="Image: a .sif path for apptainer/singularity, an enroot image URI for pyxis.",
    )
    mounts: list[str] = Field(
        default_factory=list,
        description="Bind mounts as 'src:dst[:ro]', one per item; nothing is mounted implicitly.",
    )
    nv: bool = Field(default=True, description="Pass --nv (apptainer/singularity) so the container sees the GPUs.")
    extra_args: list[str] = Field(default_factory=list, description="Extra runtime flags, one list item per flag.")


DEFAULT_EXPORT: tuple[str, ...] = (
    "PATH",
    "LD_LIBRARY_PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HF_HOME",
    "HF_TOKEN",
)
"""Variables of the submitting shell a Slurm job gets by default (``backend.export``)."""


class SlurmLBConfig(StrictModel):
    """Resources of the Slurm load-balancer job (nginx, the reconciler and, with --overlap, every job
    step run in its allocation). Unset fields fall back to the replicas' settings."""

    cpus: Count = Field(default=1, description="CPUs of the LB job (--cpus-per-task).")
    steps_per_cpu: Count = Field(
        default=4,
        description="Batch-job shards one CPU of the LB job hosts as job steps (a shard is an async HTTP "
        "client, mostly waiting). A job with more shards than cpus x steps_per_cpu runs each shard as an "
        "sbatch job of its own (backend.jobs resources, 1 CPU each when unset); `validate` says which.",
    )
    mem: str | None = Field(default=None, description="Memory of the LB job (--mem), e.g. 8G.")
    partition: str | None = Field(
        default=None,
        description="Partition of the LB job (many sites refuse a GPU-less job in a GPU partition); "
        "default: backend.lb_partition, else the replicas' partition.",
    )
    qos: str | None = Field(default=None, description="QoS of the LB job (--qos); default: backend.qos.")
    account: str | None = Field(
        default=None, description="Account of the LB job (--account); default: backend.account."
    )
    time_limit: SlurmTime | None = Field(
        default=None, description="Wall-time limit of the LB job (--time); default: backend.time_limit."
    )


class SlurmJobsConfig(StrictModel):
    """Batch-job shards as sbatch jobs of their own (one per shard) instead of job steps in the LB
    job's allocation (``srun --overlap``). Unset fields fall back to the LB job's settings."""

    cpus: Count = Field(default=1, description="CPUs of each shard's job (--cpus-per-task).")
    mem: str | None = Field(default=None, description="Memory of each shard's job (--mem), e.g. 4G.")
    partition: str | None = Field(
        default=None, description="Partition of the shard jobs; default: the LB job's partition."
    )
    time_limit: SlurmTime | None = Field(
        default=None, description="Wall-time limit of each shard's job (--time); default: backend.time_limit."
    )


class SlurmConfig(Priced):
    """Replicas as ``sbatch --array`` tasks, plus one nginx load-balancer job."""

    type: Literal["slurm"] = Field(default="slurm", description="Backend discriminator: 'slurm'.")
    partition: str | None = Field(default=None, description="Partition for replica jobs (--partition).")
    account: str | None = Field(default=None, description="Account to charge (--account).")
    qos: str | None = Field(default=None, description="Quality of service (--qos).")
    reservation: str | None = Field(default=None, description="Reservation to run in (--reservation).")
    constraint: str | None = Field(default=None, description="Node features required (--constraint).")
    time_limit: SlurmTime = Field(
        default="24:00:00",
        description="Wall-time limit of each replica and of the LB job (--time), e.g. 04:00:00; it is "
        "also the swarm's life: a replica or LB job replaced after it left the queue gets only the time "
        "left until the first submission's limit, and none is replaced past it.",
    )
    cpus_per_replica: Count = Field(default=4, description="CPUs per replica (--cpus-per-task).")
    mem_per_replica: str | None = Field(default=None, description="Memory per replica (--mem), e.g. 64G.")
    gres_name: str = Field(default="gpu", description="Generic resource name GPUs are requested by (--gres=NAME:N).")
    lb_partition: str | None = Field(
        default=None, description="Partition for the load-balancer job; default: the replicas' partition."
    )
    lb_port: Port = Field(
        default=9000, description="Port nginx prefers; when it is taken on the node, the LB picks a free one."
    )
    lb: SlurmLBConfig = Field(default_factory=SlurmLBConfig, description="Resources of the load-balancer job.")
    jobs: SlurmJobsConfig | None = Field(
        default=None,
        description="Run each batch-job shard as an sbatch job of its own with these resources; "
        "default (unset): shards are job steps in the load balancer's allocation (backend.lb).",
    )
    nginx_bin: str = Field(default="nginx", description="nginx executable on the compute nodes.")
    proxy_timeout_s: Seconds = Field(
        default=3600.0, description="nginx proxy read/send timeout; at least the job's request timeout."
    )
    queue_timeout_s: Seconds = Field(
        default=900.0,
        description="Seconds the swarm may stay PENDING before readiness fails with Slurm's reason.",
    )
    requeue: bool = Field(default=False, description="Submit with --requeue (some sites forbid it).")
    port_range: str | None = Field(
        default=None,
        description="Ports the replicas and the LB may listen on, 'LOW-HIGH' (e.g. '20000-20999': the range "
        "a site's firewall opens between nodes). Each start takes its preferred port (port + i, lb_port) "
        "when it is free and in the range, else a free one of the range; default: the preferred port, "
        "else one the kernel picks.",
    )
    idle_timeout_s: Seconds | None = Field(
        default=None,
        description="Park (or stop, see idle_action) the swarm after this many seconds in which no replica "
        "answered or held a request (health checks do not count), so a forgotten swarm gives its GPUs back; "
        "the reason shows in `status`. Default: off (the swarm runs until `down` or backend.time_limit).",
    )
    idle_action: Literal["park", "stop"] = Field(
        default="park",
        description="What idle_timeout_s does to an idle swarm: 'park' ends its replica and LB jobs and keeps "
        "its snapshot, so the next run or job that needs it restores it (`prefect-swarm restore` by hand); "
        "'stop' ends it as `down` would, and the next run brings it up cold.",
    )
    signal_seconds: NonNegativeInt = Field(
        default=120,
        description="Seconds before the time limit Slurm sends USR1 (--signal) so steps flush.",
    )
    run_dir: str | None = Field(
        default=None,
        validation_alias=AliasChoices("run_dir", "shared_dir"),
        description="Folder for the swarm's scripts, logs, head and status files and job ledgers "
        "(<run_dir>/swarms/<name>); it MUST be on a filesystem every node shares (scratch, NFS, "
        "Lustre), and sbatch runs the jobs in it (--chdir). Default: $PREFECT_SWARM_HOME (then it "
        "must be shared). 'shared_dir' is accepted as the old name.",
    )
    share_allocation_of: str | None = Field(
        default=None,
        description="Run this swarm's replicas inside the allocation of another Slurm swarm, which must be "
        "up (its name): replica task i runs as an `srun --overlap` step in that swarm's task i, on its "
        "node and GPUs, and this swarm's own tasks hold one CPU each and no GPU. Both swarms need "
        "engine.sleep_mode: they take turns on the GPUs (one sleeps while the other runs). "
        "Down this swarm before the other.",
    )
    open_endpoint: bool = Field(
        default=False,
        description="Serve without an API key. By default a swarm without api_key gets a random key of "
        "its own (kept in a 0600 file in its run dir, passed to replicas, LB and job steps in the "
        "environment), so no other user of the cluster can use its replicas; true opts out.",
    )
    export: list[str] = Field(
        default_factory=lambda: list(DEFAULT_EXPORT),
        description="Environment variables of the submitting shell the replica and LB jobs get "
        "(sbatch --export=NAME,...); the variables prefect-swarm itself needs (PREFECT_SWARM_*, the "
        "API key) are always added. Ignored with export_all. Shell functions such as `module` are not "
        "inherited: start `setup` with `source /etc/profile` to use them.",
    )
    export_all: bool = Field(
        default=False,
        description="Give the jobs the whole submitting environment (sbatch --export=ALL) instead of 'export'.",
    )
    hf_offline: bool = Field(
        default=True,
        description="Set HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1 for the replicas (compute nodes "
        "usually have no internet: the model must be in the cache or a local path); false lets them download.",
    )
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before the engine starts (e.g. 'module load cuda'); written verbatim. "
        "The job stops at the first line that fails, and `up` reports that line (end a line with "
        "'|| true' to let it fail).",
    )
    sbatch_args: list[str] = Field(
        default_factory=list, description="Extra sbatch options, one per item, e.g. '--exclusive'."
    )
    job_python: str | None = Field(
        default=None, description="Python on the compute nodes for job steps; default: this interpreter."
    )
    container: ContainerConfig = Field(
        default_factory=ContainerConfig, description="Container runtime for replicas and job steps."
    )
    node_tmp: str = Field(
        default="/tmp",
        description="Node-local folder for the Ray session files of a replica spanning several nodes "
        "(gpus_per_replica > gpus_per_node: one Ray cluster per replica, head on its first node); "
        "keep it short (Ray's socket paths live under it).",
    )

    @field_validator("port_range")
    @classmethod
    def _port_range(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
        low, high = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        if not match or not 1024 <= low < high <= 65535:
            raise ValueError(
                f"'{value}' is not a port range: give 'LOW-HIGH' with 1024 <= LOW < HIGH <= 65535, e.g. 20000-20999"
            )
        return f"{low}-{high}"

    @property
    def ports(self) -> tuple[int, int] | None:
        """``port_range`` as (low, high), or None."""
        if not self.port_range:
            return None
        low, high = self.port_range.split("-")
        return int(low), int(high)

    @property
    def ending_s(self) -> float:
        """A job with less time left than this is at its end: Slurm may already have sent the signal
        (it sends it up to ``SIGNAL_EARLY_S`` early), so no job step goes into it and no replica or LB
        job is resubmitted with less of the swarm's life left."""
        return self.signal_seconds + SIGNAL_EARLY_S

    @model_validator(mode="after")
    def _life_after_signal(self) -> SlurmConfig:
        limit = slurm_seconds(self.time_limit) or 0.0
        if self.signal_seconds and limit <= self.ending_s:
            raise ValueError(
                f"backend.time_limit ({self.time_limit} = {limit:g}s) must be longer than backend.signal_seconds "
                f"({self.signal_seconds}) + {SIGNAL_EARLY_S:g}s (Slurm may send the signal that early): the swarm "
                "would be at its end as soon as it starts. Raise time_limit or lower signal_seconds."
            )
        return self


def _needs(backend: SlurmConfig) -> list[tuple[str, str]]:
    runtime = backend.container.runtime
    return [] if runtime == "none" else [("containers", f"backend.container.runtime={runtime}")]


def _warnings(cfg: SwarmConfig) -> list[str]:
    if isinstance(cfg.backend, SlurmConfig) and cfg.backend.open_endpoint and cfg.api_key is None:
        return [
            "backend.open_endpoint: true serves without an API key: any user of the cluster who can "
            "reach a node can send requests to this swarm's replicas and LB. Remove it to get a key per swarm."
        ]
    return []


def _run_dir(backend: SlurmConfig) -> str | None:
    return backend.run_dir


def _wall_time(backend: SlurmConfig) -> str:
    return str(backend.time_limit)


ENTRY = BackendEntry(
    config=SlurmConfig,
    serving="prefect_swarm.backends.slurm.serving:SlurmServing",
    compute="prefect_swarm.backends.slurm.compute:SlurmCompute",
    title="Slurm",
    summary="Run a swarm's replicas as one Slurm job array behind an nginx load balancer.",
    stages_models=True,
    nginx_lb=True,
    shard_placement="prefect_swarm.backends.slurm.render:shard_placement",
    run_dir=_run_dir,
    wall_time=_wall_time,
    needs=_needs,
    warnings=_warnings,
)
"""The Slurm backend in the table of backends."""
