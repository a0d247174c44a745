"""``prefect-swarm``: bring a swarm of LLM replicas up, look at it, run jobs on it, take it down.

Commands::

    prefect-swarm up -c FILE [--replicas N] [--name NAME] [--no-wait] [--keep]
    prefect-swarm scale NAME --replicas N
    prefect-swarm status NAME [-o table|json]
    prefect-swarm list [-o table|json]
    prefect-swarm describe NAME [-o table|json]
    prefect-swarm down NAME | --all [-y]
    prefect-swarm top NAME [--once] [-o table|json]
    prefect-swarm validate -c FILE [-o table|json] [--estimate K --input IN]   (a pilot: time and cost)
    prefect-swarm exec NAME [--replica i] -- CMD ...
    prefect-swarm sleep NAME [--replica i] [--level 1|2] | wake NAME [--replica i]   (engine.sleep_mode)
    prefect-swarm db prune [-y] [--dry-run]
    prefect-swarm job ...            (batch jobs; see `prefect-swarm job --help`)
    prefect-swarm history [NAME]
    prefect-swarm automations install [--within 90]
    prefect-swarm volumes list|rm PATH   (model copies staged on node-local disk)
    prefect-swarm cache info|clear       (the response cache across jobs)
    prefect-swarm version

Config precedence, lowest first: built-in defaults < ``$PREFECT_SWARM_HOME/defaults.yaml`` <
``-c FILE`` < ``PREFECT_SWARM_*`` environment variables < command-line flags.

Results go to stdout (``-o json`` prints one JSON document with a top-level ``schema_version``);
logs, progress and errors go to stderr. An error raised on purpose prints as one message without
a traceback unless ``--debug`` is given.

Exit codes:

    0  ok
    1  runtime or backend failure (scheduler, API, process), or a declined confirmation
    2  bad input: invalid config or argument (ConfigError, usage errors)
    3  not found: no such swarm or job in the state database (StateError)
    4  not ready: the swarm did not become ready (ReadinessError), or no capacity (CapacityError)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

from prefect_swarm.cli import db, swarms, top, validate, version, views
from prefect_swarm.cli.automations import automations_app
from prefect_swarm.cli.cache import cache_app
from prefect_swarm.cli.errors import EXIT_CODES_HELP, SwarmGroup
from prefect_swarm.cli.exec import exec_cmd
from prefect_swarm.cli.history import history_cmd
from prefect_swarm.cli.job import job_app
from prefect_swarm.cli.logs import logs_cmd
from prefect_swarm.cli.output import setup_logging
from prefect_swarm.cli.serve import serve_app
from prefect_swarm.cli.sleep import sleep_cmd, wake_cmd
from prefect_swarm.cli.volumes import volumes_app
from prefect_swarm.paths import private_umask
from prefect_swarm.settings import get_settings

log = logging.getLogger("prefect_swarm.cli")

app = typer.Typer(
    cls=SwarmGroup,
    name="prefect-swarm",
    help="Bring up a swarm of LLM replicas behind one endpoint, run batch jobs on it, tear it down. "
    "Config precedence, lowest first: built-in defaults < $PREFECT_SWARM_HOME/defaults.yaml < -c FILE "
    "< PREFECT_SWARM_* environment < command-line flags.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def main(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
    log_level: Annotated[
        str | None, typer.Option("--log-level", help="Log level (default: PREFECT_SWARM_LOG_LEVEL or INFO).")
    ] = None,
    _version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=version.print_version_and_exit, help="Print versions, exit."),
    ] = False,
) -> None:
    """Global options."""
    ctx.obj = {"debug": debug}
    setup_logging("DEBUG" if debug else (log_level or get_settings().log_level))


app.command("up", epilog=EXIT_CODES_HELP)(swarms.up)
app.command("scale", epilog=EXIT_CODES_HELP)(swarms.scale)
app.command("status", epilog=EXIT_CODES_HELP)(swarms.status)
app.command("list", epilog=EXIT_CODES_HELP)(swarms.list_swarms)
app.command("describe", epilog=EXIT_CODES_HELP)(swarms.describe)
app.command("park", epilog=EXIT_CODES_HELP)(swarms.park)
app.command("restore", epilog=EXIT_CODES_HELP)(swarms.restore)
app.command("down", epilog=EXIT_CODES_HELP)(swarms.down)
app.command("top", epilog=EXIT_CODES_HELP)(top.top)
app.command("validate", epilog=EXIT_CODES_HELP)(validate.validate)
app.command("exec", epilog=EXIT_CODES_HELP)(exec_cmd)
app.command("logs", epilog=EXIT_CODES_HELP)(logs_cmd)
app.command("sleep", epilog=EXIT_CODES_HELP)(sleep_cmd)
app.command("wake", epilog=EXIT_CODES_HELP)(wake_cmd)
app.add_typer(db.db_app, name="db")


app.command("version")(version.version)
app.add_typer(job_app, name="job")
app.command("history", epilog=EXIT_CODES_HELP)(history_cmd)
app.add_typer(automations_app, name="automations")
app.add_typer(volumes_app, name="volumes")
app.add_typer(cache_app, name="cache")
app.add_typer(serve_app, name="serve")


def run() -> None:
    """The ``prefect-swarm`` console script: :data:`app`, with an exit that survives an abandoned lookup.

    When a Prefect API lookup timed out and its thread still runs, the interpreter's shutdown could
    abort the process after the command finished; the exit status and output are flushed and the
    process ends without that shutdown.
    """
    private_umask()
    try:
        app()
    except SystemExit as exc:
        if not views.lookup_abandoned():
            raise
        code = exc.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


if __name__ == "__main__":
    run()
