#!/usr/bin/env bash
# Builds helixlm with the CUDA backend in build-gpu/ and runs the GPU tests (CTest label `gpu`): every
# CUDA op against the CPU reference, every fixture end to end against the transformers / K3-reference
# goldens through the CUDA backend, and CUDA-graph decode against eager decode; with 2 or more GPUs also
# the GPU collectives against NCCL, Helix parity on 2 GPUs (tp1·cp2, tp2·cp1) and failing ranks under
# mpirun (skipped, and listed as skipped, with fewer GPUs). Prints a summary. Run it on a machine with
# NVIDIA Hopper GPUs (sm_90a). HLM_NO_APT=1 skips the package installation (a machine
# without a package mirror that already has the build dependencies); HLM_SKIP_BUILD=1 reuses the build.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${HLM_BUILD_DIR:-build-gpu}
log="$build/test_gpu.log"
if [ "${HLM_SKIP_BUILD:-0}" != 1 ]; then
  if [ "${HLM_NO_APT:-0}" != 1 ]; then scripts/install_deps.sh; fi
  scripts/build.sh -B "$build" -DHLM_CUDA=ON
fi
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  echo "test_gpu.sh: no NVIDIA GPU is visible on this machine" >&2
  exit 1
fi
mkdir -p "$build"
set +e
# One test binary at a time: each takes a share of the GPU's memory. Verbose, so the per-fixture lines
# of the passing tests reach the log (and the summary below).
ctest --test-dir "$build" -L gpu --verbose -j1 --timeout 1800 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo
echo "== GPU test summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
grep -E '^([0-9]+: )?\[(cuda golden|gpu helix|gpu layer split)\]' "$log" | sed 's/^/  /' || true
grep -E '^([0-9]+: )?\[  (PASSED|FAILED|SKIPPED) +\]|tests passed|tests failed|Skipped' "$log" | sed 's/^/  /' || true
exit "$status"
