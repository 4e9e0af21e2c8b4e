#!/usr/bin/env bash
# swarmkv serve --exact against the default (issue 17): 16 concurrent
# streamed chat requests over the ~3,500-token document, 32 greedy tokens
# each, SmolLM2-135M F16, 2 threads, the serve bench's client
# (../serve/client.py). Arms, alternated three times: default (flash
# attention off), --flash-attn on, --exact. Then once the reference:
# --exact --max-live 1, where each request runs alone, so its answer is its
# re-prefill's (tests/server_model_test.cpp, ALoneRequestEqualsAReprefill...).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/serve-exact
B=${SWARMKV:-build/release/swarmkv}
MODEL=${SWARMKV_TEST_MODEL:-$HOME/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf}
TRIALS=${TRIALS:-3}
wait_ready() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }
arm() {  # name, then serve's flags
  local name=$1; shift
  "$B" serve --port 18092 --model "$MODEL" -c 8192 -t 2 --snapshot-cache off "$@" 2>"$out/runs/$name.log" &
  local pid=$!
  wait_ready 18092
  /usr/bin/python3 bench/results/serve/client.py --port 18092 >"$out/runs/$name.json"
  curl -s http://127.0.0.1:18092/metrics >"$out/runs/$name.metrics"
  kill -TERM $pid; wait $pid
}
rm -rf "$out/runs"; mkdir -p "$out/runs"
for t in $(seq "$TRIALS"); do
  arm "default-$t" --max-live 16
  arm "fa-on-$t" --max-live 16 --flash-attn on
  arm "exact-$t" --max-live 16 --exact
done
arm reference --max-live 1 --exact
/usr/bin/python3 "$out/summarize.py" "$out" "$TRIALS"
