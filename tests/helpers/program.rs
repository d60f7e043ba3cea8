//! What the tests' helper programs (`tests/helpers/`) share with the tests that start them: how
//! long a helper may live, and the number inside an `ExitCode`. Included by `tests/common` and by
//! each helper program, so it is written once.

#![allow(dead_code)] // each includer uses its part

/// How long a helper process may live before it gives up by itself.
pub const HELPER_LIFETIME: std::time::Duration = std::time::Duration::from_secs(60);

/// In a helper: end the process with 99 after [`HELPER_LIFETIME`], so a helper whose test died
/// never lingers.
pub fn give_up_after_helper_lifetime() {
    std::thread::spawn(|| {
        std::thread::sleep(HELPER_LIFETIME);
        std::process::exit(99);
    });
}

/// The number inside an `ExitCode` (it has no accessor): what the process would exit with.
pub fn code_of(code: std::process::ExitCode) -> i32 {
    (0..=255)
        .find(|&n| std::process::ExitCode::from(n) == code)
        .map_or(1, i32::from)
}
