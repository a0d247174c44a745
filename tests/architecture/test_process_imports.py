"""What a process of our own imports before it does anything.

Every `prefect-swarm` call, job process, watchdog, Slurm LB reconciler and batch-script helper pays
for its imports at each start (a swarm's `up` starts several, a job one per shard, the suite
hundreds), and on a cluster each import is read from a shared filesystem. Each entry point below
stays free of the libraries it does not use; a new top-level import that pulls one in fails here
(see CONTRIBUTING.md, "Where the time goes").
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = {"prefect", "pyarrow", "aiohttp", "httpx", "pydantic", "pydantic_settings", "yaml", "jinja2"}
SIDECAR = {"prefect", "pyarrow", "aiohttp", "httpx", "pydantic", "pydantic_settings", "yaml"}
"""A sidecar imports pydantic (the cost models) only when its swarm has a budget."""

NOT_IMPORTED = {
    "prefect_swarm.cli.main": {"prefect", "pyarrow", "aiohttp", "httpx", "jinja2", "pygments"},
    "prefect_swarm.launch": {"prefect", "aiohttp", "jinja2"},  # `job status`, `job list`, `job cancel`
    "prefect_swarm.jobs.run": {"prefect", "httpx", "pydantic_settings", "yaml", "jinja2", "typer"},
    "prefect_swarm.backends.slurm.lb": SIDECAR | {"jinja2"},
    "prefect_swarm.backends.slurm.members": SIDECAR,
    "prefect_swarm.sidecar.watchdog": SIDECAR | {"jinja2"},
    "prefect_swarm.sidecar.ports": HEAVY | {"psutil"},
    "prefect_swarm.testing.stub_engine": HEAVY,
}
"""Entry point -> top-level packages its import must not load."""


def _imported(module: str) -> set[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("module", sorted(NOT_IMPORTED))
def test_an_entry_point_imports_only_what_it_uses(module: str) -> None:
    loaded = _imported(module) & NOT_IMPORTED[module]
    assert not loaded, f"`import {module}` loads {sorted(loaded)}: import them where they are used"


def test_a_package_loads_its_names_on_first_use() -> None:
    """``from prefect_swarm.config import SwarmConfig`` still works; the loader's YAML comes with it only then."""
    code = (
        "import sys, prefect_swarm.config as c; before = 'yaml' in sys.modules; c.load_config; "
        "from prefect_swarm.interfaces import JobStatus; from prefect_swarm.jobs import JobSpec; "
        "print(before, 'yaml' in sys.modules, JobStatus.__name__, JobSpec.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True", "JobStatus", "JobSpec"]
    with pytest.raises(AttributeError, match=r"prefect_swarm\.config' has no attribute 'Nope'"):
        import prefect_swarm.config

        prefect_swarm.config.Nope  # noqa: B018


def test_a_flow_run_builds_only_the_flows_of_its_entrypoint() -> None:
    """A deployment's entrypoint (``prefect_swarm.flows.batch:batch_inference``) imports its module, not
    every flow of the package (each module's flows build their parameter schemas at import); the
    package's names still load on first use."""
    code = (
        "import sys, prefect_swarm.flows.batch; flows = lambda: sorted(m for m in sys.modules if "
        "m.startswith('prefect_swarm.flows.')); print(flows()); from prefect_swarm.flows import pipeline; "
        "print(flows(), pipeline.name)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    first, then = out.stdout.splitlines()
    assert "pipeline" not in first and "flows.swarm'" not in first, first
    assert "'prefect_swarm.flows.pipeline'" in then and then.endswith(" pipeline"), then


def test_the_flows_name_pipeline_is_the_flow_whatever_was_imported_before() -> None:
    """``from prefect_swarm.flows import pipeline`` gives the flow even after its module was imported
    (a deployment's entrypoint, ``from prefect_swarm.flows.pipeline import Stage``)."""
    code = (
        "import prefect_swarm.flows.pipeline; from prefect_swarm.flows.pipeline import Stage; "
        "from prefect_swarm.flows import pipeline; import importlib; "
        "m = importlib.import_module('prefect_swarm.flows.pipeline'); print(pipeline.name, m.Stage is Stage)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["pipeline", "True"], out.stdout
