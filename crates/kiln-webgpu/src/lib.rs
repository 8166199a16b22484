//! kiln-webgpu: the WebGPU backend, on wgpu (Vulkan here; Metal and DX12 where wgpu is
//! built with them).
//!
//! Every adapter wgpu enumerates is one kiln device, `WEBGPU:0..n`, in wgpu's order. On a
//! machine without a GPU, Mesa's lavapipe (`apt-get install mesa-vulkan-drivers libvulkan1`)
//! is a conformant Vulkan device on the CPU; a machine with no Vulkan driver at all gets
//! [`Error::Unavailable`] saying what to install.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::{Buffer, ErrorClass, kiln_ir::{DeviceSpec, KernelBuilder, Scalar}};
//! let device = match kiln_webgpu::open(&DeviceSpec::new(kiln_webgpu::BACKEND, 0)) {
//!     Ok(device) => device,
//!     Err(e) if e.class() == ErrorClass::Unavailable => return Ok(()), // no Vulkan driver
//!     Err(e) => return Err(e.into()),
//! };
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1 << 20);
//! let (x, z) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! k.store(&z.at(&i), &x.at(&i).load().max(0.0));
//! let relu = device.compile(&k.finish()?, Some("relu"))?; // WGSL → naga → compute pipeline
//! let a = Buffer::from_slice(device.allocator(), &[-1.0f32, 2.0, -3.0])?;
//! let b = device.buffer(Scalar::F32, 3)?;
//! relu.launch(&[&a, &b], &[3])?;
//! assert_eq!(b.to_vec::<f32>()?, [0.0, 2.0, 0.0]);
//! # Ok(())
//! # }
//! ```
//!
//! The rooms, read top to bottom:
//! - [`renderer`]: WGSL from the kernel IR.
//! - [`compiler`]: naga validation (and SPIR-V / MSL output).
//! - [`loops`]: the loop iteration budget of Mesa's llvmpipe (lavapipe): long loops unrolled
//!   to fit it, launches past it refused.
//! - [`program`]: compute pipelines, bind groups and dispatches.
//! - [`allocator`]: storage buffers and staged host transfers.
//! - [`queue`]: kiln queues over wgpu's one ordered queue.
//! - [`signal`]: timeline signals over wgpu submission indices.
//! - [`exports`]: the backend for the rest of kiln: registration, conformance entry, the
//!   offline `webgpu` target (WGSL, SPIR-V, MSL) and its own bench baselines.

pub mod allocator;
pub mod compiler;
pub mod exports;
pub mod loops;
pub mod program;
pub mod queue;
pub mod renderer;
pub mod signal;
mod wgsl;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Device, Error, LruAllocator, RawPtr, Result};

pub use allocator::WgpuAllocator;
pub use compiler::{Emit, WgslCompiler, translate};
pub use exports::DRIVER;
pub use program::{EmptyDispatch, WgpuProgram};
pub use queue::{WebGpu, WgpuQueue, WgpuQueueFactory, WgpuStream, queue_factory};
pub use renderer::{Caps, WgslRenderer};
pub use signal::{WgpuEvent, WgpuSignal};

/// The backend's name in device specs (`WEBGPU:n`), in `KILN_REQUIRE` (lower case) and in
/// the registry.
pub const BACKEND: &str = "WEBGPU";

/// A wgpu failure as a kiln driver error.
pub(crate) fn driver(what: &str, e: impl std::fmt::Display, fatal: bool) -> Error {
    Error::Driver { backend: "WebGPU", code: None, fatal, message: format!("{what} failed: {e}") }
}

/// Runs a wgpu future that completes without an executor (wgpu-core's adapter and device
/// requests, error scopes): polled once; a future that is still pending is an error.
pub(crate) fn ready<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Ok(v),
        std::task::Poll::Pending => Err(driver(what, "the request did not complete", false)),
    }
}

/// The process's wgpu instance and its adapters, in ordinal order.
fn adapters() -> &'static [wgpu::Adapter] {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        ready("enumerate_adapters", instance.enumerate_adapters(wgpu::Backends::all())).unwrap_or_default()
    })
}

/// One line for `kiln devices`: name, backend, device type and driver.
fn describe(info: &wgpu::AdapterInfo) -> String {
    format!(
        "{} ({:?}; {:?}; driver {} {})",
        info.name.trim(),
        info.backend,
        info.device_type,
        info.driver.trim(),
        info.driver_info.trim()
    )
}

/// An opened wgpu device: the device and its queue, what the adapter offers, and the table
/// that maps kiln's buffer addresses to wgpu buffers.
pub struct WgpuDevice {
    pub spec: DeviceSpec,
    pub info: wgpu::AdapterInfo,
    pub caps: Caps,
    pub limits: wgpu::Limits,
    /// Whether the device writes timestamps in compute passes (`TIMESTAMP_QUERY`).
    pub timestamps: bool,
    /// The loop passes one work item may make before the driver cuts its loops short
    /// (Mesa's llvmpipe: 65,535; see [`loops`]), or `None` where loops run to the end.
    pub loop_budget: Option<u64>,
    /// The driver's pipeline cache (`PIPELINE_CACHE`, Vulkan), shared by every pipeline of
    /// the device: a shader built again (another work-group size, a reloaded kernel) reuses
    /// the driver's compiled code. It lives in memory; across processes Mesa's own shader
    /// cache (`MESA_SHADER_CACHE_DIR`) serves.
    pub pipeline_cache: Option<wgpu::PipelineCache>,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    buffers: Mutex<HashMap<usize, wgpu::Buffer>>,
    next: AtomicUsize,
    submitting: Mutex<()>,
    lost: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuDevice({}: {})", self.spec, self.info.name.trim())
    }
}

impl WgpuDevice {
    /// Requests a new wgpu device (and queue) from the adapter of `spec`.
    pub fn open(spec: &DeviceSpec) -> Result<WgpuDevice> {
        if spec.base_type() != BACKEND {
            return Err(Error::Invalid(format!("{spec} is not a WebGPU device (expected {BACKEND}:n)")));
        }
        let all = adapters();
        let adapter = all.get(spec.ordinal() as usize).ok_or_else(|| unavailable(spec, all.len()))?;
        let offered = adapter.features();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SHADER_INT64
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::PIPELINE_CACHE;
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: offered & wanted,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) =
            ready("request_device", adapter.request_device(&desc))?.map_err(|e| driver("request_device", e, false))?;
        let lost = Arc::new(Mutex::new(None));
        let on_lost = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            *on_lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{reason:?}: {message}"));
        });
        // Errors outside an error scope are recorded, never a panic (wgpu's default handler).
        let on_error = lost.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if matches!(e, wgpu::Error::Internal { .. }) {
                *on_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
        }));
        let pipeline_cache = offered.contains(wgpu::Features::PIPELINE_CACHE).then(|| {
            let desc = wgpu::PipelineCacheDescriptor { label: Some("kiln"), data: None, fallback: true };
            // SAFETY: the only requirement is on `data` (bytes an earlier cache returned); this
            // cache starts empty.
            unsafe { device.create_pipeline_cache(&desc) }
        });
        let caps = Caps {
            f16: offered.contains(wgpu::Features::SHADER_F16),
            int64: offered.contains(wgpu::Features::SHADER_INT64),
        };
        let info = adapter.get_info();
        Ok(WgpuDevice {
            spec: spec.clone(),
            loop_budget: loops::loop_budget(&info),
            info,
            caps,
            limits,
            timestamps: offered.contains(wgpu::Features::TIMESTAMP_QUERY),
            pipeline_cache,
            device,
            queue,
            buffers: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(1),
            submitting: Mutex::new(()),
            lost,
        })
    }

    /// The adapter's identity for cache keys: name, backend, driver.
    pub fn identity(&self) -> String {
        describe(&self.info)
    }

    /// An error when the device was lost (the driver reported it).
    pub fn check_lost(&self) -> Result<()> {
        match self.lost.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(why) => Err(driver(&format!("{}", self.spec), format!("the device was lost ({why})"), true)),
            None => Ok(()),
        }
    }

    /// Registers `buffer` and returns the address kiln knows it by.
    fn insert(&self, buffer: wgpu::Buffer) -> RawPtr {
        let id = self.next.fetch_add(1, Ordering::Relaxed) << 8;
        self.buffers.lock().unwrap_or_else(|p| p.into_inner()).insert(id, buffer);
        RawPtr(id as *mut std::ffi::c_void)
    }

    fn remove(&self, ptr: RawPtr) -> Option<wgpu::Buffer> {
        self.buffers.lock().unwrap_or_else(|p| p.into_inner()).remove(&(ptr.0 as usize))
    }

    /// The wgpu buffer behind kiln address `ptr`.
    pub fn buffer(&self, ptr: RawPtr) -> Result<wgpu::Buffer> {
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(ptr.0 as usize))
            .cloned()
            .ok_or_else(|| Error::Launch(format!("address {:p} is no buffer of {}", ptr.0, self.spec)))
    }

    /// Finishes `encoder` (if any) and submits it to the device's queue; a command wgpu
    /// refuses is [`Error::Driver`] with wgpu's message, and nothing of it runs. Submissions
    /// are made one at a time, so each index is known to `poll` once it is returned.
    pub fn submit(&self, encoder: Option<wgpu::CommandEncoder>) -> Result<wgpu::SubmissionIndex> {
        let _one = self.submitting.lock().unwrap_or_else(|p| p.into_inner());
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let index = self.queue.submit(encoder.map(|e| e.finish()));
        match ready("pop_error_scope", scope.pop())? {
            Some(e) => Err(driver("Queue::submit", e, false)),
            None => Ok(index),
        }
    }

    /// Blocks until submission `index` (or everything submitted, for `None`) completed.
    pub fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: index, timeout: None })
            .map_err(|e| driver("Device::poll", e, false))?;
        self.check_lost()
    }
}

fn unavailable(spec: &DeviceSpec, count: usize) -> Error {
    if count == 0 {
        return Error::Unavailable(
            "no WebGPU adapter: wgpu found no Vulkan driver; install one (on Debian: apt-get install \
             mesa-vulkan-drivers libvulkan1, a software Vulkan device) or a GPU driver"
                .into(),
        );
    }
    Error::Unavailable(format!(
        "{spec} does not exist: this machine has {count} WebGPU adapter(s) (WEBGPU:0..{})",
        count - 1
    ))
}

/// Every WebGPU adapter with its description, or why there are none.
pub fn probe() -> Result<Vec<(DeviceSpec, String)>> {
    let all = adapters();
    if all.is_empty() {
        return Err(unavailable(&DeviceSpec::new(BACKEND, 0), 0));
    }
    Ok(all.iter().enumerate().map(|(i, a)| (DeviceSpec::new(BACKEND, i as u32), describe(&a.get_info()))).collect())
}

/// Opens `spec` as a kiln [`Device`]: WGSL renderer, naga compiler, pipeline loader, a
/// cached (`LruAllocator`) storage-buffer allocator and its queue factory. Every generation
/// (a reset) requests a new wgpu device from the adapter.
pub fn open(spec: &DeviceSpec) -> Result<Arc<Device>> {
    Ok(Arc::new(build_device(spec)?))
}

fn build_device(spec: &DeviceSpec) -> Result<Device> {
    build_device_with(spec, None)
}

/// [`build_device`], with `loop_budget` (when given) in place of the adapter's own (tests
/// render and check loops as a device with that budget would).
fn build_device_with(spec: &DeviceSpec, loop_budget: Option<Option<u64>>) -> Result<Device> {
    let open_gpu = move |spec: &DeviceSpec| -> Result<WgpuDevice> {
        let mut gpu = WgpuDevice::open(spec)?;
        if let Some(budget) = loop_budget {
            gpu.loop_budget = budget;
        }
        Ok(gpu)
    };
    let first = Arc::new(open_gpu(spec)?);
    let description = first.identity();
    let l = &first.limits;
    let properties = kiln_device::DeviceProperties {
        max_work_group_size: Some(l.max_compute_invocations_per_workgroup as usize),
        max_work_group_dims: Some(
            [l.max_compute_workgroup_size_x, l.max_compute_workgroup_size_y, l.max_compute_workgroup_size_z]
                .map(|d| d as usize),
        ),
        local_memory_bytes: Some(l.max_compute_workgroup_storage_size as usize),
        ..kiln_device::DeviceProperties::default()
    };
    let first = Mutex::new(Some(first));
    Device::new(spec.clone(), description, move |ctx| {
        let taken = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let gpu = match taken {
            Some(g) => g,
            None => Arc::new(open_gpu(ctx.spec())?),
        };
        let loader = gpu.clone();
        let runtime: kiln_device::RuntimeFactory =
            Arc::new(move |compiled| Ok(Arc::new(WgpuProgram::load(loader.clone(), compiled)?) as _));
        let allocator = Arc::new(LruAllocator::from_env(Arc::new(WgpuAllocator::new(gpu.clone())))?);
        let compilers = vec![kiln_device::CompilerPair::new(
            "wgsl",
            Arc::new(WgslRenderer::new(gpu.spec.clone(), gpu.caps).with_loop_budget(gpu.loop_budget)),
            Arc::new(WgslCompiler::new(gpu.caps, gpu.identity())),
        )];
        Ok(kiln_device::DeviceParts::new(allocator, compilers, runtime)
            .with_queues(Arc::new(queue::queue_factory(gpu))))
    })
    .map(|d| d.with_properties(properties))
}

/// Registers the `WEBGPU` backend with the device registry ([`kiln_device::open_device`]).
/// Idempotent.
pub fn register() {
    kiln_device::register_backend(kiln_device::Backend { name: BACKEND, probe: Some(probe), open });
}

/// Test support: the first WebGPU device, or why the test is skipped. With `KILN_REQUIRE`
/// naming `webgpu`, a missing device fails the test instead.
#[cfg(test)]
pub(crate) fn test_device() -> Option<Arc<Device>> {
    test_device_with(None)
}

/// [`test_device`] with `loop_budget` (when given) in place of the adapter's own.
#[cfg(test)]
pub(crate) fn test_device_with(loop_budget: Option<Option<u64>>) -> Option<Arc<Device>> {
    let built = build_device_with(&DeviceSpec::new(BACKEND, 0), loop_budget);
    kiln_device::testing::device_or_skip("webgpu", "this WebGPU test", built)
}

#[cfg(test)]
mod tests {
    use kiln_device::kiln_ir::{KernelBuilder, Scalar};
    use kiln_device::{Buffer, Compiler, Renderer};

    use super::*;

    #[test]
    fn discovery_lists_the_adapters_in_a_stable_order() {
        let Some(dev) = test_device() else { return };
        let list = probe().unwrap();
        assert_eq!(list, probe().unwrap());
        assert_eq!(list[0].0, DeviceSpec::new(BACKEND, 0));
        assert!(list[0].1.contains("driver"), "{}", list[0].1);
        assert_eq!(dev.description(), list[0].1);
        let missing = DeviceSpec::new(BACKEND, list.len() as u32);
        assert!(matches!(open(&missing), Err(Error::Unavailable(_))));
        assert!(matches!(open(&DeviceSpec::new("CPU", 0)), Err(Error::Invalid(_))));
        register();
        assert_eq!(*kiln_device::open_device("WEBGPU:0").unwrap().spec(), DeviceSpec::new(BACKEND, 0));
    }

    /// A buffer larger than the adapter's storage binding limit (but not its buffer limit) is
    /// refused when allocated with [`Error::Limit`], naming the limit: a fixed limit of the
    /// device, not a shortage (`kiln bench` reports an entry that needs one as skipped).
    #[test]
    fn a_buffer_past_the_storage_binding_limit_is_a_limit_error() {
        let Some(dev) = test_device() else { return };
        let limits = WgpuDevice::open(dev.spec()).unwrap().limits;
        let binding = limits.max_storage_buffer_binding_size;
        if binding + 64 > limits.max_buffer_size {
            return; // no size lies between the two limits on this adapter
        }
        match dev.allocator().alloc(binding as usize + 64) {
            Err(Error::Limit { device, message }) => {
                assert_eq!(device, dev.spec().to_string());
                assert!(message.contains(&format!("storage binding limit of {binding} B")), "{message}");
            }
            Err(e) => panic!("expected a limit error, got {e:?}"),
            Ok(_) => panic!("a buffer past the binding limit was allocated"),
        }
        let at_limit = dev.allocator().alloc(binding as usize).expect("a buffer at the limit is allocated");
        // SAFETY: allocated just above with this size, used by nothing, freed once.
        unsafe { dev.allocator().free(at_limit, binding as usize) };
    }

    /// More work groups than one dispatch axis holds (65,535) are folded into a 2-D grid:
    /// every element is written once, by the item kiln's launch gives it.
    #[test]
    fn launches_beyond_one_axis_of_groups_fold_into_a_grid() {
        let Some(dev) = test_device() else { return };
        let n = (renderer::MAX_GROUPS_PER_AXIS as usize + 5) * renderer::DIRECT_GROUP as usize + 3;
        let mut k = KernelBuilder::new();
        let len = k.var("n", 1, 1 << 24);
        let (x, y) = (k.param(0, Scalar::I32, &len), k.param(1, Scalar::I32, &len));
        let i = k.global(0, &len);
        k.store(&y.at(&i), &(x.at(&i).load() * 3 + &i));
        let kernel = dev.compile(&k.finish().unwrap(), Some("fold")).unwrap();
        let input: Vec<i32> = (0..n as i32).map(|v| v % 1000).collect();
        let a = Buffer::from_slice(dev.allocator(), &input).unwrap();
        let b = Buffer::from_slice(dev.allocator(), &vec![-1i32; n]).unwrap();
        kernel.launch(&[&a, &b], &[n as i64]).unwrap();
        let got = b.to_vec::<i32>().unwrap();
        let bad = (0..n).filter(|&i| got[i] != input[i] * 3 + i as i32).count();
        assert_eq!(bad, 0, "{bad} of {n} elements are wrong");
    }

    /// A work-group size that depends on a variable is set at each launch (one pipeline per
    /// size); a size beyond the device's limits is a launch error that writes nothing.
    #[test]
    fn work_group_sizes_set_per_launch() {
        let Some(dev) = test_device() else { return };
        let mut k = KernelBuilder::new();
        let l = k.var("l", 1, 1 << 14);
        let out = k.param(0, Scalar::I32, &l * 4);
        let (g, i) = (k.special("gidx0", 4), k.special("lidx0", &l));
        let flat = &g * &l + &i;
        k.store(&out.at(&flat), &(&flat * 2));
        let kernel = dev.compile(&k.finish().unwrap(), Some("dynamic_group")).unwrap();
        for size in [1usize, 32, 7] {
            let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; 4 * size]).unwrap();
            kernel.launch(&[&buf], &[size as i64]).unwrap();
            let want: Vec<i32> = (0..4 * size as i32).map(|v| v * 2).collect();
            assert_eq!(buf.to_vec::<i32>().unwrap(), want, "groups of {size}");
        }
        let big = 1 << 14;
        let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; 4 * big]).unwrap();
        assert!(matches!(kernel.launch(&[&buf], &[big as i64]), Err(Error::Launch(_))));
        assert!(buf.to_vec::<i32>().unwrap().iter().all(|v| *v == -1));
    }

    /// The kernel in `text` (kiln's text form), compiled on `dev`.
    fn text_kernel(dev: &Device, text: &str, name: &str) -> kiln_device::Kernel {
        dev.compile(&kiln_device::kiln_ir::parse_kernel(text).unwrap(), Some(name)).unwrap()
    }

    /// One work item summing i32 values (wrapping): `out[0] = a[0] + ... + a[n-1]`.
    const ISUM: &str = "%n = DEFINE_VAR i32 \"n\" 1 16777216\n%one = CONST i32 1\n%z = CONST i32 0\n\
        %a = PARAM ptr<i32> 0 (%n)\n%out = PARAM ptr<i32> 1 (%one)\n%r = RANGE i32 0 (%n)\n\
        %acc = DEFINE_ACC i32 0 (%z, %r)\n%pa = INDEX ptr<i32> (%a, %r)\n%x = LOAD i32 (%pa)\n\
        %nx = ADD i32 (%acc, %x)\n%up = ASSIGN i32 (%acc, %nx)\n%t = END i32 (%r, %up)\n\
        %po = INDEX ptr<i32> (%out, %z)\n%st = STORE void (%po, %t)\nSINK void (%st)";

    /// Regression (found by the conformance fuzzer): a loop of more than 65,535 iterations in
    /// one work item summed only its first 65,535 elements on lavapipe, whose llvmpipe
    /// compiler ends a work item's loops after 65,535 passes (see [`loops`]). The loop is
    /// unrolled to fit, up to `sum.kiln`'s declared bound of 2^24 elements.
    #[test]
    fn loops_of_more_than_65535_iterations_run_to_the_end() {
        let Some(dev) = test_device() else { return };
        let sum = text_kernel(&dev, include_str!("../../../examples/kernels/sum.kiln"), "sum");
        let isum = text_kernel(&dev, ISUM, "isum");
        let out = dev.buffer(Scalar::F32, 1).unwrap();
        let iout = dev.buffer(Scalar::I32, 1).unwrap();
        for n in [65_535usize, 65_536, 65_537, 70_000, 1 << 20, (1 << 24) - 1, 1 << 24] {
            // f32 ones: every partial sum is exact up to 2^24.
            let a = Buffer::from_slice(dev.allocator(), &vec![1.0f32; n]).unwrap();
            sum.launch(&[&a, &out], &[n as i64]).unwrap();
            assert_eq!(out.to_vec::<f32>().unwrap(), [n as f32], "sum of {n} ones");
            // i32 values that differ: a missing or repeated element changes the (wrapping) sum.
            let values: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(7919) ^ (i >> 3)).collect();
            let want = values.iter().fold(0i32, |s, v| s.wrapping_add(*v));
            let a = Buffer::from_slice(dev.allocator(), &values).unwrap();
            isum.launch(&[&a, &iout], &[n as i64]).unwrap();
            assert_eq!(iout.to_vec::<i32>().unwrap(), [want], "i32 sum of {n} values");
        }
    }

    /// Nested and consecutive loops share lavapipe's one budget per work item: a 300 x 300
    /// nest (90,000 inner iterations) and two loops of 40,000 each give the whole sums.
    #[test]
    fn nested_and_consecutive_loops_beyond_65535_iterations_run_to_the_end() {
        let Some(dev) = test_device() else { return };
        let nest = text_kernel(
            &dev,
            "%a = DEFINE_VAR i32 \"a\" 1 1000\n%b = DEFINE_VAR i32 \"b\" 1 1000\n%one = CONST i32 1\n\
             %z = CONST i32 0\n%ab = MUL i32 (%a, %b)\n%x = PARAM ptr<i32> 0 (%ab)\n%out = PARAM ptr<i32> 1 (%one)\n\
             %i = RANGE i32 0 (%a)\n%j = RANGE i32 1 (%b)\n%acc = DEFINE_ACC i32 0 (%z, %i, %j)\n\
             %ib = MUL i32 (%i, %b)\n%k = ADD i32 (%ib, %j)\n%p = INDEX ptr<i32> (%x, %k)\n%v = LOAD i32 (%p)\n\
             %nx = ADD i32 (%acc, %v)\n%up = ASSIGN i32 (%acc, %nx)\n%ej = END i32 (%j, %up)\n\
             %ei = END i32 (%i, %ej)\n%po = INDEX ptr<i32> (%out, %z)\n%st = STORE void (%po, %ei)\nSINK void (%st)",
            "nest",
        );
        let out = dev.buffer(Scalar::I32, 1).unwrap();
        for (a, b) in [(300usize, 300usize), (1000, 1000), (1, 1000), (1000, 1)] {
            let values: Vec<i32> = (0..(a * b) as i32).map(|i| i.wrapping_mul(31) + 7).collect();
            let want = values.iter().fold(0i32, |s, v| s.wrapping_add(*v));
            let x = Buffer::from_slice(dev.allocator(), &values).unwrap();
            nest.launch(&[&x, &out], &[a as i64, b as i64]).unwrap();
            assert_eq!(out.to_vec::<i32>().unwrap(), [want], "{a} x {b}");
        }
        // out[0] = sum of x, out[1] = sum of y: two loops one after the other.
        let two = text_kernel(
            &dev,
            "%n = DEFINE_VAR i32 \"n\" 1 100000\n%two = CONST i32 2\n%z = CONST i32 0\n%o1 = CONST i32 1\n\
             %x = PARAM ptr<i32> 0 (%n)\n%y = PARAM ptr<i32> 1 (%n)\n%out = PARAM ptr<i32> 2 (%two)\n\
             %r = RANGE i32 0 (%n)\n%acc = DEFINE_ACC i32 0 (%z, %r)\n%px = INDEX ptr<i32> (%x, %r)\n\
             %vx = LOAD i32 (%px)\n%nx = ADD i32 (%acc, %vx)\n%ux = ASSIGN i32 (%acc, %nx)\n%tx = END i32 (%r, %ux)\n\
             %p0 = INDEX ptr<i32> (%out, %z)\n%s0 = STORE void (%p0, %tx)\n\
             %q = RANGE i32 1 (%n)\n%bcc = DEFINE_ACC i32 1 (%z, %q)\n%py = INDEX ptr<i32> (%y, %q)\n\
             %vy = LOAD i32 (%py)\n%ny = ADD i32 (%bcc, %vy)\n%uy = ASSIGN i32 (%bcc, %ny)\n%ty = END i32 (%q, %uy)\n\
             %p1 = INDEX ptr<i32> (%out, %o1)\n%s1 = STORE void (%p1, %ty)\nSINK void (%s0, %s1)",
            "two_loops",
        );
        let out = dev.buffer(Scalar::I32, 2).unwrap();
        for n in [40_000usize, 100_000] {
            let xs: Vec<i32> = (0..n as i32).map(|i| i * 3 + 1).collect();
            let ys: Vec<i32> = (0..n as i32).map(|i| i ^ 0x5a5a).collect();
            let want =
                [xs.iter().fold(0i32, |s, v| s.wrapping_add(*v)), ys.iter().fold(0i32, |s, v| s.wrapping_add(*v))];
            let (x, y) =
                (Buffer::from_slice(dev.allocator(), &xs).unwrap(), Buffer::from_slice(dev.allocator(), &ys).unwrap());
            two.launch(&[&x, &y, &out], &[n as i64]).unwrap();
            assert_eq!(out.to_vec::<i32>().unwrap(), want, "two loops of {n}");
        }
    }

    /// Where unrolling cannot bring a launch within lavapipe's loop budget (an outer loop of
    /// 100,000 around a loop of 2), the launch is refused with a launch error and nothing
    /// runs; a smaller launch of the same kernel runs. Adapters without a budget run both.
    #[test]
    fn launches_past_the_loop_budget_are_refused_not_cut_short() {
        let Some(dev) = test_device() else { return };
        let budget = WgpuDevice::open(dev.spec()).unwrap().loop_budget;
        let k = text_kernel(
            &dev,
            "%n = DEFINE_VAR i32 \"n\" 1 100000\n%two = CONST i32 2\n%one = CONST i32 1\n%z = CONST i32 0\n\
             %out = PARAM ptr<i32> 0 (%one)\n%i = RANGE i32 0 (%n)\n%j = RANGE i32 1 (%two)\n\
             %acc = DEFINE_ACC i32 0 (%z, %i, %j)\n%nx = ADD i32 (%acc, %one)\n%up = ASSIGN i32 (%acc, %nx)\n\
             %ej = END i32 (%j, %up)\n%ei = END i32 (%i, %ej)\n%po = INDEX ptr<i32> (%out, %z)\n\
             %st = STORE void (%po, %ei)\nSINK void (%st)",
            "outer",
        );
        let out = Buffer::from_slice(dev.allocator(), &[-1i32]).unwrap();
        k.launch(&[&out], &[20_000]).unwrap();
        assert_eq!(out.to_vec::<i32>().unwrap(), [40_000]);
        let out = Buffer::from_slice(dev.allocator(), &[-1i32]).unwrap();
        match (budget, k.launch(&[&out], &[100_000])) {
            (Some(_), Err(Error::Launch(m))) => {
                assert!(m.contains("llvmpipe") && m.contains("n=100000"), "{m}");
                assert_eq!(out.to_vec::<i32>().unwrap(), [-1], "a refused launch writes nothing");
            }
            (None, Ok(())) => assert_eq!(out.to_vec::<i32>().unwrap(), [200_000]),
            (budget, r) => panic!("loop budget {budget:?}: {r:?}"),
        }
    }

    /// Values past 16 bits reach the kernel whole, in variables and in launch sizes: each of
    /// 70,000 items (1,094 work groups) writes its index plus a variable near i32::MAX.
    #[test]
    fn variables_and_launch_sizes_beyond_16_bits_arrive_whole() {
        let Some(dev) = test_device() else { return };
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 24);
        let m = k.var("m", 0, i32::MAX as i64 - (1 << 24));
        let out = k.param(0, Scalar::I32, &n);
        let i = k.global(0, &n);
        k.store(&out.at(&i), &(&i + &m));
        let kernel = dev.compile(&k.finish().unwrap(), Some("vars")).unwrap();
        for (n, m) in [(70_000usize, 65_536i64), (65_537, 16_777_216), (70_000, i32::MAX as i64 - (1 << 24))] {
            let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; n]).unwrap();
            // Variables are passed sorted by name: m, n.
            kernel.launch(&[&buf], &[m, n as i64]).unwrap();
            let got = buf.to_vec::<i32>().unwrap();
            let bad = (0..n).filter(|&i| got[i] as i64 != i as i64 + m).count();
            assert_eq!(bad, 0, "n = {n}, m = {m}: {bad} wrong, first {:?}", &got[..4]);
        }
    }

    /// Unrolled loops compute what plain loops compute: every example kernel, rendered for a
    /// budget of 256 loop passes (which unrolls most innermost loops, many of them fully),
    /// gives bit-identical outputs to the plain render, for small variable values whose
    /// launches fit that budget.
    #[test]
    fn unrolled_loops_give_the_results_of_plain_loops() {
        const BUDGET: u64 = 256;
        let (Some(plain), Some(unrolled)) = (test_device_with(Some(None)), test_device_with(Some(Some(BUDGET)))) else {
            return;
        };
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
        let mut files: Vec<_> = [root.clone(), root.join("bench")]
            .iter()
            .flat_map(|d| std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()))
            .filter(|f| f.extension().is_some_and(|e| e == "kiln"))
            .collect();
        files.sort();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut compared, mut unrolled_kernels) = (0, 0);
        for file in files {
            let sink = kiln_device::kiln_ir::parse_kernel(&std::fs::read_to_string(&file).unwrap()).unwrap();
            let spec = plain.renderer().render(&sink, Some("k")).unwrap();
            let plan = loops::LoopPlan::new(&kiln_device::kiln_ir::linearize(&sink).unwrap(), Some(BUDGET));
            // Launches that fit the budget (no variables: the one launch, if it fits).
            let launches: Vec<Vec<i64>> = (0..3)
                .map(|_| spec.vars.iter().map(|v| v.min.saturating_add((next() % 40) as i64).min(v.max)).collect())
                .filter(|vals: &Vec<i64>| plan.launch_passes(&spec.var_names, vals) <= BUDGET as u128)
                .filter(|vals| spec.param_lens(vals).is_ok_and(|lens| lens.iter().all(|n| *n <= 1 << 22)))
                .collect();
            if launches.is_empty() {
                continue;
            }
            let a = plain.compile(&sink, Some("k")).unwrap();
            let b = unrolled.compile(&sink, Some("k")).unwrap();
            unrolled_kernels += usize::from(a.spec.src != b.spec.src);
            for vals in launches {
                let lens = a.spec.param_lens(&vals).unwrap();
                let inputs: Vec<Vec<u8>> = a
                    .spec
                    .params
                    .iter()
                    .zip(&lens)
                    .map(|(p, n)| {
                        (0..*n)
                            .flat_map(|_| {
                                let r = next();
                                match p.scalar {
                                    // Small multiples of 1/8: no rounding in sums, no NaNs.
                                    Scalar::F32 => (((r % 33) as f32 - 16.0) / 8.0).to_le_bytes().to_vec(),
                                    s => r.to_le_bytes()[..s.size()].to_vec(),
                                }
                            })
                            .collect()
                    })
                    .collect();
                let run = |dev: &Device, k: &kiln_device::Kernel| -> Result<Vec<Vec<u8>>> {
                    let bufs = k
                        .spec
                        .params
                        .iter()
                        .zip(&inputs)
                        .map(|(p, bytes)| {
                            let buf = dev.buffer(p.scalar, bytes.len() / p.scalar.size())?;
                            buf.copyin(bytes)?;
                            Ok(buf)
                        })
                        .collect::<Result<Vec<Buffer>>>()?;
                    k.launch(&bufs.iter().collect::<Vec<_>>(), &vals)?;
                    bufs.iter()
                        .map(|buf| {
                            let mut out = vec![0u8; buf.nbytes()];
                            buf.copyout(&mut out)?;
                            Ok(out)
                        })
                        .collect()
                };
                // A launch kiln refuses (a bounds proof) is refused by both.
                let Ok(want) = run(&plain, &a) else { continue };
                let got = run(&unrolled, &b).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                assert!(got == want, "{}: unrolled and plain loops differ for {vals:?}", file.display());
                compared += 1;
            }
        }
        assert!(
            unrolled_kernels >= 4 && compared >= 10,
            "{unrolled_kernels} kernels unrolled, {compared} runs compared"
        );
    }

    /// With a loop budget, long innermost loops are rendered unrolled (every example kernel
    /// still passes naga); without one the WGSL is the plain loop.
    #[test]
    fn long_loops_are_unrolled_only_under_a_loop_budget() {
        let caps = Caps { f16: true, int64: true };
        let plain = WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps);
        let budgeted =
            WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps).with_loop_budget(Some(loops::LLVMPIPE_LOOP_BUDGET));
        let sum = kiln_device::kiln_ir::parse_kernel(include_str!("../../../examples/kernels/sum.kiln")).unwrap();
        let src = plain.render(&sum, Some("sum")).unwrap().src;
        assert!(src.contains("ridx0++") && !src.contains("ridx0_b"), "{src}");
        let src = budgeted.render(&sum, Some("sum")).unwrap().src;
        assert!(
            src.contains("ridx0_b += 257i") && src.contains("if (kiln_var0 - ridx0_b <= 256i) { break; }"),
            "{src}"
        );
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
        let compiler = WgslCompiler::new(caps, "test".into());
        for dir in [root.clone(), root.join("bench")] {
            for file in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
                if file.extension().is_none_or(|e| e != "kiln") {
                    continue;
                }
                let sink = kiln_device::kiln_ir::parse_kernel(&std::fs::read_to_string(&file).unwrap()).unwrap();
                for r in [&plain, &budgeted] {
                    let spec = r.render(&sink, Some("k")).unwrap();
                    compiler.compile(&spec).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                }
            }
        }
    }

    #[test]
    fn the_grid_fold_covers_every_group_once() {
        assert_eq!(renderer::grid([1, 1, 1]), Some([1, 1, 1]));
        assert_eq!(renderer::grid([65_535, 1, 1]), Some([65_535, 1, 1]));
        assert_eq!(renderer::grid([65_536, 1, 1]), Some([65_535, 2, 1]));
        assert_eq!(renderer::grid([300, 300, 2]), Some([65_535, 3, 1]));
        assert_eq!(renderer::grid([u64::MAX, 2, 1]), None);
        // The shader folds the grid back in u32, so it stays 2-D: at most 65,535^2 groups (a
        // third axis would give dispatched groups linear indices past 2^32, which wrap).
        assert_eq!(renderer::grid([65_535, 65_535, 1]), Some([65_535, 65_535, 1]));
        assert_eq!(renderer::grid([65_535, 65_536, 1]), None);
        assert_eq!(renderer::grid([1 << 16, 1 << 10, 1 << 10]), None);
        assert_eq!(renderer::grid([0, 5, 1]), Some([0, 0, 0]));
    }

    /// A render bug reaches the caller as naga's diagnostic in a compile error.
    #[test]
    fn invalid_wgsl_is_a_compile_error_with_nagas_message() {
        let caps = Caps { f16: false, int64: false };
        let mut k = KernelBuilder::new();
        let (x, out) = (k.param(0, Scalar::F32, 4), k.param(1, Scalar::F32, 4));
        let i = k.global(0, 4);
        k.store(&out.at(&i), &(x.at(&i).load() + 1.0));
        let r = WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps);
        let mut spec = r.render(&k.finish().unwrap(), Some("broken")).unwrap();
        spec.src = spec.src.replace("kiln_main", "kiln main");
        let e = WgslCompiler::new(caps, "test".into()).compile(&spec).unwrap_err();
        let Error::Compile { message, log, .. } = &e else { panic!("{e:?}") };
        assert!(message.contains("naga") && message.contains("broken"), "{message}");
        assert!(log.contains("expected"), "{log}");
    }

    /// Float comparisons and sin/cos do not rely on the driver's float rules: an ordered
    /// comparison also tests its operands for NaN by their bits, and sin/cos are kiln's own
    /// (NVIDIA's Vulkan driver broke both: a NaN compared as less, and sin 30 ulps off).
    #[test]
    fn float_comparisons_and_sin_are_rendered_without_the_drivers_float_rules() {
        let caps = Caps { f16: false, int64: false };
        let mut k = KernelBuilder::new();
        let (x, out) = (k.param(0, Scalar::F32, 4), k.param(1, Scalar::F32, 4));
        let i = k.global(0, 4);
        let v = x.at(&i).load();
        k.store(&out.at(&i), &v.lt(1.0f32).select(&v.sin(), v.cos()));
        let src = WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps).render(&k.finish().unwrap(), None).unwrap().src;
        assert!(src.contains("< 1") && src.contains("&& !kiln_isnan_f32("), "{src}");
        assert!(src.contains("kiln_sin_f32(") && src.contains("kiln_cos_f32(") && !src.contains(" sin("), "{src}");
    }

    /// A dtype WGSL (or the adapter) lacks is refused when rendering, naming it.
    #[test]
    fn missing_dtypes_are_render_errors_that_name_them() {
        let caps = Caps { f16: false, int64: false };
        let r = WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps);
        for (s, words) in [(Scalar::F64, "f64"), (Scalar::F16, "SHADER_F16"), (Scalar::I64, "SHADER_INT64")] {
            let mut k = KernelBuilder::new();
            let (x, y) = (k.param(0, s, 4), k.param(1, s, 4));
            let i = k.global(0, 4);
            k.store(&y.at(&i), &x.at(&i).load());
            let e = r.render(&k.finish().unwrap(), None).unwrap_err();
            assert!(matches!(&e, Error::Render(m) if m.contains(words)), "{s}: {e}");
        }
    }

    /// The kernel cache finds a kernel's WGSL by the renderer's identity, without rendering:
    /// adapters with other features or loop budgets name other identities, and the metadata
    /// described without rendering is the rendered one's.
    #[test]
    fn the_identity_names_the_features_and_describe_matches_render() {
        let (spec, caps) = (DeviceSpec::new(BACKEND, 0), Caps { f16: true, int64: false });
        let plain = WgslRenderer::new(spec.clone(), caps);
        let identities = [
            plain.identity(),
            WgslRenderer::new(spec.clone(), Caps { f16: false, int64: false }).identity(),
            WgslRenderer::new(spec.clone(), caps).with_loop_budget(Some(loops::LLVMPIPE_LOOP_BUDGET)).identity(),
        ];
        assert!(identities.iter().all(Option::is_some));
        assert!(identities[0] != identities[1] && identities[0] != identities[2] && identities[1] != identities[2]);
        let mut k = KernelBuilder::new();
        let (x, y) = (k.param(0, Scalar::F32, 4), k.param(1, Scalar::F32, 4));
        let i = k.global(0, 4);
        k.store(&y.at(&i), &x.at(&i).load());
        let sink = k.finish().unwrap();
        let (rendered, described) =
            (plain.render(&sink, Some("k")).unwrap(), plain.describe(&sink, Some("k")).unwrap());
        assert_eq!(
            (rendered.name, rendered.globals, rendered.outs, rendered.ins),
            (described.name, described.globals, described.outs, described.ins)
        );
    }

    #[test]
    fn the_cache_key_names_the_adapter() {
        let Some(dev) = test_device() else { return };
        let gpu = WgpuDevice::open(dev.spec()).unwrap();
        let c = WgslCompiler::new(gpu.caps, gpu.identity());
        assert!(c.fingerprint().contains(gpu.info.name.trim()), "{}", c.fingerprint());
        assert_eq!(c.cache_key(), "webgpu");
    }
}
