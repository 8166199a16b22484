//! Launch graphs: the device part behind an execution plan's replay as one device-side
//! graph (CUDA graphs).
//!
//! Graph capture is a part of the device, as in tinygrad's `Compiled(device, allocator,
//! renderer, runtime, graph)`: a backend that has graphs puts a [`GraphFactory`] in its
//! [`crate::DeviceParts`], and every kernel the device loads reaches it through its origin
//! ([`crate::Kernel::graphs`]). A plan whose nodes are all kernel launches asks that factory
//! to capture the whole sequence; it replays the [`LaunchGraph`] with one call per run, and
//! when the variable values change it re-points the captured launches at their new arguments
//! ([`LaunchGraph::update`]) instead of capturing again. A device without a factory (CPU,
//! OpenCL) replays through its queues. The device wraps its factory with the generation
//! check and launch gate of its kernels, so programs and their wrappers have no graph hook
//! to forward.

use std::sync::Arc;
use std::time::Duration;

use crate::buffer::RawView;
use crate::error::Result;
use crate::program::{LaunchDims, Program};

/// One launch of a captured sequence, with arguments already checked by
/// [`crate::Kernel::check`].
#[derive(Clone)]
pub struct GraphLaunch {
    /// The program launched.
    pub program: Arc<dyn Program>,
    /// One buffer window per parameter slot.
    pub views: Vec<RawView>,
    /// The kernel's variable values, in `var_names` order.
    pub vals: Vec<i64>,
    /// The launch sizes for these values.
    pub dims: LaunchDims,
}

/// Captures launches of one device as a graph (a part of the device, see the module docs).
pub trait GraphFactory: Send + Sync {
    /// Captures `launches` (programs of this device, in order) as a [`LaunchGraph`] the
    /// device replays with one call. `Ok(None)` when it cannot take these launches (a
    /// program of another device): the caller runs them one by one.
    ///
    /// # Errors
    /// The backend's error when capturing fails; the caller then runs the launches one by one.
    fn capture(&self, launches: &[GraphLaunch]) -> Result<Option<Box<dyn LaunchGraph>>>;
}

/// A captured sequence of launches, run in capture order on the device.
pub trait LaunchGraph: Send {
    /// Re-points the captured launches at new arguments: `launches` are the same programs in
    /// the same order. `Ok(false)` when the graph cannot take them (another program, a
    /// launch shape the driver will not update): the caller captures a new graph.
    ///
    /// # Errors
    /// The backend's error when updating fails in a way a new capture would not fix.
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool>;

    /// Starts every launch, in order, and returns without waiting for them: [`LaunchGraph::wait`]
    /// waits. A launch before the last one finished runs after it.
    ///
    /// # Errors
    /// The driver's error when the graph cannot be started (a fatal one loses the device, as
    /// with [`Program::execute`]).
    ///
    /// # Safety
    /// Every launch's arguments, as captured or last updated, satisfy the contract of
    /// [`Program::execute`] until [`LaunchGraph::wait`] returned `Ok`: the memory is live,
    /// large enough and unraced.
    unsafe fn launch(&mut self) -> Result<()>;

    /// Waits up to `timeout` (`Duration::MAX`: without limit) for the last launch to finish.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] when it has not finished in time: the graph still runs and a
    /// later wait may succeed. The first failing launch's error otherwise (a fatal one loses
    /// the device).
    fn wait(&mut self, timeout: Duration) -> Result<()>;
}
