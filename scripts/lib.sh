# Shared helpers for scripts/*.sh. Source it; it defines functions only.
# shellcheck shell=bash

SWARMKV_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=deps.env
. "$SWARMKV_ROOT/scripts/deps.env"

# All caches live outside the repository, keyed by version and options.
SWARMKV_CACHE=${SWARMKV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/swarmkv}

log() { printf '[swarmkv] %s\n' "$*" >&2; }
die() { printf '[swarmkv] error: %s\n' "$*" >&2; exit 1; }

# sha256_ok FILE EXPECTED -> 0 when FILE exists and its sha256 is EXPECTED.
sha256_ok() {
  [ -f "$1" ] || return 1
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ]
}

# pip_download SPEC DEST [extra pip args...]: one package, no dependencies.
pip_download() {
  local spec=$1 dest=$2
  shift 2
  mkdir -p "$dest"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    -d "$dest" "$@" "$spec" >&2 || die "pip could not download $spec"
}

# Debian packages the build, the tests and the tools need.
SWARMKV_APT_PACKAGES=(
  g++ cmake ninja-build pkg-config python3 python3-pip unzip patch clang-format
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libyaml-cpp-dev libcpp-httplib-dev libxxhash-dev libssl-dev python3-matplotlib python3-prometheus-client
  redis-server ccache
  python3-venv curl openssl  # the README's serve and cluster blocks (tests/readme_blocks_test.py)
)

# What the test suite needs besides: a browser for the run pages' tests, an
# aarch64 cross compiler and qemu-user for the kernel's ARM path
# (scripts/kernel-variants.sh).
SWARMKV_TEST_APT_PACKAGES=(chromium g++-aarch64-linux-gnu qemu-user)

# Installs the missing Debian packages (as root), saying what it installs:
# SWARMKV_APT_PACKAGES and the ones named.
ensure_system_packages() {
  local missing=() pkg
  for pkg in "${SWARMKV_APT_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  # A python3 with its own pip (pyenv, venv) needs no python3-pip.
  if [ ${#missing[@]} -gt 0 ] && python3 -m pip --version >/dev/null 2>&1; then
    local keep=()
    for pkg in "${missing[@]}"; do [ "$pkg" = python3-pip ] || keep+=("$pkg"); done
    missing=("${keep[@]}")
  fi
  # A python3 from outside Debian (pyenv) also counts.
  if [ ${#missing[@]} -gt 0 ] && command -v python3 >/dev/null 2>&1; then
    local keep=()
    for pkg in "${missing[@]}"; do [ "$pkg" = python3 ] || keep+=("$pkg"); done
    missing=("${keep[@]}")
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "not root and no sudo: install these packages first: ${missing[*]}"
    sudo=(sudo)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
    die "apt-get install failed for: ${missing[*]}"
}

# The hash of our llama.cpp patches (scripts/patches/*.patch), part of every
# cache key of a tree they were applied to.
llama_patch_key() {
  cat "$SWARMKV_ROOT"/scripts/patches/*.patch | sha256sum | cut -c1-12
}

# llama_source DEST: the pinned llama.cpp tree (the llama-cpp-python sdist's
# vendor/llama.cpp, downloaded and sha256-checked if missing) with our
# patches applied in name order, in DEST, unless DEST already holds it.
# llama_sdist: prints the path of the pinned llama-cpp-python sdist,
# downloaded and sha256-checked if missing.
llama_sdist() {
  local sdist_dir="$SWARMKV_CACHE/downloads"
  local sdist="$sdist_dir/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz"
  if ! sha256_ok "$sdist" "$LLAMA_CPP_PYTHON_SHA256"; then
    rm -f "$sdist"
    log "downloading llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} sdist from PyPI"
    pip_download "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" "$sdist_dir" --no-binary :all:
    sha256_ok "$sdist" "$LLAMA_CPP_PYTHON_SHA256" ||
      die "sha256 mismatch for $sdist (expected $LLAMA_CPP_PYTHON_SHA256)"
  fi
  echo "$sdist"
}

llama_source() {
  local dest=$1 p sdist
  [ -f "$dest/CMakeLists.txt" ] && return 0
  sdist=$(llama_sdist)
  local extract="$dest.extract"
  local tree="$extract/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
  rm -rf "$dest" "$extract"
  mkdir -p "$extract"
  tar -xzf "$sdist" -C "$extract" "llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
  for p in "$SWARMKV_ROOT"/scripts/patches/*.patch; do
    log "applying $(basename "$p")"
    patch -d "$tree" -p1 --forward --batch <"$p" >&2 ||
      die "patch $(basename "$p") does not apply to llama.cpp ${LLAMA_CPP_COMMIT}"
  done
  mv "$tree" "$dest"
  rm -rf "$extract"
}

# Sets SWARMKV_LLAMA_PREFIX to an installed llama.cpp: the one named by
# $SWARMKV_LLAMA_PREFIX, else one that find_package(llama) already finds
# (e.g. through $CMAKE_PREFIX_PATH), else the pinned build (built if needed).
ensure_llama() {
  if [ -n "${SWARMKV_LLAMA_PREFIX:-}" ]; then
    [ -f "$SWARMKV_LLAMA_PREFIX/lib/cmake/llama/llama-config.cmake" ] ||
      [ -n "$(find "$SWARMKV_LLAMA_PREFIX" -path '*cmake/llama/llama-config.cmake' -print -quit 2>/dev/null)" ] ||
      die "SWARMKV_LLAMA_PREFIX=$SWARMKV_LLAMA_PREFIX holds no lib/cmake/llama/llama-config.cmake"
    log "using llama.cpp from SWARMKV_LLAMA_PREFIX=$SWARMKV_LLAMA_PREFIX"
    export SWARMKV_LLAMA_PREFIX
    return 0
  fi
  if [ "${SWARMKV_BUILD_LLAMA:-0}" != 1 ]; then
    local probe dir
    probe=$(mktemp -d)
    cat >"$probe/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(probe C CXX)
find_package(llama CONFIG QUIET)
if(llama_FOUND)
  file(WRITE "${CMAKE_BINARY_DIR}/llama_dir.txt" "${llama_DIR}")
endif()
CMAKE
    if cmake -S "$probe" -B "$probe/build" >/dev/null 2>&1 && [ -f "$probe/build/llama_dir.txt" ]; then
      dir=$(cat "$probe/build/llama_dir.txt")
      SWARMKV_LLAMA_PREFIX=$(cd "$dir/../../.." && pwd)
      log "using the llama.cpp installation that find_package(llama) found: $SWARMKV_LLAMA_PREFIX" \
        "(SWARMKV_BUILD_LLAMA=1 builds the pinned one instead)"
    fi
    rm -rf "$probe"
  fi
  if [ -z "${SWARMKV_LLAMA_PREFIX:-}" ]; then
    SWARMKV_LLAMA_PREFIX=$("$SWARMKV_ROOT/scripts/build-llama.sh")
  fi
  export SWARMKV_LLAMA_PREFIX
  ensure_llama_common
}

# Sets SWARMKV_LLAMA_COMMON_SOURCE to the pinned tree's common/ folder (the
# JSON-schema-to-grammar converter and what it needs), taken from the sdist
# into the cache once. llama.cpp installs no headers for it, so CMake
# compiles those few files into our build (swarmkv_llama_common).
ensure_llama_common() {
  local dir="$SWARMKV_CACHE/llama-common/$LLAMA_CPP_PYTHON_VERSION" sdist tmp
  if [ ! -f "$dir/common/json-schema-to-grammar.cpp" ]; then
    sdist=$(llama_sdist)
    tmp=$(mktemp -d)
    tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/common" ||
      die "$sdist holds no vendor/llama.cpp/common"
    rm -rf "$dir"
    mkdir -p "$dir"
    mv "$tmp/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/common" "$dir/common"
    rm -rf "$tmp"
  fi
  SWARMKV_LLAMA_COMMON_SOURCE=$dir/common
  export SWARMKV_LLAMA_COMMON_SOURCE
}

# Sets SWARMKV_HIREDIS_SOURCE to a folder holding hiredis/ssl.c and the
# rest of hiredis 1.5.0's sources, from the pinned PyPI sdist (cached).
ensure_hiredis() {
  local dir="$SWARMKV_CACHE/hiredis/$HIREDIS_PY_VERSION"
  if [ ! -f "$dir/hiredis/ssl.c" ]; then
    local sdist_dir="$SWARMKV_CACHE/downloads" sdist tmp
    sdist="$sdist_dir/hiredis-$HIREDIS_PY_VERSION.tar.gz"
    if ! sha256_ok "$sdist" "$HIREDIS_PY_SHA256"; then
      rm -f "$sdist"
      log "downloading the hiredis $HIREDIS_PY_VERSION sdist from PyPI (its vendored hiredis: TLS to Redis)"
      pip_download "hiredis==$HIREDIS_PY_VERSION" "$sdist_dir" --no-binary :all:
      sha256_ok "$sdist" "$HIREDIS_PY_SHA256" || die "sha256 mismatch for $sdist (expected $HIREDIS_PY_SHA256)"
    fi
    tmp=$(mktemp -d)
    tar -xzf "$sdist" -C "$tmp" "hiredis-$HIREDIS_PY_VERSION/vendor/hiredis" ||
      die "$sdist holds no vendor/hiredis"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    mv "$tmp/hiredis-$HIREDIS_PY_VERSION/vendor" "$dir"
    rm -rf "$tmp"
  fi
  SWARMKV_HIREDIS_SOURCE=$dir
  export SWARMKV_HIREDIS_SOURCE
}

# Sets SWARMKV_TEST_BROWSER_PYTHON to a Python with the pinned Playwright,
# PyYAML and openai client (scripts/browser-requirements.txt): a virtual
# environment in the cache, made once per version of that file.
ensure_browser_python() {
  local reqs="$SWARMKV_ROOT/scripts/browser-requirements.txt" key venv
  key=$(sha256sum "$reqs" | cut -c1-16)
  venv="$SWARMKV_CACHE/venvs/browser-$key"
  if [ ! -f "$venv/.complete" ]; then
    log "installing the Python tests' packages (Playwright, PyYAML, openai, LangChain) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      --only-binary :all: --require-hashes -r "$reqs" >&2 || die "pip could not install $reqs"
    touch "$venv/.complete"
  fi
  export SWARMKV_TEST_BROWSER_PYTHON="$venv/bin/python"
}

# configure_and_build PRESET: configures (idempotent) and builds one preset.
configure_and_build() {
  local preset=$1 var val cache="$SWARMKV_ROOT/build/$1/CMakeCache.txt"
  # A preset sets the test-model cache entries from the environment; where
  # they are unset here (scripts/demo.sh), keep what the last configure of
  # this build recorded, so the main job does not switch off its model tests.
  for var in SWARMKV_TEST_MODEL SWARMKV_TEST_MODEL_GEMMA3 SWARMKV_TEST_BROWSER_PYTHON; do
    if [ -z "${!var:-}" ] && [ -f "$cache" ]; then
      val=$(sed -n "s/^$var:[A-Z]*=//p" "$cache")
      if [ -n "$val" ]; then export "$var=$val"; fi
    fi
  done
  # A build configured against another llama.cpp (an older cache key, before
  # a patch changed) would keep linking it: find_package caches llama_DIR.
  if [ -f "$cache" ] && ! grep -q "^llama_DIR:PATH=$SWARMKV_LLAMA_PREFIX/" "$cache"; then
    log "build/$preset was configured against another llama.cpp; configuring it afresh"
    rm -f "$cache"
  fi
  mkdir -p "$SWARMKV_ROOT/build"
  # ccache (CMakeLists.txt): one cache beside the others, keyed by paths
  # relative to the checkout, so that a fresh clone hits what another built.
  export CCACHE_DIR=${CCACHE_DIR:-$SWARMKV_CACHE/ccache} CCACHE_BASEDIR=$SWARMKV_ROOT CCACHE_NOHASHDIR=1
  (cd "$SWARMKV_ROOT" && cmake --preset "$preset" >"$SWARMKV_ROOT/build/configure-$preset.log" 2>&1) || {
    tail -n 30 "$SWARMKV_ROOT/build/configure-$preset.log" >&2
    die "configure failed for preset $preset (log: build/configure-$preset.log)"
  }
  (cd "$SWARMKV_ROOT" && cmake --build --preset "$preset" >&2) || die "build failed for preset $preset"
}

# setup_release: everything the main job and the benchmark need: packages,
# llama.cpp, the model (exported as SWARMKV_RUN_MODEL: $SWARMKV_MODEL or the
# fetched default) and a release build.
setup_release() {
  ensure_system_packages
  ensure_llama
  ensure_hiredis
  SWARMKV_RUN_MODEL=${SWARMKV_MODEL:-$("$SWARMKV_ROOT/scripts/fetch-model.sh" "$SWARMKV_DEFAULT_MODEL")}
  export SWARMKV_RUN_MODEL
  configure_and_build release
}
