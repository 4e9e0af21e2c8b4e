#!/usr/bin/env bash
# `cmake --install` gives a swarmkv that runs from its prefix alone: the
# llama.cpp libraries beside it (lib/), found through a relative RUNPATH, none
# of them from the build's cache, and the prefix may move.
#
#   install_test.sh BUILD_DIR LLAMA_PREFIX
set -euo pipefail
build=$1 llama_prefix=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
bin=$tmp/prefix/bin/swarmkv
[ -x "$bin" ] || { echo "no bin/swarmkv under the prefix"; exit 1; }
runpath=$(readelf -d "$bin" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
[ "$runpath" = '$ORIGIN/../lib' ] || { echo "RUNPATH is '$runpath', want \$ORIGIN/../lib"; exit 1; }
for lib in libllama.so.0 libggml.so.0 libggml-base.so.0 libggml-cpu.so.0; do
  [ -e "$tmp/prefix/lib/$lib" ] || { echo "the prefix lacks lib/$lib"; exit 1; }
done
# Moved elsewhere, with no library path from the environment.
mv "$tmp/prefix" "$tmp/moved"
bin=$tmp/moved/bin/swarmkv
deps=$(env -u LD_LIBRARY_PATH ldd "$bin")
if grep -q "not found" <<<"$deps"; then echo "unresolved libraries:"; echo "$deps"; exit 1; fi
for lib in libllama.so.0 libggml.so.0 libggml-base.so.0 libggml-cpu.so.0; do
  grep -qE "$lib => $tmp/moved/(bin/\.\./)?lib/$lib " <<<"$deps" ||
    { echo "$lib does not resolve inside the prefix:"; echo "$deps"; exit 1; }
done
if grep -qF "$llama_prefix" <<<"$deps"; then
  echo "a library still comes from the build's llama.cpp ($llama_prefix):"; echo "$deps"; exit 1
fi
out=$(env -u LD_LIBRARY_PATH "$bin" --version)
grep -q '^swarmkv [0-9]' <<<"$out" || { echo "--version printed: $out"; exit 1; }
echo "ok: $out"
