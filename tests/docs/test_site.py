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
