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
//! or [`Kernel::refusing`] for one kernel) such a launch is refused with the proof's
//! [`Error::OutOfBounds`], as [`Kernel::check`] always does.

use std::sync::{Arc, OnceLock};

use kiln_ir::bounds::OutOfBounds;
use kiln_ir::{Guarded, UOp};

use crate::buffer::{Allocator, Buffer, RawView};
use crate::device::Kernel;
use crate::error::{Error, Result};
use crate::program::LaunchDims;

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

/// Compiles a kernel of the device a [`Fallback`] belongs to (its cache and toolchain).
pub(crate) type CompileFn = dyn Fn(&Arc<UOp>) -> Result<Kernel> + Send + Sync;

/// A kernel's guarded form, compiled on first need (an error is not kept: the next launch
/// that needs the form tries again).
pub(crate) struct Fallback {
    compile: Box<CompileFn>,
    allocator: Arc<dyn Allocator>,
    built: OnceLock<(Arc<Guarded>, Kernel)>,
}

impl Fallback {
    pub(crate) fn new(compile: Box<CompileFn>, allocator: Arc<dyn Allocator>) -> Fallback {
        Fallback { compile, allocator, built: OnceLock::new() }
    }

    /// The guarded form of `kernel`: its accesses left open at build time guard themselves.
    fn get(&self, kernel: &Kernel) -> Result<&(Arc<Guarded>, Kernel)> {
        if let Some(built) = self.built.get() {
            return Ok(built);
        }
        let guarded = kiln_ir::guard(&kernel.spec.ast, &kernel.spec.bounds.pending_nodes())?;
        let compiled = (self.compile)(&guarded.sink)?;
        // Two launches racing here compile one kernel (the cache joins them); either wins.
        Ok(self.built.get_or_init(|| (Arc::new(guarded), compiled)))
    }
}

/// A launch checked and ready to run: the kernel to execute (the one launched, or its guarded
/// form) with its buffers' views and sizes, and the faults to check once it ran.
#[derive(Debug)]
pub struct PreparedLaunch {
    /// What to execute: the launched kernel, or its guarded form (one buffer more).
    pub kernel: Kernel,
    /// One view per buffer of `kernel`, checked by [`Kernel::check`].
    pub views: Vec<RawView>,
    /// The checked launch sizes.
    pub dims: LaunchDims,
    /// `Some` when `kernel` is a guarded form: check it after the run.
    pub faults: Option<FaultWatch>,
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

impl Kernel {
    /// The safe launch's check with its fallback: [`Kernel::check`], and when that refuses
    /// the launch only because an access could not be proven in bounds, the kernel's guarded
    /// form with a fresh fault record (see the module docs). Queues, plans and
    /// [`Kernel::launch`] run what this returns and then [`FaultWatch::check`] the faults.
    ///
    /// # Errors
    /// The errors of [`Kernel::check`]; [`Error::OutOfBounds`] as `check` gives it when the
    /// device's policy is [`BoundsPolicy::Refuse`] or the access cannot be guarded (its
    /// address is not an INDEX chain over a buffer); the errors of compiling the guarded
    /// form or allocating its record.
    pub fn prepare(&self, bufs: &[&Buffer], vals: &[i64]) -> Result<PreparedLaunch> {
        let refused = match self.check(bufs, vals) {
            Ok((views, dims)) => return Ok(PreparedLaunch { kernel: self.clone(), views, dims, faults: None }),
            Err(e @ Error::OutOfBounds { .. }) => e,
            Err(e) => return Err(e),
        };
        let Some(fallback) = &self.fallback else { return Err(refused) };
        let (guarded, kernel) = match fallback.get(self) {
            Ok(g) => g,
            Err(Error::Ir(_)) => return Err(refused), // not guardable: the proof's error says why
            Err(e) => return Err(e),
        };
        let record = Buffer::new(fallback.allocator.clone(), kiln_ir::Scalar::I64, 2 * guarded.accesses.len())?;
        let faults = FaultWatch {
            record,
            kernel: self.spec.name.clone(),
            guarded: guarded.clone(),
            lens: self.spec.param_lens(vals)?,
        };
        faults.arm()?;
        let mut all: Vec<&Buffer> = bufs.to_vec();
        all.push(&faults.record);
        match kernel.check(&all, vals) {
            Ok((views, dims)) => Ok(PreparedLaunch { kernel: kernel.clone(), views, dims, faults: Some(faults) }),
            // The guards bound every access by its own buffer's size, which a launch may
            // still fail to prove when that size wraps in the kernel's arithmetic.
            Err(Error::OutOfBounds { .. }) => Err(refused),
            Err(e) => Err(e),
        }
    }
}
