#!/usr/bin/env bash
# Smoke test of a serving deployment, as an operator would run it:
#   tgictl launch on a tiny random model → /health 200 → one /generate → one /v1/chat/completions
#   → SIGTERM → exit code 0, no tgictl process and no socket file left.
# Exits non-zero (printing the launcher's log) if any step fails.
#
#   scripts/smoke.sh                  # one shard
#   scripts/smoke.sh --num-shard 2    # tensor parallel (gloo on CPU)
#
# Needs only python3 with tgictl importable (pip install -e ., or run from the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
NUM_SHARD=1
if [ "${1:-}" = "--num-shard" ]; then NUM_SHARD="${2:?--num-shard needs a number}"; fi
START_TIMEOUT_S=180

WORK="$(mktemp -d /tmp/tgictl-smoke.XXXXXX)"
LOG="$WORK/launch.log"
LAUNCHER_PID=""
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1  # a local model: no reason to contact the hub

fail() {
    echo "smoke: FAILED: $*" >&2
    if [ -f "$LOG" ]; then echo "--- launcher log ---" >&2; cat "$LOG" >&2; fi
    if [ -n "$LAUNCHER_PID" ] && kill -0 "$LAUNCHER_PID" 2>/dev/null; then
        kill -INT "$LAUNCHER_PID" 2>/dev/null || true
        sleep 5
        kill -KILL "$LAUNCHER_PID" 2>/dev/null || true
    fi
    exit 1
}
trap 'rm -rf "$WORK"' EXIT
trap 'fail "interrupted"' INT TERM

# Stdlib-only HTTP so the script needs nothing beyond python3.
http() {  # http METHOD PATH [JSON_BODY] → prints the body; fails on a non-200 answer
    "$PYTHON" - "$PORT" "$@" <<'EOF'
import sys, urllib.request
port, method, path = sys.argv[1:4]
body = sys.argv[4].encode() if len(sys.argv) > 4 else None
req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=60) as response:
    if response.status != 200:
        sys.exit(f"{method} {path}: HTTP {response.status}")
    print(response.read().decode())
EOF
}

# The interpreter first: outside the venv the real cause (No module named torch) must be what we say.
if ! MISSING="$("$PYTHON" -c 'import torch, tgictl' 2>&1)"; then
    echo "smoke: FAILED: $PYTHON cannot run tgictl: $(printf '%s\n' "$MISSING" | tail -n 1)" >&2
    echo "smoke: run it with the virtual environment's python: PYTHON=.venv/bin/python $0 (or activate it)" >&2
    exit 1
fi

echo "smoke: making a tiny model in $WORK/model"
"$PYTHON" scripts/make_tiny_model.py "$WORK/model" >/dev/null 2>"$WORK/make_tiny_model.err" \
    || fail "make_tiny_model.py: $(tail -n 3 "$WORK/make_tiny_model.err")"
PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
SOCKETS="$WORK/sockets"

echo "smoke: tgictl launch --num-shard $NUM_SHARD on port $PORT"
OMP_NUM_THREADS=1 "$PYTHON" -m tgictl --json-output launch --model-id "$WORK/model" --num-shard "$NUM_SHARD" \
    --port "$PORT" --shard-uds-path "$SOCKETS/s" --kv-cache-memory 8MiB --max-total-tokens 512 \
    --graceful-termination-timeout 10 >"$LOG" 2>&1 &
LAUNCHER_PID=$!

deadline=$((SECONDS + START_TIMEOUT_S))
until http GET /health >/dev/null 2>&1; do
    kill -0 "$LAUNCHER_PID" 2>/dev/null || fail "the launcher exited before /health answered 200"
    [ "$SECONDS" -lt "$deadline" ] || fail "/health not 200 after ${START_TIMEOUT_S} s"
    sleep 0.5
done
echo "smoke: healthy"

GENERATE="$(http POST /generate '{"inputs": "hello world", "parameters": {"max_new_tokens": 8}}')" \
    || fail "/generate"
"$PYTHON" -c 'import json, sys; t = json.loads(sys.argv[1])["generated_text"]; assert isinstance(t, str), t' \
    "$GENERATE" || fail "/generate answered $GENERATE"
echo "smoke: /generate ok"

CHAT="$(http POST /v1/chat/completions \
    '{"model": "tgi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}')" \
    || fail "/v1/chat/completions"
"$PYTHON" -c '
import json, sys
choice = json.loads(sys.argv[1])["choices"][0]
assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("length", "stop"), choice
' "$CHAT" || fail "/v1/chat/completions answered $CHAT"
echo "smoke: /v1/chat/completions ok"

kill -TERM "$LAUNCHER_PID"
status=0
wait "$LAUNCHER_PID" || status=$?
LAUNCHER_PID=""
[ "$status" -eq 0 ] || fail "the launcher exited with $status after SIGTERM"

# The children the launcher logged ("started shard 0: pid N") must all be gone.
CHILD_PIDS="$("$PYTHON" -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        record = json.loads(line)
    except ValueError:
        continue
    if isinstance(record, dict) and str(record.get("message", "")).startswith("started ") and "child_pid" in record:
        print(record["child_pid"])
' "$LOG")"
[ "$(echo "$CHILD_PIDS" | wc -w)" -eq $((NUM_SHARD + 1)) ] || fail "expected $((NUM_SHARD + 1)) children in the log"
for pid in $CHILD_PIDS; do
    if kill -0 "$pid" 2>/dev/null; then fail "child pid $pid is still running"; fi
done
if [ -n "$(ls -A "$SOCKETS" 2>/dev/null)" ]; then fail "files left in $SOCKETS: $(ls -A "$SOCKETS")"; fi
if pgrep -f "tgictl .*$WORK" >/dev/null 2>&1; then fail "a tgictl process for $WORK is still running"; fi
echo "smoke: OK (exit 0, $((NUM_SHARD + 1)) children gone, no socket left)"
