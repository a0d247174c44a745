"""``prefect-swarm validate``: parse a config, check it against the backend, show what would start.

Starts nothing and writes nothing: no state row, no swarm folder, no process.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
import yaml
from rich.syntax import Syntax

from prefect_swarm.cli.output import OutputFormat, console, emit_json
from prefect_swarm.cli.swarms import ConfigOpt, NameOpt, OutputOpt, ReplicasOpt, make_swarm
from prefect_swarm.config import SwarmConfig, load_config


def validate(
    config: ConfigOpt,
    replicas: ReplicasOpt = None,
    name: NameOpt = None,
    output: OutputOpt = OutputFormat.table,
    show_config: Annotated[
        bool, typer.Option("--show-config", help="Also print the resolved config.")
    ] = False,
) -> None:
    """Check a config (fields, then what the backend can do) and print the plan; starts nothing."""
    cfg = load_config(config, overrides={"replicas": replicas, "name": name})
    swarm = make_swarm(cfg)
    swarm.validate()
    serving = swarm.backends.serving
    backend_check = getattr(serving, "validate", None)
    if callable(backend_check):
        backend_check()  # the backend's own pre-flight checks (calls nothing remote)
    caps = serving.capabilities()
    plan = _mask(render_plan(cfg, serving), cfg)
    if output is OutputFormat.json:
        emit_json(
            {
                "valid": True,
                "name": cfg.name,
                "backend": cfg.backend.type,
                "config": cfg.redacted(),
                "capabilities": caps.to_dict(),
                "plan": plan,
            }
        )
        return
    console.print(
        f"[green]OK[/]: {config} is a valid {cfg.backend.type} swarm '{cfg.name}' "
        f"({cfg.replicas} x {cfg.model_name})."
    )
    if show_config:
        console.print(
            Syntax(yaml.safe_dump(cfg.redacted(), sort_keys=False), "yaml", background_color="default")
        )
    _print_plan(plan)


def render_plan(cfg: SwarmConfig, serving: Any) -> dict[str, Any]:
    """The backend's rendered plan (``serving.render_plan()``), else a summary of what would start."""
    render = getattr(serving, "render_plan", None)
    if callable(render):
        rendered = render()
        return {
            "kind": "rendered",
            "rendered": rendered if isinstance(rendered, str | dict | list) else str(rendered),
        }
    return {"kind": "summary", "replicas": _replica_summary(cfg)}


def _replica_summary(cfg: SwarmConfig) -> list[dict[str, Any]]:
    local = cfg.backend.type == "local"
    host = str(getattr(cfg.backend, "host", "")) if local else f"<node assigned by {cfg.backend.type}>"
    per_node = cfg.effective_replicas_per_node
    out = []
    for i in range(cfg.replicas):
        port = cfg.port + i if local else cfg.port + i % per_node
        out.append(
            {
                "index": i,
                "host": host,
                "port": port,
                "gpus": cfg.gpus_per_replica,
                "command": _engine_argv(cfg, host, port),
            }
        )
    return out


def _engine_argv(cfg: SwarmConfig, host: str, port: int) -> list[str] | None:
    try:
        engine = importlib.import_module("prefect_swarm.backends.engine")
    except ImportError:
        return None
    argv = engine.engine_argv(cfg, host=host, port=port)
    return [str(a) for a in argv]


def _mask(plan: Any, cfg: SwarmConfig) -> Any:
    """Belt and braces: no secret value may reach the printed plan."""
    secrets = [v for v in (s.get_secret_value() for s in _secrets(cfg)) if v]
    if isinstance(plan, str):
        for secret in secrets:
            plan = plan.replace(secret, "***")
        return plan
    if isinstance(plan, dict):
        return {k: _mask(v, cfg) for k, v in plan.items()}
    if isinstance(plan, list):
        return [_mask(v, cfg) for v in plan]
    return plan


def _secrets(cfg: SwarmConfig) -> list[Any]:
    found = [cfg.api_key] if cfg.api_key is not None else []
    token = getattr(cfg.backend, "token", None)
    return found + ([token] if token is not None else [])


def _print_plan(plan: dict[str, Any]) -> None:
    if plan["kind"] == "rendered":
        rendered = plan["rendered"]
        console.print("[bold]plan[/] (rendered by the backend):")
        files = rendered if isinstance(rendered, dict) else {"plan": rendered}
        for fname, text in files.items():
            console.print(f"[bold]--- {fname}[/]")
            body = text if isinstance(text, str) else yaml.safe_dump(text, sort_keys=False)
            console.print(body, markup=False)
        return
    console.print("[bold]would start[/]:")
    for rep in plan["replicas"]:
        cmd = " ".join(rep["command"]) if rep["command"] else "(engine command not available)"
        console.print(f"  replica {rep['index']}: {rep['host']}:{rep['port']}  gpus={rep['gpus']}  {cmd}")
