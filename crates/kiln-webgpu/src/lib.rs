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
//! - [`program`]: compute pipelines, bind groups and dispatches.
//! - [`allocator`]: storage buffers and staged host transfers.
//! - [`queue`]: kiln queues over wgpu's one ordered queue.
//! - [`signal`]: timeline signals over wgpu submission indices.

pub mod allocator;
pub mod compiler;
pub mod program;
pub mod queue;
pub mod renderer;
pub mod signal;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Device, Error, LruAllocator, RawPtr, Result};

pub use allocator::WgpuAllocator;
pub use compiler::{Emit, WgslCompiler, translate};
pub use program::{EmptyDispatch, WgpuProgram};
pub use queue::{WebGpu, WgpuQueue, WgpuQueueFactory, WgpuStream};
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
        Ok(WgpuDevice {
            spec: spec.clone(),
            info: adapter.get_info(),
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
    let first = Arc::new(WgpuDevice::open(spec)?);
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
            None => Arc::new(WgpuDevice::open(ctx.spec())?),
        };
        let loader = gpu.clone();
        let runtime: kiln_device::RuntimeFactory =
            Arc::new(move |compiled| Ok(Arc::new(WgpuProgram::load(loader.clone(), compiled)?) as _));
        let allocator = Arc::new(LruAllocator::from_env(Arc::new(WgpuAllocator::new(gpu.clone())))?);
        let compilers: Vec<kiln_device::CompilerPair> = vec![(
            Arc::new(WgslRenderer::new(gpu.spec.clone(), gpu.caps)),
            Arc::new(WgslCompiler::new(gpu.caps, gpu.identity())),
        )];
        Ok(kiln_device::DeviceParts::new(allocator, compilers, runtime)
            .with_queues(Arc::new(WgpuQueueFactory::new(gpu))))
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
    let spec = DeviceSpec::new(crate::BACKEND, 0);
    let memory_only = || Arc::new(kiln_device::KernelCache::new(kiln_device::CacheConfig::memory_only()));
    match build_device(&spec) {
        Ok(d) => Some(Arc::new(d.with_cache(memory_only()))),
        Err(e) => {
            kiln_device::skip_unless_required("webgpu", "this WebGPU test", &e);
            None
        }
    }
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

    #[test]
    fn the_grid_fold_covers_every_group_once() {
        assert_eq!(renderer::grid([1, 1, 1]), Some([1, 1, 1]));
        assert_eq!(renderer::grid([65_535, 1, 1]), Some([65_535, 1, 1]));
        assert_eq!(renderer::grid([65_536, 1, 1]), Some([65_535, 2, 1]));
        assert_eq!(renderer::grid([300, 300, 2]), Some([65_535, 3, 1]));
        assert_eq!(renderer::grid([u64::MAX, 2, 1]), None);
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

    #[test]
    fn the_cache_key_names_the_adapter() {
        let Some(dev) = test_device() else { return };
        let gpu = WgpuDevice::open(dev.spec()).unwrap();
        let c = WgslCompiler::new(gpu.caps, gpu.identity());
        assert!(c.fingerprint().contains(gpu.info.name.trim()), "{}", c.fingerprint());
        assert_eq!(c.cache_key(), "webgpu");
    }
}
