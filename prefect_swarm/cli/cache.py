"""``prefect-swarm cache``: the response cache across jobs (see :mod:`prefect_swarm.jobs.dispatch.cache`).

    prefect-swarm cache info [-o json]
    prefect-swarm cache clear [--fingerprint FP] [-y]

The cache is used by jobs with ``--cache`` (or every job when ``PREFECT_SWARM_CACHE`` is on); its
folder is ``PREFECT_SWARM_CACHE_DIR`` (default ``$PREFECT_SWARM_HOME/cache``) and its size bound
``PREFECT_SWARM_CACHE_MAX_GB``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from prefect_swarm.cli.output import OutputFormat, console, emit_json, iso, table
from prefect_swarm.cli.swarms import OutputOpt, YesOpt, confirm
from prefect_swarm.settings import get_settings

cache_app = typer.Typer(
    help="The response cache across jobs (PREFECT_SWARM_CACHE_DIR, default $PREFECT_SWARM_HOME/cache).",
    no_args_is_help=True,
)


@cache_app.command("info")
def info(output: OutputOpt = OutputFormat.table) -> None:
    """What the cache holds: answers, bytes, hits, per engine fingerprint, and its size bound."""
    settings = get_settings()
    from prefect_swarm.jobs.dispatch.cache import cache_info  # pyarrow: only for this command

    doc = {**cache_info(settings.cache_folder), "max_bytes": int(settings.cache_max_gb * 1e9)}
    doc["default_on"] = settings.cache
    if output is OutputFormat.json:
        emit_json(doc)
        return
    console.print(
        f"response cache {doc['path']}: {doc['entries']} answer(s), {doc['bytes']} bytes of {doc['max_bytes']} "
        f"at most, {doc['hits']} hit(s); used by every job: {'yes' if doc['default_on'] else 'no (--cache)'}"
    )
    if doc["fingerprints"]:
        rows = [
            [f["fingerprint"], f["entries"], f["body_bytes"], f["hits"], iso(f["last_used"])]
            for f in doc["fingerprints"]
        ]
        console.print(table(None, ["engine fingerprint", "answers", "bytes", "hits", "last used"], rows))


@cache_app.command("clear")
def clear(
    fingerprint: Annotated[
        str | None,
        typer.Option("--fingerprint", help="Only the answers of this engine fingerprint (`cache info` lists them)."),
    ] = None,
    yes: YesOpt = False,
) -> None:
    """Drop the cached answers (all, or one engine's); jobs running meanwhile see misses from then on."""
    folder = get_settings().cache_folder
    what = f"engine {fingerprint}'s answers" if fingerprint else "every answer"
    confirm(f"Drop {what} from the response cache {folder}?", yes)
    from prefect_swarm.jobs.dispatch.cache import cache_clear

    dropped = cache_clear(folder, fingerprint)
    console.print(f"dropped {dropped} answer(s) from the response cache {folder}")
