"""``prefect-swarm job ...``: submit batch jobs to a swarm, watch them, wait, cancel, retry errors.

    prefect-swarm job submit -n SWARM --input IN --output OUT [--shards N] [--job module:Class]
                             [--job-kwargs JSON] [--response-schema module:Model|FILE]
                             [--schema-retries N] [--max-failed-fraction F] [--detach] [--overwrite]
                             [--cache | --no-cache] [--spec FILE]
    prefect-swarm job status ID [--refresh] [-o json]
    prefect-swarm job wait ID [--timeout S]
    prefect-swarm job cancel ID
    prefect-swarm job list [-n SWARM] [-o json]
    prefect-swarm job retry ID [--detach] [--overwrite] [--up]   rerun only the error rows, then commit
    prefect-swarm job submit-script -n SWARM SCRIPT [ARGS]...

A job succeeds (exit 0, status SUCCEEDED) when every row is in its ledger and the share of
failed rows is at most the job's ``max_failed_fraction`` (default 0.01); above it, `submit`
(not detached), `wait` and `retry` print the counts and the failed-rows file and exit 1. A
resubmit while the job's processes still run attaches to them instead of starting more.

The orchestration lives in :mod:`prefect_swarm.launch`; this module parses arguments and
shows results (tables on stdout, progress on stderr).
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from prefect_swarm.cli.errors import ExitCode
from prefect_swarm.cli.output import OutputFormat, console, emit_json, err_console, table
from prefect_swarm.cli.views import cost_text, job_view
from prefect_swarm.config.cost import duration, projection_text, usd_text
from prefect_swarm.config.errors import invalid_fields
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import JobStatus
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.state import StateStore

job_app = typer.Typer(help="Run batch inference jobs against a swarm.", no_args_is_help=True)

SwarmOpt = Annotated[str, typer.Option("--swarm", "-n", help="Swarm name.")]
OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="Output format.")]
IdArg = Annotated[str, typer.Argument(help="Job id (`prefect-swarm job list`).")]


def _spec_from_args(base: Path | None, fields: dict[str, Any]) -> JobSpec:
    data: dict[str, Any] = json.loads(base.read_text()) if base else {}
    data.update({k: v for k, v in fields.items() if v is not None})
    try:
        return JobSpec.model_validate(data)
    except ValueError as exc:
        raise invalid_fields(exc, JobSpec, "invalid job arguments") from exc


@job_app.command("submit")
def submit(
    swarm: SwarmOpt,
    input: Annotated[
        str | None, typer.Option("--input", help="Input parquet file/folder or OpenAI Batch JSONL.")
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            help="A folder ending with '/' (a parquet dataset: part files, _manifest.json, _SUCCESS; for large "
            "jobs), or one file: *.parquet, or *.jsonl / *.jsonl.gz (OpenAI Batch output).",
        ),
    ] = None,
    shards: Annotated[
        int | None,
        typer.Option("--shards", min=1, help="Number of shards (processes); default: sized from the swarm."),
    ] = None,
    job: Annotated[
        str | None, typer.Option("--job", help="Job class module:Class, or chat|completion|embedding.")
    ] = None,
    job_kwargs: Annotated[str | None, typer.Option("--job-kwargs", help="Job kwargs as a JSON object.")] = None,
    response_schema: Annotated[
        str | None,
        typer.Option(
            "--response-schema",
            help="Structured output: a pydantic model 'module:Model' or a JSON Schema file (both must be "
            "readable by the job processes); answers are validated and each top-level field becomes a typed "
            "column (job kwarg response_schema).",
        ),
    ] = None,
    schema_retries: Annotated[
        int | None,
        typer.Option("--schema-retries", min=0, help="Times an answer that breaks the schema is asked again (2)."),
    ] = None,
    id_column: Annotated[str | None, typer.Option("--id-column", help="Unique id column.")] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=1,
            help="Most requests in flight per shard (a cap); default: each replica kept full (its batch "
            "capacity plus a short queue), adjusted from its /metrics.",
        ),
    ] = None,
    output_format: Annotated[
        str | None,
        typer.Option(
            "--output-format", help="parquet | openai-batch (default: from the --output name; a mismatch is refused)."
        ),
    ] = None,
    spec_file: Annotated[
        Path | None, typer.Option("--spec", help="JobSpec JSON to start from (flags override).")
    ] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once submitted.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Discard an existing checkpoint; start over.")] = False,
    job_id: Annotated[str | None, typer.Option("--id", help="Job id (reuse one to resume it).")] = None,
    resubmit_on_preempt: Annotated[
        int,
        typer.Option(
            "--resubmit-on-preempt",
            min=0,
            help="When shards were preempted (Slurm's signal before a time limit or a preemption; they "
            "flushed their checkpoints), resubmit the job up to N times: the shards resume.",
        ),
    ] = 0,
    max_failed_fraction: Annotated[
        float | None,
        typer.Option(
            "--max-failed-fraction",
            min=0.0,
            max=1.0,
            help="Most failed rows (share of all rows) for the job to count as succeeded (default 0.01); "
            "above it the command exits 1.",
        ),
    ] = None,
    cache: Annotated[
        bool | None,
        typer.Option(
            "--cache/--no-cache",
            help="--cache: answer requests seen by earlier jobs on the same engine from the response cache, and "
            "keep this job's answers there. --no-cache: every row sends its own request (not even identical "
            "rows of this job share one). Default: identical rows share one request; the cache as "
            "PREFECT_SWARM_CACHE says.",
        ),
    ] = None,
) -> None:
    """Submit a batch job: one process per shard, checkpointed; resubmitting the same --id resumes it
    (or attaches to its processes while they still run)."""
    from prefect_swarm.launch import submit_job

    try:
        kwargs = json.loads(job_kwargs) if job_kwargs else None
    except ValueError as exc:
        raise ConfigError(f"--job-kwargs is not JSON: {exc}") from exc
    if response_schema and Path(response_schema).expanduser().is_file():  # the job processes may run elsewhere
        response_schema = str(Path(response_schema).expanduser().resolve())
    structured = {"response_schema": response_schema, "schema_retries": schema_retries}
    if any(v is not None for v in structured.values()):
        kwargs = {**(kwargs or {}), **{k: v for k, v in structured.items() if v is not None}}
    spec = _spec_from_args(
        spec_file,
        {
            "input": input,
            "output": output,
            "shards": shards,
            "job": job,
            "job_kwargs": kwargs,
            "job_id": job_id,
            "id_column": id_column,
            "concurrency": concurrency,
            "output_format": output_format,
            "swarm": swarm,
            "max_failed_fraction": max_failed_fraction,
            "cache": cache,
        },
    )
    attached: list[str] = []
    swarm_obj = default_holding().attach(swarm)
    rec = submit_job(swarm_obj, spec, detach=True, overwrite=overwrite, on_attach=_attached(attached))
    if not attached:
        err_console.print(f"submitted job [bold]{rec.id}[/] ({spec.shards} shard(s)) to swarm '{swarm}'")
    if detach:
        console.print(rec.id)
        return
    seen: set[str] = set()
    attempt = 0
    with _interruptible(rec.id):
        while True:
            doc = _wait(rec.id)
            if not _preempted(doc, seen):
                _show(doc)
                return
            hold = default_holding()
            if hold.parked(swarm):  # a pause, not a preemption: no attempt spent, resumed after the restore
                live = hold.wait_restored(swarm, say=err_console.print)
                err_console.print(f"job {rec.id}: swarm '{swarm}' was restored; resuming the job's shards")
            else:
                attempt += 1
                if attempt > resubmit_on_preempt:
                    break
                err_console.print(
                    f"job {rec.id}: shard(s) were preempted; resubmitting ({attempt}/{resubmit_on_preempt}) once "
                    f"swarm '{swarm}' is back to strength"
                )
                live = _restored(swarm)
            submit_job(live, spec.model_copy(update={"job_id": rec.id}), detach=True)
        _wait_and_show(rec.id)


@contextlib.contextmanager
def _interruptible(job_id: str) -> Iterator[None]:
    """Ctrl-C stops the waiting, not the job: say so, and how to wait again or stop it (exit 130)."""
    try:
        yield
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted: job {job_id} keeps running (its shard processes are not this command's). "
            f"`prefect-swarm job wait {job_id}` waits for it again; `prefect-swarm job cancel {job_id}` stops "
            f"it (the shards flush their checkpoints; resubmitting with --id {job_id} resumes it)."
        )
        raise typer.Exit(ExitCode.INTERRUPTED) from None


def _restored(name: str) -> Any:
    """The swarm, reconciled with the config it was brought up with before a resume: jobs at their
    time limit are waited for and submitted afresh, a lost LB or replica is resubmitted (what `up`
    does); returns once every replica answers, so the resumed shards get a swarm that lives."""
    swarm = default_holding().attach(name)
    swarm.up()
    swarm.wait_ready()
    return swarm


def _preempted(doc: dict[str, Any], seen: set[str]) -> bool:
    """The job stopped unfinished because the scheduler stopped shards of its latest submission
    (they flushed, then exited 75); ``seen``: ids of earlier submissions, updated."""
    probes = [p for p in doc.get("backend") or [] if str(p.get("id")) not in seen]
    seen.update(str(p.get("id")) for p in probes)
    return doc["status"] == JobStatus.PREEMPTED and any(p.get("status") == JobStatus.PREEMPTED for p in probes)


@job_app.command("retry")
def retry(
    job_id: IdArg,
    detach: Annotated[bool, typer.Option("--detach", help="Return once submitted.")] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Discard the checkpoint and rerun every row (e.g. after an engine change)."),
    ] = False,
    up: Annotated[
        bool,
        typer.Option("--up", help="Bring the job's swarm up again first when it is stopped (it stays up after)."),
    ] = False,
) -> None:
    """Rerun only the rows that ended as errors, then commit the output again.

    The swarm is looked up again (its endpoints, model and engine fingerprint as they are now); a
    swarm whose engine changed since the job ran is refused (exit 2) unless --overwrite starts over.
    A stopped swarm is refused before any row is sent (exit 4, naming `prefect-swarm up -c ...`)
    unless --up brings it up again. Each row's earlier error reasons are kept in its error."""
    from prefect_swarm.launch import submit_job

    rec = StateStore().require_job(job_id)
    if not rec.swarm or "input" not in rec.spec:
        raise ConfigError(f"job {job_id} is not a batch job on a swarm; nothing to retry.")
    spec = JobSpec.model_validate(rec.spec)
    submit_job(
        _live_swarm(rec.swarm, job_id, up),
        spec,
        detach=True,
        retry_failed=not overwrite,
        overwrite=overwrite,
        on_attach=_attached([]),
    )
    if not detach:
        _wait_and_show(job_id)


def _live_swarm(name: str, job_id: str, up: bool) -> Any:
    """The job's swarm, when it is live; stopped, or recorded live but gone (its processes or
    scheduler jobs are not there: one non-blocking look, :meth:`Swarm.status`): brought up again with
    ``up`` (:func:`_restored`), else ReadinessError (exit 4) before any row is sent, naming how to
    bring it up."""
    from prefect_swarm.exceptions import ReadinessError
    from prefect_swarm.interfaces import ServingPhase

    rec = StateStore().require_swarm(name)
    state = str(rec.phase)
    if default_holding().live(name) is not None:
        swarm = default_holding().attach(name)
        seen = swarm.status()
        if seen.phase not in (ServingPhase.STOPPED, ServingPhase.FAILED):
            return swarm
        state = f"recorded {rec.phase} but gone ({seen.phase}: {seen.detail or 'no replica is running'})"
    if up:
        err_console.print(f"swarm '{name}' is {state}: bringing it up again for job {job_id}")
        return _restored(name)
    raise ReadinessError(
        f"swarm '{name}' of job {job_id} is {state}: no row was sent. Bring it up again, then retry: "
        f"`prefect-swarm up -c {default_holding().attach(name).paths.config}`, "
        f"or `prefect-swarm job retry {job_id} --up`."
    )


def _attached(log: list[str]) -> Callable[[Any, list[dict[str, Any]]], None]:
    """An ``on_attach`` for submit_job that says so on stderr (and remembers the job id in ``log``)."""

    def on_attach(rec: Any, running: list[dict[str, Any]]) -> None:
        shards = sorted({i for p in running for i in (p.get("shards") or [])})
        log.append(rec.id)
        err_console.print(
            f"job [bold]{rec.id}[/] is still running (shards {shards}): attached to it; nothing new was started"
        )

    return on_attach


def _wait_and_show(job_id: str, timeout_s: float | None = None) -> None:
    _show(_wait(job_id, timeout_s))


def _show(doc: dict[str, Any]) -> None:
    _print_status(doc)
    if doc["status"] == JobStatus.PREEMPTED:
        err_console.print(
            f"job {doc['id']} is PREEMPTED (resumable): its shards flushed their checkpoints. "
            f"`prefect-swarm job submit -n {doc.get('swarm')} --id {doc['id']}` with the other arguments as before "
            f"resumes it (exit {ExitCode.RESUMABLE.value})."
        )
        raise typer.Exit(ExitCode.RESUMABLE)
    if doc["status"] != JobStatus.SUCCEEDED:
        raise typer.Exit(1)


PROJECTION_EVERY_S = 60.0
"""Without a terminal, the wait prints the projection when it is first known, then at most this often."""


def _wait(job_id: str, timeout_s: float | None = None) -> dict[str, Any]:
    from prefect_swarm.launch import wait_job

    if sys.stderr.isatty():
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} rows/s  failed {task.fields[failed]}"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[cost]}"),
            console=err_console,
        ) as bar:
            task = bar.add_task(job_id, total=None, rate=0, failed=0, cost="")

            def show(doc: dict[str, Any]) -> None:
                p = doc.get("progress") or {}
                bar.update(
                    task,
                    total=p.get("total"),
                    completed=p.get("done", 0),
                    rate=p.get("rate_rows_s", 0),
                    failed=p.get("failed", 0),
                    cost=_bar_projection(doc.get("projection")),
                )

            doc = wait_job(job_id, timeout_s=timeout_s, on_progress=show)
    else:
        doc = wait_job(job_id, timeout_s=timeout_s, on_progress=_ProjectionLines())
    return doc


def _bar_projection(p: dict[str, Any] | None) -> str:
    """The progress bar's short form of the projection: whole-input wall time, GPU-hours, USD."""
    if not p or not p.get("ready"):
        return ""
    text = f"whole input ~{duration(p['wall_s'])}"
    if p.get("gpus"):
        text += f", {p['gpu_hours']:.4g} GPU-h"
    return text + (f", {usd_text(p['usd'])}" if p.get("usd") is not None else "")


class _ProjectionLines:
    """``on_progress`` of a wait without a terminal: the projection on stderr, when first known and
    then every :data:`PROJECTION_EVERY_S`."""

    def __init__(self) -> None:
        self.last: float | None = None

    def __call__(self, doc: dict[str, Any]) -> None:
        p = doc.get("projection")
        now = time.monotonic()
        if not p or not p.get("ready") or (self.last is not None and now - self.last < PROJECTION_EVERY_S):
            return
        self.last = now
        err_console.print(f"job {doc['id']}: {projection_text(p)}", markup=False, soft_wrap=True)


@job_app.command("status")
def status(
    job_id: IdArg,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Also ask the compute backend about the processes.")
    ] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Show a job's status and per-shard progress (from its ledger)."""
    from prefect_swarm.launch import job_status

    doc = job_status(job_id, refresh=refresh)
    if output is OutputFormat.json:
        emit_json(doc)
    else:
        _print_status(doc)


def _print_recovered(progress: dict[str, Any]) -> None:
    """Rows answered on a retry after failing before, with the reasons they had (their output has no error)."""
    from prefect_swarm.jobs.checkpoint.plan import recovered_text  # pyarrow: only where progress is shown

    if recovered := recovered_text(progress.get("shards") or []):
        console.print(recovered, markup=False)


def _print_failure_reasons(summary: dict[str, Any] | None) -> None:
    """Why rows failed: the top reasons with counts, an example row of each (the engine's words)."""
    from prefect_swarm.jobs.checkpoint.failures import failure_lines  # pyarrow: only where a result is shown

    for line in failure_lines(summary):
        console.print(line, markup=False, soft_wrap=True)


def _print_status(doc: dict[str, Any]) -> None:
    if doc.get("kind") == "script":
        console.print(f"job {doc['id']} (script on swarm {doc['swarm']}): [bold]{doc['status']}[/]")
        return
    p = doc["progress"]
    committed = "committed" if doc.get("committed") else "not committed"
    console.print(
        f"job {doc['id']} on swarm {doc['swarm']}: [bold]{doc['status']}[/] ({committed})  "
        f"{p['done']}/{p['total']} rows, {p['failed']} failed, "
        f"{p['prompt_tokens']}+{p['completion_tokens']} tokens"
    )
    _print_recovered(p)
    if reused := reuse_text(p):
        console.print(reused, markup=False)
    if cost := cost_text(doc.get("cost")):
        console.print(cost, markup=False)
    if projected := projection_text(doc.get("projection")):
        console.print(projected, markup=False, soft_wrap=True)
    console.print(
        table(
            None,
            ["shard", "state", "done", "failed", "total", "rows/s"],
            [
                [
                    s.get("shard"),
                    s.get("state"),
                    s.get("done"),
                    s.get("failed"),
                    s.get("total"),
                    s.get("rate_rows_s"),
                ]
                for s in p["shards"]
            ],
        )
    )
    for b in doc.get("backend") or []:
        console.print(f"process {b.get('id')}: {b.get('status')} {b.get('detail') or b.get('error') or ''}")
    for s in p["shards"]:  # a shard that stopped itself resumable (exit 75): why (an outage, the budget, a signal)
        if s.get("state") == "requeue" and s.get("stopped"):
            why = s["stopped"].get("message")
            console.print(f"shard {s.get('shard')} stopped: {why}", markup=False, soft_wrap=True)
    for f in doc.get("failures") or []:
        console.print(f"shard {f['shard']} {f['reason']}; log: {f['log']}", markup=False, soft_wrap=True)
        if f.get("tail"):
            console.print(textwrap.indent(f["tail"], "  "), markup=False, soft_wrap=True)
    if doc.get("manifest"):
        console.print(f"output: {doc['output']}  failed rows: {doc['manifest'].get('failed_rows')}")
    _print_failure_reasons(doc.get("failure_reasons"))
    if doc.get("verdict"):
        style = "green" if doc["verdict"]["succeeded"] else "bold red"
        console.print(f"[{style}]{doc['verdict']['message']}[/]", soft_wrap=True)


def reuse_text(p: dict[str, Any]) -> str:
    """The shards' last runs: requests sent, and rows answered without one (jobs.cache); '' when none was."""
    hits, dups = int(p.get("cache_hits") or 0), int(p.get("deduplicated") or 0)
    if not hits and not dups:
        return ""
    return (
        f"requests sent: {int(p.get('requests') or 0)}; rows answered without one: {dups} by an identical row's "
        f"request, {hits} from the response cache"
    )


@job_app.command("wait")
def wait(
    job_id: IdArg,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Give up waiting after this many seconds.")] = None,
) -> None:
    """Wait for a job to end; commit its output when every shard is done."""
    with _interruptible(job_id):
        _wait_and_show(job_id, timeout)


@job_app.command("cancel")
def cancel(job_id: IdArg) -> None:
    """Stop a job's processes (they flush their checkpoint; resubmit with --id to resume)."""
    from prefect_swarm.launch import cancel_job

    cancel_job(job_id)
    console.print(f"job {job_id} cancelled")


@job_app.command("list")
def list_cmd(
    swarm: Annotated[str | None, typer.Option("--swarm", "-n", help="Only jobs of this swarm.")] = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """List recorded jobs."""
    from prefect_swarm.launch import list_jobs

    views = [job_view(r) for r in list_jobs(swarm)]
    if output is OutputFormat.json:
        emit_json({"jobs": views})
        return
    cols = ["id", "swarm", "status", "done", "failed", "total", "created_at"]
    console.print(table(None, cols, [[v[c] for c in cols] for v in views]))


@job_app.command("submit-script", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit_script_cmd(
    swarm: SwarmOpt,
    script: Annotated[str, typer.Argument(help="Python script; ENDPOINT and MODEL are in its environment.")],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments for the script.")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once submitted.")] = False,
) -> None:
    """Run an arbitrary Python script next to the swarm."""
    from prefect_swarm.launch import submit_script

    if not Path(script).is_file():
        raise ConfigError(f"script {script} does not exist.")
    rec = submit_script(default_holding().attach(swarm), script, list(args or []), detach=detach)
    console.print(f"{rec.id} {rec.status}")
    if not detach and rec.status is not JobStatus.SUCCEEDED:
        raise typer.Exit(1)
