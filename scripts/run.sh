#!/usr/bin/env bash
# Installs dependencies, builds, and runs `helixlm generate` on the bundled tiny model. This is the
# README's run command. Extra arguments are passed to `helixlm generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
if [ $# -eq 0 ]; then set -- --prompt-ids 5,17,300 -n 24; fi
./build/helixlm generate -m models/kimi-linear-tiny "$@"
