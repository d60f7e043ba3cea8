# Tasks for planned-stop. `just --list` shows them.

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
    PROPTEST_CASES={{cases}} cargo test --release --test state_machine
