#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
// What stays `unsafe` is what no maintained crate covers (the Windows process calls); each block
// says why it is sound.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod marker;
pub mod stopper;

// The service's side of the files, for planned-stop's own crates: public so they can reach it,
// hidden because it is not an API and may change in any release.
#[doc(hidden)]
pub mod error_chain;
#[doc(hidden)]
pub mod identity;
#[doc(hidden)]
pub mod judgement;
#[doc(hidden)]
pub mod outcome;
#[doc(hidden)]
pub mod schema;
mod stop;
#[doc(hidden)]
pub mod store;

pub use identity::{IdentityError, ProcessIdentity};
pub use stop::{ProcessState, SignalKind, StopCause, StopVerdict};
pub use store::Layout;
