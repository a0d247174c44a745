"""``failed-rows-notice``: the example automation's action (``deployments/prefect.yaml``).

Its deployment triggers on ``prefect-swarm.job.committed`` events whose job resource carries
``prefect-swarm.failed-rows: "true"``; the run logs a WARNING and leaves an artifact naming the job,
the counts and the failed-rows file. Replace or extend it (a notification block, a ticket) as needed.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from prefect_swarm.flows.params import swarm_flow
from prefect_swarm.tasks.artifacts import artifact_key


@swarm_flow(name="failed-rows-notice")
def failed_rows_notice(
    job_id: str,
    swarm: str = "",
    output: str = "",
    rows: int = 0,
    failed: int = 0,
    failed_rows: str = "",
    why: str = "",
) -> str:
    """Say that job ``job_id`` committed its output with failed rows.

    Args:
        job_id: the job (`prefect-swarm job status JOB_ID`).
        swarm: the swarm it ran on.
        output: the output file.
        rows: rows in the output.
        failed: rows that failed.
        failed_rows: the JSONL file of the failed rows (id, error).
        why: the top reasons with their counts (``Why: HTTP 503 x12, timeout after 60s x3.``).
    """
    message = (
        f"job {job_id} on swarm {swarm or '?'} committed {rows} rows with {failed} failed; failed rows: {failed_rows}"
    )
    if why:
        message += f"\n{why}"
    get_run_logger().warning(message)
    create_markdown_artifact(
        key=artifact_key(f"{swarm or 'job'}-{Path(output).stem or job_id}", "failed-rows-notice"),
        markdown=f"# Job `{job_id}`: {failed} of {rows} rows failed\n\n{why}\n\nSwarm: `{swarm}`\n\n"
        f"Failed rows (JSONL: id, error): `{failed_rows}`\n\n`prefect-swarm job retry {job_id}` (or the flow "
        "rerun with `retry_failed: true`) resends only those rows.",
        description=f"job {job_id}: failed rows",
    )
    return message
