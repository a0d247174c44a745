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
set -euo pipefail
BIN="$1"
"$BIN/pip" install -q --no-warn-conflicts -e '.[dev,lepton]'
"$BIN/pip" install -q --no-deps 'leptonai==0.47.1'
