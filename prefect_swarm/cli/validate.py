"""``prefect-swarm validate``: parse a config, check it against the backend, show what would start.

Starts nothing and writes nothing: no state row, no swarm folder, no process. The one remote call is
the backend's read-only pre-flight question (Slurm: ``sbatch --test-only``, so a partition, account or
QOS that does not exist is named here); a scheduler that cannot be asked is a warning.

``--estimate K --input IN`` (with the job's options, as `job submit` takes them) also sizes a job on
the swarm, which must be up: the first K rows of IN run on it from this machine in a throwaway folder
(:func:`prefect_swarm.launch.pilot_job`: K requests, no state row, no output), and the projected wall
time, GPU-hours and USD of the whole input are printed, for the replica count of the config as given
(``--replicas 64`` projects a pilot run on 2 replicas for 64).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from prefect_swarm.backends.registry import entry_of
from prefect_swarm.cli.output import OutputFormat, console, emit_json, err_console
from prefect_swarm.cli.swarms import ConfigOpt, NameOpt, OutputOpt, ReplicasOpt, make_swarm
from prefect_swarm.config import SwarmConfig, load_config
from prefect_swarm.config.cost import projection_text
from prefect_swarm.config.errors import invalid_fields
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.state import StateStore

MASK = "***"


def validate(
    config: ConfigOpt,
    replicas: ReplicasOpt = None,
    name: NameOpt = None,
    output: OutputOpt = OutputFormat.table,
    show_config: Annotated[bool, typer.Option("--show-config", help="Also print the resolved config.")] = False,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="Do not ask the scheduler (Slurm: sbatch --test-only) whether it would take the jobs: "
            "for a config written away from its cluster.",
        ),
    ] = False,
    estimate: Annotated[
        int | None,
        typer.Option(
            "--estimate",
            min=1,
            help="Size a job on the RUNNING swarm: send the first K rows of --input (a pilot in a throwaway "
            "folder: no output, no job record) and print the projected wall time, GPU-hours and USD of the "
            "whole input for this config's replicas (--replicas projects another count).",
        ),
    ] = None,
    input: Annotated[
        str | None, typer.Option("--input", help="With --estimate: the job's input (parquet or OpenAI Batch JSONL).")
    ] = None,
    job: Annotated[
        str | None, typer.Option("--job", help="With --estimate: job class module:Class, or chat|completion|embedding.")
    ] = None,
    job_kwargs: Annotated[
        str | None, typer.Option("--job-kwargs", help="With --estimate: job kwargs as a JSON object.")
    ] = None,
    id_column: Annotated[str | None, typer.Option("--id-column", help="With --estimate: unique id column.")] = None,
    spec_file: Annotated[
        Path | None, typer.Option("--spec", help="With --estimate: JobSpec JSON to start from (flags override).")
    ] = None,
) -> None:
    """Check a config (fields, then what the backend can do) and print the plan; starts nothing.
    With --estimate: a pilot of K rows on the running swarm, and the whole input's projected time and cost."""
    cfg = load_config(config, overrides={"replicas": replicas, "name": name})
    job_spec = _pilot_spec(spec_file, input, job, job_kwargs, id_column) if estimate else None
    swarm = make_swarm(cfg)
    unchecked = swarm.validate(ask=not offline)  # capabilities, the backend's pre-flight, the scheduler's answer
    serving = swarm.backends.serving
    caps = serving.capabilities()
    plan = mask_secrets(serving.plan(), cfg)
    notes = [*unchecked, *warnings(cfg)]
    shards = shard_placement(cfg)
    pilot = pilot_estimate(cfg, config, job_spec, estimate) if job_spec is not None and estimate else None
    if output is OutputFormat.json:
        emit_json(
            {
                "valid": True,
                "name": cfg.name,
                "backend": cfg.backend.type,
                "config": cfg.redacted(),
                "capabilities": caps.to_dict(),
                "plan": plan,
                "warnings": notes,
                "job_shards": shards,
                "estimate": pilot,
            }
        )
        return
    console.print(
        f"[green]OK[/]: {config} is a valid {cfg.backend.type} swarm '{cfg.name}' ({cfg.replicas} x {cfg.model_name})."
    )
    for note in notes:
        console.print(f"[yellow]warning[/]: {note}")
    if shards:
        console.print(f"[bold]job shards[/]: {shards}", markup=True)
    if show_config:
        from rich.syntax import Syntax  # pygments: ~50 ms that every other command would pay

        console.print(Syntax(yaml.safe_dump(cfg.redacted(), sort_keys=False), "yaml", background_color="default"))
    console.print(f"[bold]would start[/] (rendered by the {cfg.backend.type} backend; nothing was started):")
    for fname, text in plan.items():
        console.print(f"[bold]--- {fname}[/]")
        console.print(text, markup=False)
    if pilot is not None:
        print_estimate(pilot)


def _pilot_spec(
    spec_file: Path | None, input: str | None, job: str | None, job_kwargs: str | None, id_column: str | None
) -> JobSpec:
    """The job to size, from ``--spec`` and the flags (``--input`` required); refused before anything runs."""
    data: dict[str, Any] = json.loads(spec_file.read_text()) if spec_file else {}
    try:
        kwargs = json.loads(job_kwargs) if job_kwargs else None
    except ValueError as exc:
        raise ConfigError(f"--job-kwargs is not JSON: {exc}") from exc
    data.update(
        {k: v for k, v in {"input": input, "job": job, "job_kwargs": kwargs, "id_column": id_column}.items() if v}
    )
    if not data.get("input"):
        raise ConfigError("--estimate needs the job's input: add --input FILE (or a --spec holding one).")
    data.setdefault("output", "pilot.parquet")  # the pilot writes in its own throwaway folder
    try:
        return JobSpec.model_validate(data)
    except ValueError as exc:
        raise invalid_fields(exc, JobSpec, "invalid job arguments for --estimate") from exc


def pilot_estimate(cfg: SwarmConfig, config: Path, spec: JobSpec, k: int) -> dict[str, Any]:
    """Run the pilot on the swarm named by ``cfg`` (it must be up: else ConfigError, exit 2, with the
    command that brings it up) and return its figures and the projection for ``cfg``."""
    from prefect_swarm.holding import default_holding
    from prefect_swarm.launch import pilot_job
    from prefect_swarm.pilot import pilot_size_text

    rec = StateStore().get_swarm(cfg.name)
    up = f"`prefect-swarm up -c {config}` brings it up; then run this command again"
    if rec is None or rec.phase is not ServingPhase.RUNNING:
        state = "not recorded" if rec is None else rec.phase.value
        raise ConfigError(
            f"--estimate runs a pilot on the running swarm '{cfg.name}', and it is not up ({state}): {up}."
        )
    swarm = default_holding().attach(cfg.name)
    if swarm.status().healthy == 0:
        raise ConfigError(f"--estimate: swarm '{cfg.name}' has no healthy replica now: {up} (or wait for it).")
    err_console.print(
        pilot_size_text(swarm.cfg, k), markup=False, soft_wrap=True
    )  # said before the pilot spends anything
    return pilot_job(spec, swarm, k, target=cfg)


def print_estimate(est: dict[str, Any]) -> None:
    """The pilot's figures, the projection line and the notes."""
    console.print(
        f"[bold]pilot[/]: {est['pilot_rows']} rows ({est['pilot_failed']} failed) in {est['pilot_seconds']:g}s on "
        f"{est['measured_replicas']} replica(s), {est['pilot_processes']} job process(es): "
        f"{est['pilot_rate_rows_s']:g} rows/s, {est['steady_rate_rows_s']:g} once steady "
        f"({est['rows_s_per_replica']:g} a replica) after {est['start_and_tail_s']:g}s of start and tail, "
        f"{est['tokens_per_row']} tokens/row"
    )
    console.print(f"for {est['projected_replicas']} replica(s), {projection_text(est['projection'])}", markup=False)
    for note in est["notes"]:
        console.print(f"[yellow]note[/]: {note}")


def shard_placement(cfg: SwarmConfig) -> str | None:
    """Where a batch job's shards run on this swarm, when the backend places them itself (Slurm)."""
    return entry_of(cfg.backend).placement(cfg)


def warnings(cfg: SwarmConfig) -> list[str]:
    """What is valid but risky in ``cfg``."""
    return entry_of(cfg.backend).warnings(cfg)


def mask_secrets(plan: dict[str, str], cfg: SwarmConfig) -> dict[str, str]:
    """Belt and braces (the backends mask already): no secret value may reach the printed plan."""
    secrets = [s.get_secret_value() for s in _secrets(cfg)]
    out = {}
    for fname, text in plan.items():
        for secret in filter(None, secrets):
            text = text.replace(secret, MASK)
        out[fname] = text
    return out


def _secrets(cfg: SwarmConfig) -> list[Any]:
    found = [cfg.api_key] if cfg.api_key is not None else []
    found += [getattr(cfg.backend, f) for f in entry_of(cfg.backend).secret_fields]
    return [s for s in found if s is not None]
