#!/usr/bin/env bash
# The whole test suite, with all of its own set-up (idempotent, cached):
# Debian packages (chromium too, for the run pages' browser tests, and an
# aarch64 cross compiler with qemu-user for the kernel's ARM path), the
# pinned llama.cpp, hiredis, the browser tests' Python packages, both test
# models, then for each preset (release, asan, tsan) a build and a CTest run.
#
#   scripts/test.sh                 everything (what CI runs)
#   SWARMKV_PRESETS="release" scripts/test.sh     only some presets
#   SWARMKV_CTEST_ARGS="-L unit" scripts/test.sh  extra ctest arguments
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(date +%s)
ensure_system_packages "${SWARMKV_TEST_APT_PACKAGES[@]}"
ensure_llama
ensure_hiredis
ensure_browser_python
SWARMKV_TEST_MODEL=$("$SWARMKV_ROOT/scripts/fetch-model.sh" "$SWARMKV_DEFAULT_MODEL")
SWARMKV_TEST_MODEL_GEMMA3=$("$SWARMKV_ROOT/scripts/fetch-model.sh" gemma3)
export SWARMKV_TEST_MODEL SWARMKV_TEST_MODEL_GEMMA3
log "set-up done in $(($(date +%s) - t0)) s (llama.cpp: $SWARMKV_LLAMA_PREFIX)"

# The house style is checked, not hoped for.
mapfile -t sources < <(cd "$SWARMKV_ROOT" && git ls-files '*.h' '*.cpp' 2>/dev/null || true)
if [ ${#sources[@]} -gt 0 ]; then
  (cd "$SWARMKV_ROOT" && clang-format --dry-run -Werror "${sources[@]}") ||
    die "clang-format: the files above differ from .clang-format (fix: clang-format -i <file>)"
fi

read -r -a presets <<<"${SWARMKV_PRESETS:-release asan tsan}"
read -r -a extra <<<"${SWARMKV_CTEST_ARGS:-}"
for preset in "${presets[@]}"; do
  t=$(date +%s)
  log "preset $preset: build"
  configure_and_build "$preset"
  log "preset $preset: test"
  (cd "$SWARMKV_ROOT" && ctest --preset "$preset" -j 2 "${extra[@]}") || die "tests failed in preset $preset"
  log "preset $preset: passed in $(($(date +%s) - t)) s"
done
log "all presets passed (${presets[*]}) in $(($(date +%s) - t0)) s"
