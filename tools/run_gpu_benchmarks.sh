#!/usr/bin/env bash
# The measurements of the Helix-on-GPUs issue on one host with 2 GPUs, one JSON line per run (a failed run
# prints `failed: ...` and the rest go on), for docs/benchmarks.md:
#  1. GPU collectives: peer memory (LL16) against NCCL, eager and in CUDA graphs, 4 KB - 8 MB.
#  2. Kimi-Linear-48B-A3B with random weights, decode at 4K, 128K and 1M tokens of context, batch 1 and 8:
#     (a) one GPU, (b) 2 GPUs tp 1 · cp 2 with experts EP (default) and split (--moe-tp 2), (c) tp 2 · cp 1.
#  3. The compute/communication split of (b) at 128K (eager decode steps).
# Needs a CUDA build in build-gpu/ (scripts/test_gpu.sh makes one).
#   tools/run_gpu_benchmarks.sh [steps] [repeats]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${HLM_BIN:-build-gpu/helixlm}
steps=${1:-32}
repeats=${2:-3}
config=tests/fixtures/configs/kimi-linear-48b-a3b.json
mpirun2="mpirun --allow-run-as-root -np 2 --bind-to none -x NCCL_NVLS_ENABLE=0"
export NCCL_NVLS_ENABLE=0
echo "date: $(date -u +%F)  GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | paste -sd, -)"

run() {  # label, command...
  local label=$1
  shift
  local out
  if out=$("$@" 2>/tmp/hlm_bench_err.txt); then
    echo "$out" | sed "s/^/[$label] /"
  else
    echo "[$label] failed: $(tail -3 /tmp/hlm_bench_err.txt | tr '\n' ' ')"
  fi
}

run comm $mpirun2 "$bin" --log-level warn bench-comm --json

common=(--log-level warn bench --device cuda --config "$config" --random-weights --steps "$steps" --repeats "$repeats"
        --prefill-tokens 0 --json)
for batch in 1 8; do
  for context in 4096 131072 1048576; do
    args=("${common[@]}" --batch "$batch" --context "$context")
    run "a 1gpu b$batch c$context" "$bin" "${args[@]}"
    run "b cp2 ep b$batch c$context" $mpirun2 "$bin" "${args[@]}" --tp 1 --cp 2
    run "b cp2 moe-tp2 b$batch c$context" $mpirun2 "$bin" "${args[@]}" --tp 1 --cp 2 --moe-tp 2
    run "c tp2 b$batch c$context" $mpirun2 "$bin" "${args[@]}" --tp 2 --cp 1
  done
done
run "split cp2 b1 c131072" $mpirun2 "$bin" "${common[@]}" --batch 1 --context 131072 --tp 1 --cp 2 --no-cuda-graphs
