//! Launch graphs: the backend hook behind an execution plan's replay as one device-side
//! graph (CUDA graphs).
//!
//! A plan whose nodes are all kernel launches asks the first node's program to capture the
//! whole sequence ([`Program::capture_graph`]). A backend that can returns a
//! [`LaunchGraph`]; the plan then replays the graph with one call per run, and when the
//! variable values change it re-points the captured launches at their new arguments
//! ([`LaunchGraph::update`]) instead of capturing again. Every program's default is "no
//! graphs" (`Ok(None)`): the plan replays through its queues as before, so backends without
//! graphs (CPU, OpenCL) are unaffected.

use std::sync::Arc;

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

/// A captured sequence of launches, run in capture order on the device.
pub trait LaunchGraph: Send {
    /// Re-points the captured launches at new arguments: `launches` are the same programs in
    /// the same order. `Ok(false)` when the graph cannot take them (another program, a
    /// launch shape the driver will not update): the caller captures a new graph.
    ///
    /// # Errors
    /// The backend's error when updating fails in a way a new capture would not fix.
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool>;

    /// Runs every launch in order and returns when the last one finished.
    ///
    /// # Errors
    /// The first failing launch's error (a fatal one loses the device, as with
    /// [`Program::execute`]).
    ///
    /// # Safety
    /// Every launch's arguments, as captured or last updated, satisfy the contract of
    /// [`Program::execute`] now: the memory is live, large enough and unraced.
    unsafe fn launch(&mut self) -> Result<()>;
}
