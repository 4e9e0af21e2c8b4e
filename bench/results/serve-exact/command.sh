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
arm() {  # name, then serve's flags: bench/serve_arm.py starts it, runs the client, keeps /metrics
  local name=$1; shift
  /usr/bin/python3 bench/serve_arm.py --port 18092 --out "$out/runs/$name" --log "$out/runs/$name.log" --metrics -- \
    "$B" serve --port 18092 --model "$MODEL" -c 8192 -t 2 --snapshot-cache off "$@"
}
rm -rf "$out/runs"; mkdir -p "$out/runs"
for t in $(seq "$TRIALS"); do
  arm "default-$t" --max-live 16
  arm "fa-on-$t" --max-live 16 --flash-attn on
  arm "exact-$t" --max-live 16 --exact
done
arm reference --max-live 1 --exact
/usr/bin/python3 "$out/summarize.py" "$out" "$TRIALS"
