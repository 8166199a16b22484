//! The one error type of the device layer. Every failure a caller can cause is a variant
//! here with a message that says what was wrong and what to do.
//!
//! Errors are values a recovery policy can inspect: [`Error::class`] sorts every variant into
//! an [`ErrorClass`] (device lost, out of memory, invalid argument, timeout, ...), a failed
//! signal or queue carries the original error (shared, [`Error::root_cause`] reaches it),
//! and a driver error keeps the backend's native code and whether it is fatal.

use std::sync::Arc;

use kiln_ir::IrError;

/// The device layer's result: every fallible call in kiln-device returns an [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the device layer. `Clone` because one failure is shared: a failed
/// signal or queue hands the same cause (behind an `Arc`) to every waiter. Match on
/// [`Error::class`] for a recovery policy; match on variants for the details.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The kernel itself is malformed (parse, dtype, structure, variable errors).
    #[error(transparent)]
    Ir(#[from] IrError),
    /// The renderer cannot express this kernel for its backend.
    #[error("render: {0}")]
    Render(String),
    /// No compiler could be found or started.
    #[error("compiler not available: {0}")]
    CompilerMissing(String),
    /// The backend compiler rejected the source. `log` is its output; `line` the offending
    /// source line when the log names one.
    #[error("compile failed: {message}\n{log}{}", line.as_ref().map(|l| format!("\noffending line: {l}")).unwrap_or_default())]
    Compile {
        /// What failed, in one line (which compiler, which kernel).
        message: String,
        /// The compiler's full diagnostic output, unmodified.
        log: String,
        /// The source line the log points at, when it names one.
        line: Option<String>,
    },
    /// Loading a compiled program failed (missing symbol, bad binary).
    #[error("load failed: {0}")]
    Load(String),
    /// A launch was refused before running: wrong buffer count/size/dtype, bad dims, a kernel
    /// of another device or backend.
    #[error("launch: {0}")]
    Launch(String),
    /// A launch refused because a LOAD or STORE could not be proven to stay inside its
    /// buffer for these variable values (see `kiln_ir::bounds`), or a guarded launch in which
    /// an access tried to leave its buffer (`access.guarded`; see [`crate::guarded`]).
    /// `access` names the node (`%N` in `kiln_ir::print` order), the elements it may touch
    /// (or tried to) and the buffer's size.
    #[error("{}", out_of_bounds(kernel, access))]
    OutOfBounds {
        /// The refused kernel's name.
        kernel: String,
        /// The access that may leave its buffer (boxed: it is large and rare).
        access: Box<kiln_ir::bounds::OutOfBounds>,
    },
    /// Buffer misuse: out-of-bounds view, size or dtype mismatch on copy or host access.
    #[error("buffer: {0}")]
    Buffer(String),
    /// An allocation could not be satisfied even after freeing the allocator's cache.
    #[error(
        "out of memory on {device}: requested {requested} B, in use {in_use} B, cached {cached} B, budget {}; free buffers or raise KILN_MEMORY_BUDGET",
        budget.map(|b| format!("{b} B")).unwrap_or_else(|| "none".into())
    )]
    OutOfMemory {
        /// The device that ran out.
        device: String,
        /// Bytes the failed allocation asked for.
        requested: usize,
        /// Bytes held by live buffers when it failed.
        in_use: usize,
        /// Bytes still cached by the allocator after trimming (normally 0).
        cached: usize,
        /// The configured memory budget in bytes, if any (`KILN_MEMORY_BUDGET`).
        budget: Option<usize>,
    },
    /// A request beyond a fixed limit of the device, such as a buffer larger than it can bind
    /// to a kernel: the same request can never succeed on this device, while a smaller one
    /// can. Unlike [`Error::OutOfMemory`] (a shortage that freeing memory may cure) nothing the
    /// caller frees changes it; unlike [`Error::Buffer`] the request itself is well formed.
    #[error("beyond a limit of {device}: {message}")]
    Limit {
        /// The device whose limit it is.
        device: String,
        /// Which limit, its value and what was asked, and how to stay within it.
        message: String,
    },
    /// A timeline signal wait ran out of time.
    #[error("timeout: waited {waited_ms} ms for signal value {target}, current value {current}")]
    Timeout {
        /// The value waited for.
        target: u64,
        /// The signal's value when the wait gave up (below `target`).
        current: u64,
        /// How long the wait lasted, in milliseconds.
        waited_ms: u64,
    },
    /// A signal was failed by the work that should have set it; carries the original error.
    #[error("signal failed: {0}")]
    SignalFailed(Arc<Error>),
    /// A queue hit an error earlier (a failed wait or command) and runs no more work; every
    /// later submit fails its signals with this. Carries the error that failed the queue.
    #[error("the queue on {device} failed earlier and runs no more work: {cause}; create a new queue")]
    QueueFailed {
        /// The device the queue runs on.
        device: String,
        /// The first error the queue hit, shared by every later failure.
        cause: Arc<Error>,
    },
    /// An object minted under an older generation of a device was used after the device
    /// was reset: its memory, program or events belong to a context that no longer exists.
    #[error(
        "device lost: {what} belongs to generation {minted} of {device}, the device is now at generation {current}; recreate it"
    )]
    DeviceLost {
        /// The device that was reset.
        device: String,
        /// The stale object (a buffer, a program, a signal), in words.
        what: String,
        /// The generation the object was created under.
        minted: u64,
        /// The device's generation now (larger than `minted`).
        current: u64,
    },
    /// The device hit a fatal (sticky) error: work in flight was failed with it and new work
    /// is refused until [`crate::Device::reset`].
    #[error("device {device} is lost after a fatal error: {cause}; call Device::reset() and recreate its objects")]
    DeviceFailed {
        /// The failed device.
        device: String,
        /// The fatal error that made the device unusable.
        cause: Arc<Error>,
    },
    /// A device or backend that is not present on this machine.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// The kernel cache could not be read or written (never fatal for correctness).
    #[error("kernel cache: {0}")]
    Cache(String),
    /// A backend driver call failed. `code` is the backend's native status (an OpenCL
    /// `cl_int`, a CUDA `CUresult`) when there is one; `fatal` says the error is sticky: the
    /// device context is unusable and must be reset.
    #[error("{backend} driver: {message}{}", if *fatal { " (fatal: the device context is lost; reset the device)" } else { "" })]
    Driver {
        /// The backend's name (`"OpenCL"`, `"CUDA"`, `"CPU"`).
        backend: &'static str,
        /// The driver's native status code, when the call returned one.
        code: Option<i64>,
        /// Whether the device context is lost (see [`ErrorClass::DeviceLost`]).
        fatal: bool,
        /// What the driver call was doing and what went wrong.
        message: String,
    },
    /// A collective failed on a channel (see [`crate::collective`]): a peer did not arrive in
    /// time, failed, or passed other buffers. The channel is broken: every later collective
    /// on it fails with this error. The devices and plans stay usable; create a new channel.
    #[error("channel {channel}: {message}; the channel is broken, create a new one")]
    Channel {
        /// The channel, in words (provider, id, ranks).
        channel: String,
        /// What went wrong, naming the ranks.
        message: String,
    },
    /// A malformed setting (an environment variable, a configuration value).
    #[error("configuration: {0}")]
    Config(String),
    /// A host file could not be read or written (a trace, an output file).
    #[error("i/o: {0}")]
    Io(String),
    /// An argument that makes no sense (a foreign signal type, a decreasing signal value,
    /// a device name of another backend).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// What kind of failure an [`Error`] is, so a caller can choose a recovery policy without
/// matching every variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The device context is gone (a fatal driver error, a stale handle after a reset):
    /// reset the device and rebuild what ran on it.
    DeviceLost,
    /// Memory ran out: free buffers, trim caches or lower the batch size, then retry.
    OutOfMemory,
    /// The caller passed something wrong: retrying the same call cannot succeed.
    InvalidArgument,
    /// A wait ran out of time; the work may still complete.
    Timeout,
    /// Rendering, compiling or loading a kernel failed.
    Compile,
    /// A launch was refused before it ran.
    Launch,
    /// A device, backend or tool is not present.
    Unavailable,
    /// The disk cache or a host file failed (never a wrong result).
    Io,
    /// Any other driver failure (not fatal).
    Driver,
    /// A collective failed and broke its channel: make a new channel.
    Channel,
}

impl Error {
    /// A non-fatal driver error without a native code (a failed thread spawn, a lost worker).
    pub fn driver(backend: &'static str, message: impl Into<String>) -> Error {
        Error::Driver { backend, code: None, fatal: false, message: message.into() }
    }

    /// The error that started a chain of failures: the cause inside a failed signal or queue
    /// (recursively), else `self`.
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::SignalFailed(cause) | Error::QueueFailed { cause, .. } => cause.root_cause(),
            other => other,
        }
    }

    /// The kind of failure; failed signals and queues report their root cause's class.
    pub fn class(&self) -> ErrorClass {
        match self.root_cause() {
            Error::Ir(_) | Error::Buffer(_) | Error::Config(_) | Error::Invalid(_) | Error::Limit { .. } => {
                ErrorClass::InvalidArgument
            }
            Error::Render(_) | Error::Compile { .. } | Error::Load(_) => ErrorClass::Compile,
            Error::CompilerMissing(_) | Error::Unavailable(_) => ErrorClass::Unavailable,
            Error::Launch(_) | Error::OutOfBounds { .. } => ErrorClass::Launch,
            Error::OutOfMemory { .. } => ErrorClass::OutOfMemory,
            Error::Timeout { .. } => ErrorClass::Timeout,
            Error::DeviceLost { .. } | Error::DeviceFailed { .. } => ErrorClass::DeviceLost,
            Error::Driver { fatal: true, .. } => ErrorClass::DeviceLost,
            Error::Driver { .. } => ErrorClass::Driver,
            Error::Cache(_) | Error::Io(_) => ErrorClass::Io,
            Error::Channel { .. } => ErrorClass::Channel,
            // root_cause never returns these two.
            Error::SignalFailed(_) | Error::QueueFailed { .. } => ErrorClass::Driver,
        }
    }

    /// Whether the device context is unusable after this error (see [`ErrorClass::DeviceLost`]).
    pub fn is_fatal(&self) -> bool {
        self.class() == ErrorClass::DeviceLost
    }
}

fn out_of_bounds(kernel: &str, access: &kiln_ir::bounds::OutOfBounds) -> String {
    if access.guarded {
        format!("kernel `{kernel}` ran guarded and faulted: {access}")
    } else {
        format!("launch of kernel `{kernel}` refused: {access}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_signals_and_queues_classify_by_their_root_cause() {
        let oom = Error::OutOfMemory { device: "CPU".into(), requested: 8, in_use: 0, cached: 0, budget: Some(4) };
        let chained = Error::QueueFailed { device: "CPU".into(), cause: Arc::new(Error::SignalFailed(Arc::new(oom))) };
        assert_eq!(chained.class(), ErrorClass::OutOfMemory);
        assert!(matches!(chained.root_cause(), Error::OutOfMemory { requested: 8, .. }));
        assert!(chained.to_string().contains("requested 8 B"), "{chained}");
        let fatal = Error::Driver { backend: "OpenCL", code: Some(-5), fatal: true, message: "boom".into() };
        assert!(fatal.is_fatal() && fatal.to_string().contains("reset"));
        assert!(!Error::driver("CPU", "no thread").is_fatal());
        assert_eq!(Error::Timeout { target: 1, current: 0, waited_ms: 1 }.class(), ErrorClass::Timeout);
        assert_eq!(Error::Config("x".into()).class(), ErrorClass::InvalidArgument);
    }
}
