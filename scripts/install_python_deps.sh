#!/usr/bin/env bash
# Install prefect-swarm (editable) with its dev extra, plus the leptonai SDK, into the venv whose
# bin/ is $1.
#
# leptonai is installed without its dependency tree: that tree pulls ray (~400 MB, for a CLI
# command we never use) and pins httpx==0.27.2 / anyio<=4.9 below what Prefect runs with. The SDK
# calls we make go through `requests` and work with Prefect's httpx/anyio (tests/lepton prove it),
# so `pip check` lists leptonai's unmet pins; that is expected.
set -euo pipefail
BIN="$1"
"$BIN/pip" install -q -e '.[dev]'
"$BIN/pip" install -q --no-deps 'leptonai==0.47.1'
"$BIN/pip" install -q --no-warn-conflicts contextlib2 loguru requests click rich fastapi exceptiongroup typing-extensions
