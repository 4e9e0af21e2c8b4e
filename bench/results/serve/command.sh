#!/usr/bin/env bash
# swarmkv serve against llama-server -np 16 (issue 17): 16 concurrent
# streamed chat requests, each the same ~3,500-token document plus its own
# one-line question, 32 greedy tokens each, SmolLM2-135M F16, 2 threads,
# flash attention off, one trial per server, the same client (client.py, run by
# bench/serve_arm.py).
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
# bench/serve_arm.py: starts a server, runs client.py against it, keeps /metrics, stops it.
/usr/bin/python3 bench/serve_arm.py --port 18090 --out "$out/swarmkv" --log "$out/swarmkv.log" --metrics -- \
  "$B" serve --port 18090 --model "$MODEL" -c 8192 -t 2 --max-live 16

/usr/bin/python3 bench/serve_arm.py --port 18091 --out "$out/llama-server" --log "$out/llama-server.log" --metrics -- \
  "$LS" --model "$MODEL" --host 127.0.0.1 --port 18091 --ctx-size 65536 --parallel 16 --no-kv-unified \
  --threads 2 --threads-batch 2 --batch-size 512 --ubatch-size 512 --flash-attn off \
  --cache-prompt --metrics --no-webui --no-warmup
/usr/bin/python3 "$out/summarize.py" "$out"
