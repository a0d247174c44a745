#!/usr/bin/env bash
# Fill the venv whose bin/ is $1 from the lock: exactly the versions and hashes of
# requirements/lock.txt (runtime + dev and lepton extras), the leptonai SDK of
# requirements/leptonai.txt without its dependency tree, then prefect-swarm itself (editable).
# A package the lock does not list is removed (uv pip sync), so the venv never drifts.
#
# leptonai is installed without its tree: that tree pulls ray (~900 MB, for a CLI command we never
# use) and pins httpx==0.27.2 / anyio<=4.9 below what Prefect runs with. The `lepton` extra lists
# what the SDK calls we make need at run time; they go through `requests` and work with Prefect's
# httpx/anyio (tests/lepton prove it). `pip check` lists leptonai's unmet pins; that is expected.
#
# uv does the work (about 30 s and 12 CPU-seconds on a 2-core machine, against about 2 minutes for
# pip); it is bootstrapped with pip at the version and hashes the lock gives it.
set -euo pipefail
BIN="$1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$HERE/requirements/lock.txt"
export UV_LINK_MODE=copy  # the uv cache and the venv may sit on different filesystems
uv_pin="$(mktemp)"; trap 'rm -f "$uv_pin"' EXIT
awk '/^uv==/{on=1; print; next} on && /^ /{print; next} {on=0}' "$LOCK" > "$uv_pin"
[[ -s "$uv_pin" ]] || { echo "requirements/lock.txt pins no uv: run 'make lock'" >&2; exit 1; }
"$BIN/pip" install -q --require-hashes --no-deps -r "$uv_pin"
"$BIN/uv" pip sync --python "$BIN/python" -q --require-hashes "$LOCK"
"$BIN/uv" pip install --python "$BIN/python" -q --require-hashes --no-deps -r "$HERE/requirements/leptonai.txt"
"$BIN/uv" pip install --python "$BIN/python" -q --no-deps -e "$HERE"
