#!/usr/bin/env bash
# Builds the libFuzzer targets with Clang in build-fuzz/ and runs each for a bounded time (default 45 s;
# first argument overrides), starting from the committed seeds and the fixtures. A crash or sanitizer
# report fails the script and leaves the input as build-fuzz/crash-*; such an input becomes a unit test.
# Installs Clang and its libFuzzer runtime with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-45}

if ! dpkg-query -W -f='${Status}' clang libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev \
    >/dev/null
fi

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DHLM_FUZZ=ON -DHLM_BUILD_TESTS=ON -DHLM_CUDA=OFF >/dev/null
targets=(safetensors_fuzz config_fuzz index_fuzz sizes_fuzz tokenizer_fuzz json_schema_fuzz)
cmake --build build-fuzz --target "${targets[@]}" -j"$(nproc)"

run() {  # target, then libFuzzer flags and seed directories
  local target=$1
  shift
  local corpus=build-fuzz/corpus/$target
  mkdir -p "$corpus"
  echo "== $target (${seconds} s)"
  rm -f build-fuzz/crash-* build-fuzz/leak-* build-fuzz/timeout-* build-fuzz/oom-*
  # New inputs go to the first directory (the corpus); the others are read-only seeds.
  "./build-fuzz/tests/fuzz/$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
    -artifact_prefix=build-fuzz/ -print_final_stats=1 "$corpus" "$@" >build-fuzz/$target.log 2>&1 || true
  grep -E "^stat::number_of_executed_units|^SUMMARY|ERROR" "build-fuzz/$target.log" || true
  # On a finding libFuzzer writes crash-*/leak-*/timeout-*/oom-* (with the report in the log).
  local findings
  findings=$(shopt -s nullglob; echo build-fuzz/crash-* build-fuzz/leak-* build-fuzz/timeout-* build-fuzz/oom-*)
  if [ -n "$findings" ]; then
    grep -A30 -E "^==[0-9]+==|terminate called|deadly signal" "build-fuzz/$target.log" | head -60 >&2
    echo "fuzz: $target found a failing input: $findings" >&2
    exit 1
  fi
}

run safetensors_fuzz -dict=tests/fuzz/safetensors.dict
run config_fuzz tests/fixtures/configs
run index_fuzz -dict=tests/fuzz/index.dict tests/fuzz/seeds/index
run sizes_fuzz
run tokenizer_fuzz
run json_schema_fuzz -dict=tests/fuzz/json_schema.dict tests/fuzz/seeds/json_schema
