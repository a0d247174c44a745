"""Artifacts a run leaves in the Prefect UI: the run summary table and links to the output.

Secrets never reach an artifact: everything here comes from manifests, progress files and the
redacted swarm config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from prefect_swarm.config import SwarmConfig
from prefect_swarm.jobs.spec import JobSpec


def summary_row(
    manifest: dict[str, Any],
    shard_results: list[dict[str, Any]],
    cfg: SwarmConfig,
    wall_s: float,
    swarm_s: float,
    *,
    tokens_before: int = 0,
    flow_run: str | None = None,
    swarm_name: str | None = None,
) -> dict[str, Any]:
    """The run's numbers: swarm, model, flow run, rows ok/failed/cached, tokens, tok/s of THIS run
    (tokens this run produced: the shards' totals less ``tokens_before``, what their ledgers held
    when the run started), wall time, swarm time, GPU-hours."""
    cached = sum(int(r.get("total") or 0) for r in shard_results if r.get("how") == "skipped")
    ran = [r for r in shard_results if r.get("how") != "skipped"]
    tokens_run = sum(int(r.get("prompt_tokens") or 0) + int(r.get("completion_tokens") or 0) for r in ran)
    tokens_run = max(tokens_run - tokens_before, 0)
    gpus = cfg.replicas * max(cfg.gpus_per_replica, 0)
    return {
        "swarm": swarm_name or cfg.name,
        "model": cfg.model_name,
        "flow_run": flow_run,
        "rows": manifest.get("rows", 0),
        "ok": manifest.get("ok", 0),
        "failed": manifest.get("failed", 0),
        "skipped": cached,
        "cached": cached,
        "prompt_tokens": manifest.get("prompt_tokens", 0),
        "completion_tokens": manifest.get("completion_tokens", 0),
        "tokens_this_run": tokens_run,
        "tok_per_s": round(tokens_run / wall_s, 1) if wall_s > 0 else 0.0,
        "wall_s": round(wall_s, 2),
        "swarm_s": round(swarm_s, 2),
        "gpu_hours": round(gpus * swarm_s / 3600.0, 4),
    }


def artifact_key(base: str | None, what: str) -> str:
    """An artifact key (lower case, letters, digits and dashes, at most 100 characters)."""
    raw = f"{base or 'job'}-{what}".lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw)[:100]


def artifact_base(spec: JobSpec) -> str:
    """What a job's artifact keys start with: ``<swarm>-<output file stem>``, no hash, so every run
    of the same job (and a rerun after an engine change) adds to the same collections."""
    return f"{spec.swarm or 'job'}-{Path(spec.output).stem}"


def publish_summary(
    spec: JobSpec, row: dict[str, Any], shard_results: list[dict[str, Any]], manifest: dict[str, Any]
) -> None:
    """Summary table, per-shard table, and a report naming the output and failed-rows files by
    path (a browser cannot open a ``file://`` link to the worker's disk); keys
    ``<swarm>-<output>-{summary,shards,output,report}`` (:func:`artifact_base`)."""
    job_id, base = spec.job_id, artifact_base(spec)
    create_table_artifact(key=artifact_key(base, "summary"), table=[row], description=f"job {job_id}: run summary")
    shards = [
        {
            k: r.get(k)
            for k in (
                "shard",
                "how",
                "done",
                "failed",
                "total",
                "prompt_tokens",
                "completion_tokens",
                "rate_rows_s",
            )
        }
        for r in shard_results
    ]
    if shards:
        create_table_artifact(key=artifact_key(base, "shards"), table=shards, description=f"job {job_id}: shards")
    if manifest.get("output"):
        lines = [f"Output: `{manifest.get('output')}` ({manifest.get('rows', 0)} rows)"]
        if int(manifest.get("failed") or 0) and manifest.get("failed_rows"):
            lines.append(f"Failed rows (JSONL: id, error): `{manifest.get('failed_rows')}`")
        create_markdown_artifact(
            key=artifact_key(base, "output"), markdown="\n\n".join(lines), description=f"job {job_id}: output"
        )
    create_markdown_artifact(
        key=artifact_key(base, "report"),
        markdown=_markdown(job_id, row, manifest),
        description=f"job {job_id}: report",
    )


def publish_all_cached(spec: JobSpec, manifest: dict[str, Any]) -> None:
    """A rerun with nothing to do: leave the summary of the run that did the work, say so once."""
    job_id = spec.job_id
    create_markdown_artifact(
        markdown=f"# Job `{job_id}`\n\n0 rows sent, all cached: the output `{manifest.get('output')}` "
        f"({manifest.get('rows', 0)} rows) was already committed.",
        description=f"job {job_id}: rerun, all cached",
    )


def _markdown(job_id: str | None, row: dict[str, Any], manifest: dict[str, Any]) -> str:
    lines = [
        f"# Job `{job_id}`",
        "",
        "| " + " | ".join(row) + " |",
        "|" + "---|" * len(row),
        "| " + " | ".join(str(v) for v in row.values()) + " |",
        "",
        f"Output: `{manifest.get('output')}`",
    ]
    if int(manifest.get("failed") or 0):
        lines.append(f"Failed rows: `{manifest.get('failed_rows')}`")
    return "\n".join(lines)
