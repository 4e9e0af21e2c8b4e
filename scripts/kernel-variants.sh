#!/usr/bin/env bash
# The kernel tests of exact mode (tests/attention_kernel_test.cpp: the
# batch-invariant attention; tests/matmul_kernel_test.cpp: the weight
# products) on the code paths of CPUs other than this one: ggml from the
# pinned, patched llama.cpp built for
#
#   avx2     x86-64 with AVX2, FMA and F16C, no AVX-512 (what SWARMKV_NATIVE=0
#            builds); runs here on any CPU that has those
#   aarch64  ARMv8.2-A with NEON, fp16 arithmetic and dot products (Graviton 2
#            and later, Ampere, Apple M), cross-compiled with Debian's aarch64
#            toolchain and run under qemu-user (bit for bit what the
#            instructions give; it says nothing of speed)
#
#   scripts/kernel-variants.sh [avx2] [aarch64]     (default: both)
#
# Each variant's ggml (about a minute on 2 cores) and, for aarch64, GoogleTest
# are cached under <cache>/kernel-variants/, keyed by the patches; the tests
# themselves are compiled afresh each run. Missing Debian packages are installed
# (g++-aarch64-linux-gnu, qemu-user, libgtest-dev). A variant this machine
# cannot run is skipped, saying why; a test that fails fails the script.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(avx2 aarch64)
for v in "${variants[@]}"; do
  case "$v" in
    avx2 | aarch64) ;;
    *) die "unknown variant '$v' (known: avx2, aarch64)" ;;
  esac
done

root="$SWARMKV_CACHE/kernel-variants/${LLAMA_CPP_PYTHON_VERSION}-p$(llama_patch_key)"
mkdir -p "$root"
src="$root/src"
# One source tree for every variant; a concurrent run (ctest -j) waits for it.
(
  flock 9
  llama_source "$src"
) 9>"$root/.lock"

# ggml_build VARIANT CMAKE_ARGS...: ggml-base and ggml-cpu for VARIANT in
# $root/VARIANT/build, once.
ggml_build() {
  local variant=$1 dir="$root/$1"
  shift
  [ -f "$dir/.complete" ] && return 0
  log "$variant: building ggml (about a minute; cached in $dir)"
  rm -rf "$dir/build"
  mkdir -p "$dir"
  cmake -S "$src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF "$@" \
    >"$dir/configure.log" 2>&1 ||
    { tail -n 30 "$dir/configure.log" >&2; die "$variant: ggml configure failed (log: $dir/configure.log)"; }
  cmake --build "$dir/build" --target ggml-cpu -j "$(nproc)" >"$dir/build.log" 2>&1 ||
    { grep -m 20 -E 'error|Error' "$dir/build.log" >&2; die "$variant: ggml build failed (log: $dir/build.log)"; }
  touch "$dir/.complete"
}

tests=(attention_kernel_test matmul_kernel_test)

run_avx2() {
  local dir="$root/avx2" f
  for f in avx2 fma f16c; do
    grep -m1 '^flags' /proc/cpuinfo | grep -qw "$f" || {
      log "avx2: skipped: this CPU has no $f"
      return 0
    }
  done
  ensure_system_packages libgtest-dev
  # GGML_NATIVE=OFF's defaults: SSE4.2, AVX, AVX2, BMI2, FMA, F16C; AVX-512 off
  ggml_build avx2
  local t
  for t in "${tests[@]}"; do
    g++ -std=c++20 -O2 -I"$src/ggml/include" "$SWARMKV_ROOT/tests/$t.cpp" -o "$dir/$t" \
      -L"$dir/build/bin" -lggml-cpu -lggml-base -Wl,-rpath,"$dir/build/bin" -lgtest -pthread
    log "avx2: running $t"
    "$dir/$t" --gtest_brief=1
  done
}

run_aarch64() {
  local dir="$root/aarch64"
  ensure_system_packages g++-aarch64-linux-gnu qemu-user libgtest-dev
  mkdir -p "$dir"
  cat >"$dir/toolchain.cmake" <<'CMAKE'
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
CMAKE
  # fp16 arithmetic and dot products take sgemm's and ggml's other ARM code paths
  ggml_build aarch64 -DCMAKE_TOOLCHAIN_FILE="$dir/toolchain.cmake" -DGGML_CPU_ARM_ARCH=armv8.2-a+fp16+dotprod
  if [ ! -f "$dir/gtest/lib/libgtest.a" ]; then
    log "aarch64: building GoogleTest from /usr/src/googletest"
    cmake -S /usr/src/googletest -B "$dir/gtest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DCMAKE_TOOLCHAIN_FILE="$dir/toolchain.cmake" >"$dir/gtest.log" 2>&1 &&
      cmake --build "$dir/gtest" -j "$(nproc)" >>"$dir/gtest.log" 2>&1 ||
      { tail -n 20 "$dir/gtest.log" >&2; die "aarch64: GoogleTest build failed (log: $dir/gtest.log)"; }
  fi
  local t
  for t in "${tests[@]}"; do
    aarch64-linux-gnu-g++ -std=c++20 -O2 -I"$src/ggml/include" -I/usr/src/googletest/googletest/include \
      "$SWARMKV_ROOT/tests/$t.cpp" -o "$dir/$t" -L"$dir/build/bin" -lggml-cpu -lggml-base \
      -L"$dir/gtest/lib" -lgtest -pthread
    log "aarch64: running $t under qemu-aarch64 (about a minute)"
    QEMU_CPU=max QEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH="$dir/build/bin" \
      qemu-aarch64 "$dir/$t" --gtest_brief=1
  done
}

for v in "${variants[@]}"; do
  "run_$v"
done
