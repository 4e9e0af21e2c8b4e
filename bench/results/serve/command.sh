#!/usr/bin/env bash
# swarmkv serve against llama-server -np 16 (issue 17): 16 concurrent
# streamed chat requests, each the same ~3,500-token document plus its own
# one-line question, 32 greedy tokens each, SmolLM2-135M F16, 2 threads,
# flash attention off, one trial per server, the same client (client.py).
# llama-server runs as the bench's server-concurrent arm runs it (one slot
# per request, kv-unified off as the bench picks it at 16 agents, each
# slot 4,096 cells, --cache-prompt; its host prompt cache
# --cache-ram is on by default at our pin).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/serve
B=${SWARMKV:-build/release/swarmkv}
LS=${SWARMKV_LLAMA_SERVER:-$SWARMKV_LLAMA_PREFIX/bin/llama-server}
MODEL=${SWARMKV_TEST_MODEL:-$HOME/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf}
wait_ready() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }

"$B" serve --port 18090 --model "$MODEL" -c 8192 -t 2 --max-live 16 2>"$out/swarmkv.log" &
pid=$!; trap 'kill $pid 2>/dev/null || true' EXIT
wait_ready 18090
/usr/bin/python3 "$out/client.py" --port 18090 >"$out/swarmkv.json"
curl -s http://127.0.0.1:18090/metrics >"$out/swarmkv.metrics"
kill -TERM $pid; wait $pid

"$LS" --model "$MODEL" --host 127.0.0.1 --port 18091 --ctx-size 65536 --parallel 16 --no-kv-unified \
  --threads 2 --threads-batch 2 --batch-size 512 --ubatch-size 512 --flash-attn off \
  --cache-prompt --metrics --no-webui --no-warmup 2>"$out/llama-server.log" &
pid=$!
wait_ready 18091
/usr/bin/python3 "$out/client.py" --port 18091 >"$out/llama-server.json"
curl -s http://127.0.0.1:18091/metrics >"$out/llama-server.metrics"
kill -TERM $pid; wait $pid || true
/usr/bin/python3 "$out/summarize.py" "$out"
