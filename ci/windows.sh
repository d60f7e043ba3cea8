#!/usr/bin/env bash
# Build, lint and test the Windows target (x86_64-pc-windows-gnu) under Wine, on this Linux machine.
# Called by .ci/run; `just windows` runs it alone.
#
# Installs what is missing (mingw-w64 and Wine 8 from Debian, the Rust target), prepares a Wine
# prefix once, and keeps one wineserver running for the whole job so each test process starts fast.
# If the tools cannot be downloaded at all it says so loudly and skips; any build or test failure
# fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-pc-windows-gnu
export WINE=/usr/lib/wine/wine64          # Debian puts it here, not on PATH
WINESERVER=/usr/lib/wine/wineserver

skip() {
  echo
  echo "!!!!!!!!!! SKIPPING THE WINDOWS CHECKS: $* !!!!!!!!!!"
  echo
  exit 0
}

if ! command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || [ ! -x "$WINE" ]; then
  echo "== installing mingw-w64 and wine64"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      gcc-mingw-w64-x86-64-win32 wine64 >/dev/null; } \
    || skip "cannot install gcc-mingw-w64-x86-64-win32 and wine64"
fi
if ! rustup target list --installed | grep -qx "$TARGET"; then
  echo "== rustup target add $TARGET"
  rustup target add "$TARGET" || skip "cannot download the Rust target $TARGET"
fi

export WINEPREFIX="${WINEPREFIX:-$HOME/.cache/planned-stop/wine-prefix}"
export WINEDEBUG=-all
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  echo "== creating the Wine prefix $WINEPREFIX"
  mkdir -p "$WINEPREFIX"
  "$WINE" wineboot -i >/dev/null 2>&1
  "$WINESERVER" -w
fi
# Wine 8.0 has no bcryptprimitives.dll, whose ProcessPrng every Rust >= 1.78 Windows binary imports
# (without it every .exe exits 53 before main): put a stand-in into the prefix.
x86_64-w64-mingw32-gcc -shared -O2 -o "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" \
  ci/bcryptprimitives.c ci/bcryptprimitives.def -ladvapi32
# A wineserver an earlier run left for this prefix (interrupted, or a developer's own) would make
# the persistent one below refuse to start: end it first.
"$WINESERVER" -k 2>/dev/null || true
"$WINESERVER" -w 2>/dev/null || true
"$WINESERVER" -p
trap '"$WINESERVER" -k 2>/dev/null || true' EXIT
# Start Wine's own services now, detached from this script's output: started later by a test
# process they would inherit (and hold open) whatever pipe that process writes to.
"$WINE" wineboot </dev/null >/dev/null 2>&1

echo "== cargo clippy --target $TARGET --all-targets -- -D warnings"
cargo clippy --target "$TARGET" --all-targets -- -D warnings
echo "== cargo test --target $TARGET (under Wine)"
# The record store's conformance suite runs 1,000 cases on Linux; under Wine each file operation
# costs about forty times as much (7 minutes for 1,000), so 100 cases check the Windows file store.
# The model checker's full bounded runs check pure decision code that is the same on every OS;
# they run on Linux (its injected-defect runs, which are short, run here too).
PLANNED_STOP_RECORD_CASES=100 CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER="$WINE" cargo test --target "$TARGET" \
  -- --skip holds_over_every_bounded_interleaving
echo "== Windows end-to-end scenarios (under Wine)"
# The command line itself: `cargo test` builds only the test package's copy of it
# (planned-stop-under-test.exe), so a fresh clone has no planned-stop.exe until this.
cargo build --quiet --target "$TARGET" -p planned-stop-cli --bin planned-stop
bash ci/windows-e2e.sh
