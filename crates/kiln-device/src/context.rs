//! Device contexts and generations: how kiln recovers from a lost device in-process.
//!
//! A [`DeviceContext`] is the backend-independent identity of one device: its spec, a
//! generation counter and the sticky error that lost it. Everything minted on a device
//! carries a [`Stamp`] (the context and the generation it was minted under) and checks it at
//! every entry point:
//! - buffers, through the device's allocator (`generation::ContextAllocator`): allocation,
//!   host transfers and [`crate::Buffer::raw`], the view every launch and queue command takes;
//! - kernels, through their origin ([`crate::kernel::Origin`]): `Kernel::check`, every
//!   launch (`Kernel::execute`, a native enqueue through `Kernel::admit`) and the device's
//!   launch graphs;
//! - queues and signals, through the device's queue factory (`generation::ContextQueues`): a
//!   queue's `submit`, and every signal of a generation is failed when that generation ends.
//!
//! Contract:
//! - While the device is healthy, a stamp of the current generation passes.
//! - A fatal error ([`crate::Error::is_fatal`]) seen by any of those objects marks the device
//!   *lost* ([`DeviceContext::mark_lost`]): every signal of the generation is failed with
//!   [`Error::DeviceFailed`] carrying the root cause (so no waiter hangs and every waiter
//!   learns why), and every entry point refuses new work with that error.
//! - [`crate::Device::reset`] rebuilds the backend state and bumps the generation. An object
//!   of an older generation then fails with [`Error::DeviceLost`] `{ minted, current }`,
//!   never touching the new state; its memory goes back to the allocator that minted it
//!   (the old generation's), never into the new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use kiln_ir::DeviceSpec;

use crate::error::{Error, Result};
use crate::signal::TimelineSignal;

/// Bit 63 of the state word: the current generation is lost.
const LOST: u64 = 1 << 63;

/// The identity and health of one device (see the module docs).
pub struct DeviceContext {
    spec: DeviceSpec,
    /// Low 63 bits: the generation; bit 63: lost. One word, so the common check (a stamp of
    /// the current, healthy generation) is a single load and compare.
    state: AtomicU64,
    inner: Mutex<Lifecycle>,
}

#[derive(Default)]
struct Lifecycle {
    /// Why the current generation was lost.
    cause: Option<Arc<Error>>,
    /// The signals minted under the current generation, failed when it ends.
    signals: Vec<Weak<dyn TimelineSignal>>,
}

impl std::fmt::Debug for DeviceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceContext({} generation {}, lost: {})", self.spec, self.generation(), self.is_lost())
    }
}

impl DeviceContext {
    /// A healthy context at generation 0.
    pub fn new(spec: DeviceSpec) -> Arc<DeviceContext> {
        Arc::new(DeviceContext { spec, state: AtomicU64::new(0), inner: Mutex::new(Lifecycle::default()) })
    }

    /// The device this context is the identity of; it does not change across resets.
    pub fn spec(&self) -> &DeviceSpec {
        &self.spec
    }

    /// The current generation: 0 when opened, +1 per [`crate::Device::reset`].
    pub fn generation(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !LOST
    }

    /// Whether the current generation was lost to a fatal error; only a reset clears it.
    pub fn is_lost(&self) -> bool {
        self.state.load(Ordering::Acquire) & LOST != 0
    }

    /// The fatal error that lost the current generation, if it is lost.
    pub fn lost_cause(&self) -> Option<Arc<Error>> {
        self.lock().cause.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Lifecycle> {
        // Nothing panics under this lock; a poisoned lock still holds consistent data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stamp of the current generation, for a newly minted object.
    pub fn stamp(self: &Arc<Self>) -> Stamp {
        Stamp { ctx: self.clone(), minted: self.generation() }
    }

    /// Marks the current generation lost with `cause` (the first cause wins) and fails every
    /// signal minted under it, so work in flight and its waiters end with the root cause.
    pub fn mark_lost(&self, cause: Error) {
        let (error, signals) = {
            let mut inner = self.lock();
            if inner.cause.is_some() {
                return;
            }
            let cause = Arc::new(cause);
            inner.cause = Some(cause.clone());
            self.state.fetch_or(LOST, Ordering::AcqRel);
            (Error::DeviceFailed { device: self.spec.to_string(), cause }, std::mem::take(&mut inner.signals))
        };
        for s in signals.iter().filter_map(Weak::upgrade) {
            s.fail(error.clone());
        }
    }

    /// Ends the current generation: its remaining signals fail with [`Error::DeviceLost`],
    /// the lost flag clears and the generation is bumped. Returns the new generation.
    pub(crate) fn advance(&self) -> u64 {
        let (signals, old) = {
            let mut inner = self.lock();
            inner.cause = None;
            let old = self.generation();
            self.state.store(old + 1, Ordering::Release);
            (std::mem::take(&mut inner.signals), old)
        };
        let stale = Stamp::lost_error(&self.spec, "a signal", old, old + 1);
        for s in signals.iter().filter_map(Weak::upgrade) {
            s.fail(stale.clone());
        }
        old + 1
    }

    /// Remembers a signal of the current generation so its end can fail it.
    pub(crate) fn track(&self, signal: &Arc<dyn TimelineSignal>) {
        let mut inner = self.lock();
        if inner.signals.len() >= 64 && inner.signals.len().is_power_of_two() {
            inner.signals.retain(|w| w.strong_count() > 0);
        }
        inner.signals.push(Arc::downgrade(signal));
    }
}

/// The (context, generation) an object was minted under.
#[derive(Clone, Debug)]
pub struct Stamp {
    ctx: Arc<DeviceContext>,
    minted: u64,
}

impl Stamp {
    /// The context the object belongs to; the stamp keeps it alive.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// The generation the object was minted under; fixed for the object's lifetime.
    pub fn minted(&self) -> u64 {
        self.minted
    }

    /// Whether the object may be used: `Ok` for the current healthy generation,
    /// [`Error::DeviceLost`] for an older generation, [`Error::DeviceFailed`] while the
    /// current one is lost. `what` names the object in the message.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] or [`Error::DeviceFailed`], as above.
    #[inline]
    pub fn check(&self, what: &str) -> Result<()> {
        let state = self.ctx.state.load(Ordering::Acquire);
        if state == self.minted { Ok(()) } else { Err(self.refusal(state, what)) }
    }

    /// Why a stamp that is not current is refused (kept out of line: the common check is a
    /// load and a compare on launch paths).
    #[cold]
    fn refusal(&self, state: u64, what: &str) -> Error {
        let current = state & !LOST;
        if current != self.minted {
            return Self::lost_error(&self.ctx.spec, what, self.minted, current);
        }
        let cause = self.ctx.lost_cause().unwrap_or_else(|| Arc::new(Error::driver("kiln", "cause not recorded")));
        Error::DeviceFailed { device: self.ctx.spec.to_string(), cause }
    }

    /// Marks the device lost if `result` is a fatal error seen by an object of the current
    /// generation (a stale object's failure says nothing about the new context); returns
    /// `result` unchanged.
    ///
    /// # Errors
    /// `result`'s error, unchanged.
    #[inline]
    pub fn observe<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.observe_error(e);
        }
        result
    }

    #[cold]
    fn observe_error(&self, e: &Error) {
        if e.is_fatal()
            && !matches!(e.root_cause(), Error::DeviceLost { .. } | Error::DeviceFailed { .. })
            && self.is_current()
        {
            self.ctx.mark_lost(e.clone());
        }
    }

    /// Whether the generation is still the current one (lost or not).
    pub fn is_current(&self) -> bool {
        self.ctx.generation() == self.minted
    }

    fn lost_error(spec: &DeviceSpec, what: &str, minted: u64, current: u64) -> Error {
        Error::DeviceLost { device: spec.to_string(), what: what.to_string(), minted, current }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::CpuTimelineSignal;
    use std::time::Duration;

    #[test]
    fn stamps_follow_generations_and_loss() {
        let ctx = DeviceContext::new(DeviceSpec::new("CPU", 0));
        let old = ctx.stamp();
        old.check("x").unwrap();
        let s: Arc<dyn TimelineSignal> = Arc::new(CpuTimelineSignal::new());
        ctx.track(&s);
        ctx.mark_lost(Error::Driver { backend: "test", code: Some(7), fatal: true, message: "gone".into() });
        ctx.mark_lost(Error::driver("test", "second"));
        assert!(matches!(old.check("x"), Err(Error::DeviceFailed { .. })));
        match s.wait(1, Duration::ZERO) {
            Err(e) => assert!(
                matches!(e.root_cause(), Error::DeviceFailed { cause, .. } if matches!(**cause, Error::Driver { code: Some(7), .. })),
                "{e}"
            ),
            Ok(()) => panic!("a signal of a lost device was not failed"),
        }
        assert_eq!(ctx.advance(), 1);
        assert!(!ctx.is_lost());
        match old.check("a buffer") {
            Err(Error::DeviceLost { minted: 0, current: 1, what, .. }) => assert_eq!(what, "a buffer"),
            other => panic!("expected DeviceLost, got {other:?}"),
        }
        ctx.stamp().check("x").unwrap();
    }
}
