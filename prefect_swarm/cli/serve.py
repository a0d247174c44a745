"""``prefect-swarm serve ...``: the OpenAI-compatible batch service and its tenants' keys.

    prefect-swarm serve batches -c batch-service.yaml [--host 127.0.0.1] [--port 8484]
                                [--ssl-certfile F --ssl-keyfile F]
    prefect-swarm serve keys create TENANT      prints a new key (shown once; stored hashed)
    prefect-swarm serve keys list
    prefect-swarm serve keys revoke TENANT

The service lives in :mod:`prefect_swarm.batchserver`; this module parses arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefect_swarm.cli.output import OutputFormat, console, emit_json, err_console, table

serve_app = typer.Typer(help="Serve OpenAI-compatible APIs backed by swarms.", no_args_is_help=True)
keys_app = typer.Typer(help="Keys of the batch service's tenants.", no_args_is_help=True)
serve_app.add_typer(keys_app, name="keys")


@serve_app.command("batches")
def batches(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Service config: model -> swarm config, limits (see the docs)."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8484,
    certfile: Annotated[Path | None, typer.Option("--ssl-certfile", help="TLS certificate (PEM).")] = None,
    keyfile: Annotated[Path | None, typer.Option("--ssl-keyfile", help="TLS private key (PEM).")] = None,
) -> None:
    """Serve OpenAI's Files and Batches API: each batch runs on its model's swarm, exactly once."""
    from prefect_swarm.batchserver import serve

    serve(config, host=host, port=port, certfile=certfile, keyfile=keyfile)


@keys_app.command("create")
def create_key(tenant: Annotated[str, typer.Argument(help="Tenant name: its files and batches are its own.")]) -> None:
    """Make a key for TENANT and print it (only its hash is kept: it cannot be shown again)."""
    from prefect_swarm.batchserver.store import ServiceStore

    key = ServiceStore().create_key(tenant)
    err_console.print(f"key for tenant '{tenant}' (shown once; clients send it as their OpenAI API key):")
    console.print(key)


@keys_app.command("list")
def list_keys(
    output: Annotated[OutputFormat, typer.Option("--output", "-o", help="Output format.")] = OutputFormat.table,
) -> None:
    """The tenants' keys: tenant, the first characters, when made."""
    from prefect_swarm.batchserver.store import ServiceStore

    rows = ServiceStore().list_keys()
    if output == OutputFormat.json:
        emit_json({"keys": rows})
        return
    console.print(
        table(None, ["tenant", "key", "created"], [[r["tenant"], r["prefix"], f"{r['created_at']:.0f}"] for r in rows])
    )


@keys_app.command("revoke")
def revoke(tenant: Annotated[str, typer.Argument(help="Tenant whose keys are removed.")]) -> None:
    """Remove every key of TENANT (its files and batches stay)."""
    from prefect_swarm.batchserver.store import ServiceStore

    n = ServiceStore().revoke_keys(tenant)
    err_console.print(f"removed {n} key(s) of tenant '{tenant}'")
