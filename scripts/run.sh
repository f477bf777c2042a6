#!/usr/bin/env bash
# The README's run command: installs dependencies, builds, starts `helixlm serve` on the bundled tiny
# model, sends it one chat request with curl, prints the answer and stops the server. Extra arguments go
# to `helixlm serve` (e.g. scripts/run.sh --max-num-seqs 4).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
./build/helixlm serve -m models/kimi-linear-tiny --served-model-name kimi-linear-tiny --port "$port" "$@" \
  >"$log" 2>&1 &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT

for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
grep -m1 "serving" "$log" || true

request='{"model": "kimi-linear-tiny", "messages": [{"role": "user", "content": "Hello! Who are you?"}],
          "max_tokens": 24, "temperature": 0}'
echo "> POST /v1/chat/completions $request"
response=$(curl -sS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "$request")
echo "< $response"
python3 -c 'import json, sys; r = json.loads(sys.argv[1]); print("answer:", repr(r["choices"][0]["message"]["content"]))' \
  "$response"
