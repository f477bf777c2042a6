#!/usr/bin/env bash
# Configures and builds helixlm in build/ (Release). Extra arguments go to the CMake configure step,
# e.g. scripts/build.sh -DHLM_SANITIZE=ON -B build-asan.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -B) build_dir="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
# The CUDA toolkit's usual home, where it is installed but not on PATH (CMake finds nvcc on PATH).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${args[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
