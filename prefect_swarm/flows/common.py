"""Steps shared by the flows that are not tasks: build the spec, label the run, map the shards,
publish the summary, tear down what the run owns, reap orphans."""

from __future__ import annotations

import time
import uuid
from typing import Any

from prefect import get_run_logger
from prefect.futures import wait

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import JobError
from prefect_swarm.flows.params import JobOptions, job_options
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.state import StateStore
from prefect_swarm.swarm import LIVE_PHASES, Swarm, engine_fingerprint
from prefect_swarm.tasks._common import current_flow_run_id
from prefect_swarm.tasks.artifacts import publish_summary, summary_row
from prefect_swarm.tasks.jobs import JobPlan, commit_output, results_dir, run_shard
from prefect_swarm.tasks.swarm import swarm_down, teardown_flow_run


def job_spec(cfg: SwarmConfig, job: JobOptions | str | dict[str, Any], input: str, output: str, shards: int) -> JobSpec:
    """The JobSpec for the flow's parameters on swarm ``cfg`` (commit is the flow's own step)."""
    return job_options(job).to_spec(
        input=input,
        output=output,
        shards=shards,
        model=cfg.model_name,
        swarm_fingerprint=engine_fingerprint(cfg),
        auto_commit=False,
    )


def label_run(swarm_name: str, job_id: str | None) -> None:
    """Tag the current flow run ``swarm:<name>`` and ``job:<id>`` (history joins on these)."""
    from prefect import get_client
    from prefect.runtime import flow_run

    run_id = current_flow_run_id()
    if run_id is None:
        return
    wanted = [f"swarm:{swarm_name}", f"job:{job_id}"]
    current = list(flow_run.tags or [])
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(uuid.UUID(run_id), tags=sorted({*current, *wanted}))
    except Exception as exc:  # labels are for history only; never fail a run for them
        get_run_logger().warning("could not tag flow run %s: %s", run_id, exc)


def reap_quietly() -> None:
    """Run the orphan reaper; log (never raise) what it did."""
    from prefect_swarm.tasks.reaper import reap_orphans

    try:
        reaped = reap_orphans()
    except Exception as exc:
        get_run_logger().warning("orphan reaper skipped: %s", exc)
        return
    if reaped:
        get_run_logger().warning("Reaped orphan swarm(s) of ended flow runs: %s", ", ".join(reaped))


def run_shards(plan: JobPlan, live: Swarm | None) -> list[dict[str, Any]]:
    """Map shards: pending ones always run (refresh the cache), finished ones may come from the cache."""
    spec = plan.spec
    if live is not None:
        spec = spec.model_copy(update={"endpoints": live.endpoints, "model": live.cfg.model_name})
        spec.save()
    task = run_shard.with_options(result_storage=results_dir())
    futures = [
        task.with_options(refresh_cache=i in plan.pending).submit(spec, i, plan.fingerprint, live)
        for i in range(spec.shards)
    ]
    wait(futures)
    failed = [i for i, f in enumerate(futures) if not f.state.is_completed()]
    if failed:
        futures[failed[0]].result()  # raises the first shard's error
        raise JobError(f"shards {failed} of job {spec.job_id} did not complete.")
    return [{**f.result(), "how": "skipped"} if i in plan.done else f.result() for i, f in enumerate(futures)]


def run_and_commit(
    plan: JobPlan, live: Swarm | None, cfg: SwarmConfig, started: float, up_at: float | None
) -> dict[str, Any]:
    """Run the shards, commit, publish the summary; return the run's numbers and paths."""
    results = run_shards(plan, live)
    manifest = commit_output(plan.spec)
    swarm_s = time.monotonic() - up_at if up_at is not None else 0.0
    row = summary_row(manifest, results, live.cfg if live else cfg, time.monotonic() - started, swarm_s)
    publish_summary(plan.spec.job_id, row, results, manifest)
    get_run_logger().info("Job %s: %s", plan.spec.job_id, row)
    return {
        **row,
        "job_id": plan.spec.job_id,
        "output": manifest.get("output"),
        "failed_rows": manifest.get("failed_rows"),
        "job_dir": plan.spec.job_dir,
    }


def teardown_owned(keep_swarm: bool) -> None:
    """Stop the swarms this flow run brought up (unless kept), as visible tasks; fall back to plain calls."""
    run_id = current_flow_run_id()
    if run_id is None:
        return
    store = StateStore()
    owned = [r for r in store.find_swarms_by_flow_run(run_id) if r.phase in LIVE_PHASES and not r.keep]
    if keep_swarm or not owned:
        return
    try:
        for rec in owned:
            swarm_down(rec.name)
    finally:
        teardown_flow_run(run_id)  # idempotent safety net (also cancels this run's jobs)
