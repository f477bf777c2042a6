#!/usr/bin/env bash
# with_gpus.sh N COMMAND...: runs COMMAND when at least N GPUs are visible (CUDA_VISIBLE_DEVICES counts when
# set), else says why and exits 77, which CTest reports as a skipped test (SKIP_RETURN_CODE).
set -euo pipefail
need=$1
shift
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  have=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
else
  have=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
fi
if [ "$have" -lt "$need" ]; then
  echo "skipped: needs $need GPUs, $have visible"
  exit 77
fi
exec "$@"
