//! kiln-cpu: the CPU backend. Kernels are rendered to C, compiled by the system C compiler
//! into a shared library, loaded with `dlopen` and run on a persistent pool of threads.
//!
//! The rooms, read top to bottom:
//! - [`renderer`]: the C dialect of the shared C-family core and the kernel entry ABI.
//! - [`compiler`]: finding the C compiler, its flags, compiling to `.so` bytes.
//! - [`program`]: loading the bytes and running a launch over the core pool.
//! - [`pool`]: the persistent thread pool that runs the chunks of one launch.
//! - [`allocator`]: 64-byte aligned host memory.

pub mod allocator;
pub mod compiler;
pub mod pool;
pub mod program;
pub mod queue;
pub mod renderer;
pub mod signal;

use std::sync::Arc;

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Device, DeviceParts, Error, LruAllocator, Program, Result, RuntimeFactory, register_backend};

pub use allocator::CpuAllocator;
pub use compiler::{CC_ENV, CCompiler};
pub use pool::Pool;
pub use program::CpuProgram;
pub use queue::{Cpu, CpuEvent, CpuQueue, CpuQueueFactory};
pub use renderer::{CpuDialect, CpuRenderer};

/// Opens the CPU device (`CPU`; there is only one). Fails with
/// [`Error::CompilerMissing`] when no C compiler can be run.
pub fn open(spec: &DeviceSpec) -> Result<Arc<Device>> {
    if *spec != DeviceSpec::Cpu {
        return Err(Error::Unavailable(format!("the CPU backend has only the device CPU, not {spec}")));
    }
    let compiler = Arc::new(CCompiler::detect()?);
    let description = format!("{} ({} threads), {}", cpu_model(), Pool::global().threads(), compiler.version());
    let renderer = Arc::new(CpuRenderer::new());
    // The renderer and compiler hold no device state and survive a reset; memory, queues and
    // loaded programs are built anew for every generation.
    let device = Device::new(DeviceSpec::Cpu, description, move |_| {
        let runtime: RuntimeFactory =
            Arc::new(|compiled| Ok(Arc::new(CpuProgram::load(compiled)?) as Arc<dyn Program>));
        Ok(DeviceParts {
            allocator: Arc::new(LruAllocator::from_env(Arc::new(CpuAllocator::new()))?),
            compilers: vec![(renderer.clone(), compiler.clone())],
            runtime,
            queues: Some(Arc::new(CpuQueueFactory::new())),
        })
    })?;
    Ok(Arc::new(device))
}

/// Registers [`open`] as the opener of `CPU` devices.
pub fn register() {
    register_backend("CPU", open);
}

/// The CPU model name from `/proc/cpuinfo` (or the architecture when unavailable).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
