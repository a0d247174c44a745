"""``scripts/measures.py`` counts what CONTRIBUTING.md quotes: its circle finder finds a planted circle and
the lazy import that hides it, and the table of backends (with the config layer) is in no circle. No test
patches the product: a fault is injected through a constructor argument or a setting, which the
product declares, never by ``monkeypatch.setattr`` on a prefect_swarm module, class or object."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measures.py"


def _measures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("measures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["measures"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_planted_circle_and_its_lazy_import_are_found() -> None:
    m = _measures()
    edges = [m.Import("a", "b", False, 1), m.Import("b", "c", False, 1), m.Import("c", "a", True, 9)]
    edges.append(m.Import("c", "d", False, 2))
    groups = m.circles(edges)
    assert groups == [["a", "b", "c"]]
    assert m.lazy_breaks(edges, groups) == [m.Import("c", "a", True, 9)]


def test_the_table_of_backends_and_the_config_layer_are_in_no_circle() -> None:
    m = _measures()
    edges = m.imports()
    assert m.Import("prefect_swarm.config.swarm", "prefect_swarm.backends.registry", False, 13) in edges
    caught = [
        g for g in m.circles(edges) if any(x.startswith(("prefect_swarm.backends", "prefect_swarm.config")) for x in g)
    ]
    assert caught == []


def test_no_test_patches_a_module_class_or_object_of_the_product() -> None:
    patched = _measures().patched_globals()["patched_product"]
    assert patched == [], (
        f"monkeypatch.setattr on prefect_swarm: {patched}. Inject the fault through the object's constructor "
        "(a keyword argument whose default is today's constant or collaborator), a setting of "
        "prefect_swarm.settings.Settings a user could want, or a fake in prefect_swarm.testing; or assert on "
        "what the product writes (a counter, a log line, a state row) instead of spying on a call."
    )


PLANTED = """
import os
import pyarrow.parquet as pq
from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.checkpoint.ledger import ShardLedger
import prefect_swarm.jobs.rows.output as output

def test_x(monkeypatch, tmp_path):
    from prefect_swarm import launch
    led = make()
    monkeypatch.setattr(storage, "MIN_PART_BYTES", 1)
    monkeypatch.setattr(storage.S3Upload, "_send", None)
    monkeypatch.setattr(ShardLedger, "_replay", None)
    monkeypatch.setattr(output, "PART_BYTES", 1)
    monkeypatch.setattr(launch, "plan_job", None)
    monkeypatch.setattr(led.store, "delete", None)
    monkeypatch.setattr("prefect_swarm.paths.private_dir", None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os.path, "lexists", None)
    monkeypatch.setattr(pq, "read_metadata", None)
    monkeypatch.setattr(__name__ + ".PACKAGE", tmp_path)
    monkeypatch.setenv("PREFECT_SWARM_PROGRESS_EVERY_S", "1")
"""


def test_the_patch_finder_tells_the_product_from_libraries_and_the_tests_own() -> None:
    found = _measures().setattr_patches(PLANTED)
    assert [(t, w) for _, t, w in found] == [
        ("storage", "product"),
        ("storage.S3Upload", "product"),
        ("ShardLedger", "product"),
        ("output", "product"),
        ("launch", "product"),  # imported inside the test
        ("led.store", "product"),  # an object the file does not import: the product's, as far as it can tell
        ("'prefect_swarm.paths.private_dir'", "product"),
        ("os.path", "library"),
        ("pq", "library"),
        ("__name__ + '.PACKAGE'", "own"),
    ]
