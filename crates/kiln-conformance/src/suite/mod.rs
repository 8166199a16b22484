//! The test bodies, one module per contract. Each `pub fn` takes the device under test (and,
//! for cross-device checks, a peer device) and returns an [`crate::Outcome`].

pub mod bounds;
pub mod buffers;
pub mod collectives;
pub mod errors;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod matrix;
pub mod plans;
pub mod programs;
pub mod queues;
pub mod signals;
pub mod workgroups;
