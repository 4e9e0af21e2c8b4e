#!/usr/bin/env bash
# SwarmKV on a GPU, for a bare, offline GPU machine (no Debian packages, no
# network, a small transfer): pack here, carry the folder, run there.
#
#   scripts/gpu-check.sh pack [DIR]        # here, after scripts/demo.sh (default DIR .gpu-check)
#   scripts/gpu-check.sh run [DIR] [OUT]   # there (needs nvcc, cmake, ninja, python3 with numpy)
#
# pack writes into DIR (about 30 MB): the pinned llama.cpp source with our
# patches (the build cache's tree, without its models, docs and tests), the
# swarmkv binary with the non-system libraries it links (ldd), and the
# default model's skeleton (scripts/gguf_skeleton.py: its header, no weights).
#
# run builds llama.cpp with CUDA there (SWARMKV_CUDA_ARCH, default 90: H100,
# H200), writes a model of the default model's shapes with random weights
# (timings only: its answers are noise), and runs `swarmkv bench` with every
# layer on the GPU (--n-gpu-layers -1, --no-exact: exact mode is CPU-only):
# the seed workload (2 branches, 3,501-token document, arms none, host,
# shared) and 16 agents (none, shared), 3 trials each, plus llama-bench's
# prefill and decode of the same model as llama.cpp's own baseline. Results
# go to OUT (default DIR/out) in the bench format (best_run.json,
# all_trials.csv per point), with the build's log tail and times.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmd=${1:-}
dir=${2:-.gpu-check}

pack() {
  . "$here/lib.sh"
  local prefix src binary
  prefix=$("$here/build-llama.sh")
  src=$(dirname "$prefix")/src
  [ -f "$src/CMakeLists.txt" ] || die "no llama.cpp source beside $prefix"
  binary=$SWARMKV_ROOT/build/release/swarmkv
  [ -x "$binary" ] || die "no $binary: run scripts/demo.sh first"
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
  tar -czf "$dir/llama-src.tar.gz" -C "$src" --exclude='*.gguf' --exclude=tools/server/public \
    --exclude=tools/server/webui CMakeLists.txt LICENSE cmake ggml src include common vendor tools licenses
  cp "$binary" "$dir/bin/swarmkv"
  # What it links beyond glibc, libstdc++ and llama.cpp (built there).
  ldd "$binary" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    case $name in
      # libgomp comes with the compiler that builds ggml there, zlib with any system.
      libc.so* | libm.so* | libstdc++* | libgcc_s* | ld-linux* | libllama* | libggml* | libgomp* | libz.so*) ;;
      *) cp -L "$path" "$dir/lib/$name" ;;
    esac
  done
  python3 "$here/gguf_skeleton.py" pack "$SWARMKV_CACHE/models/$SMOLLM2_F16_GGUF" "$dir/model.skel"
  du -sh "$dir"
}

run() {
  local out=${1:-$dir/out} arch=${SWARMKV_CUDA_ARCH:-90} jobs
  jobs=$(nproc)
  dir=$(cd "$dir" && pwd)
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  local work=${SWARMKV_GPU_WORK:-/tmp/swarmkv-gpu}
  mkdir -p "$work/src"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
  nvcc --version | tail -n 2 | tee -a "$out/gpu.txt"
  if [ ! -f "$work/build/bin/libllama.so" ]; then
    tar -xzf "$dir/llama-src.tar.gz" -C "$work/src"
    local t0=$SECONDS
    cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_CURL=OFF >"$out/configure.log" 2>&1 || { tail -n 30 "$out/configure.log"; exit 1; }
    cmake --build "$work/build" --target llama llama-bench -j "$jobs" >"$out/build.log" 2>&1 ||
      { tail -n 40 "$out/build.log"; exit 1; }
    echo "llama.cpp with CUDA (sm_$arch): built in $((SECONDS - t0)) s on $jobs cores" | tee "$out/build-time.txt"
    tail -n 5 "$out/build.log" >"$out/build-tail.txt"
  fi
  local model=$work/model-random.gguf
  [ -f "$model" ] || python3 "$here/gguf_skeleton.py" fill "$dir/model.skel" "$model"
  # The libraries for swarmkv and llama-bench only (not for python3).
  local libs="$work/build/bin:$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  swarmkv() { LD_LIBRARY_PATH=$libs "$dir/bin/swarmkv" "$@"; }
  swarmkv --version | tee "$out/version.txt"
  grep -q CUDA "$out/version.txt" || { echo "this swarmkv sees no CUDA backend"; exit 1; }
  local gpu=(--model "$model" --n-gpu-layers -1 --no-exact --flash-attn on --doc-tokens 3501
             --trials 3 --pause-ms 0)
  swarmkv bench "${gpu[@]}" --branches 2 --arms none,host,shared --out "$out/seed" \
    2>&1 | tee "$out/seed.log"
  swarmkv bench "${gpu[@]}" --branches 16 --arms none,shared --out "$out/agents16" \
    2>&1 | tee "$out/agents16.log"
  LD_LIBRARY_PATH=$libs "$work/build/bin/llama-bench" -m "$model" -ngl 99 -fa 1 -p 3501 -n 32 -r 3 -o md 2>/dev/null |
    tee "$out/llama-bench.md"
}

case $cmd in
  pack) pack ;;
  run) run "${@:3}" ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
