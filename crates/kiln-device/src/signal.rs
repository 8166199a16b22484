//! Timeline signals: monotonic u64 counters that order work across queues, threads and
//! devices.
//!
//! Contract (every implementation):
//! - `set(v)` never lowers the value (it is a max).
//! - `wait(v, timeout)` returns `Ok` once `value() >= v`, a [`Error::Timeout`] when the
//!   timeout passes first, or the failure error if the signal was failed. No wake-up is lost:
//!   a `set` that happens-before or races with `wait` is always observed.
//! - `fail(e)`: every current and later waiter of a value not yet reached gets `e` (as
//!   [`Error::SignalFailed`]), so a failed producer never leaves a consumer hanging.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;

pub trait TimelineSignal: Send + Sync + Debug + Any {
    /// For checked downcasts to the concrete type.
    fn as_any(&self) -> &dyn Any;

    /// For checked downcasts that keep ownership (queues hold the signal until they ran).
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;

    fn value(&self) -> u64;

    /// Raises the value to `value` (no effect if it is already higher) and wakes waiters.
    fn set(&self, value: u64);

    /// Blocks until the value reaches `value`, the timeout passes, or the signal fails.
    fn wait(&self, value: u64, timeout: Duration) -> Result<()>;

    /// Marks the signal failed: pending and future waits for unreached values return `error`.
    fn fail(&self, error: crate::Error);

    /// The failure, if the signal was failed.
    fn failure(&self) -> Option<crate::Error>;

    fn is_reached(&self, value: u64) -> bool {
        self.value() >= value
    }
}
