#!/usr/bin/env bash
# Runs `swarmkv bench` with all of its set-up, then draws the plots and writes
# report.md (the exact command line goes into the report).
#
#   scripts/bench.sh --out bench/results/seed-workload --branches 2 --doc-tokens 3501 --n-predict 1
#
# All arguments go to `swarmkv bench` (see `build/release/swarmkv bench --help`).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

setup_release
model=$SWARMKV_RUN_MODEL
out=bench-out
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    -o | --out) out=${args[$((i + 1))]} ;;
    --out=*) out=${args[$i]#--out=} ;;
  esac
done
rc=0
SWARMKV_MODEL_SHA256=$(sha256sum "$model" | cut -d' ' -f1) \
  "$SWARMKV_ROOT/build/release/swarmkv" bench --model "$model" "$@" || rc=$?
if [ -f "$out/best_run.json" ]; then
  /usr/bin/python3 "$SWARMKV_ROOT/bench/plot_bench.py" "$out" --command "scripts/bench.sh $*"
fi
exit $rc
