"""Artifacts a run leaves in the Prefect UI: the run summary table and links to the output.

Secrets never reach an artifact: everything here comes from manifests, progress files and the
redacted swarm config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from prefect_swarm.config import SwarmConfig
from prefect_swarm.jobs.checkpoint.failures import OTHER, words
from prefect_swarm.jobs.checkpoint.plan import REUSE_COUNTS, recovered_text
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.swarm import engine_fingerprint

INLINE = "inline"
"""The summary's ``block`` for a swarm that came from a YAML file or an inline config."""

HASH_MAX_BYTES = 512 * 2**20
"""Output files up to this size get a sha256 in the manifest table; larger ones their size only."""


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
    block: str | None = None,
    resumed: int = 0,
) -> dict[str, Any]:
    """The run's numbers: swarm, the SwarmSpec block it came from (``inline`` for a YAML or inline
    config), the config fingerprint (:func:`~prefect_swarm.swarm.engine_fingerprint`), model, flow
    run, rows ok/failed/cached, tokens, tok/s of THIS run (tokens this run produced: the shards'
    totals less ``tokens_before``, what their ledgers held when the run started), wall time, swarm
    time, GPU-hours (swarm time x its GPUs), USD and USD per million tokens (``backend.cost``; null
    without a price); ``resumed``: the rows its checkpoints already held done when the run started
    (0: not a resume); ``recovered``: rows answered on a retry after failing before (their reasons:
    :func:`~prefect_swarm.jobs.checkpoint.plan.recovered_text`)."""
    cached = sum(int(r.get("total") or 0) for r in shard_results if r.get("how") == "skipped")
    ran = [r for r in shard_results if r.get("how") != "skipped"]
    tokens_run = sum(int(r.get("prompt_tokens") or 0) + int(r.get("completion_tokens") or 0) for r in ran)
    tokens_run = max(tokens_run - tokens_before, 0)
    gpus = cfg.replicas * max(cfg.gpus_per_replica, 0)
    cost = cfg.backend.cost.figures(gpus * swarm_s / 3600.0, tokens_run)
    return {
        "swarm": swarm_name or cfg.name,
        "block": block or INLINE,
        "fingerprint": engine_fingerprint(cfg),
        "model": cfg.model_name,
        "flow_run": flow_run,
        "rows": manifest.get("rows", 0),
        "ok": manifest.get("ok", 0),
        "failed": manifest.get("failed", 0),
        "skipped": cached,
        "cached": cached,
        "resumed": resumed,
        "recovered": sum(int(r.get("recovered") or 0) for r in shard_results),
        "prompt_tokens": manifest.get("prompt_tokens", 0),
        "completion_tokens": manifest.get("completion_tokens", 0),
        "tokens_this_run": tokens_run,
        **{k: sum(int(r.get(k) or 0) for r in ran) for k in REUSE_COUNTS},  # requests sent, rows reused
        "tok_per_s": round(tokens_run / wall_s, 1) if wall_s > 0 else 0.0,
        "wall_s": round(wall_s, 2),
        "swarm_s": round(swarm_s, 2),
        "gpu_hours": round(gpus * swarm_s / 3600.0, 4),
        "usd": cost["usd"],
        "usd_per_million_tokens": cost["usd_per_million_tokens"],
    }


def manifest_table(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per file the commit wrote: the output and the failed rows (kind, path, rows, bytes,
    sha256; the hash only up to :data:`HASH_MAX_BYTES`, else empty)."""
    files = [("output", manifest.get("output"), manifest.get("rows", 0))]
    if manifest.get("failed_rows"):
        files.append(("failed rows", manifest.get("failed_rows"), manifest.get("failed", 0)))
    out = []
    for kind, path, rows in files:
        if not path:
            continue
        file = Path(str(path)).expanduser()
        size = file.stat().st_size if file.is_file() else None
        out.append(
            {
                "file": kind,
                "path": str(path),
                "rows": rows,
                "bytes": size,
                "sha256": _sha256(file) if size is not None and size <= HASH_MAX_BYTES else "",
            }
        )
    return out


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
    """Summary table (swarm, block, fingerprint, counts...), the manifest table (:func:`manifest_table`),
    per-shard table, and a report naming the output and failed-rows files by path (a browser
    cannot open a ``file://`` link to the worker's disk); keys
    ``<swarm>-<output>-{summary,manifest,shards,output,report}`` (:func:`artifact_base`)."""
    job_id, base = spec.job_id, artifact_base(spec)
    resumed = f"; resumed: {row['resumed']} of {row['rows']} rows already done" if row.get("resumed") else ""
    create_table_artifact(
        key=artifact_key(base, "summary"), table=[row], description=f"job {job_id}: run summary{resumed}"
    )
    files = manifest_table(manifest)
    if files:
        create_table_artifact(
            key=artifact_key(base, "manifest"), table=files, description=f"job {job_id}: files the commit wrote"
        )
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
        markdown=_markdown(job_id, row, manifest, shard_results),
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


def _markdown(job_id: str | None, row: dict[str, Any], manifest: dict[str, Any], shards: list[dict[str, Any]]) -> str:
    resumed = [f"Resumed: {row['resumed']} of {row['rows']} rows already done.", ""] if row.get("resumed") else []
    recovered = [recovered_text(shards) + ".", ""] if recovered_text(shards) else []
    head = [f"# Job `{job_id}`", "", *resumed, *recovered]
    lines = [*head, *_table([row]), "", "## Files", "", *_table(manifest_table(manifest))]
    return "\n".join(lines)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of ``rows`` (the keys of the first row are the columns)."""
    if not rows:
        return []
    cols = list(rows[0])
    head = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return head + ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |" for r in rows]


def secret_values_of(cfg: SwarmConfig) -> list[str]:
    """The swarm's secret values to mask in what a run shows (its API key)."""
    return [cfg.api_key.get_secret_value()] if cfg.api_key is not None else []


def shown_failures(summary: dict[str, Any] | None, secrets: list[str]) -> dict[str, Any] | None:
    """A failure summary (:mod:`prefect_swarm.jobs.checkpoint.failures`) as a run shows it: every error redacted
    with the swarm's ``secrets`` too."""
    if not summary:
        return None
    reasons = [{**r, "example_error": words(r.get("example_error"), secrets)} for r in summary.get("reasons") or []]
    examples = [{**e, "error": words(e.get("error"), secrets)} for e in summary.get("examples") or []]
    return {**summary, "reasons": reasons, "examples": examples}


def failed_message(job_id: str, verdict: str, why: list[str]) -> str:
    """A failed run's state message: the verdict, then why the rows failed (reasons, example rows)."""
    return "\n".join([f"job {job_id} {verdict}", *why])


def publish_failed_rows(spec: JobSpec, summary: dict[str, Any], secrets: list[str]) -> None:
    """The ``<swarm>-<output>-failed-rows`` table: one row per reason (rows, an example row's id and the
    engine's words, redacted); the whole list stays in the failed-rows file."""
    shown = shown_failures(summary, secrets) or {}
    table = [
        {"reason": r["reason"], "rows": r["rows"], "example_row": r["example_id"], "engine_said": r["example_error"]}
        for r in shown.get("reasons") or []
    ]
    if shown.get("other_rows"):
        table.append({"reason": OTHER, "rows": shown["other_rows"], "example_row": "", "engine_said": ""})
    create_table_artifact(
        key=artifact_key(artifact_base(spec), "failed-rows"),
        table=table,
        description=f"job {spec.job_id}: why {shown.get('rows', 0)} rows failed (every row: {spec.paths.failed_rows})",
    )
