"""The Lepton backend's config models and its entry in the table of backends."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from prefect_swarm.backends.entry import BackendEntry
from prefect_swarm.config.base import EnvName, Seconds, StrictModel
from prefect_swarm.config.cost import Priced


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


ENTRY = BackendEntry(
    config=LeptonConfig,
    serving="prefect_swarm.backends.lepton.serving:LeptonServing",
    compute="prefect_swarm.backends.lepton.compute:LeptonCompute",
    title="Lepton",
    summary="Run a swarm as an endpoint (and jobs as batch jobs) on NVIDIA DGX Cloud Lepton.",
    secret_fields=("token",),
    secret_scope=("workspace_id",),
)
"""The Lepton backend in the table of backends."""
