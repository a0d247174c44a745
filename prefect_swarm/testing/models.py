"""A model folder and an engine that insists on one, for tests of model paths (staging, checks).

``make_model_folder(root)`` writes a small folder shaped like a Hugging Face model;
``model_checking_engine(stub)`` wraps an engine command so it fails (exit 7) unless ``{model}``
is such a folder, and logs the path it was given, then runs ``stub``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path


def make_model_folder(root: Path, weights_mb: int = 1, *, tokenizer: bool = True, name: str = "tiny-model") -> Path:
    """``root/name``: config, a tokenizer (unless not ``tokenizer``) and a ``weights_mb`` MB
    weights file in a sub-folder."""
    model = root / name
    (model / "shards").mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "stub"}))
    if tokenizer:
        (model / "tokenizer.json").write_text("{}")
    (model / "shards" / "weights.bin").write_bytes(os.urandom(weights_mb << 20))
    return model


def model_checking_engine(stub: Sequence[str]) -> list[str]:
    """An ``engine.command`` that exits 7 unless ``{model}/config.json`` exists, logs
    ``engine model path: <path>`` to stderr, then execs ``stub``."""
    check = (
        'test -f "$1/config.json" || { echo "no model at $1" >&2; exit 7; }; '
        'echo "engine model path: $1" >&2; shift; exec "$@"'
    )
    return ["bash", "-c", check, "_", "{model}", *stub]
