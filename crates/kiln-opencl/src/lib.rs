//! kiln-opencl: the OpenCL backend.
//!
//! Every OpenCL device of every platform is one kiln device, `OPENCL:0..n`, numbered by
//! (platform order, device order within the platform) as the ICD loader reports them; that
//! order is stable for one machine configuration. `libOpenCL.so.1` is loaded at run time
//! (opencl3's `dynamic` feature), so a machine without an ICD loader or without any driver
//! gets [`Error::Unavailable`] with the reason, never a link failure or a panic.
//!
//! It is one of kiln's backends (see `docs/architecture.md`): it implements the contracts of
//! [`kiln_device`] and builds each device's [`DeviceParts`](kiln_device::DeviceParts). Open
//! a device with [`open`], or [`register`] the backend and open it by name with
//! [`kiln_device::open_device`]; [`probe`] lists the devices, or says why there are none.
//! The main types are [`OpenClRenderer`], [`OpenClCompiler`], [`OpenClProgram`],
//! [`OpenClAllocator`], [`OpenClQueueFactory`], [`OpenClSignal`] and [`ClDevice`].
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::{Buffer, ErrorClass, kiln_ir::{DeviceSpec, KernelBuilder, Scalar}};
//! let device = match kiln_opencl::open(&DeviceSpec::new(kiln_opencl::BACKEND, 0)) {
//!     Ok(device) => device,
//!     // No ICD loader, no driver or no device: the error says which, and what to install.
//!     Err(e) if e.class() == ErrorClass::Unavailable => {
//!         eprintln!("skipped: {e}");
//!         return Ok(());
//!     }
//!     Err(e) => return Err(e.into()),
//! };
//! println!("{}", device.description()); // name, platform, OpenCL and driver versions
//! // z[i] = max(x[i], 0) over n elements
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1 << 20);
//! let (x, z) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! k.store(&z.at(&i), &x.at(&i).load().max(0.0));
//! let relu = device.compile(&k.finish()?, Some("relu"))?; // OpenCL C → clBuildProgram → binary
//! let a = Buffer::from_slice(device.allocator(), &[-1.0f32, 2.0, -3.0])?;
//! let b = device.buffer(Scalar::F32, 3)?;
//! relu.launch(&[&a, &b], &[3])?;
//! assert_eq!(b.to_vec::<f32>()?, [0.0, 2.0, 0.0]);
//! # Ok(())
//! # }
//! ```
//!
//! The rooms, read top to bottom:
//! - [`renderer`]: OpenCL C from the kernel IR (the shared C-family core plus a dialect).
//! - [`compiler`]: `clBuildProgram`; the device binary is the cached artifact.
//! - [`program`]: loads the binary, sets arguments, enqueues and waits.
//! - [`allocator`]: `cl_mem` buffers and blocking host transfers.
//! - [`queue`]: in-order command queues ordered by timeline signals.
//! - [`signal`]: timeline signals backed by `cl_event`s.
//!
//! One [`ClDevice`] (context + a synchronous queue) exists per OpenCL device per process:
//! buffers, programs and queues of one kiln device must share a `cl_context`.

pub mod allocator;
pub mod compiler;
pub mod program;
pub mod queue;
pub mod renderer;
pub mod signal;

use std::sync::{Arc, Mutex};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Device, DeviceProperties, Error, LruAllocator, Result};
use opencl3::command_queue::{CL_QUEUE_PROFILING_ENABLE, CommandQueue};
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_NOT_FOUND, CL_DEVICE_TYPE_ALL};
use opencl3::error_codes::ClError;
use opencl3::types::{cl_command_queue_properties, cl_device_id, cl_platform_id};

pub use allocator::OpenClAllocator;
pub use compiler::OpenClCompiler;
pub use program::OpenClProgram;
pub use queue::{ClStream, OpenCl, OpenClQueue, OpenClQueueFactory, queue_factory};
pub use renderer::{OpenClC, OpenClDialect, OpenClRenderer, opencl_renderer, opencl_renderer_for};
pub use signal::{ClEvent, OpenClSignal};

/// The backend's name in device specs (`OPENCL:n`), in `KILN_REQUIRE` (lower case) and in the
/// registry.
pub const BACKEND: &str = "OPENCL";
/// `clGetPlatformIDs` when the ICD loader finds no driver (`CL_PLATFORM_NOT_FOUND_KHR`).
const PLATFORM_NOT_FOUND_KHR: i32 = -1001;
/// opencl3's code for "libOpenCL could not be loaded".
const RUNTIME_LOAD_FAILED: i32 = -2000;

/// Turns an OpenCL status into a driver error naming the call that failed, keeping the
/// native code and whether it is fatal.
pub(crate) fn driver(what: &str, e: impl Into<ClError>) -> Error {
    let e = e.into();
    Error::Driver {
        backend: "OpenCL",
        code: Some(e.0.into()),
        fatal: is_fatal(e.0),
        message: format!("{what} failed: {e} ({})", e.0),
    }
}

/// OpenCL has no sticky-error model; these statuses mean the device or its context stopped
/// working (`CL_DEVICE_NOT_AVAILABLE`; `CL_OUT_OF_RESOURCES`, which drivers report after a
/// kernel fault corrupted the context), so the device is treated as lost.
fn is_fatal(code: i32) -> bool {
    matches!(code, opencl3::error_codes::CL_DEVICE_NOT_AVAILABLE | opencl3::error_codes::CL_OUT_OF_RESOURCES)
}

/// Where one OpenCL device sits in the ICD loader's enumeration.
#[derive(Clone, Copy)]
struct Location {
    platform: cl_platform_id,
    device: cl_device_id,
}

/// Every OpenCL device of every platform, in ordinal order.
///
/// Serialized process-wide: the ICD loader and PoCL 3.1 initialize their platform on the
/// first call, and two threads doing that at once crash the process or see no device.
fn enumerate() -> Result<Vec<Location>> {
    static DISCOVERY: Mutex<()> = Mutex::new(());
    let _one_at_a_time = DISCOVERY.lock().unwrap_or_else(|p| p.into_inner());
    let platforms = match opencl3::platform::get_platforms() {
        Ok(p) => p,
        Err(e) if e.0 == RUNTIME_LOAD_FAILED => {
            return Err(Error::Unavailable(
                "the OpenCL ICD loader libOpenCL.so.1 could not be loaded: install one (e.g. ocl-icd-libopencl1) \
                 and a driver (e.g. pocl-opencl-icd), or point OPENCL_DYLIB_PATH at the library"
                    .into(),
            ));
        }
        Err(e) if e.0 == PLATFORM_NOT_FOUND_KHR => Vec::new(),
        Err(e) => return Err(driver("clGetPlatformIDs", e)),
    };
    if platforms.is_empty() {
        return Err(Error::Unavailable(
            "no OpenCL platform is installed (the ICD loader found no driver in /etc/OpenCL/vendors): \
             install one, e.g. pocl-opencl-icd"
                .into(),
        ));
    }
    let mut out = Vec::new();
    for p in platforms {
        match p.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(devs) => out.extend(devs.into_iter().map(|device| Location { platform: p.id(), device })),
            Err(e) if e.0 == CL_DEVICE_NOT_FOUND => {}
            Err(e) => return Err(driver("clGetDeviceIDs", e)),
        }
    }
    Ok(out)
}

/// Static facts about a device, read once at open.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub platform_name: String,
    pub platform_version: String,
    pub name: String,
    pub device_version: String,
    pub driver_version: String,
    pub extensions: String,
    pub max_work_group_size: usize,
    pub max_work_item_sizes: [usize; 3],
    /// `CL_DEVICE_LOCAL_MEM_SIZE`: local memory one work group may use, in bytes.
    pub local_mem_size: u64,
    pub max_mem_alloc_size: u64,
    pub global_mem_size: u64,
    /// `CL_DEVICE_ADDRESS_BITS`: the width of the device's `size_t` (32 or 64).
    pub address_bits: u32,
    /// `CL_DEVICE_HOST_UNIFIED_MEMORY`: device memory is host memory (CPU drivers such as
    /// PoCL, integrated GPUs).
    pub host_unified_memory: bool,
}

impl DeviceInfo {
    fn read(at: Location) -> Result<DeviceInfo> {
        let p = opencl3::platform::Platform::new(at.platform);
        let d = opencl3::device::Device::new(at.device);
        let q = |what: &str, r: opencl3::Result<String>| r.map_err(|e| driver(what, e));
        let sizes = d.max_work_item_sizes().map_err(|e| driver("CL_DEVICE_MAX_WORK_ITEM_SIZES", e))?;
        let mut max_work_item_sizes = [1usize; 3];
        for (slot, s) in max_work_item_sizes.iter_mut().zip(sizes) {
            *slot = s;
        }
        Ok(DeviceInfo {
            platform_name: q("CL_PLATFORM_NAME", p.name())?,
            platform_version: q("CL_PLATFORM_VERSION", p.version())?,
            name: q("CL_DEVICE_NAME", d.name())?,
            device_version: q("CL_DEVICE_VERSION", d.version())?,
            driver_version: q("CL_DRIVER_VERSION", d.driver_version())?,
            extensions: q("CL_DEVICE_EXTENSIONS", d.extensions())?,
            max_work_group_size: d.max_work_group_size().map_err(|e| driver("CL_DEVICE_MAX_WORK_GROUP_SIZE", e))?,
            max_work_item_sizes,
            local_mem_size: d.local_mem_size().map_err(|e| driver("CL_DEVICE_LOCAL_MEM_SIZE", e))?,
            max_mem_alloc_size: d.max_mem_alloc_size().map_err(|e| driver("CL_DEVICE_MAX_MEM_ALLOC_SIZE", e))?,
            global_mem_size: d.global_mem_size().map_err(|e| driver("CL_DEVICE_GLOBAL_MEM_SIZE", e))?,
            address_bits: d.address_bits().map_err(|e| driver("CL_DEVICE_ADDRESS_BITS", e))?,
            // Deprecated in OpenCL 2.0 and absent on some drivers: unknown means "not unified".
            host_unified_memory: d.host_unified_memory().unwrap_or(false),
        })
    }

    /// The largest value of the device's `size_t`: no launch size, work-item count or
    /// buffer offset may exceed it.
    pub fn max_size_t(&self) -> u64 {
        u64::MAX >> 64u32.saturating_sub(self.address_bits).min(63)
    }

    /// One line for `kiln devices`: name, platform, device version and driver version.
    pub fn description(&self) -> String {
        format!(
            "{} ({}; {}; driver {})",
            self.name.trim(),
            self.platform_name.trim(),
            self.device_version.trim(),
            self.driver_version.trim()
        )
    }

    pub fn has_extension(&self, ext: &str) -> bool {
        self.extensions.split_whitespace().any(|e| e == ext)
    }

    /// What kernel generators may rely on: the work-group limits and local memory.
    pub fn properties(&self) -> DeviceProperties {
        DeviceProperties {
            max_work_group_size: Some(self.max_work_group_size),
            max_work_group_dims: Some(self.max_work_item_sizes),
            local_memory_bytes: Some(usize::try_from(self.local_mem_size).unwrap_or(usize::MAX)),
            ..DeviceProperties::default()
        }
    }
}

/// An opened OpenCL device: its context and one in-order queue for synchronous work
/// (host transfers of the allocator, [`kiln_device::Program::execute`]).
///
/// Shared (`Arc`) by everything of one kiln device; the OpenCL handles inside are
/// thread-safe per the OpenCL specification (every API call except `clSetKernelArg` on one
/// kernel object, which [`program`] serializes).
pub struct ClDevice {
    pub spec: DeviceSpec,
    pub info: DeviceInfo,
    device: cl_device_id,
    context: Context,
    queue: CommandQueue,
}

impl std::fmt::Debug for ClDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClDevice({}: {})", self.spec, self.info.name.trim())
    }
}

// SAFETY: `cl_device_id` is an opaque handle; OpenCL API calls on it are thread-safe.
// `Context` and `CommandQueue` are already Send + Sync in opencl3.
unsafe impl Send for ClDevice {}
// SAFETY: as above.
unsafe impl Sync for ClDevice {}

impl ClDevice {
    fn open(spec: &DeviceSpec, at: Location) -> Result<ClDevice> {
        let info = DeviceInfo::read(at)?;
        let context =
            Context::from_device(&opencl3::device::Device::new(at.device)).map_err(|e| driver("clCreateContext", e))?;
        let queue = create_queue(&context, at.device, 0)?;
        Ok(ClDevice { spec: spec.clone(), info, device: at.device, context, queue })
    }

    pub fn device_id(&self) -> cl_device_id {
        self.device
    }

    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The in-order queue used for synchronous work.
    pub fn sync_queue(&self) -> &CommandQueue {
        &self.queue
    }

    /// A new in-order command queue on this device, with profiling enabled (events carry
    /// their device times; see [`ClEvent::host_span`]).
    pub fn new_queue(&self) -> Result<CommandQueue> {
        create_queue(&self.context, self.device, CL_QUEUE_PROFILING_ENABLE)
    }
}

/// Creates an in-order queue: `clCreateCommandQueueWithProperties` (OpenCL ≥ 2.0), falling
/// back to the 1.x entry point on platforms that lack it.
fn create_queue(context: &Context, device: cl_device_id, props: cl_command_queue_properties) -> Result<CommandQueue> {
    // SAFETY: `device` is a member of `context` (the context was created from it).
    match unsafe { CommandQueue::create_with_properties(context, device, props, 0) } {
        Ok(q) => Ok(q),
        Err(_) => {
            #[allow(deprecated)]
            // SAFETY: as above.
            unsafe { CommandQueue::create(context, device, props) }.map_err(|e| driver("clCreateCommandQueue", e))
        }
    }
}

/// The process-wide opened devices, by ordinal: one context per OpenCL device.
static CONTEXTS: kiln_device::ContextMap<ClDevice> = kiln_device::ContextMap::new(BACKEND);

/// The shared [`ClDevice`] of `OPENCL:ordinal`, opened on first use.
pub fn cl_device(spec: &DeviceSpec) -> Result<Arc<ClDevice>> {
    open_cl_device(spec, false)
}

/// The [`ClDevice`] of `spec`: the shared one, or (`fresh`) a new context that replaces it
/// (a device reset: the old context lives on only through the old generation's objects).
fn open_cl_device(spec: &DeviceSpec, fresh: bool) -> Result<Arc<ClDevice>> {
    CONTEXTS.get(
        spec,
        |_| Ok(fresh),
        |spec| {
            let all = enumerate()?;
            let at = *all.get(spec.ordinal() as usize).ok_or_else(|| {
                Error::Unavailable(format!(
                    "{spec} does not exist: this machine has {} OpenCL device(s) (OPENCL:0..{})",
                    all.len(),
                    all.len().saturating_sub(1)
                ))
            })?;
            ClDevice::open(spec, at)
        },
    )
}

/// Every OpenCL device with its description, or why there are none.
pub fn probe() -> Result<Vec<(DeviceSpec, String)>> {
    enumerate()?
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            let spec = DeviceSpec::new(crate::BACKEND, i as u32);
            Ok((spec, DeviceInfo::read(at)?.description()))
        })
        .collect()
}

/// Every OpenCL device with its description (name, platform, versions, driver version);
/// empty when OpenCL is unavailable ([`probe`] says why).
pub fn devices() -> Vec<(DeviceSpec, String)> {
    probe().unwrap_or_default()
}

/// Opens `spec` as a kiln [`Device`]: OpenCL C renderer, clBuildProgram compiler, program
/// loader, a cached (`LruAllocator`, budget from `KILN_MEMORY_BUDGET`) `cl_mem` allocator and
/// its queue factory, all over the shared context of that device.
pub fn open(spec: &DeviceSpec) -> Result<Arc<Device>> {
    Ok(Arc::new(build_device(spec)?))
}

fn build_device(spec: &DeviceSpec) -> Result<Device> {
    let info = &cl_device(spec)?.info;
    let (description, properties) = (info.description(), info.properties());
    // Every generation gets its own context (a reset opens a new one); the first uses the
    // shared context of the device.
    let device = Device::new(spec.clone(), description, |ctx| {
        let cl = open_cl_device(ctx.spec(), ctx.generation() > 0)?;
        let loader = cl.clone();
        let runtime: kiln_device::RuntimeFactory =
            Arc::new(move |compiled| Ok(Arc::new(OpenClProgram::load(loader.clone(), compiled)?) as _));
        let allocator = Arc::new(LruAllocator::from_env(Arc::new(OpenClAllocator::new(cl.clone())))?);
        let compilers = vec![kiln_device::CompilerPair::new(
            "opencl-c",
            Arc::new(opencl_renderer(&cl)),
            Arc::new(OpenClCompiler::new(cl.clone())),
        )];
        Ok(kiln_device::DeviceParts::new(allocator, compilers, runtime).with_queues(Arc::new(queue::queue_factory(cl))))
    })?;
    Ok(device.with_properties(properties))
}

/// Registers the `OPENCL` backend with the device registry ([`kiln_device::open_device`]).
/// Idempotent.
pub fn register() {
    kiln_device::register_backend(kiln_device::Backend { name: BACKEND, probe: Some(probe), open });
}

/// Why this backend skips the 8- and 16-lane f32 ALU checks: PoCL 3.1 (the driver CI runs)
/// computes `sin` and `cos` of `float8`/`float16` wrongly for small inputs (sin(0.001) = 0.008,
/// cos(0.001) = 0.99997), while its scalar and 4-lane forms are right.
const POCL_VECTOR_SIN: &str = "PoCL 3.1's float8/float16 sin and cos are wrong for small inputs (sin(0.001) = 0.008); scalar and \
     4-lane f32 are checked";

/// The OpenCL backend's driver, for kiln-backends' list: no offline target, no baseline of its own.
pub const DRIVER: kiln_device::Driver = kiln_device::Driver {
    register,
    conformance: &[kiln_device::Conformance {
        name: "opencl",
        peer: "cpu",
        unsupported: &[("alu_f32x8", POCL_VECTOR_SIN), ("alu_f32x16", POCL_VECTOR_SIN)],
        pair: None,
    }],
    targets: &[],
    baseline: kiln_device::no_baseline,
};

/// Test support: the first OpenCL device (with a memory-only kernel cache), or why the test
/// is skipped. With `KILN_REQUIRE` naming `opencl`, a missing device fails the test instead.
#[cfg(test)]
pub(crate) fn test_device() -> Option<Arc<Device>> {
    kiln_device::testing::device_or_skip("opencl", "this OpenCL test", build_device(&DeviceSpec::new(BACKEND, 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_is_stable_and_described() {
        let Some(dev) = test_device() else { return };
        let list = devices();
        assert!(!list.is_empty());
        assert_eq!(list, devices(), "two enumerations give the same order");
        for (i, (spec, desc)) in list.iter().enumerate() {
            assert_eq!(*spec, DeviceSpec::new(crate::BACKEND, i as u32));
            assert!(desc.contains("driver"), "{desc}");
        }
        assert_eq!(dev.description(), list[0].1);
        let missing = DeviceSpec::new(crate::BACKEND, list.len() as u32);
        assert!(matches!(open(&missing), Err(Error::Unavailable(_))));
        assert!(matches!(open(&DeviceSpec::new("CPU", 0)), Err(Error::Invalid(_))));
    }

    /// The device's properties carry the driver's work-group limits and local memory, and
    /// they are sane: every dimension allows a work item, and a full-profile device (PoCL is
    /// one) has at least OpenCL 1.0's 16 KiB of local memory.
    #[test]
    fn work_group_limits_and_local_memory_are_reported() {
        let Some(dev) = test_device() else { return };
        let p = dev.properties();
        let (size, dims, local) =
            (p.max_work_group_size.unwrap(), p.max_work_group_dims.unwrap(), p.local_memory_bytes.unwrap());
        let info = &cl_device(dev.spec()).unwrap().info;
        assert_eq!(
            (size, dims, local as u64),
            (info.max_work_group_size, info.max_work_item_sizes, info.local_mem_size)
        );
        assert!(size >= 1 && dims.iter().all(|&d| d >= 1), "{p:?}");
        assert!(local >= 16 << 10, "{p:?}: less local memory than a full-profile device has");
        assert_eq!((p.isa.as_deref(), p.vector_bytes), (None, None), "an OpenCL device reports no instruction set");
    }

    /// The first discovery of a process, from many threads at once, agrees (PoCL 3.1 reports
    /// no device to a thread that enumerates while another initializes the platform).
    #[test]
    fn concurrent_first_discovery_agrees() {
        let lists: Vec<Vec<(DeviceSpec, String)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(devices)).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(lists.iter().all(|l| *l == lists[0]), "{lists:?}");
        if test_device().is_some() {
            assert!(!lists[0].is_empty());
        }
    }

    #[test]
    fn registry_opens_the_backend() {
        if test_device().is_none() {
            return;
        }
        register();
        let d = kiln_device::open_device("OPENCL:0").unwrap();
        assert_eq!(*d.spec(), DeviceSpec::new(crate::BACKEND, 0));
    }
}
