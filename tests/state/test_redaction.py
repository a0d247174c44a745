"""The redaction rule for text prefect-swarm did not write (an engine's log): :mod:`prefect_swarm.redaction`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from prefect_swarm.redaction import MASK, redact, secret_values
from prefect_swarm.sidecar.watchdog import copy_redacted

CASES = [
    ("key sk-abc123456 given", ["sk-abc123456"], f"key {MASK} given"),
    ('1.2.3.4:5 "GET /v1/models?api_key=zz&b=2 HTTP/1.1" 200', [], f'1.2.3.4:5 "GET /v1/models?{MASK} HTTP/1.1" 200'),
    ('"POST /v1/chat/completions HTTP/1.1" 200', [], '"POST /v1/chat/completions HTTP/1.1" 200'),  # nothing to hide
    ("fetch https://user:s3cr3tpw@host:9/x", [], f"fetch https://{MASK}@host:9/x"),
    ("s3://AKIAXX:secret@bucket/key", [], f"s3://{MASK}@bucket/key"),
    ("Authorization: Bearer abc.def-123", [], f"Authorization: {MASK}"),
    ("{'authorization': 'Basic dXNlcjpwdw=='}", [], f"{{'authorization': '{MASK}'}}"),
    ("x-api-key=abcdef123", [], f"x-api-key={MASK}"),
    ("sending bearer tok-123456", [], f"sending bearer {MASK}"),
    ("short 1 stays", ["1"], "short 1 stays"),  # too short to mask by value
]


@pytest.mark.parametrize(("text", "secrets", "want"), CASES, ids=[c[0][:30] for c in CASES])
def test_redact(text: str, secrets: list[str], want: str) -> None:
    assert redact(text, secrets) == want


def test_secret_values_are_found_by_their_variable_names() -> None:
    env = {"PREFECT_SWARM_API_KEY": "k" * 20, "HF_TOKEN": "hf_" + "x" * 20, "AWS_SECRET_ACCESS_KEY": "s" * 30,
           "PATH": "/usr/bin:/bin", "VLLM_PORT": "8000", "RAY_AUTH_TOKEN": "t" * 64}  # fmt: skip
    assert sorted(secret_values(env)) == sorted([env["PREFECT_SWARM_API_KEY"], env["HF_TOKEN"],
                                                 env["AWS_SECRET_ACCESS_KEY"], env["RAY_AUTH_TOKEN"]])  # fmt: skip


class _Reads(io.RawIOBase):
    """A pipe whose reads return these pieces, one per read (as an engine's writes may arrive)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if not self.pieces:
            return 0
        piece = self.pieces.pop(0)
        buf[: len(piece)] = piece
        return len(piece)


def test_the_engine_log_copy_masks_a_secret_cut_between_two_reads(tmp_path: Path) -> None:
    """The watchdog's copy redacts whole lines only: a key split across two reads is still masked, and
    the last words of an engine that ended without a newline are kept (redacted)."""
    key = "sk-cut-in-two-0123456789"
    pieces = [b"INFO: start\nkey is " + key[:8].encode(), key[8:].encode() + b" ok\n", b"bye " + key.encode()]
    copy_redacted(io.BufferedReader(_Reads(pieces)), tmp_path / "replica-0.log", [key])
    assert (tmp_path / "replica-0.log").read_text() == f"INFO: start\nkey is {MASK} ok\nbye {MASK}"
    assert (tmp_path / "replica-0.log").stat().st_mode & 0o777 == 0o600
