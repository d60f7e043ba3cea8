# Tasks for planned-stop. `just --list` shows them.

# A mutation scope of the library runs its unit tests and the test package's (see `mutants`).
both := "--baseline=skip --test-package planned-stop,planned-stop-tests"

# Everything CI runs.
ci:
    bash .ci/run

# The README's main job.
demo:
    cargo run --release -- demo

# The tests, as CI runs them.
test:
    cargo test

# The state-machine test with many more cases.
proptest-long cases="10000":
    PROPTEST_CASES={{cases}} cargo test --release --test tests state_machine::

# The model checker over deeper bounds than CI's (tests/model.rs; docs/reliability.md has the
# state counts). Release build; several minutes and several GiB of memory.
model:
    PLANNED_STOP_MODEL=deep cargo test --release --test tests -- --nocapture --test-threads 1 model::

# The fleet in chaos for longer, e.g. `just chaos 600` (tests/chaos.rs; needs PostgreSQL's
# binaries, which ci/postgres.sh installs, and libfaketime: `apt-get install faketime`): 5 replicas
# on PostgreSQL and 3 on a shared state directory under random faults, a quiet phase, then the
# checker; then the same with injected defects.
chaos secs="300":
    PLANNED_STOP_CHAOS_SECS={{secs}} cargo test --release --features postgres --test tests -- --ignored --nocapture --test-threads 1 chaos::

# One injected defect of the chaos checker, e.g. `just chaos-defect ack-skips-lease 18`: the
# checker must report it (tests/chaos.rs, DEFECTS).
chaos-defect name secs="72":
    PLANNED_STOP_CHAOS_DEFECT={{name}} PLANNED_STOP_CHAOS_SECS={{secs}} cargo test --features postgres --test tests -- --ignored --nocapture --test-threads 1 chaos::the_chaos_checker_reports_injected_defects

# Fuzz one target for longer, e.g. `just fuzz judgement 600` (installs cargo-fuzz if missing).
fuzz target secs="60":
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    mkdir -p /tmp/planned-stop-fuzz/{{target}}
    cd fuzz && cargo fuzz run -s none {{target}} /tmp/planned-stop-fuzz/{{target}} corpus/{{target}} -- -max_total_time={{secs}} -print_final_stats=1

# Build, lint and test the Windows target under Wine (installs mingw-w64, Wine and the target).
windows:
    bash ci/windows.sh

# Mutation testing (installs cargo-mutants if missing): the pure modules against their unit and
# property tests; the lifecycle, the watcher and the runner against the actor tests (the state
# machine at 200 cases a mutant); the record store's lease rules and file store against its
# tests; the metrics against tests/metrics.rs. About three hours on 2 cores; the report is in
# docs/reliability.md. The library's integration tests are the package planned-stop-tests, so a
# scope tests both packages (`--test-package`). cargo-mutants' own baseline would run only the
# mutated package's tests, so each scope runs its tests here first, unmutated, and names its
# timeout itself (`--baseline=skip --timeout`).
# `just mutants-iterate` re-tests only what the last run missed.
mutants *args:
    command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
    cargo mutants {{args}} -o target/mutants-protocol -p planned-stop-protocol --file protocol/src/schema.rs --file protocol/src/judgement.rs -- --lib --test marker_and_judgement
    cargo test -p planned-stop -p planned-stop-tests --lib --test tests -- record:: store::
    cargo mutants {{args}} -o target/mutants-pure {{both}} --timeout 60 --file src/record.rs -- --lib --test tests -- record:: store::
    PROPTEST_CASES=200 cargo test -p planned-stop -p planned-stop-tests --lib --test tests -- lifecycle:: watcher:: runner:: service:: state_machine::
    PROPTEST_CASES=200 cargo mutants {{args}} -o target/mutants-actors {{both}} --timeout 40 --file src/lifecycle.rs --file src/watcher.rs --file 'src/runner/*.rs' -- --lib --test tests -- lifecycle:: watcher:: runner:: service:: state_machine::
    PROPTEST_CASES=200 cargo test -p planned-stop -p planned-stop-tests --lib --test tests -- record:: records::
    PROPTEST_CASES=200 cargo mutants {{args}} -o target/mutants-records {{both}} --timeout 60 --file src/record/lease.rs --file src/record/host.rs --file src/record/file.rs --file 'src/record/file/*.rs' -- --lib --test tests -- record:: records::
    cargo test -p planned-stop -p planned-stop-tests --features actix-web,metrics --lib --test tests -- telemetry:: metrics::
    cargo mutants {{args}} -o target/mutants-metrics {{both}} --timeout 60 --features actix-web,metrics --file src/telemetry.rs --file src/telemetry/on.rs -- --lib --test tests -- telemetry:: metrics::

# The watcher's tick without and with the `metrics` feature (a Prometheus recorder installed),
# compared by criterion in one run (docs/performance.md).
metrics-cost:
    cargo bench --bench probe -- watcher_tick --save-baseline metrics-off
    cargo bench --bench probe --features metrics -- watcher_tick --baseline metrics-off

mutants-iterate:
    just mutants --iterate

# The stop-latency harness against a statically linked build (Linux x86-64; docs/performance.md):
# a static binary starts in about half the time, which is most of a fast stop.
stop-latency-static rounds="200":
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target x86_64-unknown-linux-gnu --bin planned-stop
    RUSTFLAGS="-C target-feature=+crt-static" cargo run --release -p planned-stop-harness --target x86_64-unknown-linux-gnu --bin stop_latency -- {{rounds}}

# The library's public surface into docs/public-api.txt (CI compares it: ci/public_api.py).
public-api:
    RUSTC_BOOTSTRAP=1 cargo rustdoc --quiet -p planned-stop --lib --features systemd,actix-web,metrics,testing -- -Z unstable-options --output-format json
    RUSTC_BOOTSTRAP=1 cargo rustdoc --quiet -p planned-stop-protocol --lib -- -Z unstable-options --output-format json --document-hidden-items
    RUSTC_BOOTSTRAP=1 cargo rustdoc --quiet -p planned-stop-postgres --lib --features testing -- -Z unstable-options --output-format json
    sed -n '1,4p' docs/public-api.txt > target/public-api.txt
    python3 ci/public_api.py target/doc/planned_stop.json target/doc/planned_stop_protocol.json target/doc/planned_stop_postgres.json >> target/public-api.txt
    mv target/public-api.txt docs/public-api.txt
