//! Hardware command queues.
//!
//! A queue is a builder: `wait`, `signal`, `exec`, `copy` and `memory_barrier` record
//! commands; nothing runs before [`HardwareQueue::submit`], and `submit` never waits for
//! the work. Commands of one queue run in order; commands of different queues are ordered
//! only by timeline signals. A recording error (wrong arguments to `exec`, a foreign signal
//! type) is kept and returned by `submit`, which then submits nothing.

use std::sync::Arc;

use kiln_ir::DeviceSpec;

use crate::buffer::Buffer;
use crate::device::Kernel;
use crate::error::Result;
use crate::signal::TimelineSignal;

pub trait HardwareQueue: Send {
    type Signal: TimelineSignal;

    /// Later commands start only after `signal` reaches `value`. Blocks the queue, never the host.
    fn wait(&mut self, signal: &Arc<Self::Signal>, value: u64) -> &mut Self;

    /// Sets `signal` to `value` once every earlier command of this queue has finished.
    /// If an earlier command failed, the signal is failed with that error instead.
    fn signal(&mut self, signal: &Arc<Self::Signal>, value: u64) -> &mut Self;

    /// Runs `kernel` over `bufs` with variable values `vals` (in `var_names` order).
    /// Arguments are checked now; launch sizes are evaluated now from `vals`.
    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> &mut Self;

    /// Copies `src` into `dst` (same byte size, either may be on another device).
    fn copy(&mut self, dst: &Buffer, src: &Buffer) -> &mut Self;

    /// Makes every earlier write visible to every later command of any queue that waits on
    /// a signal set after this point.
    fn memory_barrier(&mut self) -> &mut Self;

    /// Hands the recorded batch to the device and returns without waiting.
    fn submit(&mut self) -> Result<()>;

    fn device(&self) -> &DeviceSpec;
}

/// Creates the queues and signals of one device.
pub trait QueueFactory: Send + Sync {
    type Queue: HardwareQueue<Signal = Self::Signal>;
    type Signal: TimelineSignal;

    fn create_compute_queue(&self) -> Result<Self::Queue>;

    /// A dedicated copy queue, if the device has one.
    fn create_copy_queue(&self) -> Result<Option<Self::Queue>>;

    fn create_signal(&self) -> Result<Arc<Self::Signal>>;

    fn device(&self) -> &DeviceSpec;
}
