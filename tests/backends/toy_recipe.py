"""CONTRIBUTING.md's "Adding a backend" recipe, applied to a copy of the package with the toy backend
(``toy/``): the test that builds it and ``scripts/measures.py`` (files touched to add a backend) share it."""

from __future__ import annotations

import shutil
from pathlib import Path

TOY = Path(__file__).with_name("toy")
"""The toy backend's folder: what ``prefect_swarm/backends/toy/`` holds once added."""

TEST = Path(__file__).with_name("test_toy_backend.py")
"""The toy backend's test: the one test file the recipe adds."""

_LISTED = ("from prefect_swarm.exceptions import ConfigError\n", "(LOCAL, SLURM, LEPTON, EXTERNAL)")
"""Where ``backends/registry.py`` lists the entries: its last backend import is followed by this line,
and the entries are this tuple."""


def copy_package(source: Path, to: Path) -> Path:
    """A copy of the package ``source`` under ``to`` (its bytecode left out); returns the copy's folder."""
    copy = to / source.name
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def add_toy(package: Path) -> list[Path]:
    """Add the toy backend to ``package`` (a copy) as the recipe says: its folder, and one entry in the
    table. Returns the files of the package that were added or changed."""
    folder = package / "backends" / "toy"
    folder.mkdir()
    added = []
    for source in sorted(TOY.glob("*.py")):
        shutil.copy(source, folder / source.name)
        added.append(folder / source.name)
    registry = package / "backends" / "registry.py"
    text = registry.read_text()
    imports, listed = _LISTED
    assert imports in text and listed in text, f"{registry} no longer lists its entries as the recipe says"
    text = text.replace(imports, "from prefect_swarm.backends.toy.config import ENTRY as TOY\n" + imports, 1)
    registry.write_text(text.replace(listed, listed[:-1] + ", TOY)", 1))
    return [*added, registry]


def files_touched(package: Path, scratch: Path) -> list[str]:
    """The files a new backend touches, by the recipe: those added or changed in a copy of ``package``, and
    its test (paths relative to the repository)."""
    copy = copy_package(package, scratch)
    touched = [str(Path(package.name) / p.relative_to(copy)) for p in add_toy(copy)]
    return [*touched, str(TEST.relative_to(TEST.parents[2]))]
