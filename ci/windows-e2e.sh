#!/usr/bin/env bash
# End-to-end Windows scenarios under Wine, driven from Linux. Both sides are Windows processes:
# Wine has its own pids, so `planned-stop.exe stop` must run under Wine too. Called by ci/windows.sh
# (which sets WINEPREFIX and builds the binaries); fails on the first scenario that goes wrong.
set -euo pipefail
cd "$(dirname "$0")/.."

WINE=${WINE:-/usr/lib/wine/wine64}
EXE=target/x86_64-pc-windows-gnu/debug/planned-stop.exe
HOLD=target/x86_64-pc-windows-gnu/hold.exe
x86_64-w64-mingw32-gcc -O2 -o "$HOLD" ci/hold.c
# Wine's services must already run, detached: started by the `$(...)` below they would hold its
# pipe open and hang the script.
"$WINE" wineboot </dev/null >/dev/null 2>&1

work=$(mktemp -d)
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; echo "--- serve stdout"; cat "$work/out" 2>/dev/null || true; echo "--- serve stderr"; tail -n 30 "$work/err" 2>/dev/null || true; exit 1; }

# Starts `serve` under Wine in $work/run; sets serve_pid (the Linux pid of wine) and win_pid,
# win_start (the Windows pid and start fingerprint from the ready event).
start_serve() {
  rm -rf "$work/run" "$work/out" "$work/err"
  RUST_LOG="planned_stop::watcher=trace,warn" "$WINE" "$EXE" serve --dir "$work/run" --state "$work/state" \
    --poll-ms 50 "$@" >"$work/out" 2>"$work/err" &
  serve_pid=$!
  for _ in $(seq 1 300); do
    grep -q '"event":"ready"' "$work/out" 2>/dev/null && break
    sleep 0.1
  done
  grep -q '"event":"ready"' "$work/out" || fail "serve never became ready"
  win_pid=$(grep -o '"pid":[0-9]*' "$work/out" | head -n 1 | cut -d: -f2)
  win_start=$(grep -o '"start":[0-9]*' "$work/out" | head -n 1 | cut -d: -f2)
}

# Waits for serve to exit; sets serve_code.
wait_serve() {
  set +e
  wait "$serve_pid"
  serve_code=$?
  set -e
  serve_pid=""
}

running() { kill -0 "$serve_pid" 2>/dev/null; }

# Counts the watcher's probes with the given verdict so far.
probes() { grep -c "marker probed.*verdict=\"$1\"" "$work/err" 2>/dev/null || true; }

wait_probes() { # KIND N
  local target=$(( $(probes "$1") + $2 ))
  for _ in $(seq 1 300); do
    [ "$(probes "$1")" -ge "$target" ] && return 0
    sleep 0.05
  done
  fail "fewer than $2 '$1' probes"
}

wait_gone() { # PATH: the watcher removed it (after judging it)
  for _ in $(seq 1 300); do
    [ -e "$1" ] || return 0
    sleep 0.05
  done
  fail "$1 was not removed"
}

echo "== 1. planned-stop.exe stop --wait stops planned-stop.exe serve: exit 0, planned"
start_serve --jobs 1 --job-ms 60000 --drain-ms 300
report=$("$WINE" "$EXE" stop --pid "$win_pid" --dir "$work/run" --wait 30 --json) || fail "stop exited $?: $report"
echo "   $report"
echo "$report" | grep -q '"outcome":"stopped_planned"' || fail "not stopped_planned: $report"
wait_serve
[ "$serve_code" = 0 ] || fail "serve exited $serve_code"
grep -q '"event":"exit".*"verdict":"planned"' "$work/out" || fail "no planned exit event"
echo "   ok: exit 0, planned"

echo "== 2. SIGINT to the Wine process reaches ctrl_c: exit 0, planned"
start_serve
kill -INT "$serve_pid"
wait_serve
[ "$serve_code" = 0 ] || fail "serve exited $serve_code after SIGINT"
grep -q '"signal":"interrupt"' "$work/out" || fail "the stop was not classified as Ctrl-C"
echo "   ok"

echo "== 3. hostile markers are ignored; the service keeps running"
start_serve
slot="$work/run/planned-stop-$win_pid.json"
# Each marker is written to a temporary file and renamed into place, as a stopper does, so the
# watcher never sees half of one. The probe count is taken before the write: the watcher may judge
# the file before this script looks.
put_expecting() { # KIND FORMAT ARGS...
  local kind=$1 before
  shift
  before=$(probes "$kind")
  printf "$@" >"$work/staging"
  mv "$work/staging" "$slot"
  for _ in $(seq 1 300); do
    [ "$(probes "$kind")" -gt "$before" ] && break
    sleep 0.05
  done
  [ "$(probes "$kind")" -gt "$before" ] || fail "no '$kind' probe"
  wait_gone "$slot"
}
put_expecting malformed '{"target_pid": true, "written_at": "2026-01-01T00:00:00Z"}'
put_expecting stale '{"target_pid":%s,"target_start_time":%s,"written_at":"%s"}' \
  "$win_pid" "$((win_start - 1))" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
put_expecting stale '{"target_pid":%s,"target_start_time":%s,"written_at":"2099-01-01T00:00:00Z"}' \
  "$win_pid" "$win_start"
wait_probes absent 3
running || fail "the service stopped on a hostile marker"
grep -q stop_accepted "$work/out" && fail "a hostile marker was accepted"
"$WINE" "$EXE" stop --pid "$win_pid" --dir "$work/run" --wait 30 >/dev/null || fail "the final stop failed"
wait_serve
[ "$serve_code" = 0 ] || fail "serve exited $serve_code"
echo "   ok: malformed, earlier-incarnation and future markers removed, still running, then stopped"

echo "== 4. the marker held open by another Wine process while the runner claims it"
start_serve
printf '{"target_pid":%s,"target_start_time":%s,"written_at":"%s","request_id":"held"}' \
  "$win_pid" "$win_start" "$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)" >"$work/marker.json"
win_slot=$("$WINE" winepath -w "$work/run/planned-stop-$win_pid.json" 2>/dev/null)
win_content=$("$WINE" winepath -w "$work/marker.json" 2>/dev/null)
# Held for 3 s, far longer than the claim's retries: the claim must fail loudly, never see "absent".
"$WINE" "$HOLD" "$win_slot" 3000 "$win_content" >"$work/hold.out" &
hold_pid=$!
wait_serve
wait "$hold_pid" || fail "hold.exe failed"
[ "$serve_code" = 0 ] || fail "serve exited $serve_code"
grep -q '"request_id":"held"' "$work/out" || fail "the held marker was not the one acted on"
grep -q "cannot claim the planned-stop marker" "$work/err" || fail "no claim error was reported"
grep -qi "sharing violation" "$work/err" || fail "the claim error is not the sharing violation"
echo "   ok: probe read it (shared read), claim retried and reported the sharing violation, stop planned"

echo "windows e2e: 4 scenarios passed"
