#!/usr/bin/env bash
# Old vs new binary, back to back on one machine (issue 37, "what it must
# show"): OLD is a release build of 3260f4d (before the one-core work), NEW
# this tree's. Nothing else runs meanwhile.
#   pipeline/  16 agents, shared fork, ~3,500-token document, 32 greedy
#              tokens each: bench/old_vs_new.py, TRIALS alternated trials
#   serve/     swarmkv serve, 16 concurrent streamed requests over the
#              ~3,500-token document (../serve/client.py), default and
#              --exact, the binaries alternated TRIALS times (order swapped
#              every other trial)
#   serve-fixed-mmap/  serve --exact again, 3 alternated trials, with glibc's
#              mmap threshold fixed (GLIBC_TUNABLES): the default dynamic
#              threshold places ggml's buffers by the process's allocation
#              history, which moved the exact kernel's speed by ~15 % between
#              the two binaries (report.md)
#   answers/   the README pipeline under shared, host and none, and
#              contract-review.yaml, once per binary (snapshot store off);
#              the README pipeline on two workers, run --redis --fork host
# summarize.py compares medians and answers and writes report.md.
# PARTS (default "pipeline serve answers") reruns some of them only. Other
# old-vs-new folders run this too (../one-loop-old-vs-new/command.sh): OUT
# names the folder, SERVE_ARMS the serve arms (name=flag, "default=" for
# none), SUMMARIZE=0 leaves the summary to the caller.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-bench/results/one-core-old-vs-new}
OLD=${OLD:?set OLD to the old swarmkv binary}
NEW=${NEW:-build/release/swarmkv}
MODEL=${SWARMKV_TEST_MODEL:-$HOME/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf}
TRIALS=${TRIALS:-5}
PORT=${PORT:-18093}
REDIS_PORT=${REDIS_PORT:-18094}
PY=/usr/bin/python3  # Debian's, with python3-matplotlib (scripts/lib.sh)
PARTS=${PARTS:-pipeline serve serve-fixed-mmap answers}
part() { [[ " $PARTS " == *" $1 "* ]]; }

if part pipeline; then
  rm -rf "$out/pipeline"
  "$PY" bench/old_vs_new.py "$OLD" "$NEW" "$MODEL" "$out/pipeline" --trials "$TRIALS" --branches 16 --forks shared
fi

serve_arm() {  # binary, name, then serve's flags: bench/serve_arm.py starts it, runs the client, keeps /metrics
  local bin=$1 name=$2; shift 2
  "$PY" bench/serve_arm.py --port "$PORT" --out "$out/serve/$name" --log "$out/serve/$name.log" --metrics -- \
    "$bin" serve --port "$PORT" --model "$MODEL" -c 8192 -t 2 --snapshot-cache off --max-live 16 "$@"
}
if part serve; then
  rm -rf "$out/serve"
  mkdir -p "$out/serve"
  for t in $(seq "$TRIALS"); do
    order=(old new); [ $((t % 2)) -eq 0 ] && order=(new old)
    for which in "${order[@]}"; do
      bin=$OLD; [ "$which" = new ] && bin=$NEW
      for arm in ${SERVE_ARMS:-default= exact=--exact}; do
        # shellcheck disable=SC2086  # an empty flag is no argument
        serve_arm "$bin" "$which-${arm%%=*}-$t" ${arm#*=}
      done
    done
  done
fi

if part serve-fixed-mmap; then
  rm -rf "$out/serve-fixed-mmap"
  mkdir -p "$out/serve-fixed-mmap"
  for t in 1 2 3; do
    order=(old new); [ $((t % 2)) -eq 0 ] && order=(new old)
    for which in "${order[@]}"; do
      bin=$OLD; [ "$which" = new ] && bin=$NEW
      "$PY" bench/serve_arm.py --port "$PORT" --out "$out/serve-fixed-mmap/$which-exact-$t" -- \
        env GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 "$bin" serve --port "$PORT" --model "$MODEL" \
        -c 8192 -t 2 --snapshot-cache off --max-live 16 --exact
    done
  done
fi

if part answers; then
  rm -rf "$out/answers"
  mkdir -p "$out/answers"
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    for fork in shared host none; do
      "$bin" run examples/pipelines/apache-license.yaml --model "$MODEL" --fork "$fork" -t 2 \
        --snapshot-cache off --json >"$out/answers/$which-readme-$fork.json"
    done
    "$bin" run examples/pipelines/contract-review.yaml --model "$MODEL" -t 2 --snapshot-cache off \
      --json >"$out/answers/$which-contract-review.json"
  done

  tmp=$(mktemp -d)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning \
    >/dev/null 2>&1 &
  redis_pid=$!
  trap 'kill $redis_pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
  sleep 0.5
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    pids=()
    for w in w1 w2; do
      "$bin" worker --redis "redis://127.0.0.1:$REDIS_PORT" --model "$MODEL" --name "$w" -t 1 \
        --cache-dir "$tmp/$which-$w" 2>"$out/answers/$which-cluster-$w.log" &
      pids+=($!)
    done
    sleep 3
    "$bin" run examples/pipelines/apache-license.yaml --model "$MODEL" --fork host \
      --redis "redis://127.0.0.1:$REDIS_PORT" --snapshot-cache off --timeout 600 --json \
      >"$out/answers/$which-cluster-host.json"
    kill -TERM "${pids[@]}"; wait "${pids[@]}" || true
  done
fi

if [ "${SUMMARIZE:-1}" = 1 ]; then "$PY" bench/results/one-core-old-vs-new/summarize.py "$out" "$TRIALS"; fi
