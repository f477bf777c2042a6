#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (unit, golden, multi-rank parity). This is the
# README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
# mpirun refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
