#!/usr/bin/env bash
# `make test-latest`: the newest releases pyproject.toml's ranges allow today, in a throwaway venv
# (.venv-latest), against the fast tier of the tests plus one smoke test per real component (the
# `smoke` marker: Prefect server + worker, S3 on moto, a vLLM CPU job, a Slurm job). A break seen
# here is answered with a decision - fix, bound (with a comment naming the break), or pin - and
# `make lock` then takes the newest releases into the lock that `make test` runs.
#
#   UNIT_MARKS   the fast tier's marker expression (the Makefile passes the one `make unit` runs)
#   PYTEST_ARGS  extra pytest arguments (default: -n 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-latest
: "${UNIT_MARKS:?set by the Makefile}"
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; return "${PIPESTATUS[0]}"; }
rm -rf "$VENV"
python3 -m venv "$VENV"
quiet "$VENV/bin/pip" install -q uv
# --refresh: ask the index again for every package instead of the cache's view of it.
quiet "$VENV/bin/uv" pip install --python "$VENV/bin/python" -q --refresh --upgrade -e '.[dev,lepton]'
quiet "$VENV/bin/uv" pip install --python "$VENV/bin/python" -q --no-deps --require-hashes -r requirements/leptonai.txt
echo "[test-latest] what differs from requirements/lock.txt (- locked, + installed here):"
# what `uv pip sync` would change to go back to the lock: exactly the differences, for this Python
"$VENV/bin/uv" pip sync --dry-run --python "$VENV/bin/python" requirements/lock.txt 2>&1 \
  | grep -E '^ [-+] ' | grep -vE ' (leptonai|prefect-swarm)==' | sed 's/^ - / + /; t; s/^ + / - /' || echo "  (none)"
"$VENV/bin/prefect-swarm" version
PREFECT_SWARM_REQUIRE_SERVICES=1 "$VENV/bin/pytest" -q ${PYTEST_ARGS:--n 2} -p no:cacheprovider \
  -m "smoke or ($UNIT_MARKS)"
