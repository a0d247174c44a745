#!/usr/bin/env bash
# Sleep and wake a real vLLM on a GPU: what the GPU-like simulator stands in for in the tests.
#
#   scripts/gpu/sleep_wake_check.sh [MODEL] [PORT]      (default: Qwen/Qwen2.5-0.5B-Instruct 8011)
#
# Needs a CUDA (or ROCm) GPU, nvidia-smi, and vLLM installed for the `python` on PATH (or $PYTHON).
# Starts vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (what engine.sleep_mode renders),
# times the cold start, asks one chat completion, sleeps (level 1), checks that /is_sleeping says true,
# that a completion is refused meanwhile and that the GPU memory vLLM held is freed (nvidia-smi),
# wakes it, checks it answers again with the same text as before it slept (temperature 0), then does
# the same with level 2, waking it the way `prefect-swarm wake` does for a level-2 sleep (the weights
# were discarded): /wake_up?tags=weights, /collective_rpc reload_weights, /wake_up?tags=kv_cache,
# /reset_prefix_cache. Prints the timings.
# Exits non-zero at the first check that fails; stops the server on every exit.
set -euo pipefail
MODEL=${1:-Qwen/Qwen2.5-0.5B-Instruct}
PORT=${2:-8011}
PYTHON=${PYTHON:-python}
URL="http://127.0.0.1:$PORT"
LOG=$(mktemp -t vllm-sleep-XXXXXX.log)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s }'; }
fail() { echo "FAIL: $*" >&2; echo "--- vLLM log tail ($LOG) ---" >&2; tail -40 "$LOG" >&2; exit 1; }
CHAT="{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Name three colours.\"}], \"max_tokens\": 16, \"temperature\": 0}"
chat() {  # chat -> HTTP status of one tiny chat completion
  curl -s -o /dev/null -w '%{http_code}' "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$CHAT"
}
answer() {  # answer -> the text of that completion (greedy: the same weights give the same text)
  curl -sf "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$CHAT" \
    | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
}
post() {  # post ROUTE [JSON] -> fails unless HTTP 200
  local code body=()
  [[ $# -lt 2 ]] || body=(-H 'Content-Type: application/json' -d "$2")
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL$1" "${body[@]}")
  [[ "$code" == 200 ]] || fail "POST $1 answered $code"
}
sleeping() { curl -s "$URL/is_sleeping" | "$PYTHON" -c 'import json, sys; print(str(json.load(sys.stdin)["is_sleeping"]).lower())'; }

command -v nvidia-smi > /dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU"
base=$(gpu_mib)
t0=$(now)
VLLM_SERVER_DEV_MODE=1 "$PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "$PORT" \
  --enable-sleep-mode --gpu-memory-utilization 0.5 > "$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2> /dev/null; wait "$SERVER" 2> /dev/null || true' EXIT
until curl -sf "$URL/health" > /dev/null; do
  kill -0 "$SERVER" 2> /dev/null || fail "vLLM exited during start"
  sleep 1
done
cold=$(since "$t0")
[[ "$(chat)" == 200 ]] || fail "no answer after start"
expected=$(answer)
awake=$(gpu_mib)
echo "cold start: ${cold}s; GPU memory: ${base} MiB before, ${awake} MiB with the model loaded"

for level in 1 2; do
  t=$(now)
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL/sleep?level=$level")
  [[ "$code" == 200 ]] || fail "POST /sleep?level=$level answered $code"
  slept=$(since "$t")
  [[ "$(sleeping)" == true ]] || fail "/is_sleeping is not true after /sleep?level=$level"
  asleep=$(gpu_mib)
  refused=$(chat)
  [[ "$refused" != 200 ]] || fail "a completion was answered while asleep (level $level)"
  freed=$(( awake - asleep ))
  (( freed * 2 > awake - base )) || fail "level $level freed only ${freed} MiB of $(( awake - base )) MiB"
  t=$(now)
  if [[ $level == 2 ]]; then  # the weights were discarded: reallocate, load them again, then the KV cache
    post "/wake_up?tags=weights"
    post /collective_rpc '{"method": "reload_weights"}'
    post "/wake_up?tags=kv_cache"
    post /reset_prefix_cache
  else
    post /wake_up
  fi
  [[ "$(sleeping)" == false ]] || fail "/is_sleeping is not false after waking from level $level"
  [[ "$(chat)" == 200 ]] || fail "no answer after waking from level $level"
  woke=$(since "$t")
  got=$(answer)
  [[ "$got" == "$expected" ]] || fail "after waking from level $level the answer is '$got', not '$expected'"
  echo "level $level: sleep ${slept}s, freed ${freed} MiB (${asleep} MiB left), completion while asleep: HTTP $refused, wake to first answer ${woke}s"
done
echo "OK: cold start ${cold}s vs wake (level 1) above"
