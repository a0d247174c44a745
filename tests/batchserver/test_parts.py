"""The batch service's parts without a server: its config, its store's keys and tenant scoping, the
file checks, the output split, and the keys commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_kit import chat_line, jsonl
from typer.testing import CliRunner

from prefect_swarm.batchserver.app import _filename
from prefect_swarm.batchserver.config import load_service
from prefect_swarm.batchserver.output import split_lines, stopped_lines
from prefect_swarm.batchserver.runner import fair_order
from prefect_swarm.batchserver.store import BatchRow, FileRow, ServiceStore
from prefect_swarm.batchserver.validate import MAX_ERRORS, check_input
from prefect_swarm.cli.main import app
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.testing.stub_engine import stub_swarm_config


def test_config_refuses_a_swarm_serving_another_model() -> None:
    with pytest.raises(ConfigError, match=r"model 'gpt-x' is served by swarm 's' as 'stub-model'.*served_model_name"):
        load_service(data={"models": {"gpt-x": stub_swarm_config("s")}})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"job": {"output": "x.jsonl"}}, r"job fields \['output'\] are set by the service"),
        ({"job": {"checkpoint_seconds": -1}}, "checkpoint_seconds"),
        ({"max_request": 5}, "max_request"),
    ],
)
def test_config_refuses_bad_fields(fields: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_service(data={"models": {}, **fields})


def test_keys_are_stored_hashed_and_tenants_scoped(swarm_home: Path) -> None:
    store = ServiceStore()
    key = store.create_key("alice")
    assert key.startswith("sk-batch-") and store.tenant_of(key) == "alice" and store.tenant_of(key + "x") is None
    assert key.encode() not in store.paths.db.read_bytes()
    store.add_file(FileRow("file-1", "alice", "a.jsonl", "batch", 3, 1, 0))
    assert store.get_file("alice", "file-1") is not None and store.get_file("bob", "file-1") is None
    assert not store.delete_file("bob", "file-1") and store.get_file("alice", "file-1") is not None
    assert store.revoke_keys("alice") == 1 and store.tenant_of(key) is None


def test_keys_commands(swarm_home: Path) -> None:
    made = CliRunner().invoke(app, ["serve", "keys", "create", "alice"])
    assert made.exit_code == 0
    key = made.stdout.strip().splitlines()[-1]
    listed = CliRunner().invoke(app, ["serve", "keys", "list", "-o", "json"])
    assert listed.exit_code == 0 and key not in listed.stdout
    assert [k["tenant"] for k in json.loads(listed.stdout)["keys"]] == ["alice"]
    assert CliRunner().invoke(app, ["serve", "keys", "revoke", "alice"]).exit_code == 0
    assert ServiceStore().tenant_of(key) is None


def test_check_lists_at_most_max_errors_and_counts_every_line(tmp_path: Path) -> None:
    src = jsonl(tmp_path / "in.jsonl", ["{nope"] * (MAX_ERRORS + 5) + [chat_line("a")] * 3)
    got = check_input(src, "/v1/chat/completions", {"stub-model"}, max_requests=50)
    assert got.total == MAX_ERRORS + 8 and len(got.errors) == MAX_ERRORS
    assert got.errors[0] == {
        "code": "invalid_json_line",
        "message": "This line is not parseable as valid JSON.",
        "param": None,
        "line": 1,
    }


def test_a_batch_stopped_before_its_job_has_every_line_as_an_error(tmp_path: Path) -> None:
    src = jsonl(tmp_path / "in.jsonl", [chat_line(f"c{i}") for i in range(3)])
    lines = stopped_lines(None, src, "batch_expired", "The window passed.")
    split = split_lines(lines, tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert (split.completed, split.failed) == (0, 3) and not (tmp_path / "out.jsonl").exists()
    err = [json.loads(x) for x in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in err] == ["c0", "c1", "c2"]
    assert all(x["response"] is None and x["error"]["code"] == "batch_expired" for x in err)


@pytest.mark.parametrize(
    ("given", "kept"),
    [("../../etc/passwd", "passwd"), ("C:\\x\\in.jsonl", "in.jsonl"), (None, "upload.jsonl"), ("a\nb", "ab")],
)
def test_an_upload_name_is_a_label_never_a_path(given: str | None, kept: str) -> None:
    assert _filename(given) == kept


def _row(seq: int, tenant: str, status: str = "validating", model: str = "m") -> BatchRow:
    return BatchRow(f"b{seq}", tenant, status, model, None, False, False, 0, None, {"status": status})


def test_queued_batches_start_in_fair_order_between_tenants() -> None:
    rows = [_row(1, "a", "in_progress"), _row(2, "a"), _row(3, "a"), _row(4, "b"), _row(5, "c"), _row(6, "b")]
    now, waiting = fair_order(rows, cap=None)
    assert [r.id for r in now] == ["b1", "b4", "b5", "b2", "b6", "b3"]  # a runs one: b and c go first
    assert waiting == []
    now, waiting = fair_order(rows, cap=3)
    assert [r.id for r in now] == ["b1", "b4", "b5"] and sorted(r.id for r in waiting) == ["b2", "b3", "b6"]
    other = [_row(7, "a", model="n")]  # another model's swarm has its own cap
    assert [r.id for r in fair_order(rows + other, cap=3)[0]] == ["b1", "b4", "b5", "b7"]


def test_with_none_running_the_tenant_that_started_least_recently_goes_first() -> None:
    rows = [_row(2, "a"), _row(3, "a"), _row(4, "b")]  # a's first batch has ended; b has not started one
    now, _ = fair_order(rows, cap=1, last_start={("m", "a"): 10.0})
    assert [r.id for r in now] == ["b4"]
    now, _ = fair_order(rows, cap=1, last_start={("m", "a"): 10.0, ("m", "b"): 20.0})
    assert [r.id for r in now] == ["b2"]
