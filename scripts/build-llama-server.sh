#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only) into DEST (default .venv/bin/llama-server).
#
# CI reaches package registries only (no GitHub), so the source is the llama.cpp that
# llama-cpp-python's sdist on PyPI vendors (vendor/llama.cpp: tools/server with its
# vendored cpp-httplib and in-tree web UI asset); `pip download` fetches it (and pip's
# cache keeps it). Only the `llama-server` target is built (ggml, llama, common, mtmd,
# the server), statically linked, with the cheapest flags: no native tuning (the binary
# runs on any x86-64 with AVX2 as ggml's defaults build it), no BLAS, OpenMP or libcurl.
#
# One patch (`patch_backend_search`, from llama.cpp's upstream fix, PR 17653): the
# backend search at start-up stats the binary's directory and the working directory,
# and this version aborts (an uncaught filesystem_error) on any path it may not stat. A
# deployed replica runs as the node's task user, in a work directory under the node's
# 0700 state dir, often beside files it may not stat (.venv/bin/python3 -> /root/...):
# the patched search skips what it cannot see, as upstream does now.
#
# The binary is cached under ~/.cache/populi (keyed by version, flags and patch): a
# rebuild with the same version, flags and patch is a copy. Usage:
#   PY=.venv/bin/python scripts/build-llama-server.sh [DEST]
# Env: CMAKE_BUILD_PARALLEL_LEVEL (default 2), POPULI_CACHE (default ~/.cache/populi).
set -euo pipefail
PY=${PY:-.venv/bin/python}
DEST=${1:-.venv/bin/llama-server}
# The llama-cpp-python release whose vendored llama.cpp is built (its build b6xxx).
VERSION=0.3.16
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
  -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON)
# Bump when the patch below changes (the cache key includes it).
PATCH=backend-search-1
key=$(printf '%s %s %s' "$VERSION" "${FLAGS[*]}" "$PATCH" | sha256sum | cut -c1-12)
cache=${POPULI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/populi}/llama-server-$VERSION-$key
cached=$cache/llama-server

install_cached() {
  mkdir -p "$(dirname "$DEST")"
  install -m 755 "$cached" "$DEST.tmp" && mv -f "$DEST.tmp" "$DEST"
  echo "engine: $DEST ($("$DEST" --version 2>&1 | grep -m1 version || true))"
}

if [ -x "$cached" ] && "$cached" --version >/dev/null 2>&1; then
  install_cached
  exit 0
fi
for tool in cmake g++; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "engine: $tool is missing: run \`make sysdeps\` as root, or install it" >&2
    exit 1
  }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "engine: building llama-server from llama-cpp-python $VERSION's llama.cpp (minutes)"
started=$(date +%s)
"$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
top=llama_cpp_python-$VERSION
tar -xzf "$work/$top.tar.gz" -C "$work" "$top/vendor/llama.cpp"
src=$work/$top/vendor/llama.cpp
patch_backend_search() {  # error codes instead of exceptions, as upstream (PR 17653)
  local reg=$src/ggml/src/ggml-backend-reg.cpp
  sed -i \
    -e 's/if (!fs::exists(search_path)) {/std::error_code ec;\n        if (!fs::exists(search_path, ec)) {/' \
    -e 's/if (entry.is_regular_file()) {/std::error_code entry_ec;\n            if (entry.is_regular_file(entry_ec)) {/' \
    -e 's/if (fs::exists(path)) {/std::error_code path_ec;\n            if (fs::exists(path, path_ec)) {/' \
    "$reg"
  [ "$(grep -c -e 'search_path, ec)' -e 'is_regular_file(entry_ec)' -e 'path, path_ec)' "$reg")" = 3 ] || {
    echo "engine: the backend-search patch no longer applies to $reg" >&2
    exit 1
  }
}
patch_backend_search
nice -n 10 cmake -S "$src" -B "$work/build" "${FLAGS[@]}" >"$work/configure.log" 2>&1 || {
  tail -30 "$work/configure.log" >&2
  exit 1
}
nice -n 10 cmake --build "$work/build" --target llama-server \
  -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >"$work/build.log" 2>&1 || {
  tail -30 "$work/build.log" >&2
  exit 1
}
mkdir -p "$cache"
install -m 755 "$work/build/bin/llama-server" "$cached.tmp" && mv -f "$cached.tmp" "$cached"
echo "engine: built in $(($(date +%s) - started)) s; cached in $cache"
install_cached
