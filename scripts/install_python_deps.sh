#!/usr/bin/env bash
# Installs the Python packages of the reference tools (tools/k3_reference.py, make_golden.py,
# bench_transformers.py and their self-test) at the versions the fixtures and docs were made with. PyPI's
# torch wheel pulls NVIDIA's CUDA libraries (about 3 GB; torch will not import without them), the only
# torch build this machine's package index serves. Skips pip when the pinned versions are already there.
set -euo pipefail
torch_version=2.15.0
transformers_version=5.24.0
if python3 - "$torch_version" "$transformers_version" <<'PY' 2>/dev/null; then exit 0; fi
import sys
import numpy, safetensors, torch, transformers
assert torch.__version__.split("+")[0] == sys.argv[1] and transformers.__version__ == sys.argv[2]
PY
echo "installing torch $torch_version, transformers $transformers_version" >&2
python3 -m pip install -q --disable-pip-version-check "torch==$torch_version" \
  "transformers==$transformers_version" numpy safetensors
