//! The safe launch's fallback for accesses no proof reaches: a guarded form of the kernel.
//!
//! A kernel's accesses are proven in bounds when it is built, else at each launch from the
//! bound values ([`crate::ProgramSpec::check_bounds`]). A launch whose proof still fails does
//! not run the kernel as compiled. Under [`BoundsPolicy::Guard`] (the default) it runs the
//! kernel's *guarded form* instead: the same kernel with every access left open at build time
//! checking itself ([`kiln_ir::guard`]), compiled once, on first need, through the kernel
//! cache. A guarded access outside its buffer loads its alternative (or 0) or skips its store
//! and records a fault; [`FaultWatch::check`] turns the record into [`Error::OutOfBounds`]
//! after the run. So a correct kernel that kiln cannot prove runs, an incorrect one never
//! touches memory outside its buffers and is still reported, and launches that are proven run
//! the unguarded code, with no check in it.
//!
//! Under [`BoundsPolicy::Refuse`] (`KILN_BOUNDS=refuse`, [`crate::Device::set_bounds_policy`],
//! or [`crate::Kernel::refusing`] for one kernel) such a launch is refused with the proof's
//! [`Error::OutOfBounds`], as [`crate::Kernel::check`] always does.

use std::sync::Arc;

use kiln_ir::Guarded;
use kiln_ir::bounds::OutOfBounds;

use crate::buffer::Buffer;
use crate::error::{Error, Result};

/// The environment variable that picks the [`BoundsPolicy`] of devices opened after it is
/// set: `guard` (the default) or `refuse`.
pub const BOUNDS_ENV: &str = "KILN_BOUNDS";

/// What a safe launch does with an access that neither stage of the proof reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BoundsPolicy {
    /// Run the kernel's guarded form and report an access that really left its buffer after
    /// the run (the default: a correct kernel is never refused).
    #[default]
    Guard,
    /// Refuse the launch with [`Error::OutOfBounds`] (the strict path: nothing runs that was
    /// not proven).
    Refuse,
}

impl BoundsPolicy {
    /// The policy `KILN_BOUNDS` names (unset: [`BoundsPolicy::Guard`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a value other than `guard` or `refuse`.
    pub fn from_env() -> Result<BoundsPolicy> {
        match std::env::var(BOUNDS_ENV) {
            Err(_) => Ok(BoundsPolicy::Guard),
            Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
                "" | "guard" => Ok(BoundsPolicy::Guard),
                "refuse" => Ok(BoundsPolicy::Refuse),
                other => {
                    Err(Error::Invalid(format!("{BOUNDS_ENV}={other} is not a bounds policy; use `guard` or `refuse`")))
                }
            },
        }
    }
}

/// The fault record of one guarded launch: check it once the kernel ran (and [`arm`] it
/// again before running the same launch once more).
///
/// [`arm`]: FaultWatch::arm
#[derive(Debug, Clone)]
pub struct FaultWatch {
    record: Buffer,
    kernel: String,
    guarded: Arc<Guarded>,
    /// Each buffer slot's element count for this launch.
    lens: Vec<usize>,
}

impl FaultWatch {
    /// The watch over `record` (two i64 per guarded access) of a launch of `kernel`'s
    /// guarded form `guarded`, whose buffer slots hold `lens` elements.
    pub(crate) fn new(record: Buffer, kernel: String, guarded: Arc<Guarded>, lens: Vec<usize>) -> FaultWatch {
        FaultWatch { record, kernel, guarded, lens }
    }

    /// Clears the record (a fresh one is clear) so the next run reports only its own faults.
    ///
    /// # Errors
    /// The errors of [`Buffer::copyin`].
    pub fn arm(&self) -> Result<()> {
        self.record.copyin(&vec![0u8; self.record.nbytes()])
    }

    /// The record's buffer: what holds the faults of the launch, to keep alive with its other
    /// buffers.
    pub fn record(&self) -> &Buffer {
        &self.record
    }

    /// After the run: [`Error::OutOfBounds`] for the first guarded access (in the kernel's
    /// `%N` order) that fired, naming an element it tried to touch; `Ok` when none did.
    ///
    /// # Errors
    /// That error, or the errors of [`Buffer::to_vec`] reading the record.
    pub fn check(&self) -> Result<()> {
        let record: Vec<i64> = self.record.to_vec()?;
        for (a, pair) in self.guarded.accesses.iter().zip(record.chunks_exact(2)) {
            if pair[0] != 0 {
                let len = match (a.slot, a.local) {
                    (Some(s), _) => self.lens.get(s).copied().unwrap_or(0) as i128,
                    (None, Some((_, n))) => n as i128,
                    (None, None) => 0,
                };
                let access = OutOfBounds {
                    node: a.node,
                    op: a.op,
                    slot: a.slot,
                    local: a.local.map(|(n, _)| n),
                    first: pair[1] as i128,
                    last: pair[1] as i128,
                    len,
                    guarded: true,
                };
                return Err(Error::OutOfBounds { kernel: self.kernel.clone(), access: Box::new(access) });
            }
        }
        Ok(())
    }
}
