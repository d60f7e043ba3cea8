//! An error and its causes on one line, for logs.
//!
//! The crate's errors do not repeat their source in their own message (the source chain carries
//! it, so a caller that walks the chain does not print a cause twice); a log line wants the whole
//! chain, `cannot use marker directory /run/x: permission denied (os error 13)`.

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its sources, separated by `: `.
#[derive(Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorChain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_printed_once_in_order() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(ErrorChain(&e).to_string(), "outer: inner");
    }
}
