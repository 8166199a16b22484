//! A device: renderer/compiler pairs, a runtime factory and an allocator, plus the safe
//! [`Kernel`] handle and the process-wide device registry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kiln_ir::{DeviceSpec, Scalar, UOp};

use crate::buffer::{Allocator, Buffer, RawView};
use crate::cache::{KernelCache, Toolchain};
use crate::error::{Error, Result};
use crate::program::{Compiler, LaunchDims, Program, ProgramSpec, Renderer, RuntimeFactory};
use crate::queue::DynQueueFactory;

/// A (renderer, compiler) pair. A device may offer several (e.g. two C compilers).
pub type CompilerPair = (Arc<dyn Renderer>, Arc<dyn Compiler>);

/// A loaded kernel with its metadata: the safe way to run a [`Program`].
#[derive(Clone)]
pub struct Kernel {
    pub spec: Arc<ProgramSpec>,
    pub program: Arc<dyn Program>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({} on {})", self.spec.name, self.spec.device)
    }
}

impl Kernel {
    /// Checks `bufs` and `vals` against the kernel and returns what `Program::execute` needs:
    /// one buffer per slot, each on this kernel's device, of the parameter's dtype and at
    /// least the parameter's declared size; variables within bounds; launch sizes ≥ 1; and
    /// every LOAD and STORE proven to stay inside its buffer's declared size for these
    /// values ([`ProgramSpec::check_bounds`]), else [`Error::OutOfBounds`] naming the access.
    ///
    /// Together these are the safe path's guarantee: a kernel that passes cannot read or
    /// write memory outside the buffers it is given. Queues and execution plans launch
    /// through this check (plans again whenever a run binds new variable values).
    pub fn check(&self, bufs: &[&Buffer], vals: &[i64]) -> Result<(Vec<RawView>, LaunchDims)> {
        let spec = &self.spec;
        let dims = spec.launch_dims(vals)?;
        if bufs.len() != spec.params.len() {
            return Err(Error::Launch(format!(
                "kernel `{}` takes {} buffer(s), got {}",
                spec.name,
                spec.params.len(),
                bufs.len()
            )));
        }
        let lens = spec.param_lens(vals)?;
        spec.check_bounds(vals, &dims, &lens)?;
        let mut views = Vec::with_capacity(bufs.len());
        for ((p, &want), b) in spec.params.iter().zip(&lens).zip(bufs) {
            if b.device().base_type() != spec.device.base_type() {
                return Err(Error::Launch(format!(
                    "buffer {} is on {}, the kernel runs on {}",
                    p.slot,
                    b.device(),
                    spec.device
                )));
            }
            if b.dtype() != p.scalar {
                return Err(Error::Launch(format!(
                    "buffer {} holds {}, the kernel expects {}",
                    p.slot,
                    b.dtype(),
                    p.scalar
                )));
            }
            if b.len() < want {
                return Err(Error::Launch(format!(
                    "buffer {} has {} elements, the kernel needs {want} for these variables",
                    p.slot,
                    b.len()
                )));
            }
            views.push(b.raw()?);
        }
        Ok((views, dims))
    }

    /// Runs the kernel to completion on the calling thread, after [`Kernel::check`]: a
    /// launch that could touch memory outside its buffers is refused, never run.
    pub fn launch(&self, bufs: &[&Buffer], vals: &[i64]) -> Result<()> {
        let (views, dims) = self.check(bufs, vals)?;
        // SAFETY: `check` verified count, device, dtype and size of every buffer, the
        // variables' bounds, the launch sizes and that every access stays in bounds; the
        // borrowed `bufs` keep the memory alive for the duration of this synchronous call.
        unsafe { self.program.execute(&views, vals, &dims) }
    }
}

/// One compute device and everything needed to compile for it and run on it.
pub struct Device {
    pub spec: DeviceSpec,
    /// A human-readable description (model, driver) for `kiln devices`.
    pub description: String,
    pub allocator: Arc<dyn Allocator>,
    /// Available (renderer, compiler) pairs; the first is the default.
    pub compilers: Vec<CompilerPair>,
    pub runtime: RuntimeFactory,
    /// The device's hardware queues and signals, if its backend offers them
    /// (set with [`Device::with_queues`]).
    pub queues: Option<Arc<dyn DynQueueFactory>>,
    /// Loaded and compiled kernels; [`Device::compile`] goes through it.
    cache: Arc<KernelCache>,
    /// The default pair with its fingerprint, taken at the first compile.
    toolchain: OnceLock<Toolchain>,
}

impl Device {
    pub fn new(
        spec: DeviceSpec,
        description: String,
        allocator: Arc<dyn Allocator>,
        compilers: Vec<CompilerPair>,
        runtime: RuntimeFactory,
    ) -> Result<Device> {
        if compilers.is_empty() {
            return Err(Error::Invalid(format!("device {spec} needs at least one renderer/compiler pair")));
        }
        // A malformed KILN_CACHE* variable is reported here rather than silently ignored.
        let cache = Arc::new(KernelCache::from_env()?);
        Ok(Device { spec, description, allocator, compilers, runtime, queues: None, cache, toolchain: OnceLock::new() })
    }

    /// This device with `cache` instead of the one configured from the environment (e.g. a
    /// memory-only cache, or one shared between devices whose programs are interchangeable).
    pub fn with_cache(mut self, cache: Arc<KernelCache>) -> Device {
        self.cache = cache;
        self
    }

    /// This device with `queues` as its queue factory.
    pub fn with_queues(mut self, queues: Arc<dyn DynQueueFactory>) -> Device {
        self.queues = Some(queues);
        self
    }

    /// The kernel cache [`Device::compile`] uses.
    pub fn cache(&self) -> &Arc<KernelCache> {
        &self.cache
    }

    pub fn renderer(&self) -> &Arc<dyn Renderer> {
        &self.compilers[0].0
    }

    pub fn compiler(&self) -> &Arc<dyn Compiler> {
        &self.compilers[0].1
    }

    /// The device family without ordinal: compiled kernels are shared across its members.
    pub fn base_device_key(&self) -> &'static str {
        self.spec.base_type()
    }

    /// A lazily allocated buffer of `len` elements on this device.
    pub fn buffer(&self, dtype: Scalar, len: usize) -> Result<Buffer> {
        Buffer::new(self.allocator.clone(), dtype, len)
    }

    /// The loaded kernel for `sink` with the default pair: from the memory cache, else the
    /// disk cache, else rendered, compiled and loaded (and stored in both). Concurrent calls
    /// for one kernel compile it once. A disk-cache failure never fails the compile.
    pub fn compile(&self, sink: &Arc<UOp>, name: Option<&str>) -> Result<Kernel> {
        let toolchain = self
            .toolchain
            .get_or_init(|| Toolchain::new(self.renderer().clone(), self.compiler().clone(), self.runtime.clone()));
        self.cache.get_or_compile(sink, name, &self.spec, toolchain)
    }
}

/// Opens a device of one backend family, given the full spec (with ordinal).
pub type DeviceOpener = fn(&DeviceSpec) -> Result<Arc<Device>>;

struct Registry {
    openers: HashMap<&'static str, DeviceOpener>,
    open: HashMap<DeviceSpec, Arc<Device>>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry { openers: HashMap::new(), open: HashMap::new() }))
}

/// Registers the opener of a backend family (`"CPU"`, `"OPENCL"`, ...).
pub fn register_backend(base_type: &'static str, opener: DeviceOpener) {
    registry().lock().unwrap_or_else(|p| p.into_inner()).openers.insert(base_type, opener);
}

/// Opens `name` (e.g. `"CPU"`, `"OPENCL:0"`) once per process and returns the shared device.
pub fn open_device(name: &str) -> Result<Arc<Device>> {
    let spec: DeviceSpec = name.parse()?;
    let opener = {
        let r = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = r.open.get(&spec) {
            return Ok(d.clone());
        }
        *r.openers
            .get(spec.base_type())
            .ok_or_else(|| Error::Unavailable(format!("no {} backend is registered in this build", spec.base_type())))?
    };
    // Open outside the lock: opening may be slow (driver start-up).
    let device = opener(&spec)?;
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    Ok(r.open.entry(spec).or_insert(device).clone())
}
