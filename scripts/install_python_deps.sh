#!/usr/bin/env bash
# Install prefect-swarm (editable) with its dev and lepton extras, plus the leptonai SDK, into the
# venv whose bin/ is $1. This is the supported route for the Lepton backend (README, CONTRIBUTING):
#
#   pip install 'prefect-swarm[lepton]' && pip install --no-deps 'leptonai==0.47.1'
#
# leptonai is installed without its dependency tree: that tree pulls ray (~900 MB, for a CLI
# command we never use) and pins httpx==0.27.2 / anyio<=4.9 below what Prefect runs with. The
# `lepton` extra lists what the SDK calls we make need at run time; they go through `requests` and
# work with Prefect's httpx/anyio (tests/lepton prove it). `pip check` lists leptonai's unmet pins;
# that is expected.
#
# The venv is filled by uv (installed into it from PyPI first): the same packages and versions pip
# resolves, in about 30 s and 12 CPU-seconds on a 2-core machine instead of about 2 minutes.
set -euo pipefail
BIN="$1"
export UV_LINK_MODE=copy  # the uv cache and the venv may sit on different filesystems
"$BIN/pip" install -q uv
"$BIN/uv" pip install --python "$BIN/python" -q -e '.[dev,lepton]'
"$BIN/uv" pip install --python "$BIN/python" -q --no-deps 'leptonai==0.47.1'
