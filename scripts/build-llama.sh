#!/usr/bin/env bash
# Builds the pinned llama.cpp (vendored in the llama-cpp-python sdist) into a
# cache outside the repository and prints the install prefix on stdout.
#
# The cache key is: llama-cpp-python version + build options + our patches
# (scripts/patches/*.patch, applied in name order to the vendored tree) +
# (for native builds) a hash of the CPU feature flags. A finished build leaves
# a stamp; later runs print the prefix and do nothing else.
#
# Environment:
#   SWARMKV_CACHE      cache root (default ~/.cache/swarmkv)
#   SWARMKV_CUDA=1     build with GGML_CUDA=ON (needs nvcc on PATH)
#   SWARMKV_CUDA_ARCH  CUDA architectures to compile for (default 90: H100,
#                      H200; e.g. "89;90" or "native")
#   SWARMKV_NATIVE=0   portable build (no -march=native)
#   SWARMKV_JOBS=N     parallel build jobs (default: nproc)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cuda=${SWARMKV_CUDA:-0}
cuda_arch=${SWARMKV_CUDA_ARCH:-90}
native=${SWARMKV_NATIVE:-1}
jobs=${SWARMKV_JOBS:-$(nproc)}

opts=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_TOOLS_INSTALL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_NUMBER=0
  -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT"
  -DGGML_NATIVE="$([ "$native" = 1 ] && echo ON || echo OFF)"
  -DGGML_CUDA="$([ "$cuda" = 1 ] && echo ON || echo OFF)"
  "-DCMAKE_INSTALL_RPATH=\$ORIGIN/../lib"
  # The tools are copied from the build tree into the prefix: link them with
  # the prefix's rpath from the start.
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
)
if [ "$cuda" = 1 ]; then
  command -v nvcc >/dev/null ||
    die "SWARMKV_CUDA=1 needs the CUDA toolkit's nvcc on PATH (e.g. export PATH=/usr/local/cuda/bin:\$PATH)"
  opts+=("-DCMAKE_CUDA_ARCHITECTURES=$cuda_arch")
fi
if [ "$native" = 1 ] && [ "$(uname -m)" = x86_64 ]; then
  # Virtual machines often advertise AMX in CPUID without enabling its tile
  # state: -march=native then compiles AMX kernels that die with SIGILL on the
  # first matrix multiply (seen on this project's CI machines). AVX-512 stays.
  opts+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
         "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
cpu_key=portable
if [ "$native" = 1 ]; then
  cpu_key=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
fi
# What is built is part of the key: a cache stamped complete before a tool
# joined this list would otherwise silently lack it.
targets=(llama llama-server llama-bench llama-quantize llama-perplexity)
tools=(llama-bench llama-quantize llama-perplexity)
opt_key=$(printf '%s\n' "${opts[@]}" "targets:${targets[*]}" | sha256sum | cut -c1-12)
patches=("$SWARMKV_ROOT"/scripts/patches/*.patch)
key="${LLAMA_CPP_PYTHON_VERSION}-${opt_key}-p$(llama_patch_key)-cpu${cpu_key}"
base="$SWARMKV_CACHE/llama.cpp/$key"
prefix="$base/install"

if [ -f "$prefix/.swarmkv-complete" ]; then
  echo "$prefix"
  exit 0
fi

log "building llama.cpp ${LLAMA_CPP_COMMIT} (llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION}) into $base"
log "this takes about 10 minutes on 2 cores; it is cached afterwards"
mkdir -p "$base"
src="$base/src"
llama_source "$src"

# Without an NVIDIA driver (a build machine), the tools link against the
# toolkit's stub of libcuda.so.1 and start against it (no GPU is found):
# link-time only, so not part of the cache key.
link_opts=()
run_env=()
if [ "$cuda" = 1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  stub=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)/lib64/stubs/libcuda.so
  [ -f "$stub" ] || die "no NVIDIA driver here and no stub libcuda.so in the CUDA toolkit ($stub)"
  mkdir -p "$SWARMKV_CACHE/cuda-stubs"
  ln -sf "$stub" "$SWARMKV_CACHE/cuda-stubs/libcuda.so.1"
  link_opts=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$SWARMKV_CACHE/cuda-stubs")
  run_env=(env "LD_LIBRARY_PATH=$SWARMKV_CACHE/cuda-stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  log "no NVIDIA driver here: linking against the CUDA toolkit's stub libcuda.so.1"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$base/build" "${generator[@]}" "${opts[@]}" "${link_opts[@]}" \
  -DCMAKE_INSTALL_PREFIX="$prefix" >"$base/configure.log" 2>&1 ||
  { tail -n 40 "$base/configure.log" >&2; die "llama.cpp configure failed (log: $base/configure.log)"; }
cmake --build "$base/build" --target "${targets[@]}" -j "$jobs" >&2 ||
  die "llama.cpp build failed"
cmake --install "$base/build" >"$base/install.log" 2>&1 ||
  { tail -n 40 "$base/install.log" >&2; die "llama.cpp install failed (log: $base/install.log)"; }
# The tools' implementation libraries (libllama-server-impl.so, ...) and
# the measuring tools (llama-bench, llama-quantize, llama-perplexity) are
# installed only with LLAMA_TOOLS_INSTALL, which would also install tools we
# do not build; they find libllama through the install rpath.
cp -P "$base"/build/bin/libllama-*-impl.so* "$prefix/lib/"
for t in "${tools[@]}"; do
  install -m 755 "$base/build/bin/$t" "$prefix/bin/$t"
done
"${run_env[@]}" "$prefix/bin/llama-server" --version >/dev/null 2>&1 ||
  die "the installed llama-server does not start: $prefix/bin/llama-server --version"
for t in "${tools[@]}"; do
  # --help exits 0 or 1 depending on the tool; 127 is a missing library.
  rc=0
  "${run_env[@]}" "$prefix/bin/$t" --help >/dev/null 2>&1 || rc=$?
  [ "$rc" -le 1 ] || die "the installed $t does not start (exit $rc): $prefix/bin/$t --help"
done
cat >"$prefix/swarmkv-llama.txt" <<INFO
llama_cpp_python_version=${LLAMA_CPP_PYTHON_VERSION}
llama_cpp_commit=${LLAMA_CPP_COMMIT}
cache_key=${key}
patches=$(for p in "${patches[@]}"; do basename "$p"; done | paste -sd, -)
INFO
touch "$prefix/.swarmkv-complete"
log "llama.cpp installed in $prefix"
echo "$prefix"
