"""Secrets in every place a user may put one x every command that prints a config or a job: none of
them is echoed on stdout or stderr, or kept in a log, the state database, a job file or a swarm file
(the swarm's own ``swarm.key``, 0600, is the one file meant to hold its key).

Placements: a swarm's ``api_key`` (a live local swarm on the stub engine, through up, status,
describe, list, a job, its status, the engine's log and down), a Lepton ``token``, a key pasted into
``api_key_env`` or ``token_env``, credentials in an external URL, S3 keys in a job's input URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from prefect_swarm.testing.stub_engine import stub_swarm_config

API_KEY = "sk-corpus-swarm-key-5d1e77a0"
TOKEN = "lp-corpus-token-c0ffee11"
PASTED = "sk-live-pasted-9a8b7c6d"
URL_PW = "s3cr3t-url-pw-4242"
AWS_SECRET = "aws-corpus-secret-31337xyz"
SECRETS = (API_KEY, TOKEN, PASTED, URL_PW, AWS_SECRET)


def _cli(*args: str, env: dict[str, str] | None = None) -> str:
    """``prefect-swarm ARGS``: what it printed (stdout + stderr), whatever its exit code."""
    out = subprocess.run(
        [sys.executable, "-m", "prefect_swarm.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "PREFECT_API_URL": "", **(env or {})},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    return (
        f"$ prefect-swarm {args[0]} ... -> {out.returncode}\n{out.stdout}{out.stderr}"  # (not the argv: it holds some)
    )


def _kept(root: Path, *, but: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Files under ``root`` holding a secret (bytes, so SQLite pages and WAL frames count): {file: secrets}."""
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file() and path.name not in but:
            data = path.read_bytes()
            hits = [s for s in SECRETS if s.encode() in data]
            if hits:
                found[str(path.relative_to(root))] = hits
    return found


def make_dataset(path: Path, n: int) -> Path:
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [f"question {i}" for i in range(n)]}), path)
    return path


def _write(path: Path, cfg: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_live_swarms_key_is_never_echoed_or_kept(tmp_path: Path, swarm_home: Path) -> None:
    name = "corpus-key"
    config = _write(tmp_path / "swarm.yaml", {**stub_swarm_config(name), "api_key": API_KEY})
    data, out = make_dataset(tmp_path / "in.parquet", 8), tmp_path / "out.parquet"
    said = [
        _cli("validate", "-c", config),
        _cli("up", "-c", config),
        _cli("status", name, "--no-history"),
        _cli("status", name, "-o", "json", "--no-history"),
        _cli("describe", name),
        _cli("list"),
    ]
    job = ("--input", str(data), "--output", str(out), "--id-column", "id")
    said += [
        _cli(
            "job", "submit", "-n", name, *job, "--id", "corpus-job", "--job-kwargs", '{"sampling": {"max_tokens": 4}}'
        ),
        _cli("job", "status", "corpus-job"),
        _cli("job", "list"),
        _cli("logs", name),
        _cli("down", name, "-y"),
        _cli("describe", name),
    ]
    text = "\n".join(said)
    assert "-> 0" in said[1] and "-> 0" in said[6], text  # up and the job ran: the words above are real ones
    assert [s for s in SECRETS if s in text] == [], text
    assert _kept(swarm_home, but=("swarm.key",)) == {}
    assert _kept(tmp_path, but=("swarm.yaml",)) == {}  # the job's folder, its output


@pytest.mark.parametrize(
    ("placement", "cfg"),
    [
        ("lepton token", {"backend": {"type": "lepton", "workspace_id": "ws1", "token": TOKEN}}),
        (
            "key pasted into api_key_env",
            {"backend": {"type": "external", "url": "http://127.0.0.1:9/v1", "api_key_env": PASTED}},
        ),
        ("key pasted into token_env", {"backend": {"type": "lepton", "workspace_id": "ws1", "token_env": PASTED}}),
        ("external URL user-info", {"backend": {"type": "external", "url": f"http://user:{URL_PW}@127.0.0.1:9/v1"}}),
    ],
)
def test_a_secret_in_a_config_is_never_echoed_or_kept(
    tmp_path: Path, swarm_home: Path, placement: str, cfg: dict[str, Any]
) -> None:
    config = _write(tmp_path / "swarm.yaml", {"name": "corpus-cfg", "model": "m", "replicas": 1, **cfg})
    said = "\n".join(
        [
            _cli("validate", "-c", config),
            _cli("validate", "-c", config, "-o", "json"),
            _cli("up", "-c", config),
            _cli("describe", "corpus-cfg"),
            _cli("status", "corpus-cfg", "--no-history"),
            _cli("down", "corpus-cfg", "-y"),
        ]
    )
    assert [s for s in SECRETS if s in said] == [], said
    assert _kept(swarm_home) == {}


def test_s3_keys_in_a_job_url_are_refused_without_being_echoed(tmp_path: Path, swarm_home: Path) -> None:
    name = "corpus-s3"
    config = _write(tmp_path / "swarm.yaml", stub_swarm_config(name))
    assert "-> 0" in _cli("up", "-c", config)
    try:
        src = f"s3://AKIAEXAMPLE:{AWS_SECRET}@bucket/in.parquet"
        spec = {"input": src, "output": str(tmp_path / "out.parquet"), "id_column": "id"}
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        said = "\n".join(
            [
                _cli("job", "submit", "-n", name, "--input", src, "--output", str(tmp_path / "o.parquet")),
                _cli("job", "submit", "-n", name, "--spec", str(tmp_path / "spec.json")),
                _cli("validate", "-c", config, "--input", src, "--estimate", "5"),
            ]
        )
    finally:
        _cli("down", name, "-y")
    assert said.count("-> 2") == 3, said  # refused, naming the field
    assert AWS_SECRET not in said, said
    assert _kept(swarm_home) == {}
