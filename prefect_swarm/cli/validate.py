"""``prefect-swarm validate``: parse a config, check it against the backend, show what would start.

Starts nothing and writes nothing: no state row, no swarm folder, no process. The one remote call is
the backend's read-only pre-flight question (Slurm: ``sbatch --test-only``, so a partition, account or
QOS that does not exist is named here); a scheduler that cannot be asked is a warning.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
import yaml
from rich.syntax import Syntax

from prefect_swarm.cli.output import OutputFormat, console, emit_json
from prefect_swarm.cli.swarms import ConfigOpt, NameOpt, OutputOpt, ReplicasOpt, make_swarm
from prefect_swarm.config import LeptonConfig, SlurmConfig, SwarmConfig, load_config

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
) -> None:
    """Check a config (fields, then what the backend can do) and print the plan; starts nothing."""
    cfg = load_config(config, overrides={"replicas": replicas, "name": name})
    swarm = make_swarm(cfg)
    unchecked = swarm.validate(ask=not offline)  # capabilities, the backend's pre-flight, the scheduler's answer
    serving = swarm.backends.serving
    caps = serving.capabilities()
    plan = mask_secrets(serving.plan(), cfg)
    notes = [*unchecked, *warnings(cfg)]
    shards = shard_placement(cfg)
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
        console.print(Syntax(yaml.safe_dump(cfg.redacted(), sort_keys=False), "yaml", background_color="default"))
    console.print(f"[bold]would start[/] (rendered by the {cfg.backend.type} backend; nothing was started):")
    for fname, text in plan.items():
        console.print(f"[bold]--- {fname}[/]")
        console.print(text, markup=False)


def shard_placement(cfg: SwarmConfig) -> str | None:
    """Where a batch job's shards run on this swarm, when the backend places them itself (Slurm)."""
    if isinstance(cfg.backend, SlurmConfig):
        from prefect_swarm.backends.slurm.render import shard_placement as slurm_placement

        return slurm_placement(cfg)
    return None


def warnings(cfg: SwarmConfig) -> list[str]:
    """What is valid but risky in ``cfg``."""
    if isinstance(cfg.backend, SlurmConfig) and cfg.backend.open_endpoint and cfg.api_key is None:
        return [
            "backend.open_endpoint: true serves without an API key: any user of the cluster who can "
            "reach a node can send requests to this swarm's replicas and LB. Remove it to get a key per swarm."
        ]
    return []


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
    if isinstance(cfg.backend, LeptonConfig) and cfg.backend.token is not None:
        found.append(cfg.backend.token)
    return found
