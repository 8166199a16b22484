//! Saved plans: an [`ExecutionPlan`](crate::ExecutionPlan) in one file that loads on any kiln
//! device in milliseconds, and that is safe to load whoever wrote it.
//!
//! A plan file is data, never code. It holds a manifest (named inputs and outputs with dtypes and
//! shapes, the buffers with their sizes and roles, the nodes in order), every kernel as kiln IR
//! text, and the constants as a safetensors block, each part with a checksum; `docs/saved-plans.md`
//! describes the format and its versioning rule. Loading checks every part before anything runs,
//! then compiles the kernels for the device it loads on, from the kernel cache where it holds
//! them, so a plan saved on the CPU loads on OpenCL or WebGPU where the kernels' features are
//! there. The nodes are recorded into a fresh plan through [`ExecutionPlan::exec`](crate::ExecutionPlan::exec), whose
//! checks (buffers against each kernel's parameters, every access proven in bounds or guarded)
//! are the safe path's: a damaged or hostile file fails with a typed [`PlanFileError`], and a file
//! that loads can compute garbage at worst, inside its own buffers.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::kiln_ir::{DeviceSpec, Scalar};
//! use kiln_runtime::saved::{LoadedPlan, LoadOptions, MlpShape, SampleMlp, SavedPlan, TensorRef};
//! let device = kiln_cpu::open(&DeviceSpec::new("CPU", 0))?;
//! // Record a small model and save it.
//! let model = SampleMlp::record(&device, MlpShape::default(), 4)?;
//! let bytes = SavedPlan::from_plan(&model.plan, &model.interface)?.to_bytes()?;
//! // Load it (`LoadedPlan::load(path, &device)` for a file) and run it on two rows.
//! let mut loaded = LoadedPlan::from_bytes(&bytes, &device, &LoadOptions::default())?;
//! let x = vec![0.5f32; 2 * 16];
//! let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
//! let out = loaded.run(&[("x", TensorRef { dtype: Scalar::F32, shape: &[2, 16], data: &data })])?;
//! assert_eq!((out[0].name.as_str(), out[0].shape.as_slice()), ("y", &[2usize, 8][..]));
//! # Ok(())
//! # }
//! ```

mod error;
mod format;
mod load;
mod loaded;
mod mapped;
mod sample;
mod save;

pub use error::PlanFileError;
pub use format::{Dim, FORMAT_VERSION};
pub use load::{LoadOptions, LoadProgress};
pub use loaded::{HostTensor, LoadStats, LoadedPlan, PlanVariable, TensorRef, TensorSpec};
pub use sample::{MlpShape, SampleMlp};
pub use save::{PlanInterface, PlanTensor, SavedPlan};

#[cfg(test)]
mod tests;
