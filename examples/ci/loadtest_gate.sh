#!/usr/bin/env bash
# A load-test regression gate for CI: start the server under test, run a bounded load, compare with the stored
# baseline and fail the job on a significant regression beyond the thresholds (capacity exits 3).
#
#   SERVER_CMD="vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000" MODEL=meta-llama/Llama-3.1-8B-Instruct \
#     bash examples/ci/loadtest_gate.sh
#
# First run (no baseline yet) writes one: commit it (ci/baseline.json) after a review, like any parameter change.
set -euo pipefail
: "${SERVER_CMD:?the command that starts the server, e.g. vllm serve MODEL --port 8000}"
: "${MODEL:?the model name the server expects}"
URL=${URL:-http://127.0.0.1:8000}
BASELINE=${BASELINE:-ci/baseline.json}
RULES=${RULES:-p95_ttft:+10%,p99_tpot:+10%,throughput:-5%}
LOAD=(--url "$URL" --model "$MODEL" --rate "${RATE:-4}" --requests "${REQUESTS:-200}"
      --input-len "${INPUT_LEN:-1024}" --output-len "${OUTPUT_LEN:-128}" --seed 0 --max-duration-s 600)

$SERVER_CMD > server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do  # up to 10 minutes for weights and graphs
  curl -sf "$URL/health" > /dev/null && break
  kill -0 $server 2>/dev/null || { echo "server exited; see server.log" >&2; exit 1; }
  sleep 2
done
curl -sf "$URL/health" > /dev/null || { echo "server did not become healthy" >&2; exit 1; }

if [ ! -f "$BASELINE" ]; then
  mkdir -p "$(dirname "$BASELINE")"
  capacity loadtest "${LOAD[@]}" --out "$BASELINE"
  echo "wrote the baseline $BASELINE: review and commit it"
  exit 0
fi
capacity loadtest "${LOAD[@]}" --out run.json --force --baseline "$BASELINE" --fail-on "$RULES"
