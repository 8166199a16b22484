//! kiln-runtime: execution plans.
//!
//! An [`ExecutionPlan`] records kernel launches and copies once, derives their ordering
//! from the bytes they read and write ([`hazard`]), spreads independent work over several
//! queues of a device with timeline waits only where a dependency crosses queues
//! ([`schedule`]), and replays the whole graph with new variable values at a small fixed
//! host cost per node. [`ExecutionPlan::run_profiled`] times every node on the executing
//! side and writes the timeline as a Chrome trace ([`Profile::write_chrome_trace`]).
//!
//! ```ignore
//! let mut plan = ExecutionPlan::new(&device)?;
//! plan.exec(&scale, &[&x, &y], &[("n", 1024)])?;   // y = f(x)
//! plan.exec(&scale, &[&x2, &y2], &[("n", 1024)])?; // independent: runs on another queue
//! plan.exec(&add, &[&y, &y2, &z], &[])?;           // joins both: waits on a signal
//! plan.run(&[("n", 512)])?;                        // replay with a new `n`
//! ```

pub mod bench;
mod fuse;
pub mod hazard;
mod plan;
mod profile;
pub mod schedule;

pub use hazard::{Dependency, Hazard};
pub use plan::{ExecutionPlan, PlanOptions, PlanRun};
pub use profile::{Profile, ProfileEvent};
