#!/usr/bin/env bash
# Install prefect-swarm (editable) with its dev and lepton extras into the venv whose bin/ is $1.
# leptonai is installed without its dependency tree (which pulls ray, ~400 MB, for a CLI we never
# use, and pins an old httpx); the few modules the SDK imports come from our own deps.
set -euo pipefail
BIN="$1"
"$BIN/pip" install -q -e '.[dev]'
"$BIN/pip" install -q --no-deps 'leptonai==0.47.1'
"$BIN/pip" install -q loguru contextlib2 requests
