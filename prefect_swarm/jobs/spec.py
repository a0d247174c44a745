"""JobSpec: everything a job process needs, as one JSON file (``<job_dir>/spec.json``).

The spec is written by :func:`prefect_swarm.launch.prepare_job` (CLI, Prefect task) and
read by every shard process. It holds no secret: the API key travels in the environment
(:class:`prefect_swarm.interfaces.jobenv.JobEnv`). Fields the submitter fills from the swarm (``endpoints``, ``model``,
``swarm_fingerprint``) may be left empty; the job process then reads them from its environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefect_swarm.budget import SwarmBudget
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.paths import JobPaths, atomic_write_text

OutputFormat = Literal["parquet", "openai-batch"]


class JobSpec(BaseModel):
    """A batch inference job over one dataset: input, output, job class, runner knobs, ledger."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    job_id: str | None = Field(default=None, description="Job id; generated at prepare time when empty.")
    swarm: str | None = Field(default=None, description="Name of the swarm the job runs against, if any.")
    input: str = Field(
        description="Input dataset: a parquet file, a folder of parquet files, or a JSONL file in the "
        "OpenAI Batch input format (custom_id, method, url, body)."
    )
    output: str = Field(
        description="Output: a folder or prefix ending with '/' (a parquet dataset: part files by shard, "
        "_manifest.json, _SUCCESS, a row_position column; the choice for large jobs), or one file: parquet "
        "(input columns + outputs + status, error, tokens) or JSONL in the OpenAI Batch output format (see "
        "output_format)."
    )
    job_dir: str | None = Field(
        default=None,
        description="Job folder (spec, shard checkpoints, progress, manifest, and the process bookkeeping: "
        "logs, exit files, shard locks); a local or shared POSIX path, filled at prepare time.",
    )
    ledger: str | None = Field(
        default=None,
        description="Where the shard checkpoints (parts, progress, fingerprint, DONE markers) live when "
        "not in job_dir: an s3:// or gs:// folder, e.g. s3://bucket/ledgers/my-job (one per job). Each "
        "part is one object under its final key, written in one upload; a kill -9 loses at most the "
        "rows since the last checkpoint, as on disk. The shard locks and logs stay in job_dir: one "
        "process per shard is enforced only among processes that share job_dir's filesystem, so never "
        "run the same shard from two machines that do not share it. Default: inside job_dir.",
    )
    id_column: str | None = Field(
        default=None,
        description="Column whose values identify rows (must be unique); default: the global row index "
        "(custom_id for OpenAI Batch JSONL input).",
    )
    input_columns: list[str] | None = Field(
        default=None, description="Input columns copied into the output; default: all of them."
    )
    output_columns: list[str] | None = Field(
        default=None, description="Job outputs written to the output; default: every output of the job class."
    )
    job: str = Field(
        default="prefect_swarm.jobs.builtin:ChatCompletionJob",
        description="Job class as 'module:Class' (a SwarmJob subclass), rebuilt inside the job process. "
        "Short names of built-ins are accepted: chat, completion, embedding, openai-batch.",
    )
    job_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON keyword arguments for the job class (e.g. prompt_column, system_prompt, sampling; "
        "response_schema and schema_retries for structured output; image_column, image_mime for images).",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Most requests in flight per shard (a cap). Default: sized from the swarm: each replica "
        "kept full (its capacity, e.g. vLLM's max_num_seqs) with a short queue, by a loop that reads the "
        "replicas' /metrics. A cap above what the process may open (file descriptors) is clamped, with a warning.",
    )
    prefix_affinity: bool = Field(
        default=True,
        description="Rows whose requests share a long prefix (their first 1024 bytes: a system prompt, "
        "few-shot examples) go to the same replica while it has room, so its prefix cache holds the prefix "
        "once. Not part of the fingerprint.",
    )
    cache: bool | None = Field(
        default=None,
        description="Identical requests (the same route and JSON body, keys sorted, model included) are sent "
        "once per shard and the answer is written to every row that asked. null (the default): that, plus "
        "the response cache across jobs when PREFECT_SWARM_CACHE is on; true: also the response cache "
        "(answers kept per engine fingerprint; a later identical request is answered from it, never sent); "
        "false: every row sends its own request and the cache is neither read nor written (independent "
        "samples of an unseeded temperature > 0 request). Not part of the fingerprint.",
    )
    cache_dir: str | None = Field(
        default=None,
        description="Folder of the response cache the job reads and writes; filled at submit when the cache is "
        "on (PREFECT_SWARM_CACHE_DIR, default HOME/cache), null when off. Not part of the fingerprint.",
    )
    cache_max_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Size bound of the response cache (least recently used answers dropped past it); filled "
        "at submit from PREFECT_SWARM_CACHE_MAX_GB. Not part of the fingerprint.",
    )
    replica_capacity: int | None = Field(
        default=None,
        ge=1,
        description="Requests one replica can batch (vLLM --max-num-seqs, SGLang --max-running-requests, a "
        "command engine's engine.capacity); filled at submit from the swarm's config. Null when the config does "
        "not declare it: the job starts from 256 and finds each replica's batch from its /metrics.",
    )
    replicas_file: str | None = Field(
        default=None,
        description="The swarm's list of replica engines (Prometheus file_sd JSON), re-read while the job "
        "runs so a replica added by `scale` gets requests; filled at submit. Not part of the fingerprint.",
    )
    parked_file: str | None = Field(
        default=None,
        description="The swarm's snapshot file, there while the swarm is parked: an outage then pauses the "
        "job's rows for as long as it lasts (``outage_timeout_s`` does not run) until the restore; filled at "
        "submit. Not part of the fingerprint.",
    )
    adaptive_concurrency: bool = Field(
        default=False,
        description="Back off the in-flight limit on 429/503 or rising latency; grow it again when healthy "
        "(never above concurrency).",
    )
    requests_per_minute: float | None = Field(
        default=None,
        gt=0,
        description="Rate limit of the whole job in requests a minute (retries count), each shard holding "
        "its share; filled at submit from an external swarm's backend.requests_per_minute (the lower of the "
        "two wins). Default: none. Not part of the fingerprint.",
    )
    tokens_per_minute: float | None = Field(
        default=None,
        gt=0,
        description="Rate limit of the whole job in prompt + completion tokens a minute, each shard holding its "
        "share; filled at submit from an external swarm's backend.tokens_per_minute (the lower wins). Default: "
        "none. Not part of the fingerprint.",
    )
    max_retries: int = Field(
        default=5,
        ge=0,
        description="Retries of one row on 429, 5xx, timeouts and connection errors. A timeout or connection "
        "error counts only when its endpoint answered other requests meanwhile: an outage of the swarm "
        "spends no row's retries (see outage_timeout_s).",
    )
    outage_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="While no endpoint of the swarm answers (every replica lost, the LB down), rows wait "
        "instead of failing; past this many seconds of outage the shard flushes its checkpoint and exits 75 "
        "(resumable: a rerun sends the rows not yet answered). The default leaves time for a replica to be "
        "replaced and load its model. Not part of the fingerprint.",
    )
    backoff_base_s: float = Field(default=0.5, ge=0, description="First retry delay; doubles each retry.")
    backoff_max_s: float = Field(default=30.0, ge=0, description="Longest retry delay (Retry-After included).")
    request_timeout_s: float = Field(default=600.0, gt=0, description="Timeout of one HTTP request, seconds.")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="Timeout to open a connection, seconds.")
    checkpoint_every: int = Field(
        default=5000, ge=1, description="Flush finished rows to the ledger every this many rows."
    )
    checkpoint_seconds: float = Field(
        default=30.0, gt=0, description="... or at least this often (seconds), whichever comes first."
    )
    drain_seconds: float = Field(
        default=5.0,
        ge=0,
        description="On SIGTERM/SIGUSR1: seconds requests in flight may finish before the flush and exit 75.",
    )
    read_batch_rows: int = Field(
        default=8192,
        ge=1,
        description="Rows read from the input at a time (bounds the job process's memory).",
    )
    shards: int = Field(
        default=1,
        ge=1,
        description="Number of shards (job processes) the rows are split into. Left unset on a job for a "
        "swarm, it is sized from the swarm: one process per 4096 requests in flight its replicas need "
        "(see prefect_swarm.sizing).",
    )
    output_format: OutputFormat = Field(
        default="parquet",
        description="'parquet', or 'openai-batch' for JSONL in the OpenAI Batch output format. Inferred "
        "from the output's name when not given (.jsonl, .jsonl.gz, .ndjson: openai-batch; .parquet: parquet); "
        "a format that contradicts the name is refused.",
    )
    model: str | None = Field(
        default=None, description="Model name sent in requests; filled at submit (else env MODEL)."
    )
    endpoints: list[str] = Field(
        default_factory=list,
        description="Base URL(s) requests are spread over; filled at submit (else the job environment's "
        "endpoints, see JobEnv).",
    )
    swarm_fingerprint: str | None = Field(
        default=None, description="Engine identity of the swarm (model, engine args); filled at submit."
    )
    budget: SwarmBudget | None = Field(
        default=None,
        description="The swarm's budget (backend.cost max_gpu_hours / max_cost_usd), held by the job processes "
        "themselves: past it a shard flushes and exits 75 naming the cap, also with nobody waiting on the job; "
        "filled at submit from the swarm (its GPU-hours then). Not part of the fingerprint.",
    )
    retry_failed: bool = Field(
        default=False,
        description="Rerun only the rows the ledger holds as errors (set by `job retry`); not part of the fingerprint.",
    )
    auto_commit: bool = Field(default=True, description="The last shard to finish merges the shards into the output.")
    max_failed_fraction: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="Largest share of rows (0..1) that may end as error rows for the job to count as "
        "succeeded; above it the job is reported failed (exit 1) with the counts and the failed-rows "
        "file. 0 tolerates no failed row, 1 never fails on error rows. Not part of the fingerprint.",
    )

    metrics_host: str | None = Field(
        default="auto",
        description="Address the job process serves its /metrics on (a free port, published in the shard's "
        "progress file): 'auto' is 127.0.0.1 when every endpoint is on this machine (a local swarm) and "
        "0.0.0.0 otherwise (Slurm, Lepton: a scraper on another node reaches it); an address binds there; "
        "null serves no /metrics. Not part of the fingerprint.",
    )

    @field_validator("endpoints")
    @classmethod
    def _strip_slash(cls, value: list[str]) -> list[str]:
        return [v.rstrip("/") for v in value if v.strip()]

    @field_validator("job")
    @classmethod
    def _job_ref(cls, value: str) -> str:
        from prefect_swarm.jobs.api import BUILTIN_JOBS

        value = BUILTIN_JOBS.get(value, value)
        if ":" not in value:
            raise ValueError(f"job '{value}' is not 'module:Class' nor a built-in ({', '.join(sorted(BUILTIN_JOBS))})")
        return value

    @model_validator(mode="after")
    def _output_format_from_name(self) -> JobSpec:
        if self.output.endswith("/") and self.output_format != "parquet":
            raise ValueError(
                f"output {self.output}: a folder (a name ending with '/') is a parquet dataset; the "
                f"'{self.output_format}' output is one file: name it *{_SUFFIXES[self.output_format]}."
            )
        named = output_format_of(self.output)
        if named is None or named == self.output_format:
            return self
        if "output_format" in self.model_fields_set:
            raise ValueError(
                f"output {self.output}: its name means output_format '{named}', but output_format is "
                f"'{self.output_format}'. "
                f"Drop output_format (the name decides), or name the output *{_SUFFIXES[self.output_format]}."
            )
        object.__setattr__(self, "output_format", named)
        return self

    @model_validator(mode="after")
    def _locations(self) -> JobSpec:
        from prefect_swarm.jobs.rows import storage  # pyarrow.fs: only once a spec is built

        try:
            storage.parse(self.input, "input")
            storage.parse(self.output, "output")
            if self.job_dir:
                job_dir = storage.parse(self.job_dir, "job_dir", remote_ok=False)
                if "://" in self.job_dir:  # file:///abs/path -> /abs/path; a plain path is kept as given
                    object.__setattr__(self, "job_dir", job_dir.path)
            if self.ledger:
                ledger = storage.parse(self.ledger, "ledger")
                if not ledger.remote:
                    raise ConfigError(
                        f"ledger {self.ledger}: set ledger only for an s3:// or gs:// folder; a local "
                        "ledger lives in job_dir (drop ledger, or set job_dir)."
                    )
                object.__setattr__(self, "ledger", ledger.uri)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _batch_input_defaults(self) -> JobSpec:
        if is_jsonl(self.input):
            if self.job == BUILTIN_CHAT:
                object.__setattr__(self, "job", "prefect_swarm.jobs.builtin:OpenAIBatchJob")
            if self.id_column is None:
                object.__setattr__(self, "id_column", "custom_id")
        return self

    # ------------------------------------------------------------------ helpers
    def resolved(self, base: Path | None = None) -> JobSpec:
        """This spec with every relative local path made absolute against ``base`` (default: this
        process's working folder): input, output, job_dir and a JSON Schema file given as
        ``response_schema``. The submit host calls it, so a shard started in another folder or on
        another node (sbatch ``--chdir``) reads the files the user named."""
        from prefect_swarm.jobs.structured import ResponseSchema

        base = base or Path.cwd()

        def absolute(value: str) -> str:
            if "://" in value:
                return value
            path = Path(value).expanduser()
            text = str(path if path.is_absolute() else base / path)
            return text + "/" if value.endswith("/") else text  # a dataset output keeps its '/'

        update: dict[str, Any] = {"input": absolute(self.input), "output": absolute(self.output)}
        if self.job_dir:
            update["job_dir"] = absolute(self.job_dir)
        ref = self.job_kwargs.get("response_schema")
        if isinstance(ref, str) and ResponseSchema.file_of(ref) is not None:
            update["job_kwargs"] = {**self.job_kwargs, "response_schema": absolute(ref)}
        return self.model_copy(update=update)

    @property
    def paths(self) -> JobPaths:
        """The ledger folder's files."""
        if not self.job_dir:
            raise ConfigError("the job spec has no job_dir yet; prepare_job() fills it.")
        return JobPaths(Path(self.job_dir))

    def save(self, path: Path | None = None) -> Path:
        """Write the spec as JSON (atomically) to ``path`` (default ``<job_dir>/spec.json``)."""
        path = path or self.paths.spec
        atomic_write_text(path, self.model_dump_json(indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        """Read a spec file; a bad one raises ConfigError naming the file. A spec without
        ``job_dir`` has its own folder as the job folder (as a job process reads it)."""
        try:
            spec = cls.model_validate(json.loads(Path(path).read_text()))
            return spec if spec.job_dir else spec.model_copy(update={"job_dir": str(Path(path).resolve().parent)})
        except FileNotFoundError as exc:
            raise ConfigError(f"job spec {path} does not exist.") from exc
        except ValidationError as exc:  # without the input values (a URI may hold a credential)
            found = "\n".join(
                f"{'.'.join(map(str, e['loc'])) or 'spec'}\n  {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            raise ConfigError(f"job spec {path} is invalid:\n{found}") from exc
        except ValueError as exc:
            raise ConfigError(f"job spec {path} is invalid:\n{exc}") from exc


BUILTIN_CHAT = "prefect_swarm.jobs.builtin:ChatCompletionJob"


def is_jsonl(path: str) -> bool:
    """True when ``path`` names a JSONL file (OpenAI Batch format)."""
    return path.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"))


_SUFFIXES: dict[str, str] = {"parquet": ".parquet", "openai-batch": ".jsonl"}


def output_format_of(path: str) -> OutputFormat | None:
    """The output format an output file name implies: ``openai-batch`` for ``.jsonl``/``.ndjson``
    (``.gz`` too: written gzip-compressed), ``parquet`` for ``.parquet``/``.pq``; None for other names."""
    if is_jsonl(path):
        return "openai-batch"
    if path.endswith((".parquet", ".pq")):
        return "parquet"
    return None
