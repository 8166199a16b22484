//! [`PlanFileError`]: everything that can go wrong saving, loading or running a saved plan.

use std::path::PathBuf;

/// Why a plan could not be saved, loaded or run. Each kind of damage a file can have is its own
/// variant, so a caller (and the Python binding's exception types) can tell a file to replace
/// from a device that lacks a feature from a wrong input.
#[derive(Debug, thiserror::Error)]
pub enum PlanFileError {
    /// The file could not be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`read`, `write`, `map`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with a plan file's magic bytes.
    #[error("not a kiln plan file: it starts with {found}, a plan file starts with `KILNPLAN`")]
    NotAPlan {
        /// The file's first bytes, escaped.
        found: String,
    },
    /// The file is a plan file of a format version this reader does not know.
    #[error(
        "plan format version {found} is not one this kiln reads (it reads version {known}); load the file with \
         the kiln that saved it, or save the plan again with this one"
    )]
    UnknownVersion {
        /// The version in the file.
        found: u32,
        /// The version this reader knows.
        known: u32,
    },
    /// The file ends before one of its parts does.
    #[error("the plan file is truncated: its {part} ends at byte {needed}, the file has {len} bytes")]
    Truncated {
        /// The part that is cut (the header, the manifest, kernel `k`, the constants).
        part: String,
        /// Where that part ends.
        needed: u64,
        /// The file's length.
        len: u64,
    },
    /// A part's bytes do not match their checksum: the file was damaged after it was written.
    #[error(
        "the plan file is damaged: the checksum of its {part} is {computed}, the file records {recorded}; save the plan again"
    )]
    Checksum {
        /// The damaged part.
        part: String,
        /// The checksum the file records.
        recorded: String,
        /// The checksum of the bytes there.
        computed: String,
    },
    /// The file's parts are intact but do not describe a plan (a field out of range, sizes that
    /// overflow, windows outside their buffers, a constant that does not match its buffer).
    #[error("the plan file is malformed: {0}")]
    Malformed(String),
    /// A kernel of the file is not a valid kernel, or could not be compiled.
    #[error("kernel `{kernel}` of the plan: {source}")]
    Kernel {
        /// The kernel's name in the file.
        kernel: String,
        /// What was wrong (parse, validation, compile).
        #[source]
        source: kiln_device::Error,
    },
    /// A kernel uses something the device it is loaded on cannot render (an op, a dtype).
    #[error("kernel `{kernel}` cannot run on {device}: {feature}; load the plan on a device that has it")]
    Unsupported {
        /// The kernel's name.
        kernel: String,
        /// The device the plan was loaded on.
        device: String,
        /// What the device lacks, as its renderer says it.
        feature: String,
    },
    /// A node that does not fit its kernel or its buffers (a slot count, dtype or size that does
    /// not match, an access the bounds proof refuses, a copy between windows of different sizes).
    #[error("node {node} (`{what}`) of the plan: {source}")]
    Node {
        /// The node's index.
        node: usize,
        /// Its kernel's name, or `copy`.
        what: String,
        /// The check that refused it.
        #[source]
        source: kiln_device::Error,
    },
    /// The plan cannot be saved (a collective, a buffer on another device, an input that does not
    /// fit its shape).
    #[error("cannot save the plan: {0}")]
    Unsaveable(String),
    /// An input given to a run does not fit the plan (its name, dtype or shape).
    #[error("input `{name}`: {message}")]
    Input {
        /// The input's name as given.
        name: String,
        /// What was expected.
        message: String,
    },
    /// The device failed (allocation, transfer, a kernel that failed while running).
    #[error(transparent)]
    Device(#[from] kiln_device::Error),
}
