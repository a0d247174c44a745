"""Every error prefect-swarm raises on purpose, split by who must act.

    PrefectSwarmError
    ├── ConfigError            the user fixes their input (config, CLI argument)
    │   ├── DatasetError       ... the input dataset (file, column, ids)
    │   └── AccessError        ... a folder or file another user owns or may change (a shared scratch)
    ├── CapacityError          not enough resources right now: retry later or elsewhere
    ├── BackendError           a scheduler/API/process call failed (carries command, exit code, stderr)
    │   └── ReadinessError     the swarm did not become ready (carries the evidence: log tail, reason)
    ├── JobError               a batch job failed
    │   └── FingerprintMismatch  a resume with different settings was refused
    ├── BudgetReached          a swarm or flow run passed its GPU-hour or cost cap (a rerun with a larger cap resumes)
    └── StateError             the SQLite state is missing a record or is inconsistent

Tasks decide whether to retry by exception type, never by matching message strings.

Also here, outside that tree because they are control flow, not errors a user acts on:
``JobFailed`` (a run's verdict), ``ShardStopped`` and ``ShardBusy`` (a shard's process),
``InvalidAnswer`` and ``RowRefused`` (raised by a job's own code about one row, re-exported by
``prefect_swarm.jobs.api``), ``StageError`` (model staging on a node) and ``PrefectUnavailable``
(the Prefect API could not be asked).
"""

from __future__ import annotations

from collections.abc import Sequence


class PrefectSwarmError(Exception):
    """Root of every error raised on purpose by prefect-swarm."""


class ConfigError(PrefectSwarmError):
    """Invalid configuration or argument: the user must change their input."""


class DatasetError(ConfigError):
    """The input dataset cannot be used as given (missing column, duplicate ids, unreadable file)."""


class AccessError(ConfigError):
    """A folder or file prefect-swarm would keep a swarm's or a job's files in belongs to another user,
    or other users may change it, or this user may not read it: pick a folder of your own."""


class CapacityError(PrefectSwarmError):
    """The backend lacks capacity now (queued too long, no GPUs): retry later or elsewhere."""


class BackendError(PrefectSwarmError):
    """A backend call (CLI command, HTTP API, process) failed.

    Carries the evidence so the message can show it: the command, its exit code and stderr.
    """

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str] | None = None,
        exit_code: int | None = None,
        stderr: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.command = list(command) if command is not None else None
        self.exit_code = exit_code
        self.stderr = stderr
        self.hint = hint
        super().__init__(self._render(message))

    def _render(self, message: str) -> str:
        lines = [message]
        if self.command is not None:
            lines.append("command: " + " ".join(self.command))
        if self.exit_code is not None:
            lines.append(f"exit code: {self.exit_code}")
        if self.stderr:
            lines.append("stderr: " + self.stderr.strip()[-2000:])
        if self.hint:
            lines.append("Hint: " + self.hint)
        return "\n".join(lines)


class ReadinessError(BackendError):
    """The swarm did not become ready in time, or every replica failed."""


class JobError(PrefectSwarmError):
    """A batch job (or one of its shards) failed."""


class FingerprintMismatch(JobError):
    """A resume was refused because the job's settings differ from the checkpoint's."""


class BudgetReached(PrefectSwarmError):
    """The running GPU-hours or cost passed the budget (``backend.cost.max_*``, or a flow run's
    ``max_gpu_hours`` / ``max_cost_usd``): the job was stopped after its flush and the swarm torn down.

    Not a JobError: never retried (a retry would pass the same cap again); a rerun with a larger
    budget resumes from the checkpoints.
    """


class StateError(PrefectSwarmError):
    """The state database has no such record, or the record is inconsistent."""


class JobFailed(JobError):
    """More rows failed than the run's ``max_failed_fraction`` allows (the output is committed)."""


class ShardStopped(Exception):
    """The run that watched a shard is ending; the shard's process was cancelled (it flushes)."""


class ShardBusy(ConfigError):
    """Another live process holds the shard's lock: one process per shard (exit 2, nothing touched)."""


class InvalidAnswer(ValueError):
    """A 200 answer the job refuses (e.g. it breaks the response schema): the runner asks the engine
    again, at most :attr:`prefect_swarm.jobs.api.SwarmJob.answer_retries` times, then the row is an
    error row with this message."""


class TooFewChoices(InvalidAnswer):
    """A 200 answer with fewer choices than the job asked for with OpenAI's ``n``: the engine does not
    serve ``n``. With ``samples_by="auto"`` the runner then sends one request per sample instead."""


class RowRefused(ValueError):
    """Raised by ``request`` for a row that cannot be sent as it is (bad image, ``stream: true``): the row
    is an error row with this message and no request is sent."""


class StageError(RuntimeError):
    """The source cannot be staged (missing, not a folder, or the copy failed)."""


class PrefectUnavailable(Exception):
    """The Prefect API could not be asked (down, not configured); nothing was done."""


USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, FingerprintMismatch)
"""Errors the user acts on by changing their input (a config, an argument, the dataset, or a resume
with other settings: ``--overwrite``). Shown as their own message alone, never a traceback: the
CLI's exit 2, a Prefect run's Failed message. Anything else keeps its traceback (a bug to report)."""


REPORTED_AS_MESSAGE: tuple[type[Exception], ...] = (*USER_ERRORS, JobFailed, BudgetReached)
"""Errors that are not bugs: the user errors, and the verdicts of a run that did what it was asked
(more failed rows than allowed, a budget reached). A Prefect run ends Failed with their message as the
state's message and no traceback in its logs."""
