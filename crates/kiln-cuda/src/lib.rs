//! kiln-cuda: the CUDA backend.
//!
//! Every CUDA device is one kiln device, `CUDA:0..n`, in the driver's ordinal order. The
//! driver library (`libcuda.so.1`, installed with the NVIDIA driver) is loaded at run time
//! (cudarc's `dynamic-loading`), so a machine without it builds, links and runs: its absence
//! is [`Error::Unavailable`] with the reason, never a link failure or a panic. Compiling
//! needs no driver and no GPU ([`compiler`]).
//!
//! It is one of kiln's backends (see `docs/architecture.md`): it implements the contracts of
//! [`kiln_device`] and builds each device's [`DeviceParts`], graphs included. Open a device
//! with [`open`], or [`register`] the backend and open it by name with
//! [`kiln_device::open_device`]; [`probe`] lists the devices, or says why there are none.
//! The main types are [`CudaRenderer`], [`CudaCompiler`] (with its [`Arch`] and [`Output`]),
//! [`CudaProgram`], [`CudaAllocator`], [`CudaQueueFactory`], [`CudaSignal`], [`CudaGraphs`]
//! and [`CudaDevice`].
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::{Buffer, ErrorClass, kiln_ir::{DeviceSpec, KernelBuilder, Scalar}};
//! let device = match kiln_cuda::open(&DeviceSpec::new(kiln_cuda::BACKEND, 0)) {
//!     Ok(device) => device,
//!     // No driver, no GPU, or no NVRTC: the error says which, and what to install.
//!     Err(e) if e.class() == ErrorClass::Unavailable => {
//!         eprintln!("skipped: {e}");
//!         return Ok(());
//!     }
//!     Err(e) => return Err(e.into()),
//! };
//! println!("{}", device.description()); // name, sm_XX, memory, driver version
//! // y[i] = 3·x[i] + 1 over n elements
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1 << 24);
//! let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! k.store(&y.at(&i), &(x.at(&i).load() * 3.0 + 1.0));
//! let axpb = device.compile(&k.finish()?, Some("axpb"))?; // CUDA C++ → NVRTC → cubin
//! let a = Buffer::from_slice(device.allocator(), &[0.0f32, 1.0, 2.0])?; // copied to the GPU
//! let b = device.buffer(Scalar::F32, 3)?;
//! axpb.launch(&[&a, &b], &[3])?;
//! assert_eq!(b.to_vec::<f32>()?, [1.0, 4.0, 7.0]);
//! # Ok(())
//! # }
//! ```
//!
//! The rooms, read top to bottom:
//! - [`renderer`]: CUDA C++ from the kernel IR (kiln-cstyle with CUDA C++ as data).
//! - [`compiler`]: NVRTC → PTX → cubin for one `sm_XX`; needs no GPU.
//! - [`program`]: loads a cubin (`cuModuleLoadData`) and launches it.
//! - [`allocator`]: device memory, with pinned staging for host copies.
//! - [`queue`]: one CUDA stream per queue: the native operations of the shared stream-queue
//!   skeleton.
//! - [`signal`]: timeline signals backed by CUDA events (the generic event ring).
//! - [`graph`]: CUDA graphs, which an execution plan replays as one launch.
//! - [`exports`]: the backend for the rest of kiln: registration, conformance entry, the
//!   offline `cuda:sm_XY` target and its own bench baselines (cuBLAS, device copy).
//! - `blas` (feature `cublas`): cuBLAS sgemm, the matmul baseline of `kiln bench`.
//! - `nccl` (feature `nccl`): NCCL channels, collectives between CUDA devices.
//!
//! # Contexts and threads
//! Each device is used through its *primary context*, retained once per process
//! ([`CudaDevice`]). A CUDA context is current per thread, and [`kiln_device::Program::execute`],
//! allocator calls and queue workers may run on any thread: every entry point that calls the
//! driver first makes the device's context current on the calling thread
//! ([`CudaDevice::bind`]). Synchronous work (host copies, `Program::execute`) runs on the
//! calling thread's per-thread default stream, so two threads never wait for each other's work.

pub mod allocator;
#[cfg(feature = "cublas")]
pub mod blas;
pub mod compiler;
pub mod exports;
pub mod graph;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod program;
pub mod queue;
pub mod renderer;
pub mod signal;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Device, DeviceParts, DeviceProperties, Error, LruAllocator, Result};

pub use allocator::CudaAllocator;
pub use compiler::{Arch, CudaCompiler, Output};
pub use exports::DRIVER;
pub use graph::CudaGraphs;
pub use program::CudaProgram;
pub use queue::{Cuda, CudaQueue, CudaQueueFactory, CudaStream, queue_factory};
pub use renderer::{CudaCpp, CudaDialect, CudaRenderer, cuda_renderer};
pub use signal::{CudaEvent, CudaSignal};

/// The backend's name in device specs (`CUDA:n`), in `KILN_REQUIRE` (lower case) and in the
/// registry.
pub const BACKEND: &str = "CUDA";
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream (a macro in `cuda.h`, so not
/// in the bindings). It does not synchronize with other threads' default streams.
pub(crate) const PER_THREAD_STREAM: sys::CUstream = 2 as sys::CUstream;

/// Turns a driver status into a driver error naming the call that failed, keeping the
/// `CUresult` and whether it is sticky ([`is_sticky`]): a sticky error is fatal, so the
/// stamps of kiln-device mark the device lost and its waiters get this error as the cause.
pub(crate) fn driver(what: &str, e: DriverError) -> Error {
    let name = e.error_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Error::Driver {
        backend: "CUDA",
        code: Some(e.0 as i64),
        fatal: is_sticky(e.0),
        message: format!("{what} failed: {name} ({text})"),
    }
}

/// The statuses after which the CUDA context is unusable: every later call in it returns the
/// same error until the context is destroyed (the driver documents these as leaving "the
/// process in an inconsistent state"). kiln treats them as fatal and recovers with
/// [`Device::reset`], which resets the primary context (see [`CudaDevice`]).
pub fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// Loads the driver library and initializes it, once per process; or why CUDA is unavailable.
fn driver_ready() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), Error>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the candidate names of libcuda.
            if !unsafe { sys::is_culib_present() } {
                return Err(Error::Unavailable(
                    "the CUDA driver library libcuda.so.1 was not found: install the NVIDIA driver (it provides \
                     libcuda.so.1) on a machine with an NVIDIA GPU; `kiln compile --target cuda:sm_XY` compiles \
                     without one"
                        .into(),
                ));
            }
            match cu::init() {
                Ok(()) => Ok(()),
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                    Err(Error::Unavailable("the CUDA driver is installed but reports no CUDA device".into()))
                }
                Err(e) => Err(driver("cuInit", e)),
            }
        })
        .clone()
}

/// The number of CUDA devices, or why there are none.
fn device_count() -> Result<u32> {
    driver_ready()?;
    let n = cu::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?;
    if n <= 0 {
        return Err(Error::Unavailable("the CUDA driver reports no CUDA device".into()));
    }
    Ok(n as u32)
}

/// Static facts about a device, read once at open.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub arch: Arch,
    pub total_mem: usize,
    /// `cuDriverGetVersion`: 13000 is CUDA 13.0.
    pub driver_version: i32,
    pub max_threads_per_block: u32,
    pub max_block_dims: [u32; 3],
    pub max_grid_dims: [u32; 3],
    /// Shared memory one block may use without opting in to more, in bytes.
    pub max_shared_memory_per_block: u32,
}

impl DeviceInfo {
    fn read(dev: sys::CUdevice) -> Result<DeviceInfo> {
        let attr = |a: Attr| -> Result<i32> {
            // SAFETY: `dev` is a device handle from cuDeviceGet.
            unsafe { cu::device::get_attribute(dev, a) }.map_err(|e| driver(&format!("cuDeviceGetAttribute({a:?})"), e))
        };
        let positive = |a: Attr| attr(a).map(|v| v.max(1) as u32);
        let mut driver_version = 0;
        // SAFETY: the out-pointer is valid for one write.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| driver("cuDriverGetVersion", e))?;
        Ok(DeviceInfo {
            name: cu::device::get_name(dev).map_err(|e| driver("cuDeviceGetName", e))?,
            arch: Arch {
                major: positive(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                minor: attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?.max(0) as u32,
            },
            // SAFETY: as above.
            total_mem: unsafe { cu::device::total_mem(dev) }.map_err(|e| driver("cuDeviceTotalMem", e))?,
            driver_version,
            max_threads_per_block: positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_block_dims: [
                positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ],
            max_grid_dims: [
                positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            max_shared_memory_per_block: positive(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        })
    }

    /// What kernel generators may rely on: the block limits and shared memory.
    pub fn properties(&self) -> DeviceProperties {
        DeviceProperties {
            max_work_group_size: Some(self.max_threads_per_block as usize),
            max_work_group_dims: Some(self.max_block_dims.map(|d| d as usize)),
            local_memory_bytes: Some(self.max_shared_memory_per_block as usize),
            wmma: renderer::cuda_wmma_forms(self.arch.major, self.arch.minor),
            ..DeviceProperties::default()
        }
    }

    /// One line for `kiln devices`: name, architecture, memory and driver version.
    pub fn description(&self) -> String {
        format!(
            "{} ({}, {} MiB, CUDA driver {}.{})",
            self.name.trim(),
            self.arch,
            self.total_mem >> 20,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// An opened CUDA device: its retained primary context. Shared (`Arc`) by everything of one
/// device generation, and by every kiln device of that ordinal in the process (they share the
/// primary context); released when the last user drops it.
///
/// # Reset
/// A [`Device::reset`] builds the new generation over the same primary context while that
/// context is healthy. When it is poisoned by a sticky error ([`is_sticky`]), the reset
/// *retires* this object, resets the primary context (`cuDevicePrimaryCtxReset`: every
/// allocation, module, stream and event in it is destroyed) and retains it afresh in a new
/// `CudaDevice`. A retired object refuses [`CudaDevice::bind`] with a fatal error, so objects
/// of the old context never call the driver again: their drops skip the frees (the reset
/// already released everything) and can never free memory of the new context, and another
/// kiln device that shared the poisoned context is marked lost on its next use and recovers
/// with its own reset.
///
/// Whether the driver lets a process use the device again after a sticky error is the
/// driver's decision: on an H100 with the CUDA 13.0 driver it does not (after
/// `CUDA_ERROR_ILLEGAL_ADDRESS`, `cuDevicePrimaryCtxRetain` and even `cuCtxCreate` of a new
/// context return that error). Then `reset()` returns the sticky error and the device stays
/// lost: every entry point keeps refusing work with [`Error::DeviceFailed`] naming it, and
/// recovering takes a new process. Faults that leave the context healthy (an injected fault,
/// a non-sticky driver error) reset in-process over the same primary context.
pub struct CudaDevice {
    pub spec: DeviceSpec,
    pub info: DeviceInfo,
    device: sys::CUdevice,
    context: sys::CUcontext,
    /// The primary context was reset under this object (see above).
    retired: AtomicBool,
    /// Untimed events whose last user dropped them, for the next signal value to reuse
    /// (creating an event costs more than recording one; see [`signal::CudaEvent`]).
    spare_events: Mutex<Vec<sys::CUevent>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({}: {})", self.spec, self.info.name.trim())
    }
}

// SAFETY: `CUdevice` is an integer and `CUcontext` an opaque handle; driver API calls are
// thread-safe, and every use first makes the context current on the calling thread.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    fn open(spec: &DeviceSpec, ordinal: u32) -> Result<CudaDevice> {
        let device = cu::device::get(ordinal as i32).map_err(|e| driver("cuDeviceGet", e))?;
        let info = DeviceInfo::read(device)?;
        // SAFETY: `device` is a valid device handle; the retain is released in Drop.
        let context = unsafe { cu::primary_ctx::retain(device) }.map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
        Ok(CudaDevice {
            spec: spec.clone(),
            info,
            device,
            context,
            retired: AtomicBool::new(false),
            spare_events: Mutex::new(Vec::new()),
        })
    }

    /// Releases this object's retain of the primary context.
    fn give_back(&self) {
        // SAFETY: called once per object (by retirement or Drop, never both); balances the
        // retain in `open`.
        let _ = unsafe { cu::primary_ctx::release(self.device) };
    }

    /// Makes this device's context current on the calling thread; every driver call of this
    /// backend does this first (see the crate docs). Fails (fatally) once the primary context
    /// was reset under this object.
    pub fn bind(&self) -> Result<()> {
        if self.retired.load(Ordering::Acquire) {
            return Err(Error::Driver {
                backend: "CUDA",
                code: Some(sys::CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED as i64),
                fatal: true,
                message: format!(
                    "the CUDA context of {} was reset after a sticky error; this object belonged to the old \
                     context: reset the device and recreate it",
                    self.spec
                ),
            });
        }
        // SAFETY: the context is retained for this object's lifetime.
        unsafe { cu::ctx::set_current(self.context) }.map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// The sticky error that poisoned the context, if any: `cuCtxSynchronize` (which waits
    /// for the context's work) returns it.
    fn sticky_error(&self) -> Option<Error> {
        if let Err(e) = self.bind() {
            return Some(e);
        }
        // SAFETY: the context is current on this thread.
        match unsafe { sys::cuCtxSynchronize() }.result() {
            Err(e) if is_sticky(e.0) => Some(driver("cuCtxSynchronize", e)),
            _ => None,
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // A retired device gave its context back already (its reset destroyed the spare
        // events too); nothing of this device outlives it (every user holds an
        // `Arc<CudaDevice>`).
        if !self.retired.load(Ordering::Acquire) {
            let spare = std::mem::take(self.spare_events.get_mut().unwrap_or_else(|p| p.into_inner()));
            if self.bind().is_ok() {
                for event in spare {
                    // SAFETY: a spare event is a live event of this context that nothing else
                    // holds (its last `CudaEvent` gave it back); destroyed once, here.
                    let _ = unsafe { cu::event::destroy(event) };
                }
            }
            self.give_back();
        }
    }
}

/// The process-wide opened devices, by ordinal.
static CONTEXTS: kiln_device::ContextMap<CudaDevice> = kiln_device::ContextMap::new(BACKEND);

/// The shared [`CudaDevice`] of `CUDA:ordinal`, opened on first use.
pub fn cuda_device(spec: &DeviceSpec) -> Result<Arc<CudaDevice>> {
    open_cuda_device(spec, false)
}

/// The [`CudaDevice`] of `spec`: the shared one, or (`reset`, for a new device generation)
/// the shared one after resetting its primary context if a sticky error poisoned it (see
/// [`CudaDevice`]).
fn open_cuda_device(spec: &DeviceSpec, reset: bool) -> Result<Arc<CudaDevice>> {
    let stale = |d: &Arc<CudaDevice>| {
        if !reset || d.sticky_error().is_none() {
            return Ok(false);
        }
        // Retire the poisoned context: its objects make no driver call any more, and its
        // retain is given back now so the reset leaves no user of the old context.
        if !d.retired.swap(true, Ordering::AcqRel) {
            d.give_back();
        }
        // SAFETY: detaching the calling thread from the poisoned context, then resetting it:
        // `device` is a valid device handle and nothing uses the old context any more.
        unsafe {
            let _ = sys::cuCtxSetCurrent(std::ptr::null_mut());
            sys::cuDevicePrimaryCtxReset_v2(d.device).result().map_err(|e| driver("cuDevicePrimaryCtxReset", e))?;
        }
        Ok(true)
    };
    CONTEXTS.get(spec, stale, |spec| {
        let n = device_count()?;
        if spec.ordinal() >= n {
            return Err(Error::Unavailable(format!(
                "{spec} does not exist: this machine has {n} CUDA device(s) (CUDA:0..{})",
                n.saturating_sub(1)
            )));
        }
        CudaDevice::open(spec, spec.ordinal())
    })
}

/// Every CUDA device with its description, or why there are none.
pub fn probe() -> Result<Vec<(DeviceSpec, String)>> {
    (0..device_count()?)
        .map(|i| {
            let dev = cu::device::get(i as i32).map_err(|e| driver("cuDeviceGet", e))?;
            Ok((DeviceSpec::new(crate::BACKEND, i), DeviceInfo::read(dev)?.description()))
        })
        .collect()
}

/// Opens `spec` as a kiln [`Device`]: CUDA C++ renderer, NVRTC compiler to a cubin for the
/// device's architecture, module loader, a cached (`LruAllocator`, budget from
/// `KILN_MEMORY_BUDGET`) device-memory allocator and its stream queues.
pub fn open(spec: &DeviceSpec) -> Result<Arc<Device>> {
    Ok(Arc::new(build_device(spec)?))
}

fn build_device(spec: &DeviceSpec) -> Result<Device> {
    let info = &cuda_device(spec)?.info;
    let (description, properties) = (info.description(), info.properties());
    // Every generation gets a fresh allocator, program loader and queue factory; a reset
    // after a sticky error also resets the primary context (see [`CudaDevice`]).
    let device = Device::new(spec.clone(), description, |ctx| {
        let cu = open_cuda_device(ctx.spec(), ctx.generation() > 0)?;
        let loader = cu.clone();
        let runtime: kiln_device::RuntimeFactory =
            Arc::new(move |compiled| Ok(Arc::new(CudaProgram::load(loader.clone(), compiled)?) as _));
        let allocator = Arc::new(LruAllocator::from_env(Arc::new(CudaAllocator::new(cu.clone())))?);
        let compilers = vec![kiln_device::CompilerPair::new(
            "nvrtc",
            Arc::new(cuda_renderer(ctx.spec().clone())),
            Arc::new(CudaCompiler::new(cu.info.arch, Output::Cubin)?),
        )];
        Ok(DeviceParts::new(allocator, compilers, runtime)
            .with_queues(Arc::new(queue::queue_factory(cu.clone())))
            .with_graphs(Arc::new(CudaGraphs::new(cu))))
    })?;
    Ok(device.with_properties(properties))
}

/// Registers the `CUDA` backend with the device registry ([`kiln_device::open_device`]).
/// Idempotent.
pub fn register() {
    kiln_device::register_backend(kiln_device::Backend { name: BACKEND, probe: Some(probe), open });
}

/// Test support: the first CUDA device (with a memory-only kernel cache), or why the test is
/// skipped. With `KILN_REQUIRE` naming `cuda`, a missing device fails the test instead.
#[cfg(test)]
pub(crate) fn test_device() -> Option<Arc<Device>> {
    kiln_device::testing::device_or_skip("cuda", "this CUDA test", build_device(&DeviceSpec::new(BACKEND, 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absence_is_a_typed_error_and_discovery_is_described() {
        match probe() {
            Err(e) => {
                assert!(matches!(e, Error::Unavailable(_) | Error::Driver { .. }), "{e}");
                assert!(test_device().is_none());
            }
            Ok(list) => {
                for (i, (spec, desc)) in list.iter().enumerate() {
                    assert_eq!(*spec, DeviceSpec::new(crate::BACKEND, i as u32));
                    assert!(desc.contains("sm_") && desc.contains("CUDA driver"), "{desc}");
                }
                let missing = DeviceSpec::new(crate::BACKEND, list.len() as u32);
                assert!(matches!(open(&missing), Err(Error::Unavailable(_))));
            }
        }
        assert!(matches!(open(&DeviceSpec::new("CPU", 0)), Err(Error::Invalid(_))));
    }

    #[test]
    fn registry_opens_the_backend() {
        if test_device().is_none() {
            return;
        }
        register();
        let d = kiln_device::open_device("CUDA:0").unwrap();
        assert_eq!(d.spec(), &DeviceSpec::new(crate::BACKEND, 0));
    }

    /// The device's properties carry the driver's block limits and shared memory, and they are
    /// those of every GPU since compute capability 2.0: 1024 threads a block and 48 KiB of shared
    /// memory without opting in.
    #[test]
    fn block_limits_and_shared_memory_are_reported() {
        let Some(dev) = test_device() else { return };
        let p = dev.properties();
        let (size, dims, shared) =
            (p.max_work_group_size.unwrap(), p.max_work_group_dims.unwrap(), p.local_memory_bytes.unwrap());
        assert_eq!(size, 1024, "{p:?}");
        assert!(dims.iter().all(|&d| (1..=size).contains(&d)), "{p:?}");
        assert_eq!(shared, 48 << 10, "{p:?}");
    }
}
