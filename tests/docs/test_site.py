"""The docs site builds in strict mode: every page in the nav, every link, every snippet and every
API reference entry resolves (a warning fails the build)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    site = tmp_path / "site"
    blocks = (site / "blocks" / "index.html").read_text()
    assert "from_config" in blocks and "load_config" in blocks  # the example's code, included from examples/
    reference = (site / "reference" / "flows" / "index.html").read_text()
    assert "batch_inference" in reference and "hold_swarm" in (site / "reference" / "tasks" / "index.html").read_text()


def test_the_site_is_the_manual(tmp_path: Path) -> None:
    """Every page of the path from nothing to a scheduled deployment is built, and no docstring shows a
    raw Sphinx role (``:func:`` before a code span): the hook renders each as the code it names."""
    import re

    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    argv = [str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")]
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    site = tmp_path / "site"
    pages = [
        "getting-started/install", "getting-started/concepts", "getting-started/local", "getting-started/deployment",
        "tutorials/slurm", "tutorials/lepton", "tutorials/external", "jobs", "pipeline", "prefect", "prefect/deploy",
        "prefect/events", "prefect/work-pools", "cost", "operations", "cli", "reference/cli",
        "reference/config-fields", "benchmarks",
    ]  # fmt: skip
    missing = [p for p in pages if not (site / p / "index.html").is_file()]
    assert not missing, missing
    raw = {
        str(f.relative_to(site)): m
        for f in site.rglob("*.html")
        if (m := re.findall(r":(?:func|class|mod|meth|attr|data|exc|obj):<code>", f.read_text()))
    }
    assert not raw, raw
    assert "name: local-stub" in re.sub(r"<[^>]+>", "", (site / "getting-started" / "local" / "index.html").read_text())
    assert "Slurm LB" in (site / "benchmarks" / "index.html").read_text()  # BENCHMARKS.md, included


def test_the_readme_is_the_front_door() -> None:
    """At most 10 KB, the two set-up commands as they always were, links into the site."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 10 * 1024, len(readme.encode())
    setup = (
        "```bash\n"
        "make demo   # the main job: batch_inference on the local backend with real vLLM replicas, end to end\n"
        "make test   # the tests: installs and starts what they need (venv, vLLM CPU build, Slurm, nginx), then runs "
        "them all\n```"
    )
    assert setup in readme
    for page in ("docs/getting-started/install.md", "docs/getting-started/deployment.md", "docs/reference/cli.md"):
        assert f"]({page})" in readme and (REPO / page).is_file(), page
