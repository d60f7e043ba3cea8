//! What the tests' helper programs (`tests/helpers/`) share with the tests that start them: how
//! long a helper may live, the number inside an `ExitCode`, and a seeded random generator.
//! Included by `tests/common` and by each helper program, so it is written once.

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

/// A small deterministic generator for the tests' random choices (kill delays, chaos faults):
/// print the seed, and a failing run can be repeated.
pub struct Lcg(pub u64);

impl Lcg {
    /// A number in `0..n` (0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}
