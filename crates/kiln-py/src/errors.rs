//! kiln's errors as Python exceptions: one class per [`ErrorClass`] under `kiln.Error`, each
//! carrying the Rust error's message and root cause, and no Rust panic reaching Python. A saved
//! plan's errors ([`PlanFileError`]) map onto the same classes, with four of their own under
//! `kiln.InvalidArgumentError`: a file that is not a loadable plan, a format version this kiln
//! does not read, a plan that cannot be saved, and an input that does not fit.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kiln_device::{Error as KilnError, ErrorClass};
use kiln_ir::IrError;
use kiln_runtime::saved::PlanFileError as SavedPlanError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    kiln,
    Error,
    PyException,
    "Every failure kiln reports; `root_cause` holds the first error of a chain."
);
create_exception!(
    kiln,
    DeviceLostError,
    Error,
    "The device context is gone (a fatal driver error, or an object of an older generation after `Device.reset()`): reset the device and recreate what ran on it."
);
create_exception!(
    kiln,
    OutOfMemoryError,
    Error,
    "Memory ran out even after the allocator's cache was freed: free buffers or raise KILN_MEMORY_BUDGET."
);
create_exception!(
    kiln,
    InvalidArgumentError,
    Error,
    "The caller passed something wrong (a dtype, a length, a variable, a malformed kernel): retrying the same call cannot succeed."
);
create_exception!(
    kiln,
    ParseError,
    InvalidArgumentError,
    "Kernel text that does not parse; `line` and `col` say where (1-based)."
);
create_exception!(kiln, TimeoutError, Error, "A wait ran out of time; the work may still complete.");
create_exception!(kiln, CompileError, Error, "Rendering, compiling or loading a kernel failed.");
create_exception!(
    kiln,
    LaunchError,
    Error,
    "A launch was refused before it ran (buffer count, dtype, length, device)."
);
create_exception!(
    kiln,
    OutOfBoundsError,
    LaunchError,
    "An access that no proof keeps inside its buffer (or a guarded access that tried to leave it); `node` and `line` say which."
);
create_exception!(kiln, UnavailableError, Error, "A device, backend or tool is not present.");
create_exception!(kiln, IoError, Error, "The kernel cache or a host file failed.");
create_exception!(kiln, DriverError, Error, "Any other (non-fatal) driver failure.");
create_exception!(
    kiln,
    ChannelError,
    Error,
    "A collective failed (a peer did not arrive in time, failed, or passed other buffers); the channel is broken: make a new one."
);

create_exception!(
    kiln,
    PlanFileError,
    InvalidArgumentError,
    "A file that is not a plan this kiln can load: not a plan file, damaged (cut short, a checksum that does not match), malformed, or a kernel or node that does not fit; `kind` says which. Save the plan again, or fetch the file again."
);
create_exception!(
    kiln,
    PlanVersionError,
    PlanFileError,
    "A plan file of a format version this kiln does not read (`found`, `known`): load it with the kiln that saved it, or save it again with this one."
);
create_exception!(
    kiln,
    PlanSaveError,
    InvalidArgumentError,
    "A plan that cannot be saved (a collective, a buffer of another device, inputs or outputs that do not fit their names or shapes)."
);
create_exception!(
    kiln,
    PlanInputError,
    InvalidArgumentError,
    "An input given to a loaded plan that does not fit it (an unknown or missing name, a dtype or shape it does not take); `input` names it."
);

/// Adds every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("DeviceLostError", py.get_type::<DeviceLostError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("ParseError", py.get_type::<ParseError>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("LaunchError", py.get_type::<LaunchError>())?;
    m.add("OutOfBoundsError", py.get_type::<OutOfBoundsError>())?;
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("DriverError", py.get_type::<DriverError>())?;
    m.add("ChannelError", py.get_type::<ChannelError>())?;
    m.add("PlanFileError", py.get_type::<PlanFileError>())?;
    m.add("PlanVersionError", py.get_type::<PlanVersionError>())?;
    m.add("PlanSaveError", py.get_type::<PlanSaveError>())?;
    m.add("PlanInputError", py.get_type::<PlanInputError>())?;
    Ok(())
}

/// Kernel texts by kernel name, to locate the errors reported after a launch returned (an
/// asynchronous launch, a plan run), which name the kernel but not its text. A name compiled
/// from two different texts locates nothing.
fn texts() -> &'static Mutex<HashMap<String, Option<Arc<str>>>> {
    static TEXTS: OnceLock<Mutex<HashMap<String, Option<Arc<str>>>>> = OnceLock::new();
    TEXTS.get_or_init(Default::default)
}

/// Remembers the text kernel `name` was compiled from.
pub fn remember(name: &str, text: &Arc<str>) {
    let mut texts = texts().lock().unwrap_or_else(|p| p.into_inner());
    match texts.get_mut(name) {
        None => {
            texts.insert(name.to_string(), Some(text.clone()));
        }
        Some(known) => {
            if known.as_ref().is_some_and(|k| k != text) {
                *known = None;
            }
        }
    }
}

fn recall(name: &str) -> Option<Arc<str>> {
    texts().lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned().flatten()
}

/// Why a call failed: kiln's error, a saved plan's, or a panic caught before it reached Python.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The device layer's typed error.
    Kiln(KilnError),
    /// A saved plan's error, classified ([`PlanFileError`](SavedPlanError) is not `Clone`).
    Plan(PlanFailure),
    /// A Rust panic's message.
    Panic(String),
}

/// A saved plan's error as Python sees it: its exception and message.
#[derive(Debug, Clone)]
pub struct PlanFailure {
    exception: PlanException,
    message: String,
    root_cause: String,
}

/// Which exception a saved plan's error raises.
#[derive(Debug, Clone)]
enum PlanException {
    /// `kiln.PlanFileError` with this `kind`.
    File(&'static str),
    /// `kiln.PlanVersionError`.
    Version { found: u32, known: u32 },
    /// `kiln.PlanSaveError`.
    Save,
    /// `kiln.PlanInputError` for this input.
    Input(String),
    /// The class kiln's own error has (a device that fails, lacks a feature or runs out of
    /// memory; a kernel that does not compile; a launch refused by the bounds proof).
    Kiln(KilnError),
}

impl From<SavedPlanError> for Failure {
    fn from(e: SavedPlanError) -> Failure {
        use PlanException as X;
        let message = e.to_string();
        let root = |source: &KilnError| source.root_cause().to_string();
        // A kernel or node whose error is the file's (text that does not parse, slots that do
        // not fit the kernel) is a damaged file; one the device causes keeps the device's class.
        let file_or_device = |kind: &'static str, source: &KilnError| {
            let file_fault = matches!(source.class(), ErrorClass::InvalidArgument)
                || (kind == "node" && matches!(source.root_cause(), KilnError::Launch(_)));
            if file_fault { X::File(kind) } else { X::Kiln(source.clone()) }
        };
        let (exception, root_cause) = match &e {
            SavedPlanError::Io { .. } => (X::Kiln(KilnError::Io(message.clone())), message.clone()),
            SavedPlanError::NotAPlan { .. } => (X::File("not_a_plan"), message.clone()),
            SavedPlanError::UnknownVersion { found, known } => {
                (X::Version { found: *found, known: *known }, message.clone())
            }
            SavedPlanError::Truncated { .. } => (X::File("truncated"), message.clone()),
            SavedPlanError::Checksum { .. } => (X::File("checksum"), message.clone()),
            SavedPlanError::Malformed(_) => (X::File("malformed"), message.clone()),
            SavedPlanError::Kernel { source, .. } => (file_or_device("kernel", source), root(source)),
            SavedPlanError::Unsupported { .. } => (X::Kiln(KilnError::Unavailable(message.clone())), message.clone()),
            SavedPlanError::Node { source, .. } => (file_or_device("node", source), root(source)),
            SavedPlanError::Unsaveable(_) => (X::Save, message.clone()),
            SavedPlanError::Input { name, .. } => (X::Input(name.clone()), message.clone()),
            SavedPlanError::Device(source) => return Failure::Kiln(source.clone()),
        };
        Failure::Plan(PlanFailure { exception, message, root_cause })
    }
}

impl From<KilnError> for Failure {
    fn from(e: KilnError) -> Failure {
        Failure::Kiln(e)
    }
}

impl From<IrError> for Failure {
    fn from(e: IrError) -> Failure {
        Failure::Kiln(KilnError::Ir(e))
    }
}

/// Runs `f`, turning a panic into [`Failure::Panic`] so it never unwinds into Python.
pub fn no_panic<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Err(Failure::Panic(message))
    })
}

/// Runs `f` with the GIL released and panics caught; `text` is the kernel source its errors
/// may point into.
pub fn detached<T: Send>(
    py: Python<'_>,
    text: Option<&str>,
    f: impl FnOnce() -> Result<T, Failure> + Send,
) -> PyResult<T> {
    py.detach(|| no_panic(f)).map_err(|e| e.into_py(py, text))
}

impl Failure {
    /// The Python exception: the class of the error's [`ErrorClass`] (refined for parse and
    /// bounds errors), its message with the kernel line it names when `text` is the kernel's
    /// source, and the attributes `root_cause`, plus `line`/`col` or `node` when known.
    pub fn into_py(self, py: Python<'_>, text: Option<&str>) -> PyErr {
        let e = match self {
            Failure::Panic(message) => {
                return Error::new_err(format!(
                    "internal error: a Rust panic was caught ({message}); please report it"
                ));
            }
            Failure::Plan(p) => return p.into_py(py),
            Failure::Kiln(e) => e,
        };
        let recalled = match (text, e.root_cause()) {
            (None, KilnError::OutOfBounds { kernel, .. }) => recall(kernel),
            _ => None,
        };
        let text = text.or(recalled.as_deref());
        let mut message = e.to_string();
        let (mut line, mut col, mut node) = (None, None, None);
        match e.root_cause() {
            KilnError::Ir(IrError::Parse { line: l, col: c, .. }) => (line, col) = (Some(*l), Some(*c)),
            KilnError::Ir(IrError::Type { node: n, .. }) => node = Some(*n),
            KilnError::OutOfBounds { access, .. } => node = Some(access.node),
            _ => {}
        }
        if let (Some(n), Some(text)) = (node, text)
            && let Some(at) = kiln_ir::locate_node(text, n)
        {
            message = format!("{message} (at {at})");
            line = at.rsplit_once("line ").and_then(|(_, l)| l.trim_end_matches(')').parse().ok());
        }
        let err = exception(&e, message);
        let value = err.value(py);
        // Attributes are a convenience: a failure to set one must not hide the error itself.
        let _ = value.setattr("root_cause", e.root_cause().to_string());
        let _ = value.setattr("line", line);
        let _ = value.setattr("col", col);
        let _ = value.setattr("node", node);
        err
    }
}

/// The exception of kiln error `e`'s class (refined for parse and bounds errors), with `message`.
fn exception(e: &KilnError, message: String) -> PyErr {
    match (e.class(), e.root_cause()) {
        (_, KilnError::Ir(IrError::Parse { .. })) => ParseError::new_err(message),
        (_, KilnError::OutOfBounds { .. }) => OutOfBoundsError::new_err(message),
        (ErrorClass::DeviceLost, _) => DeviceLostError::new_err(message),
        (ErrorClass::OutOfMemory, _) => OutOfMemoryError::new_err(message),
        (ErrorClass::InvalidArgument, _) => InvalidArgumentError::new_err(message),
        (ErrorClass::Timeout, _) => TimeoutError::new_err(message),
        (ErrorClass::Compile, _) => CompileError::new_err(message),
        (ErrorClass::Launch, _) => LaunchError::new_err(message),
        (ErrorClass::Unavailable, _) => UnavailableError::new_err(message),
        (ErrorClass::Io, _) => IoError::new_err(message),
        (ErrorClass::Driver, _) => DriverError::new_err(message),
        (ErrorClass::Channel, _) => ChannelError::new_err(message),
    }
}

impl PlanFailure {
    /// The exception, with `root_cause` and the attributes of its class (`kind`; `found` and
    /// `known`; `input`), and `line`/`col`/`node` unset as on every `kiln.Error`.
    fn into_py(self, py: Python<'_>) -> PyErr {
        let PlanFailure { exception: which, message, root_cause } = self;
        let err = match &which {
            PlanException::File(_) => PlanFileError::new_err(message),
            PlanException::Version { .. } => PlanVersionError::new_err(message),
            PlanException::Save => PlanSaveError::new_err(message),
            PlanException::Input(_) => PlanInputError::new_err(message),
            PlanException::Kiln(e) => exception(e, message),
        };
        let value = err.value(py);
        // Attributes are a convenience: a failure to set one must not hide the error itself.
        let _ = value.setattr("root_cause", root_cause);
        for attr in ["line", "col", "node"] {
            let _ = value.setattr(attr, py.None());
        }
        let _ = match which {
            PlanException::File(kind) => value.setattr("kind", kind),
            PlanException::Version { found, known } => value
                .setattr("kind", "unknown_version")
                .and_then(|()| value.setattr("found", found))
                .and_then(|()| value.setattr("known", known)),
            PlanException::Input(name) => value.setattr("input", name),
            PlanException::Save | PlanException::Kiln(_) => Ok(()),
        };
        err
    }
}

/// An [`Error::Invalid`](KilnError::Invalid) failure: a bad argument found on the Python side.
pub fn invalid(message: impl Into<String>) -> Failure {
    Failure::Kiln(KilnError::Invalid(message.into()))
}

/// [`invalid`] as the Python exception (`kiln.InvalidArgumentError`).
pub fn invalid_arg(py: Python<'_>, message: impl Into<String>) -> PyErr {
    invalid(message).into_py(py, None)
}

/// A kiln error as the Python exception, without a kernel source to locate it in.
pub fn raise(py: Python<'_>, e: impl Into<Failure>) -> PyErr {
    e.into().into_py(py, None)
}

/// A duration in seconds (a Python number): a negative, NaN or unbounded one is
/// `kiln.InvalidArgumentError`.
pub fn seconds_arg(py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = t.extract().map_err(|_| invalid_arg(py, format!("timeout is in seconds (a number), got {t}")))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| invalid_arg(py, format!("timeout {secs} is not a duration in seconds")))
}
