"""Backend configs, one per backend, as a union discriminated by ``type``.

Each model only *describes* where replicas and jobs run; the code that acts on it lives in
``prefect_swarm.backends``. Adding a backend means adding a model here, a member to
:data:`BackendConfig`, and an entry in ``prefect_swarm.backends.registry``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, Field, SecretStr, field_validator, model_validator

from prefect_swarm.config.base import Count, EnvName, NonNegativeInt, NonNegativeSeconds, Port, Seconds, StrictModel
from prefect_swarm.config.cost import Priced
from prefect_swarm.config.slurm_time import check_slurm_time, slurm_seconds

SlurmTime = Annotated[str, AfterValidator(check_slurm_time)]
"""A Slurm wall-time (--time): MM, MM:SS, HH:MM:SS or D-HH:MM:SS."""


SIGNAL_EARLY_S = 60.0
"""Slurm sends a job's ``--signal`` up to this much earlier than asked (its time-limit check is periodic)."""


class LocalConfig(Priced):
    """Replicas are engine processes on this machine, each under a watchdog."""

    type: Literal["local"] = Field(default="local", description="Backend discriminator: 'local'.")
    host: str = Field(default="127.0.0.1", description="Interface the replicas listen on.")
    max_restarts: NonNegativeInt = Field(
        default=3, description="Restarts the watchdog allows a replica before marking it failed."
    )
    restart_backoff_s: NonNegativeSeconds = Field(
        default=2.0,
        description="First delay before a restart; doubles after each restart (capped 60 s).",
    )
    startup_grace_s: NonNegativeSeconds = Field(
        default=5.0,
        description="Seconds after a start before failed health checks count against a replica.",
    )
    health_interval_s: Seconds = Field(default=2.0, description="Seconds between the watchdog's health checks.")
    wall_time_s: Seconds | None = Field(
        default=24 * 3600.0,
        description="Wall-time limit of each replica in seconds: the watchdog stops it after this, "
        "so a swarm whose flow died cannot run forever. null disables the limit.",
    )
    gpus: list[str] | None = Field(
        default=None,
        description="GPU ids to hand out (CUDA_VISIBLE_DEVICES), gpus_per_replica to each replica; "
        "null: do not set CUDA_VISIBLE_DEVICES.",
    )


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


class LeptonMount(StrictModel):
    """A storage mount for a Lepton endpoint or job."""

    path: str = Field(description="Path inside the storage volume.")
    mount_path: str = Field(description="Where it appears inside the container.")
    from_: str = Field(default="node-nfs:lepton-shared-fs", alias="from", description="Storage source name.")


class LeptonConfig(Priced):
    """An endpoint (deployment) and batch jobs on NVIDIA DGX Cloud Lepton."""

    type: Literal["lepton"] = Field(default="lepton", description="Backend discriminator: 'lepton'.")
    workspace_id: str = Field(description="Lepton workspace id.")
    workspace_url: str | None = Field(
        default=None, description="Workspace API URL; default: the SDK's default for the workspace."
    )
    token: SecretStr | None = Field(
        default=None,
        description="Workspace API token; default: the environment variable named by token_env.",
    )
    token_env: EnvName = Field(
        default="LEPTON_WORKSPACE_TOKEN",
        description="Environment variable read for the token when 'token' is unset.",
    )
    endpoint_token_secret: str | None = Field(
        default=None,
        description="Name of a Lepton secret holding the endpoint's API token; default: the swarm's api_key.",
    )
    adopt: bool = Field(
        default=False,
        description="Take over an endpoint of the swarm's name that this swarm did not make (by hand, or "
        "another home's swarm of the same name): `up` then replaces its spec and `down` deletes it. Off: "
        "such a name is refused before any change. `prefect-swarm up --adopt` sets it.",
    )
    resource_shape: str = Field(default="gpu.h100-sxm", description="Resource shape of each endpoint replica.")
    job_resource_shape: str = Field(default="cpu.small", description="Resource shape of each batch-job worker.")
    node_groups: list[str] = Field(
        default_factory=list,
        description="Node groups to schedule on, each by id or by name (an id first, then a name, as the "
        "leptonai CLI matches them); the specs sent carry their ids.",
    )
    image: str = Field(default="vllm/vllm-openai:latest", description="Container image of the endpoint.")
    job_image: str | None = Field(
        default=None,
        description="Container image of batch jobs (needs prefect-swarm); default: the endpoint image.",
    )
    job_python: str = Field(
        default="python3",
        description="Interpreter of batch jobs inside job_image (it needs prefect-swarm); checked before "
        "the endpoint starts.",
    )
    job_setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before each job process in the container, e.g. "
        "'pip install prefect-swarm==<version>' when job_image lacks it; written verbatim.",
    )
    job_wheel: bool = Field(
        default=True,
        description="Stage this prefect-swarm's own wheel (the installed version) under shared_path at `up`, "
        "once per version, and install it with job_python's pip in each job's setup when job_image lacks "
        "that version; its dependencies come from the image or the package index. false: job_image must "
        "have prefect-swarm.",
    )
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets used to pull private images.")
    mounts: list[LeptonMount] = Field(default_factory=list, description="Storage mounts for endpoint and jobs.")
    shared_path: str | None = Field(
        default=None,
        description="Path inside a mount where jobs write ledgers and output; must lie under a mount_path.",
    )
    ready_poll_s: Seconds = Field(default=5.0, description="Seconds between deployment state polls.")
    queue_timeout_s: Seconds | None = Field(
        default=900.0,
        description="Seconds the endpoint may stay queued (every replica waiting for capacity) before "
        "`up` gives up with a capacity error and tears it down; null waits until ready_timeout_s.",
    )
    job_queue_timeout_s: Seconds | None = Field(
        default=1800.0,
        description="Seconds a batch job may stay Queueing (no capacity) before it is stopped and "
        "reported failed; null waits forever.",
    )
    storage_check_timeout_s: Seconds | None = Field(
        default=300.0,
        description="Before an endpoint is created, a tiny CPU job must read back a file this process "
        "wrote under shared_path (proving both see the same storage) and import prefect_swarm with "
        "job_python, within this many seconds; null skips the check.",
    )
    secret_env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Environment variables of the endpoint read from Lepton workspace secrets, "
        "{ENV_NAME: secret-name} (e.g. {HF_TOKEN: hf-token} for a gated model): the spec carries only "
        "the reference. Each secret must exist in the workspace (checked before anything starts).",
    )
    job_secret_env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Environment variables of every batch job read from Lepton workspace secrets, "
        "{ENV_NAME: secret-name}: e.g. {AWS_ACCESS_KEY_ID: aws-key-id, AWS_SECRET_ACCESS_KEY: aws-secret} "
        "for s3:// input and output (AWS_ENDPOINT_URL / AWS_REGION, not secret, go in env). The spec "
        "carries only the reference; each secret must exist in the workspace (checked at up).",
    )
    reservation: str | None = Field(
        default=None,
        description="Node reservation id the endpoint and the jobs run in (needs node_groups).",
    )
    job_priority: str | None = Field(
        default=None,
        description="Queue priority of batch jobs: low, mid, high, 1-9 or a class such as mid-4000 "
        "(needs node_groups); default: the workspace's.",
    )
    job_preemptible: bool | None = Field(
        default=None,
        description="Whether higher-priority work may preempt the batch jobs (needs node_groups); a "
        "preempted shard resumes from its ledger when it runs again. Default: the workspace's.",
    )
    deployment_spec: dict[str, Any] = Field(
        default_factory=dict,
        description="Further fields of the Lepton endpoint spec (LeptonDeploymentUserSpec), passed "
        "as given, e.g. {health: {liveness: {initial_delay_seconds: 600}}, ingress_timeout_seconds: "
        "600}; the fields prefect-swarm sets itself are refused.",
    )
    job_spec: dict[str, Any] = Field(
        default_factory=dict,
        description="Further fields of each Lepton batch job's spec (LeptonJobUserSpec), passed as "
        "given, e.g. {shared_memory_size: 1024, max_job_failure_retry: 2}; the fields prefect-swarm "
        "sets itself are refused.",
    )

    @field_validator("job_priority", mode="before")
    @classmethod
    def _priority(cls, value: object) -> str | None:
        return None if value is None else lepton_priority_class(value)

    @model_validator(mode="after")
    def _queue_needs_node_groups(self) -> LeptonConfig:
        # the SDK's CLI: "queue/preempt/reservation flags require --node-group (dedicated node group)"
        used = [
            name
            for name, value in (
                ("reservation", self.reservation),
                ("job_priority", self.job_priority),
                ("job_preemptible", self.job_preemptible),
            )
            if value is not None
        ]
        if used and not self.node_groups:
            raise ValueError(
                f"{', '.join(used)} need(s) node_groups: Lepton applies queue priority, preemption and "
                "reservations on dedicated node groups only; add node_groups: [<node group id>]"
            )
        return self


_PRIORITY_BANDS = {"low": (1, 3), "mid": (4, 6), "high": (7, 9)}


def lepton_priority_class(value: object) -> str:
    """A Lepton queue priority class (``low-1000`` .. ``high-9000``) from a band name (its lowest
    level), a level 1-9, ``<band>-<level>`` or the class itself."""
    text = str(value).strip().lower()
    level: int | None = None
    if text.isdigit():
        level = int(text)
    elif text in _PRIORITY_BANDS:
        level = _PRIORITY_BANDS[text][0]
    else:
        m = re.fullmatch(r"(low|mid|high)-(\d)(?:000)?", text)
        if m and _PRIORITY_BANDS[m.group(1)][0] <= int(m.group(2)) <= _PRIORITY_BANDS[m.group(1)][1]:
            level = int(m.group(2))
    if level is None or not 1 <= level <= 9:
        raise ValueError(
            f"'{value}' is not a Lepton queue priority: use low, mid, high, a level 1-9, or a class "
            "such as low-1000, mid-4000, high-9000"
        )
    band = next(b for b, (lo, hi) in _PRIORITY_BANDS.items() if lo <= level <= hi)
    return f"{band}-{level}000"


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


CLIENT_SIDE_FIELDS: frozenset[str] = frozenset(
    {
        "cost",
        "max_concurrency",
        "requests_per_minute",
        "tokens_per_minute",
        "request_timeout_s",
        "api_key_env",
        "api_key_secret",
    }
)
"""Backend fields that say how clients use a swarm (its price, budget, limits, where its key is read), not
which engine answers: left out of the engine fingerprint, so changing them resumes the same checkpoints."""

BackendConfig = Annotated[LocalConfig | SlurmConfig | LeptonConfig | ExternalConfig, Field(discriminator="type")]
"""Any backend config; the ``type`` key picks the model."""

BACKEND_TYPES: tuple[str, ...] = ("local", "lepton", "slurm", "external")
