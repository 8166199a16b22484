//! The one error type of the device layer. Every failure a caller can cause is a variant
//! here with a message that says what was wrong and what to do.

use kiln_ir::IrError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    Compile { message: String, log: String, line: Option<String> },
    /// Loading a compiled program failed (missing symbol, bad binary).
    #[error("load failed: {0}")]
    Load(String),
    /// A launch was refused before running: wrong buffer count/size/dtype, bad dims.
    #[error("launch: {0}")]
    Launch(String),
    /// A launch refused because a LOAD or STORE could not be proven to stay inside its
    /// buffer for these variable values (see `kiln_ir::bounds`). `access` names the node
    /// (`%N` in `kiln_ir::print` order), the elements it may touch and the buffer's size.
    #[error("launch of kernel `{kernel}` refused: {access}")]
    OutOfBounds { kernel: String, access: Box<kiln_ir::bounds::OutOfBounds> },
    /// Buffer misuse: out-of-bounds view, size or dtype mismatch on copy or host access.
    #[error("buffer: {0}")]
    Buffer(String),
    /// An allocation could not be satisfied even after freeing the allocator's cache.
    #[error(
        "out of memory on {device}: requested {requested} B, in use {in_use} B, cached {cached} B, budget {}; free buffers or raise KILN_MEMORY_BUDGET",
        budget.map(|b| format!("{b} B")).unwrap_or_else(|| "none".into())
    )]
    OutOfMemory { device: String, requested: usize, in_use: usize, cached: usize, budget: Option<usize> },
    /// A timeline signal wait ran out of time.
    #[error("timeout: waited {waited_ms} ms for signal value {target}, current value {current}")]
    Timeout { target: u64, current: u64, waited_ms: u64 },
    /// A signal was failed by the work that should have set it; carries the original error.
    #[error("signal failed: {0}")]
    SignalFailed(String),
    /// An object from an older device generation was used after a device reset.
    #[error("device lost: {what} belongs to generation {had} of {device}, the device is now at {now}; recreate it")]
    DeviceLost { device: String, what: String, had: u64, now: u64 },
    /// A device or backend that is not present on this machine.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// The kernel cache could not be read or written (never fatal for correctness).
    #[error("kernel cache: {0}")]
    Cache(String),
    /// A backend driver call failed.
    #[error("{backend} driver: {message}")]
    Driver { backend: &'static str, message: String },
    /// An argument that makes no sense (a foreign signal type, an unknown option).
    #[error("invalid argument: {0}")]
    Invalid(String),
}
