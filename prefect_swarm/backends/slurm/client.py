"""Every call to the Slurm CLI (sbatch, squeue, sacct, scancel) and the ONE place that maps their
exit codes and stderr to prefect-swarm errors.

Quirks of the real thing (seen on Slurm 22.05) handled here:

* ``srun --jobid`` rejects ``123_0``: :meth:`SlurmClient.raw_id` asks ``squeue -o %A``;
* ``scancel`` of an unknown id exits 0, of a finished *step* exits 1 ("Invalid job id"): both fine;
* ``squeue -j`` of a job that has left the queue exits 1 ("Invalid job id specified"): empty;
* ``sacct`` lags ``squeue`` by ~0.5 s, so callers look at squeue first;
* ``SLURM_*`` variables of an enclosing job would leak into our commands: they are dropped.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefect_swarm.config.slurm_time import slurm_seconds
from prefect_swarm.exceptions import BackendError, ConfigError
from prefect_swarm.paths import PRIVATE_UMASK

DEFAULT_TIMEOUT_S = 60.0

_TOO_BIG = (
    "Requested node configuration is not available",
    "Requested partition configuration not available",
    "More processors requested than permitted",
    "Node count specification invalid",
    "Job violates accounting/QOS policy",
    "QOSMax",
    "AssocMax",
    "Requested time limit is invalid",
)
_CONFIG_HINTS = {
    "Invalid account": "set backend.account; `sacctmgr show assoc user=$USER` lists yours.",
    "invalid partition": "set backend.partition; `sinfo -s` lists the partitions.",
    "Invalid partition": "set backend.partition; `sinfo -s` lists the partitions.",
    "Invalid qos": "set backend.qos; `sacctmgr show qos` lists them.",
    "Invalid generic resource": "check backend.gres_name and gpus_per_replica; `sinfo -o %G` lists GRES.",
    "Invalid feature specification": "check backend.constraint; `sinfo -o %f` lists node features.",
}
_QUEUE_FORMAT = "%i|%A|%F|%K|%j|%T|%r|%N|%L"
_GONE = ("Invalid job id specified", "already completing or completed", "Job has already finished")


@dataclass(frozen=True)
class QueueEntry:
    """One line of squeue: a job or one array task."""

    id: str  # 123 or 123_4
    raw_id: str  # what srun --jobid takes
    array_job_id: str
    task_id: str | None
    name: str
    state: str
    reason: str
    nodes: str
    time_left_s: float | None = None
    """squeue's TimeLeft in seconds (None: unlimited or not known)."""


@dataclass(frozen=True)
class AcctEntry:
    """One line of sacct: a job, an array task or a step."""

    id: str  # 123, 123_4, 123.0, 123.batch
    raw_id: str
    name: str
    state: str
    exit_code: int | None
    signal: int | None


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the ``SLURM_*`` variables of an enclosing job, plus ``extra``.

    ``SLURM_UMASK`` is :data:`~prefect_swarm.paths.PRIVATE_UMASK`: Slurm creates a job's output files
    and runs its tasks with it, so what the swarm's jobs write is the user's alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env["SLURM_UMASK"] = f"{PRIVATE_UMASK:04o}"
    env.update(extra or {})
    return env


class SlurmClient:
    """Thin, typed wrapper over the Slurm commands; raises only prefect-swarm errors."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.user = getpass.getuser()

    # ------------------------------------------------------------------ the one runner
    def run(
        self,
        argv: Sequence[str],
        *,
        what: str,
        env: Mapping[str, str] | None = None,
        ok_gone: bool = False,
        stdin: str | None = None,
    ) -> str:
        """Run ``argv`` (``stdin``: its input); stdout on success. ``ok_gone``: "no such job" answers
        count as success (empty)."""
        try:
            proc = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout_s, env=clean_env(env), input=stdin
            )
        except FileNotFoundError as exc:
            raise BackendError(
                f"{argv[0]} not found while trying to {what}.",
                command=argv,
                hint="install the Slurm client tools (sbatch, squeue, sacct, scancel, srun) or put them on PATH.",
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise BackendError(
                f"{argv[0]} did not answer within {self.timeout_s:g}s while trying to {what}.",
                command=argv,
                hint="is slurmctld up? `scontrol ping` tells.",
            ) from exc
        if proc.returncode == 0:
            return proc.stdout
        if ok_gone and any(s in proc.stderr for s in _GONE):
            return ""
        raise map_error(argv, proc.returncode, proc.stderr, what)

    # ------------------------------------------------------------------ submit / cancel
    def sbatch(
        self,
        script: str,
        *,
        env: Mapping[str, str] | None = None,
        what: str = "submit a job",
        args: Sequence[str] = (),
    ) -> str:
        """Submit the batch script whose text is ``script``, on sbatch's stdin (``args`` before it, e.g.
        ``--array=1,3``); returns the job id. What Slurm runs is the text handed here, never a file as
        found at submit time (see :func:`prefect_swarm.backends.slurm.members.script_text`). ``env``
        (secrets too) is sbatch's environment: the job gets the variables the script's
        ``#SBATCH --export`` names (``backend.export``), never their values in a file."""
        out = self.run(["sbatch", "--parsable", *args], what=what, env=env, stdin=script)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed no job id while trying to {what}: {out!r}", command=["sbatch", *args])
        return job_id

    def test_only(self, script: str | None, *, what: str, args: Sequence[str] = ()) -> None:
        """``sbatch --test-only``: would Slurm take the script ``script`` (its text, on stdin; None: the
        job is all in ``args``, e.g. ``--wrap``) now, with its partition, account, QOS, GRES and time
        limit? Submits and writes nothing; raises as :meth:`sbatch` would (ConfigError for a partition,
        account or QOS that does not exist)."""
        self.run(["sbatch", "--test-only", *args], what=what, stdin=script)

    def scancel(
        self, ids: Sequence[str], *, signal: str | None = None, full: bool = False, batch: bool = False
    ) -> None:
        """Cancel (or signal) jobs, tasks or steps. Idempotent: ids already gone are fine.
        ``full``: the signal also reaches the batch shell and its children (``--full``), not only the
        job steps; ``batch``: it reaches the batch shell alone (``--batch``)."""
        if not ids:
            return
        where = ["--full"] if full else ["--batch"] if batch else []
        argv = ["scancel", *([f"--signal={signal}"] if signal else []), *where, *ids]
        self.run(argv, what="cancel " + ", ".join(ids), ok_gone=True)

    def terminate(self, ids: Sequence[str], *, grace_s: float, full: bool, poll_s: float = 0.5) -> None:
        """End jobs or array tasks ``ids`` at their own pace: ``TERM`` to the running ones -- to every
        process of the job (``full``), or to the batch shell alone, whose trap stops the rest -- a plain
        cancel of the ones not running yet (Slurm refuses to signal those), and after ``grace_s`` a
        plain cancel of what still runs. Returns once none of them runs (some may still be COMPLETING).

        A plain ``scancel`` KILLs a job the site's ``KillWait`` after its TERM, and TERM makes an
        ``srun`` KILL its step at once: a script that stops engines, nginx or a Ray node on each of its
        nodes needs the signal to itself, and the time its teardown takes."""
        if not ids:
            return
        entries = self.squeue(ids)
        running = sorted({e.id for e in entries if e.state == "RUNNING"})
        self.scancel(sorted({e.id for e in entries if e.state != "RUNNING"}))
        if not running:
            return
        self.scancel(running, signal="TERM", full=full, batch=not full)
        end = time.monotonic() + grace_s

        def still() -> list[str]:
            return sorted(e.id for e in self.squeue(running) if e.state == "RUNNING")

        while (left := still()) and time.monotonic() < end:
            time.sleep(poll_s)
        self.scancel(left)

    def srun_overlap(
        self, job_id: str, argv: Sequence[str], *, node: str | None = None, env: Mapping[str, str] | None = None
    ) -> int:
        """``srun --jobid=<job_id> --overlap --nodes=1 --ntasks=1 [--nodelist=<node>] ARGV``: one task in
        the running job's allocation, next to its steps. stdin/stdout/stderr are ours (streamed, never
        captured); returns the exit code (srun's own, 1, when the job is gone). ``env`` (secrets too)
        reaches the step through srun's environment, never its command line."""
        where = [f"--nodelist={node}"] if node else []
        srun = ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", *where, "--", *argv]
        try:
            return subprocess.run(srun, env=clean_env(env), check=False).returncode
        except FileNotFoundError as exc:
            raise BackendError(
                "srun not found while trying to run a command in a job.",
                command=srun,
                hint="install the Slurm client tools (sbatch, squeue, sacct, scancel, srun) or put them on PATH.",
            ) from exc

    # ------------------------------------------------------------------ look
    def squeue(self, ids: Sequence[str] = (), *, names: Sequence[str] = ()) -> list[QueueEntry]:
        """Jobs/tasks by id and/or by name (names: this user's only). Jobs gone from the queue are absent.

        With both, squeue ANDs them: only jobs with one of the ids AND one of the names.
        """
        if not ids and not names:
            return []
        argv = ["squeue", "-h", "-r", "-o", _QUEUE_FORMAT]
        if ids:
            argv += ["-j", ",".join(ids)]
        if names:
            argv += ["-n", ",".join(names), "-u", self.user]
        out = self.run(argv, what="list jobs", ok_gone=True)
        return [e for e in (_queue_entry(line) for line in out.splitlines()) if e is not None]

    def user_jobs(self) -> list[QueueEntry]:
        """Every job of this user in the queue."""
        out = self.run(["squeue", "-h", "-r", "-u", self.user, "-o", _QUEUE_FORMAT], what="list jobs")
        return [e for e in (_queue_entry(line) for line in out.splitlines()) if e is not None]

    def raw_id(self, task: str) -> str | None:
        """The raw job id of array task ``123_0`` (what ``srun --jobid`` needs); None if gone."""
        out = self.run(["squeue", "-h", "-o", "%A", "-j", task], what=f"find the raw id of {task}", ok_gone=True)
        lines = out.split()
        return lines[0] if lines else None

    def steps(self, job_id: str) -> dict[str, str]:
        """Running steps of job ``job_id``: step id (``123.4``) -> step name."""
        out = self.run(
            ["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], what=f"list steps of {job_id}", ok_gone=True
        )
        pairs = (line.split("|", 1) for line in out.splitlines() if "|" in line)
        return {sid.strip(): name.strip() for sid, name in pairs}

    def sacct(self, ids: Sequence[str]) -> list[AcctEntry]:
        """Accounting records of jobs/steps (steps included); empty when sacct has none yet."""
        if not ids:
            return []
        out = self.run(
            ["sacct", "-n", "-P", "-j", ",".join(ids), "-o", "JobID,JobIDRaw,JobName,State,ExitCode"],
            what="read accounting",
            ok_gone=True,
        )
        return [e for e in (_acct_entry(line) for line in out.splitlines()) if e is not None]


def _queue_entry(line: str) -> QueueEntry | None:
    parts = line.strip().split("|")
    if len(parts) not in (8, 9):
        return None
    jid, raw, array, task, name, state, reason, nodes = parts[:8]
    # squeue's TimeLeft: INVALID once a job is past its limit (Slurm is ending it): nothing left
    left = (0.0 if parts[8] == "INVALID" else slurm_seconds(parts[8])) if len(parts) == 9 else None
    return QueueEntry(
        id=jid,
        raw_id=raw,
        array_job_id=array,
        task_id=None if task in ("N/A", "") else task,
        name=name,
        state=state,
        reason=reason,
        nodes=nodes,
        time_left_s=left,
    )


def _acct_entry(line: str) -> AcctEntry | None:
    parts = line.strip().split("|")
    if len(parts) != 5:
        return None
    jid, raw, name, state, exit_code = parts
    code, _, sig = exit_code.partition(":")
    return AcctEntry(
        id=jid,
        raw_id=raw,
        name=name,
        state=state,
        exit_code=int(code) if code.isdigit() else None,
        signal=int(sig) if sig.isdigit() else None,
    )


def map_error(argv: Sequence[str], code: int, stderr: str, what: str) -> Exception:
    """The one translation of a failed Slurm command into ConfigError or BackendError.

    Slurm refusing the request itself -- an unknown partition, account or QOS, more than a node or
    a policy allows -- is one kind of error whatever Slurm's reason (ConfigError, exit 2): the
    request as configured will not be taken, so asking again does not help; the message carries
    Slurm's words and what to change. (A job Slurm takes but cannot start in time is a
    CapacityError, raised where the queue is watched.)"""
    err = stderr.strip()
    tool = argv[0]
    for needle in _TOO_BIG:
        if needle in err:
            return ConfigError(
                f"Slurm refused the request: {tool} could not {what}: Slurm cannot give what was asked.\n"
                f"stderr: {err}\ncommand: {' '.join(argv)}\n"
                "Hint: ask for fewer GPUs/CPUs per replica or fewer replicas, or pick another partition."
            )
    for needle, config_hint in _CONFIG_HINTS.items():
        if needle in err:
            return ConfigError(
                f"Slurm refused the request: {tool} could not {what}.\nstderr: {err}\nHint: {config_hint}"
            )
    down = "Unable to contact slurm controller" in err or "Socket timed out" in err
    return BackendError(
        f"{tool} exited {code} while trying to {what}.",
        command=argv,
        exit_code=code,
        stderr=err,
        hint="slurmctld is not answering; `scontrol ping` tells." if down else None,
    )
