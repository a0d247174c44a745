"""Artifacts a run leaves in the Prefect UI: the run summary table and links to the output.

Secrets never reach an artifact: everything here comes from manifests, progress files and the
redacted swarm config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from prefect_swarm.config import SwarmConfig


def summary_row(
    manifest: dict[str, Any],
    shard_results: list[dict[str, Any]],
    cfg: SwarmConfig,
    wall_s: float,
    swarm_s: float,
) -> dict[str, Any]:
    """The run's numbers: rows ok/failed/skipped, tokens, tok/s, wall time, GPU-hours."""
    skipped = sum(int(r.get("total") or 0) for r in shard_results if r.get("how") == "skipped")
    ran = [r for r in shard_results if r.get("how") != "skipped"]
    tokens_run = sum(int(r.get("prompt_tokens") or 0) + int(r.get("completion_tokens") or 0) for r in ran)
    gpus = cfg.replicas * max(cfg.gpus_per_replica, 0)
    return {
        "rows": manifest.get("rows", 0),
        "ok": manifest.get("ok", 0),
        "failed": manifest.get("failed", 0),
        "skipped": skipped,
        "prompt_tokens": manifest.get("prompt_tokens", 0),
        "completion_tokens": manifest.get("completion_tokens", 0),
        "tok_per_s": round(tokens_run / wall_s, 1) if wall_s > 0 else 0.0,
        "wall_s": round(wall_s, 2),
        "gpu_hours": round(gpus * swarm_s / 3600.0, 4),
    }


def _key(job_id: str | None, what: str) -> str:
    raw = f"{job_id or 'job'}-{what}".lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw)[:100]


def publish_summary(
    job_id: str | None, row: dict[str, Any], shard_results: list[dict[str, Any]], manifest: dict[str, Any]
) -> None:
    """Summary table, per-shard table, and links to the output and the failed rows."""
    create_table_artifact(key=_key(job_id, "summary"), table=[row], description=f"job {job_id}: run summary")
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
        create_table_artifact(key=_key(job_id, "shards"), table=shards, description=f"job {job_id}: shards")
    output = manifest.get("output")
    if output:
        create_link_artifact(
            key=_key(job_id, "output"),
            link=Path(output).resolve().as_uri(),
            link_text=str(output),
            description=f"job {job_id}: output",
        )
    failed = manifest.get("failed_rows")
    if failed and int(manifest.get("failed") or 0) > 0:
        create_link_artifact(
            key=_key(job_id, "failed-rows"),
            link=Path(failed).resolve().as_uri(),
            link_text=str(failed),
            description=f"job {job_id}: failed rows (JSONL: id, error)",
        )
    create_markdown_artifact(
        key=_key(job_id, "report"),
        markdown=_markdown(job_id, row, manifest),
        description=f"job {job_id}: report",
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
