"""``pipeline``: stages of batch jobs, each on its own swarm, each over the stage before it.

Generate with one model, judge with another, keep the rows the judge passes. Each stage is a
``batch-inference`` run of its own (a subflow: its swarm brought up for it and released as soon as
its last row is answered, its job exactly-once and resumable), over what the stage before it handed
on (:mod:`prefect_swarm.jobs.stages`: the answered rows its filter passes, its outputs renamed
``<stage>_<column>`` so the next stage's ``prompt_template`` can name them). A rerun resumes where
the last one stopped: a finished stage sends nothing and brings no swarm up, the stage that was
running sends only its remaining rows.

With ``overlap`` a stage's swarm is brought up while the stage before it still runs, so it is ready
when its rows are; otherwise each swarm is up only while its own stage runs.

With ``sleep_between`` the stages share their GPUs: each stage's swarm (``engine.sleep_mode``) is
kept after its stage and put to sleep (its GPU memory freed, its allocation kept), and woken before
its stage on the next run, so one model is awake at a time and a run after the first pays a wake
(seconds) instead of a bring-up per stage (allocation, load, readiness).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from prefect import get_run_logger
from prefect.futures import PrefectFuture
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field

from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.swarm import Sharing
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.flows.batch import batch_inference
from prefect_swarm.flows.hooks import teardown_hook
from prefect_swarm.flows.params import (
    ConcurrencyArg,
    InputArg,
    JobArg,
    JobOptions,
    MaxCostArg,
    MaxFailedArg,
    MaxGpuHoursArg,
    ShardsArg,
    SwarmArg,
    job_options,
    swarm_flow,
)
from prefect_swarm.holding import default_holding
from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.checkpoint.failures import reasons_line
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.rows.input import InputDataset
from prefect_swarm.jobs.stages import STAGE_NAME, HandOver, RowFilter, check_stage, outputs_of
from prefect_swarm.paths import PipelinePaths
from prefect_swarm.state import flow_run_owner
from prefect_swarm.tasks._common import current_flow_run_id, flow_result_storage, tag_run
from prefect_swarm.tasks.pipeline import hand_over_stage, publish_pipeline_summary
from prefect_swarm.tasks.reaper import reap_quietly
from prefect_swarm.tasks.swarm import (
    block_ref,
    live_swarm,
    resolve_swarm,
    sleep_replicas,
    swarm_down,
    swarm_up,
    teardown_owned,
    wait_ready,
    wake_replicas,
)

MAX_STAGES = 16


class Stage(BaseModel):
    """One stage of a pipeline: a batch job on a swarm of its own, over the stage before it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=STAGE_NAME,
        description="The stage's name (lower case, digits, '_'): its outputs reach the next stages as "
        "<name>_<column> (e.g. generate_text).",
    )
    swarm: SwarmArg = Field(
        description="A saved SwarmSpec block or its name, a YAML config path, or an inline config (mapping)."
    )
    job: JobArg = Field(
        default="chat",
        description="A job kind ('chat', 'completion', 'embedding', 'module:Class') or JobOptions. A later "
        "stage names the earlier stages' outputs in job_kwargs.prompt_template, e.g. "
        "'Question: {prompt} Answer: {generate_text}'. Without an id_column of its own it takes the previous stage's.",
    )
    keep: RowFilter | None = Field(
        default=None,
        description="Which answered rows go on to the next stage (or into the output, for the last stage); "
        "default: every answered row.",
    )
    shards: ShardsArg = Field(
        default=None, description="Shards (job processes) of the stage's job; default: sized from its swarm."
    )
    concurrency: ConcurrencyArg = Field(default=None, description="Most requests in flight per shard (a cap).")
    max_failed_fraction: MaxFailedArg = Field(
        default=None, description="Largest share of failed rows for the stage (and so the pipeline) to go on."
    )
    sharing: Sharing | None = Field(default=None, description="'shared' or 'exclusive'; default: the swarm's own.")
    max_gpu_hours: MaxGpuHoursArg = Field(default=None, description="GPU-hour budget of the stage on its swarm.")
    max_cost_usd: MaxCostArg = Field(default=None, description="USD budget of the stage (needs a price).")


@dataclass
class _Planned:
    """A stage as the run will do it."""

    stage: Stage
    index: int
    cfg: SwarmConfig
    options: JobOptions
    outputs: list[str]
    source: str
    """What the stage reads: the pipeline's input, or the previous stage's hand-over."""
    output: Path
    """The stage's committed output (in the pipeline's folder)."""
    dest: str
    """Where its hand-over goes: the next stage's input, or the pipeline's output."""


def pipeline_id(output: str, names: list[str]) -> str:
    """The pipeline's id (its folder's name): the same output and stage names give the same id, so a
    rerun finds its stages' outputs and hand-overs."""
    key = f"{storage.parse(output, 'output').uri}|{'/'.join(names)}"
    stem = Path(str(output).rstrip("/")).stem or "pipeline"
    return f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _check_output(input: str, output: str) -> None:
    if storage.is_folder(output) or not str(output).endswith(".parquet"):
        raise ConfigError(
            f"output {output}: a pipeline writes one parquet file (a name ending in .parquet); the stages' own "
            "outputs (with status, errors and tokens) stay in its folder (work_dir)."
        )
    loc = storage.parse(output, "output")
    if loc.uri == storage.parse(input, "input").uri:
        raise ConfigError(f"output {output}: it is the input; choose another file.")
    if loc.remote:
        storage.check_writable(loc, "output")
        return
    folder = loc.local_path.resolve().parent
    while not folder.exists():
        folder = folder.parent
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"output {output}: {folder} cannot be written by this user; choose another place.")


def _check_sleep_between(planned: list[_Planned], keep_swarms: bool) -> None:
    """``sleep_between`` keeps every stage's swarm up (asleep) for the next run: it needs ``keep_swarms``
    and engines that sleep; refused before any swarm is brought up."""
    if not keep_swarms:
        raise ConfigError(
            "sleep_between keeps the stages' swarms up, asleep, for the next run: set keep_swarms: true "
            "(`prefect-swarm down NAME` ends them)."
        )
    for p in planned:
        if not p.cfg.engine.sleep_mode:
            raise ConfigError(
                f"stage {p.index} ({p.stage.name}): sleep_between needs engine.sleep_mode: true in its swarm "
                f"'{p.cfg.name}' (the engines sleep between stages)."
            )


def plan_pipeline(
    stages: list[Stage], input: str, output: str, work_dir: str | None
) -> tuple[PipelinePaths, list[_Planned]]:
    """Check every stage before any swarm is brought up (names, swarm configs, job options, the
    columns each stage's job and filter name), and lay out where each stage reads and writes."""
    if not 1 <= len(stages) <= MAX_STAGES:
        raise ConfigError(f"stages: give 1 to {MAX_STAGES} stages (got {len(stages)}).")
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"stages: names must differ (got {', '.join(names)}); each prefixes its outputs.")
    _check_output(input, output)
    pid = pipeline_id(output, names)
    if work_dir:
        paths = PipelinePaths(storage.parse(work_dir, "work_dir", remote_ok=False).local_path.resolve())
    else:
        paths = PipelinePaths.for_pipeline(pid)
    columns = list(InputDataset(input).schema.names)
    planned: list[_Planned] = []
    id_column: str | None = None
    for i, stage in enumerate(stages, 1):
        cfg = resolve_swarm(stage.swarm)
        options = job_options(stage.job)
        if options.id_column is None and id_column is not None:
            options = options.model_copy(update={"id_column": id_column})  # the ids go on with the rows
        id_column = options.id_column
        job = load_job(options.job, options.job_kwargs)
        try:
            columns = check_stage(
                stage.name,
                job,
                columns,
                id_column=options.id_column,
                input_columns=options.input_columns,
                output_columns=options.output_columns,
                keep=stage.keep,
            )
        except ConfigError as exc:
            raise ConfigError(f"{exc} (stage {i} of {len(stages)})") from None
        source = input if i == 1 else str(paths.stage_input(i, stage.name))
        dest = output if i == len(stages) else str(paths.stage_input(i + 1, stages[i].name))
        outputs = outputs_of(job, options.output_columns)
        planned.append(_Planned(stage, i, cfg, options, outputs, source, paths.stage_output(i, stage.name), dest))
    return paths, planned


@dataclass
class _Warm:
    """A later stage's swarm this run brings up ahead of its stage (``overlap``)."""

    up: PrefectFuture[Any]
    ready: PrefectFuture[Any]


def _prewarm(planned: list[_Planned], reuse: bool) -> dict[int, _Warm]:
    """Bring up (as this run's holds) the swarms of the stages after the first whose previous stage has
    not committed yet: each comes up while the stages before it run. A stage the run passed before
    (a rerun) is not warmed: it may have nothing left to send."""
    warm: dict[int, _Warm] = {}
    for p in planned[1:]:
        if planned[p.index - 2].output.exists():
            continue
        up = swarm_up.submit(p.cfg, keep=False, reuse=reuse, source=block_ref(p.stage.swarm))
        warm[p.index] = _Warm(up, wait_ready.submit(up))  # type: ignore[call-overload]  # a future of its Swarm
    return warm


def _run_stage(p: _Planned, *, keep_swarms: bool, reuse: bool, retry_failed: bool) -> Any:
    """The stage's ``batch-inference`` subflow run (its final state)."""
    stage = p.stage
    run = batch_inference.with_options(flow_run_name=f"stage-{p.index}-{stage.name}")
    return run(
        swarm=stage.swarm,
        job=p.options,
        input=p.source,
        output=str(p.output),
        shards=stage.shards,
        concurrency=stage.concurrency,
        keep_swarm=keep_swarms,
        reuse=reuse,
        max_failed_fraction=stage.max_failed_fraction,
        sharing=stage.sharing,
        max_gpu_hours=stage.max_gpu_hours,
        max_cost_usd=stage.max_cost_usd,
        retry_failed=retry_failed,
        return_state=True,
    )


def _stage_row(p: _Planned, result: dict[str, Any] | None, handed: HandOver | None) -> dict[str, Any]:
    res = result or {}
    return {
        "stage": p.stage.name,
        "swarm": res.get("swarm", p.cfg.name),
        "model": res.get("model", p.cfg.model_name),
        "job_id": res.get("job_id"),
        "rows": res.get("rows", 0),
        "ok": res.get("ok", 0),
        "failed": res.get("failed", 0),
        "why": reasons_line(res.get("failure_reasons")),  # why its rows failed (top reasons with counts)
        "cached": res.get("cached", 0),
        "went_on": handed.kept if handed is not None else 0,
        "keep": p.stage.keep.describe() if p.stage.keep is not None else "",
        "tokens_this_run": res.get("tokens_this_run", 0),
        "wall_s": res.get("wall_s", 0.0),
        "swarm_s": res.get("swarm_s", 0.0),
        "gpu_hours": res.get("gpu_hours", 0.0),
        "usd": res.get("usd"),
        "output": str(p.output),
    }


def _totals(rows: list[dict[str, Any]], final_rows: int, wall_s: float) -> dict[str, Any]:
    usd = [r["usd"] for r in rows if r["usd"] is not None]
    return {
        "rows": final_rows,
        "tokens_this_run": sum(int(r["tokens_this_run"] or 0) for r in rows),
        "gpu_hours": round(sum(float(r["gpu_hours"] or 0) for r in rows), 4),
        "usd": round(sum(usd), 4) if usd else None,
        "wall_s": round(wall_s, 2),
    }


def _let_go(name: str) -> None:
    """Release this run's own hold on swarm ``name`` (a warmed swarm, once its stage is over)."""
    run_id = current_flow_run_id()
    if run_id is not None and default_holding().holds(name, flow_run_owner(run_id)):
        swarm_down(name, owner=flow_run_owner(run_id))


@swarm_flow(
    name="pipeline",
    persist_result=True,
    result_storage=flow_result_storage(),  # PREFECT_SWARM_RESULT_STORAGE, else $PREFECT_SWARM_HOME/prefect-results
    task_runner=ThreadPoolTaskRunner(max_workers=2 * MAX_STAGES + 4),
    on_cancellation=[teardown_hook],
    on_crashed=[teardown_hook],
)
def pipeline(
    stages: Annotated[list[Stage], Field(min_length=1, max_length=MAX_STAGES)],
    input: InputArg,
    output: Annotated[str, Field(min_length=1, description="The pipeline's output: one parquet file (*.parquet).")],
    overlap: bool = False,
    keep_swarms: bool = False,
    reuse: bool = True,
    retry_failed: bool = False,
    work_dir: str | None = None,
    sleep_between: bool = False,
) -> dict[str, Any]:
    """Run ``stages`` one after the other, each a batch job on its own swarm over what the stage before
    it handed on; write the rows the last stage passes to ``output``; one summary at the end.

    Args:
        stages: the stages in order (name, swarm, job, keep filter, and batch_inference's shards,
            concurrency, max_failed_fraction, sharing, budgets). Stage 1 reads ``input``; every
            later stage reads the rows the stage before it answered and its ``keep`` passed, with the
            input columns and every earlier stage's outputs as ``<stage>_<column>`` (``generate_text``).
        input: parquet file/folder or OpenAI Batch JSONL (stage 1's input).
        output: one parquet file: the rows the last stage answered and its ``keep`` passed, with the
            input columns and every stage's outputs as ``<stage>_<column>``.
        overlap: bring each later stage's swarm up while the stage before it still runs (it is ready
            when its rows are; both swarms are up meanwhile). Default: each swarm is up only while
            its own stage runs.
        keep_swarms: leave the stages' swarms running afterwards (a later run may share them).
        reuse: share a live kept swarm serving the same engine under another name.
        retry_failed: each stage reruns only the rows its ledger holds as errors (see
            batch_inference); a stage whose output changed hands the next one a new input, which
            then runs as a new job.
        work_dir: where the stages' outputs and hand-overs live (a POSIX folder every stage's job
            processes can read: on a cluster, a shared one). Default:
            ``$PREFECT_SWARM_HOME/pipelines/<output stem>-<hash of output and stage names>``.
        sleep_between: the stages share their GPUs: each stage's swarm sleeps after its stage (GPU
            memory freed, allocation kept) and is woken before it on the next run. Needs
            ``keep_swarms`` and ``engine.sleep_mode`` in every stage's swarm.
    """
    started = time.monotonic()
    log = get_run_logger()
    paths, planned = plan_pipeline(stages, input, output, work_dir)
    if sleep_between:
        _check_sleep_between(planned, keep_swarms)
    pid = paths.root.name
    tag_run(f"pipeline:{pid}")
    reap_quietly()
    log.info("Pipeline %s: %s (folder %s).", pid, " -> ".join(p.stage.name for p in planned), paths.root)
    rows: list[dict[str, Any]] = []
    final_rows = 0
    try:
        warm = _prewarm(planned, reuse) if overlap else {}
        handed: HandOver | None = None
        for p in planned:
            if handed is not None and handed.kept == 0:
                log.warning("Stage %s: no rows came to it; it is skipped.", p.stage.name)
                rows.append({**_stage_row(p, None, None), "keep": "skipped: no rows came to it"})
                continue
            if p.index in warm:
                warm[p.index].ready.result()  # its swarm is ready (or the bring-up's error ends the run here)
            if sleep_between and (asleep := live_swarm(p.cfg.name)) is not None:
                wake_replicas(asleep)  # kept asleep since the last run: woken, not brought up
            state = _run_stage(p, keep_swarms=keep_swarms, reuse=reuse, retry_failed=retry_failed)
            if sleep_between and state.is_completed() and (awake := live_swarm(state.result()["swarm"])) is not None:
                sleep_replicas(awake)  # the next stage's model gets the GPUs
            if p.index in warm and not keep_swarms:
                _let_go(warm[p.index].up.result().cfg.name)  # its stage is over: this run's hold goes too
            if not state.is_completed():
                rows.append(_stage_row(p, None, None))
                publish_pipeline_summary(pid, output, rows, _totals(rows, 0, time.monotonic() - started))
                return Failed(message=f"pipeline {pid}: stage {p.index} ({p.stage.name}) {state.name}: {state.message}")  # type: ignore[return-value]
            result = state.result()
            handed = hand_over_stage(paths, p.stage.name, p.output, p.dest, p.outputs, p.stage.keep)
            rows.append(_stage_row(p, result, handed))
            final_rows = handed.kept if p.index == len(planned) else 0
        ran = [p for p, r in zip(planned, rows, strict=True) if r["job_id"] is not None]
        if len(ran) < len(planned):  # later stages got no rows: so does the output
            final_rows = 0
            _empty_output(ran[-1].dest, output)
    finally:
        teardown_owned(keep_swarms)  # warmed swarms this run still holds (a stage that failed or never ran)
    totals = _totals(rows, final_rows, time.monotonic() - started)
    publish_pipeline_summary(pid, output, rows, totals)
    log.info("Pipeline %s: %d rows in %s (%s).", pid, final_rows, output, totals)
    return {
        "pipeline": pid,
        "output": output,
        "rows": final_rows,
        "work_dir": str(paths.root),
        "stages": rows,
        **totals,
    }


def _empty_output(last: str, output: str) -> None:
    """The output of a pipeline whose later stages got no rows: the columns of the last hand-over, no rows."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(last)
    with storage.publish_file(storage.parse(output, "output")) as sink:
        pq.write_table(schema.empty_table(), str(sink) if isinstance(sink, Path) else sink)
