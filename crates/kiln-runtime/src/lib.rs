//! kiln-runtime: execution plans.
//!
//! An [`ExecutionPlan`] records kernel launches and copies once, derives their ordering
//! from the bytes they read and write ([`hazard`]), spreads independent work over several
//! queues of a device with timeline waits only where a dependency crosses queues
//! ([`schedule`]), and replays the whole graph with new variable values at a small fixed
//! host cost per node. [`ExecutionPlan::run_profiled`] times every node on the executing
//! side and writes the timeline as a Chrome trace ([`Profile::write_chrome_trace`]).
//!
//! It sits above the device layer (see `docs/architecture.md`): it is written against
//! `kiln-device`'s [`Device`](kiln_device::Device), [`Kernel`](kiln_device::Kernel) and
//! hardware queues alone, so a plan runs on every backend, and as one GPU graph where the
//! device has one. [`PlanOptions`] sets how many queues a plan spreads over, [`PlanRun`] is a
//! replay in flight, a [`Hazard`] says why one node must run after another, and
//! [`bench`](mod@bench) measures replay for `kiln bench`.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::{Buffer, kiln_ir::{DeviceSpec, KernelBuilder, Scalar}};
//! use kiln_runtime::ExecutionPlan;
//! let device = kiln_cpu::open(&DeviceSpec::new("CPU", 0))?;
//! // y[i] = 2·x[i] over n elements
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1024);
//! let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! k.store(&y.at(&i), &(x.at(&i).load() * 2.0));
//! let double = device.compile(&k.finish()?, Some("double"))?;
//! let a = Buffer::from_slice(device.allocator(), &[1.0f32; 1024])?;
//! let (b, c) = (device.buffer(Scalar::F32, 1024)?, device.buffer(Scalar::F32, 1024)?);
//! let mut plan = ExecutionPlan::new(&device)?;
//! plan.exec(&double, &[&a, &b], &[("n", 1024)])?; // b = 2a
//! plan.exec(&double, &[&b, &c], &[("n", 1024)])?; // c = 2b: reads what the first wrote
//! plan.run(&[("n", 512)])?;                         // replay with a new `n`
//! assert_eq!(c.to_vec::<f32>()?[..512], [4.0f32; 512]);
//! # Ok(())
//! # }
//! ```
//!
//! A plan saved to a file ([`saved`]) loads on any device without its recorder: kernels as IR,
//! constants as safetensors, every part checked before anything runs.
//!
//! `cargo run --release -p kiln-runtime --example tensor_compiler` walks through a whole
//! compiler front end on kiln: elementwise ops, reductions and a matmul lowered to kernels,
//! recorded into one plan and replayed with new sizes.

#![warn(missing_docs)]

mod fuse;
pub mod hazard;
mod launches;
mod plan;
mod profile;
pub mod saved;
pub mod schedule;

pub use hazard::{Dependency, Hazard};
pub use launches::LaunchStream;
pub use plan::{ExecutionPlan, KernelLaunch, PlanOptions, PlanRun};
pub use profile::{Profile, ProfileEvent};
