//! The command line's error type and how it is shown.
//!
//! Usage errors (a bad flag, a missing value) exit with status 2; everything that goes wrong
//! while doing the work (unreadable files, bad kernels, compile or launch failures) exits
//! with status 1. The message printed is the error followed by its whole `source()` chain.

use std::path::{Path, PathBuf};

use crate::npy::NpyError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// clap refused the command line; its message ends with the usage line and a hint.
    #[error("{}", args_text(.0))]
    Args(clap::Error),
    /// The command line parsed but does not make sense; the message says how to write it.
    #[error("{0}\n(run `kiln help` for usage)")]
    Usage(String),
    /// The device layer failed; `context` says what the command was doing.
    #[error("{context}")]
    Kiln {
        context: String,
        #[source]
        source: kiln_device::Error,
    },
    /// A saved plan could not be loaded or failed while running; `context` says which.
    #[error("{context}")]
    Plan {
        context: String,
        /// Boxed: the plan error is large, and every command's result carries this type.
        #[source]
        source: Box<kiln_runtime::saved::PlanFileError>,
    },
    /// A file could not be read or written.
    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A `.npy` file that cannot be used.
    #[error("{} is not a usable .npy file", path.display())]
    Npy {
        path: PathBuf,
        #[source]
        source: NpyError,
    },
    /// The arguments do not fit the kernel (a slot it does not have, an input of the wrong
    /// dtype or size, a variable it does not declare).
    #[error("{0}")]
    Mismatch(String),
    /// A `kiln bench` entry (or one row of it) that cannot run on this device: a buffer beyond
    /// one of the device's fixed limits or its memory, or a capability it lacks (this kiln has
    /// no MPI). The bench reports the entry as skipped with this reason and runs the others.
    /// It is made only at those points, never from a failure or a wrong result.
    #[error("cannot run on this device: {0}")]
    CannotRun(String),
    /// The host could not provide staging memory for a buffer of this many bytes.
    #[error("cannot allocate {0} bytes of host memory to stage a buffer")]
    HostMemory(usize),
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) | CliError::Args(_) => 2,
            _ => 1,
        }
    }

    /// The error and its causes, one per line, as printed after `error: `.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let text = s.to_string();
            // Transparent wrappers repeat their inner message: print each cause once.
            if !out.contains(&text) {
                out.push_str("\n  caused by: ");
                out.push_str(&text.replace('\n', "\n    "));
            }
            source = s.source();
        }
        out
    }

    pub fn io(action: &'static str, path: &Path, source: std::io::Error) -> CliError {
        CliError::Io { action, path: path.to_path_buf(), source }
    }
}

/// A clap error as text, without the `error: ` that [`crate::main`] prints itself.
fn args_text(e: &clap::Error) -> String {
    let text = e.to_string();
    text.strip_prefix("error: ").unwrap_or(&text).trim_end().to_string()
}

/// Attaches what the command was doing to a device-layer error.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, CliError>;
}

impl<T> Context<T> for Result<T, kiln_device::Error> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, CliError> {
        self.map_err(|source| CliError::Kiln { context: what(), source })
    }
}

impl<T> Context<T> for Result<T, kiln_ir::IrError> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, CliError> {
        self.map_err(|e| CliError::Kiln { context: what(), source: e.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_prints_the_chain_once() {
        let e: Result<(), kiln_device::Error> = Err(kiln_device::Error::CompilerMissing("no cc".into()));
        let e = e.context(|| "cannot compile k.kiln for CPU".into()).unwrap_err();
        assert_eq!(e.report(), "cannot compile k.kiln for CPU\n  caused by: compiler not available: no cc");
        assert_eq!(e.exit_code(), 1);
        let u = CliError::Usage("unknown flag --x".into());
        assert_eq!(u.exit_code(), 2);
        assert!(u.report().starts_with("unknown flag --x"));
    }
}
