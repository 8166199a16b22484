//! kiln-device: the contracts between kiln's kernel IR and its backends, and everything
//! that is backend-independent (launch checks, buffers, signals, queues, the kernel cache).
//!
//! It sits between [`kiln_ir`] (the kernels) and the backend crates (`kiln-cpu`,
//! `kiln-opencl`, `kiln-cuda`, `kiln-webgpu`), which implement its traits; `kiln-runtime`'s execution plans
//! and the `kiln` command line are written against it alone. A kernel goes down the layers
//! (see `docs/architecture.md`):
//!
//! - a [`Renderer`] turns the kernel's SINK into source, and [`ProgramSpec::from_sink`]
//!   derives its metadata (buffers, variables, launch sizes, the bounds proof of every access);
//! - a [`Compiler`] makes a [`CompiledSpec`], cached in memory and on disk by [`KernelCache`];
//! - a [`Loader`] loads it as the backend's [`Program`], wrapped in a [`Kernel`] that checks
//!   every launch ([`Kernel::launch`]) against the buffers and variable values it is given;
//! - it runs on [`Buffer`]s from the device's [`Allocator`] (usually behind an
//!   [`LruAllocator`]), directly or on a [`HardwareQueue`] ordered by [`TimelineSignal`]s.
//!
//! A [`Device`] owns all of this for one backend device: it holds the [`DeviceParts`] a
//! backend builds for each generation, and [`Device::reset`] recovers it after a fatal
//! error. Backends register with the [`registry`] and are opened by name with
//! [`open_device`]; each backend crate describes itself to the rest of kiln as a [`Driver`].
//! Every failure is an [`Error`], and [`Error::class`] sorts it into an [`ErrorClass`] for a
//! recovery policy.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::{Buffer, kiln_ir::{KernelBuilder, Scalar}};
//! kiln_cpu::register(); // once per process, for each backend linked
//! let device = kiln_device::open_device("CPU")?;
//! // y[i] = x[i] + 1 over n elements
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1 << 20);
//! let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! k.store(&y.at(&i), &(x.at(&i).load() + 1.0));
//! let kernel = device.compile(&k.finish()?, Some("inc"))?; // render, compile, cache, load
//! // Both accesses are proven in bounds for every n when the kernel is built.
//! assert!(kernel.spec.access_proofs().iter().all(|a| !a.at_launch));
//! let a = Buffer::from_slice(device.allocator(), &[1.0f32, 2.0, 3.0])?;
//! let b = device.buffer(Scalar::F32, 3)?;
//! kernel.launch(&[&a, &b], &[3])?; // variable values in name order: n = 3
//! assert_eq!(b.to_vec::<f32>()?, [2.0, 3.0, 4.0]);
//! // A launch that would touch memory past a buffer is an error, never a fault.
//! let e = kernel.launch(&[&a, &b], &[4]).unwrap_err();
//! assert_eq!(e.class(), kiln_device::ErrorClass::Launch);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod allocator;
pub mod backend;
pub mod buffer;
pub mod cache;
pub mod collective;
pub mod context;
pub mod device;
#[cfg(test)]
pub(crate) mod doubles;
pub mod driver;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod generation;
pub mod graph;
pub mod guarded;
pub mod kernel;
pub mod parts;
pub mod program;
pub mod properties;
pub mod queue;
pub mod registry;
pub mod ring;
pub mod signal;
pub mod stream;
#[cfg(feature = "testing")]
pub mod testing;

pub use allocator::{LruAllocator, MEMORY_BUDGET_ENV, parse_byte_size, size_class};
pub use backend::{AccelBackend, AccelStream, ContextMap, EventOf};
pub use buffer::{Allocator, AllocatorStats, Buffer, Element, MAX_BUFFER_BYTES, RawPtr, RawView};
pub use cache::{CACHE_DIR_ENV, CACHE_ENV, CACHE_LIMIT_ENV, CacheConfig, CacheStats, KernelCache, Toolchain};
pub use collective::{Channel, Collective, LocalChannel, ReduceOp};
pub use context::{DeviceContext, Stamp};
pub use device::{Device, MAX_KERNEL_NAME};
pub use driver::{Baseline, BaselineFn, BenchWork, Conformance, Driver, OfflineTarget, TargetOutput, no_baseline};
pub use error::{Error, ErrorClass, Result};
pub use graph::{GraphFactory, GraphLaunch, LaunchGraph};
pub use guarded::{BOUNDS_ENV, BoundsPolicy, FaultWatch};
pub use kernel::{Kernel, LaunchGate, Loader, Origin, PreparedLaunch};
pub use kiln_ir;
pub use parts::{CompilerPair, DeviceParts, PartsBuilder};
pub use program::{
    AccessProof, CompiledSpec, Compiler, LaunchDims, ParamInfo, Program, ProgramSpec, Renderer, RuntimeFactory,
    Variable, special_axis,
};
pub use properties::DeviceProperties;
pub use queue::{DynQueue, DynQueueFactory, HardwareQueue, QueueFactory};
pub use registry::{
    Backend, DeviceOpener, DeviceProbe, REQUIRE_ENV, backends, device_names, find_backend, open_device, opened_device,
    register_backend, required, required_names,
};
pub use ring::{BackendEvent, EventRing, RingSignal};
pub use signal::{CpuTimelineSignal, TimelineSignal};
pub use stream::{StreamQueue, StreamQueueFactory};
