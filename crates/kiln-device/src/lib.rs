//! kiln-device: the contracts between kiln's kernel IR and its backends, and everything
//! that is backend-independent (launch checks, buffers, signals, queues, the kernel cache).

#![warn(missing_docs)]

pub mod allocator;
pub mod backend;
pub mod buffer;
pub mod cache;
pub mod context;
pub mod device;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod generation;
pub mod graph;
pub mod guarded;
pub mod kernel;
pub mod parts;
pub mod program;
pub mod queue;
pub mod registry;
pub mod ring;
pub mod signal;
pub mod stream;
#[cfg(test)]
pub(crate) mod testing;

pub use allocator::{LruAllocator, MEMORY_BUDGET_ENV, parse_byte_size, size_class};
pub use backend::{AccelBackend, AccelDevice, AccelStream, DeviceOf, EventOf};
pub use buffer::{Allocator, AllocatorStats, Buffer, Element, RawPtr, RawView};
pub use cache::{CACHE_DIR_ENV, CACHE_ENV, CACHE_LIMIT_ENV, CacheConfig, CacheStats, KernelCache, Toolchain};
pub use context::{DeviceContext, Stamp};
pub use device::{Device, DeviceProperties};
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
pub use queue::{DynQueue, DynQueueFactory, HardwareQueue, QueueFactory};
pub use registry::{
    Backend, DeviceOpener, DeviceProbe, REQUIRE_ENV, backends, device_names, find_backend, open_device,
    register_backend, report_skip, required, required_names, skip_unless_required,
};
pub use ring::{BackendEvent, EventRing, RingSignal};
pub use signal::{CpuTimelineSignal, TimelineSignal};
pub use stream::StreamQueue;
