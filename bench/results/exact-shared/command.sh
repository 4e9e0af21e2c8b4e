#!/usr/bin/env bash
# Exact vs inexact shared fork, back to back on one machine (issue 15):
# 4, 8 and 16 agents over a 3,501-token document, 32 greedy tokens each,
# SmolLM2-135M F16 (the default model), 2 threads.
# Three modes, one process each (ggml reads its kernel switches once):
#   exact-patched  --exact with our batch-invariant flash-attention kernel
#                  (scripts/patches/ggml-fa-batch-invariant.patch)
#   exact-api      --exact without it (GGML_CPU_FA_BATCH_INVARIANT=0: the
#                  public-API measures only, one-row steps on one thread)
#   inexact        today's default settings (flash attention off)
# Each run's reference is `none` with the same settings (one trial per arm).
# Then the goal's two arms alone, `shared` exact-patched and inexact,
# alternated five times (repeat/): the ratio is taken of their medians.
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${SWARMKV:-build/release/swarmkv}
out=bench/results/exact-shared
common=(--sweep branches=4,8,16 --doc-tokens 3501 --branch-tokens 6 --n-predict 32 --threads 2)
GGML_CPU_FA_BATCH_INVARIANT=1 "$B" bench --arms none,shared,host --trials 1 "${common[@]}" --exact -o "$out/exact-patched"
GGML_CPU_FA_BATCH_INVARIANT=0 "$B" bench --arms none,shared,host --trials 1 "${common[@]}" --exact -o "$out/exact-api"
"$B" bench --arms none,shared,host --trials 1 "${common[@]}" -o "$out/inexact"
for rep in 1 2 3 4 5; do
  GGML_CPU_FA_BATCH_INVARIANT=1 "$B" bench --arms shared --trials 1 "${common[@]}" --exact -o "$out/repeat/exact-patched-$rep"
  "$B" bench --arms shared --trials 1 "${common[@]}" -o "$out/repeat/inexact-$rep"
done
/usr/bin/python3 "$out/summarize.py" "$out"
