//! kiln-device: the contracts between kiln's kernel IR and its backends, and everything
//! that is backend-independent (launch checks, buffers, signals, queues, the kernel cache).

pub mod buffer;
pub mod device;
pub mod error;
pub mod program;
pub mod queue;
pub mod signal;

pub use buffer::{Allocator, AllocatorStats, Buffer, Element, RawPtr, RawView};
pub use device::{CompilerPair, Device, DeviceOpener, Kernel, open_device, register_backend};
pub use error::{Error, Result};
pub use kiln_ir;
pub use program::{
    CompiledSpec, Compiler, LaunchDims, ParamInfo, Program, ProgramSpec, Renderer, RuntimeFactory, Variable,
    special_axis,
};
pub use queue::{HardwareQueue, QueueFactory};
pub use signal::TimelineSignal;
