#!/usr/bin/env bash
# Reproduces the CPU figures of docs/benchmarks.md: `helixlm bench` on every fixture model, and the peer
# (transformers' kimi_linear on CPU, tools/bench_transformers.py) on the Kimi Linear fixtures, in one
# session on the same machine. Needs a Release build in build/ and, for the peer, torch + transformers.
#   tools/run_benchmarks.sh [context] [threads]
set -euo pipefail
cd "$(dirname "$0")/.."
context=${1:-512}
threads=${2:-1}
echo "date: $(date -u +%F)  host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores  context $context  threads $threads"
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
for dir in tests/fixtures/*/; do
  name=$(basename "$dir")
  [ -f "$dir/golden.json" ] || continue
  ./build/helixlm --log-level warn bench -m "$dir" --context "$context" --steps 64 --repeats 5 \
    --threads "$threads" --no-warmup | sed "s/^/[helixlm] $name: /"
  if [[ $name == kimi-* ]]; then
    python3 tools/bench_transformers.py -m "$dir" --context "$context" --steps 64 --repeats 5 \
      --threads "$threads" 2>/dev/null | sed "s/^/[transformers] $name: /"
  fi
done
