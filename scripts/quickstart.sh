#!/usr/bin/env bash
# The README's Quickstart serve line, run exactly as written, as a new user would: on an empty home
# directory (no ~/.cache/tgictl, no Hugging Face cache, no pip cache) in a virtual environment holding
# only what that line installs. Then /health, the README's two curl requests, SIGTERM, exit code 0
# and no tgictl process left behind.
#
#   scripts/quickstart.sh            # from the repository root of a clean clone (CI does this)
#
# The line creates .venv in the current directory, as the README says; run it on a clone whose .venv
# does not exist yet, or the check proves less than it claims.
set -euo pipefail
cd "$(dirname "$0")/.."

START_TIMEOUT_S="${QUICKSTART_START_TIMEOUT_S:-900}"  # pip downloads + the first GGUF conversion
WORK="$(mktemp -d /tmp/tgictl-quickstart.XXXXXX)"
LOG="$WORK/serve.log"
SERVE_PID=""

# The README's first ```bash block of the Quickstart is the serve line; its curl lines follow it.
SERVE_LINE="$(awk '/^## Quickstart/{q=1} q && /^```bash/{getline; print; exit}' README.md)"
[[ "$SERVE_LINE" == *"tgictl launch"* ]] || { echo "quickstart: no serve line found in README.md" >&2; exit 1; }
mapfile -t CURLS < <(awk '/^## /{q=0} /^## Quickstart/{q=1} q && /^curl /' README.md)
[ "${#CURLS[@]}" -ge 2 ] || { echo "quickstart: expected the README's curl requests" >&2; exit 1; }

fail() {
    echo "quickstart: FAILED: $*" >&2
    if [ -f "$LOG" ]; then echo "--- last 60 lines of the serve line's output ---" >&2; tail -n 60 "$LOG" >&2; fi
    if [ -n "$SERVE_PID" ]; then
        pkill -TERM -f 'tgictl launch' -s "$SERVE_PID" 2>/dev/null || true
        sleep 10
        pkill -KILL -s "$SERVE_PID" 2>/dev/null || true
    fi
    exit 1
}
trap 'rm -rf "$WORK"' EXIT

mkdir "$WORK/home"
echo "quickstart: running the README's serve line with HOME=$WORK/home"
echo "  $SERVE_LINE"
# Its own process group and session, so the launch and every child can be found and stopped.
env -u HF_HOME -u HF_HUB_CACHE -u XDG_CACHE_HOME -u PIP_CACHE_DIR -u VIRTUAL_ENV HOME="$WORK/home" \
    setsid bash -c "$SERVE_LINE" >"$LOG" 2>&1 &
SERVE_PID=$!

deadline=$((SECONDS + START_TIMEOUT_S))
until curl -sf 127.0.0.1:8080/health >/dev/null 2>&1; do
    kill -0 "$SERVE_PID" 2>/dev/null || fail "the serve line exited before /health answered 200"
    [ "$SECONDS" -lt "$deadline" ] || fail "/health not 200 after ${START_TIMEOUT_S} s"
    sleep 1
done
echo "quickstart: healthy after ${SECONDS} s"

for line in "${CURLS[@]}"; do
    # -f: an HTTP error fails the check; the README's own arguments follow unchanged.
    body="$(bash -c "curl -sS -f ${line#curl }")" || fail "$line"
    python3 -c 'import json, sys; json.loads(sys.argv[1])' "$body" || fail "not JSON: $body"
    echo "quickstart: ok: ${line:0:60}... -> ${body:0:120}"
done

# setsid made the serve line's shell a session leader: its session holds the launch.
LAUNCH_PID="$(pgrep -s "$SERVE_PID" -f 'tgictl launch' | head -n 1)"
[ -n "$LAUNCH_PID" ] || fail "no 'tgictl launch' process in the serve line's session"
# The launcher starts each child in a session of its own: find them as its descendants.
descendants() { local pid; for pid in $(pgrep -P "$1"); do echo "$pid"; descendants "$pid"; done; }
CHILDREN="$(descendants "$LAUNCH_PID")"
[ "$(echo "$CHILDREN" | wc -w)" -ge 2 ] || fail "expected a shard and a router under the launcher, found: $CHILDREN"
kill -TERM "$LAUNCH_PID"
status=0
wait "$SERVE_PID" || status=$?
[ "$status" -eq 0 ] || fail "the serve line exited with $status after SIGTERM"
left="$(pgrep -s "$SERVE_PID" || true)"
for pid in $CHILDREN; do if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi; done
session="$SERVE_PID"; SERVE_PID=""
[ -z "$left" ] || fail "processes of the serve line still running: $left"
echo "quickstart: OK (serve line exit 0 after SIGTERM; nothing left of session $session nor of its children $(echo $CHILDREN))"
