"""``prefect-swarm volumes list|rm``: the model copies ``stage`` left on node-local disk.

``list`` looks under every ``stage.to`` of the swarms in the state database (and each ``--to DIR``).
Folders of swarms on this machine (local backend, ``--to``) are listed with their marker
(``prefect_swarm.sidecar.stage``); a Slurm swarm's copies are on its compute nodes' own disks, which
this process cannot see: those rows say so (n/a) and how to list them on a node. ``rm PATH`` removes
one staged copy on this machine, and refuses while a live swarm's config stages to it.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from prefect_swarm.backends.registry import ENTRIES
from prefect_swarm.cli.output import OutputFormat, console, emit_json, err_console, table
from prefect_swarm.cli.swarms import confirm
from prefect_swarm.config.swarm import staged_path
from prefect_swarm.exceptions import BackendError, ConfigError
from prefect_swarm.paths import file_lock
from prefect_swarm.sidecar.stage import lock_path, read_marker, staged_copies
from prefect_swarm.state import StateStore, SwarmRecord
from prefect_swarm.swarm import LIVE_PHASES

volumes_app = typer.Typer(help="Model copies staged on node-local disk (`stage:` in a swarm config).")

VISIBLE_BACKENDS = frozenset(kind for kind, entry in ENTRIES.items() if entry.disks_here)
"""Backends whose nodes' disks are this machine's (their entries say so): their staged copies can be listed
and removed here."""


def _staging(rec: SwarmRecord) -> tuple[str, str] | None:
    """(stage.to, staged folder) of a stored swarm config, or None without ``stage``."""
    stage = rec.config.get("stage") or None
    if not stage or not stage.get("to"):
        return None
    return stage["to"], staged_path(stage["to"], stage.get("from") or rec.config.get("model") or "")


def _users(records: list[SwarmRecord], path: Path) -> list[str]:
    """Names of the live swarms whose config stages to ``path``."""
    out = []
    for rec in records:
        staging = _staging(rec)
        if rec.phase in LIVE_PHASES and staging and Path(staging[1]) == path:
            out.append(rec.name)
    return out


@volumes_app.command("list")
def list_volumes(
    to: Annotated[list[str] | None, typer.Option("--to", help="Also list the staged copies under this folder.")] = None,
    output: Annotated[OutputFormat, typer.Option("--output", "-o")] = OutputFormat.table,
) -> None:
    """List staged model copies (this machine's; a Slurm node's disk shows as n/a with the reason)."""
    records = StateStore().list_swarms()
    roots: dict[str, set[str]] = {}  # stage.to -> backends of the swarms that use it
    for rec in records:
        staging = _staging(rec)
        if staging:
            roots.setdefault(staging[0], set()).add(rec.backend)
    for extra in to or []:
        roots.setdefault(str(Path(extra).expanduser()), set()).update(VISIBLE_BACKENDS)  # a folder of this machine
    host = socket.gethostname()
    copies: list[dict[str, Any]] = []
    unavailable: list[dict[str, str]] = []
    for root, backends in sorted(roots.items()):
        for backend in sorted(backends - VISIBLE_BACKENDS):
            unavailable.append(
                {
                    "to": root,
                    "backend": backend,
                    "reason": f"on the {backend} nodes' local disks, not visible from {host}; on a node run "
                    f"`python -m prefect_swarm.sidecar.stage --list {root}`",
                }
            )
        if backends & VISIBLE_BACKENDS:
            for copy in staged_copies(Path(root)):
                copies.append({**copy, "node": host, "used_by": _users(records, Path(copy["path"]))})
    if output is OutputFormat.json:
        emit_json({"volumes": copies, "unavailable": unavailable})
        return
    if not copies and not unavailable:
        err_console.print("no staged copies (no swarm config has `stage:`; `--to DIR` looks in a folder).")
        return
    cols = ["path", "node", "source", "hash", "files", "bytes", "used_by"]
    rows = [[c["path"], c["node"], c.get("source"), str(c.get("hash", ""))[:12], c.get("files"), c.get("bytes"),
             ", ".join(c["used_by"]) or "-"] for c in copies]  # fmt: skip
    rows += [[u["to"], "n/a", u["reason"], "", "", "", ""] for u in unavailable]
    console.print(table(None, cols, rows))


@volumes_app.command("rm")
def rm_volume(
    path: Annotated[Path, typer.Argument(help="A staged folder (as `volumes list` shows it).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Remove a staged copy on this machine; refused while a live swarm stages to it."""
    path = path.expanduser().absolute()
    users = _users(StateStore().list_swarms(), path)
    if users:
        raise BackendError(
            f"{path} is the staged model of live swarm(s) {', '.join(users)}: their engines load it.",
            hint=f"take them down first (`prefect-swarm down {users[0]}`), then remove it.",
        )
    if read_marker(path) is None:
        raise ConfigError(f"{path} is not a staged copy (no marker file in it): nothing removed.")
    confirm(f"Remove staged copy {path}?", yes)
    with file_lock(lock_path(path)):  # not while a stager is checking or copying it
        shutil.rmtree(path)
    lock_path(path).unlink(missing_ok=True)
    console.print(f"removed {path}")
