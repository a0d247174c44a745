"""Swarm commands: ``up``, ``scale``, ``status``, ``list``, ``describe``, ``park``, ``restore``, ``down``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from prefect_swarm.cli.output import OutputFormat, console, emit_json, err_console, table
from prefect_swarm.cli.views import cost_text, job_view, live_status, paths_view, prefect_history, record_view
from prefect_swarm.config import load_config
from prefect_swarm.exceptions import BackendError, ConfigError, PrefectSwarmError, StateError
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.swarm import Swarm

log = logging.getLogger("prefect_swarm.cli")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Swarm config YAML file.", show_default=False)]
ReplicasOpt = Annotated[
    int | None, typer.Option("--replicas", help="Override the number of replicas (highest precedence).")
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Override the swarm name (highest precedence).")]
OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="Output format.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
NoWaitOpt = Annotated[bool, typer.Option("--no-wait", help="Return once submitted; do not wait for readiness.")]
TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", help="Readiness timeout in seconds; default: ready_timeout_s.")
]


def make_swarm(cfg: SwarmConfig, **kwargs: Any) -> Swarm:
    """``Swarm(cfg)`` (starts nothing); a backend that cannot be imported is a BackendError with the fix."""
    from prefect_swarm.backends.registry import entry_of
    from prefect_swarm.swarm import Swarm

    if entry_of(cfg.backend).key_block(cfg.backend):  # the Prefect API: only then
        from prefect_swarm.blocks import with_secret_key

        cfg = with_secret_key(cfg)
    try:
        return Swarm(cfg, **kwargs)
    except ImportError as exc:
        raise BackendError(
            f"the {cfg.backend.type} backend cannot be loaded: {exc}",
            hint="install the backend's optional dependencies (the message above says how) or check the installation.",
        ) from exc


def up(
    config: ConfigOpt,
    replicas: ReplicasOpt = None,
    name: NameOpt = None,
    no_wait: NoWaitOpt = False,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="If bring-up fails, leave what started for inspection instead of tearing it "
            "down; the swarm is also marked keep (the orphan reaper leaves it alone).",
        ),
    ] = False,
    timeout: TimeoutOpt = None,
    output: OutputOpt = OutputFormat.table,
    adopt: Annotated[
        bool,
        typer.Option(
            "--adopt",
            help="Lepton: take over an endpoint of the swarm's name that this swarm did not make "
            "(backend.adopt); without it such a name is refused before any change.",
        ),
    ] = False,
) -> None:
    """Bring a swarm up and wait until every replica answers a chat completion.

    On a live swarm ``up`` reconciles: missing replicas are replaced and a new ``--replicas`` count is
    applied; healthy replicas keep running.
    """
    cfg = load_config(config, overrides={"replicas": replicas, "name": name})
    if adopt:
        if "adopt" not in type(cfg.backend).model_fields:
            raise ConfigError(f"--adopt: the {cfg.backend.type} backend has no objects of others to adopt.")
        cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"adopt": True})})
    bring_up(cfg, keep=keep, no_wait=no_wait, timeout=timeout, output=output)


def scale(
    name: Annotated[str, typer.Argument(help="Swarm name.")],
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="The number of replicas wanted.")],
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Change the replica count of a live swarm; running replicas keep running.

    The same as `up --replicas N` with the config the swarm was brought up with (so, like `up`, the
    swarm is then held until `down`).
    """
    from prefect_swarm.swarm import LIVE_PHASES

    store = StateStore()
    rec = store.require_swarm(name)
    if rec.phase not in LIVE_PHASES:
        raise StateError(f"swarm '{name}' is {rec.phase}: nothing to scale. `prefect-swarm up -c FILE` brings it up.")
    current = default_holding(store).attach(name).cfg
    cfg = type(current).model_validate({**current.model_dump(by_alias=True), "replicas": replicas})
    bring_up(cfg, keep=rec.keep, no_wait=no_wait, timeout=timeout, output=output)


def bring_up(cfg: SwarmConfig, *, keep: bool, no_wait: bool, timeout: float | None, output: OutputFormat) -> None:
    """``up`` of ``cfg``: bring it up, or reconcile the live swarm of its name with it; then show its status.

    Held until `down` (the KEEP hold); waits if a run is bringing it up. What this command started
    is torn down when it fails (unless ``keep``); a swarm it joined belongs to its users."""
    from prefect_swarm.state import keep_lease

    swarm = make_swarm(cfg, keep=keep, delete_on_exit=not keep)
    log.info("bringing up swarm '%s': %d x %s on %s", cfg.name, cfg.replicas, cfg.model_name, cfg.backend.type)
    if no_wait:
        default_holding(swarm.store).bring_up(swarm, keep_lease(cfg.name), reconcile=True, leave_on_failure=keep)
        log.info("submitted; `prefect-swarm status %s` shows its progress", cfg.name)
        show_status(cfg.name, output, history=False)
        return
    with err_console.status(f"waiting for {cfg.replicas} replica(s) of '{cfg.name}' to be ready..."):
        held = default_holding(swarm.store).bring_up(
            swarm, keep_lease(cfg.name), reconcile=True, wait=True, timeout_s=timeout, leave_on_failure=keep
        )
    show_status(cfg.name, output, history=False, live=held.ready.to_dict() if held.ready else None)


def status(
    name: Annotated[str, typer.Argument(help="Swarm name.")],
    output: OutputOpt = OutputFormat.table,
    history: Annotated[bool, typer.Option("--history/--no-history", help="Show Prefect run history.")] = True,
) -> None:
    """Show a swarm's record, its live status with each replica, and its Prefect runs."""
    show_status(name, output, history=history)


def show_status(name: str, output: OutputFormat, *, history: bool, live: dict[str, Any] | None = None) -> None:
    """Print the status document of swarm ``name`` (``live``: a status already in hand)."""
    store = StateStore()
    rec = store.require_swarm(name)
    doc: dict[str, Any] = {
        "swarm": record_view(rec),
        "status": live if live is not None else live_status(rec, store),
        "prefect": prefect_history(name) if history else {"available": False, "runs": [], "error": None},
    }
    if output is OutputFormat.json:
        emit_json(doc)
        return
    _print_status(doc)


def _print_status(doc: dict[str, Any]) -> None:
    sw, st = doc["swarm"], doc["status"]
    total = sw["replicas"] or len(st["replicas"])
    console.print(f"[bold]{sw['name']}[/]  {st['phase']}  ({sw['backend']}, model {sw['model']})")
    console.print(
        f"endpoint: {st.get('url') or '-'}   healthy replicas: "
        f"{st['healthy_replicas']}/{total}   recorded phase: {sw['phase']}"
    )
    if st.get("detail"):
        console.print(f"detail: {st['detail']}")
    if cost := cost_text(st.get("cost")):
        console.print(cost, markup=False)
    if st["replicas"]:
        rows = [
            (
                r["index"],
                r["health"],
                r.get("url"),
                r.get("restarts"),
                r.get("last_exit_code"),
                r.get("detail") or "",
            )
            for r in st["replicas"]
        ]
        console.print(table(None, ["#", "health", "url", "restarts", "last exit", "detail"], rows))
    _print_history(doc["prefect"])


def _print_history(prefect: dict[str, Any]) -> None:
    if prefect["error"]:
        console.print(f"Prefect runs: {prefect['error']}")
        return
    if not prefect["available"]:
        return
    runs = [r for r in prefect["runs"] if isinstance(r, dict)]
    if not runs:
        console.print("Prefect runs: none")
        return
    cols = {"flow_run_name": "name", "flow": "flow", "start": "start", "state": "state", "flow_run_id": "id"}
    # rows are history.runs_for_swarm's; a row keyed by the column label itself is shown as well
    rows = [[r.get(key, r.get(label)) for key, label in cols.items()] for r in runs]
    console.print(table("Prefect runs", list(cols.values()), rows))


def list_swarms(output: OutputOpt = OutputFormat.table) -> None:
    """List the swarms in the state database (recorded phases; `status` asks the backend)."""
    views = [record_view(r) for r in StateStore().list_swarms()]
    if output is OutputFormat.json:
        emit_json({"swarms": views})
        return
    if not views:
        err_console.print("no swarms recorded; `prefect-swarm up -c FILE` brings one up.")
        return
    cols = ["name", "backend", "phase", "replicas", "model", "endpoint", "created_at"]
    console.print(table(None, cols, [[v[c] for c in cols] for v in views]))


def describe(name: Annotated[str, typer.Argument(help="Swarm name.")], output: OutputOpt = OutputFormat.table) -> None:
    """Show a swarm's stored config (secrets removed), its files and its backend handle."""
    store = StateStore()
    rec = store.require_swarm(name)
    doc = {
        "swarm": record_view(rec),
        "config": rec.config,
        "paths": paths_view(rec),
        "handle": rec.handle,
        "jobs": [job_view(j) for j in store.list_jobs(swarm=name)],
    }
    if output is OutputFormat.json:
        emit_json(doc)
        return
    from rich.syntax import Syntax  # pygments: ~50 ms that every other command would pay

    for key in ("swarm", "config", "paths", "handle", "jobs"):
        console.print(f"[bold]{key}[/]")
        console.print(Syntax(yaml.safe_dump(doc[key], sort_keys=False).rstrip(), "yaml", background_color="default"))


def park(
    name: Annotated[str, typer.Argument(help="Swarm name.")],
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Give back every GPU of a live swarm and keep what a fast restore needs; it shows as PARKED.

    Slurm: its replica and LB jobs end; local: its engines stop. The swarm's folder (config, key,
    staged weights, the engine's caches) stays. Jobs on it pause, no row failed, and go on after
    `restore` (or after the next run that needs it restores it). Idempotent.
    """
    snap = default_holding(StateStore()).park(name, "parked by `prefect-swarm park`")
    log.info("swarm '%s' parked; `prefect-swarm restore %s` brings it back", name, name)
    if output is OutputFormat.json:
        emit_json({"name": name, "phase": ServingPhase.PARKED.value, "snapshot": snap.to_dict()})
        return
    show_status(name, output, history=False)


def restore(
    name: Annotated[str, typer.Argument(help="Swarm name.")],
    no_wait: NoWaitOpt = False,
    timeout: TimeoutOpt = None,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Bring a parked swarm back from its snapshot; its paused jobs go on.

    Replicas take their addresses again where the platform lets them (local: the same ports). A run
    or job that needs a parked swarm restores it too; however many ask at once, it is restored once.
    """
    with err_console.status(f"restoring swarm '{name}'..."):
        held = default_holding(StateStore()).restore(name, wait=not no_wait, timeout_s=timeout)
    log.info("swarm '%s' restored", name)
    show_status(name, output, history=False, live=held.ready.to_dict() if held.ready else None)


def down(
    name: Annotated[str | None, typer.Argument(help="Swarm name (or --all).", show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every swarm that is not already STOPPED.")] = False,
    yes: YesOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="Stop it even while flow runs or jobs hold a lease on it.")
    ] = False,
) -> None:
    """Stop a swarm (or all of them); idempotent. The record stays, phase STOPPED, until `db prune`.

    A swarm that a live flow run or job still holds (a lease) is not stopped unless --force: the
    message names the holders; the last of them stops it when it ends.
    """

    if (name is None) == (not all_):
        raise ConfigError("give either a swarm NAME or --all (not both). `prefect-swarm list` shows the swarms.")
    store = StateStore()
    if name is not None:
        names = [store.require_swarm(name).name]
    else:
        names = [r.name for r in store.list_swarms() if r.phase is not ServingPhase.STOPPED]
    if not names:
        err_console.print("no running swarms to stop.")
        return
    confirm(f"Stop swarm(s) {', '.join(names)}?", yes)
    failed: list[str] = []
    held: list[str] = []
    for one in names:
        try:
            if _stop(one, store, force):
                log.info("swarm '%s' stopped", one)
            else:
                held.append(one)
        except PrefectSwarmError as exc:
            if name is not None:
                raise
            log.error("could not stop '%s': %s", one, exc)
            failed.append(one)
    if failed:
        raise BackendError(
            f"could not stop {len(failed)} swarm(s): {', '.join(failed)}",
            hint="rerun `prefect-swarm down NAME --debug` for each to see why.",
        )
    if held:
        raise StateError(
            f"swarm(s) {', '.join(held)} still held by live users (see above); not stopped. "
            "The last of them stops it when it ends; `prefect-swarm down NAME -y --force` stops it now."
        )


def _stop(name: str, store: StateStore, force: bool) -> bool:
    """Release the KEEP hold of swarm ``name`` and stop it if no live holder is left (or ``force``);
    a stop under way by another command is waited for."""
    hold = default_holding(store)
    if force:
        hold.stop(name)
        return True
    left = hold.release_keep(name)
    for lease in left:
        log.warning("swarm '%s' is held by %s (%s lease)", name, lease.owner, lease.kind)
    return not left


def confirm(question: str, yes: bool) -> None:
    """Ask ``question`` on the terminal unless ``yes``; a refusal (or no terminal) exits 1."""
    if yes:
        return
    try:
        ok = typer.confirm(question, default=False, err=True)
    except typer.Abort:
        ok = False
    if not ok:
        err_console.print("Aborted: nothing changed. Pass -y to skip the question.")
        raise typer.Exit(1)
