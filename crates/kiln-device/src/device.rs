//! A device: its generations of parts ([`DeviceParts`]), its kernel cache and bounds
//! policy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use kiln_ir::{DeviceSpec, Scalar, UOp};

use crate::buffer::{Allocator, Buffer};
use crate::cache::{KernelCache, Toolchain};
use crate::context::DeviceContext;
use crate::error::{Error, ErrorClass, Result};
use crate::generation::Generation;
use crate::guarded::BoundsPolicy;
use crate::kernel::{Fallback, Kernel, Loader};
use crate::parts::{CompilerPair, DeviceParts, PartsBuilder};
use crate::program::{Compiler, Renderer, RuntimeFactory};
use crate::properties::DeviceProperties;
use crate::queue::DynQueueFactory;

/// One compute device and everything needed to compile for it and run on it.
///
/// The device owns its [`DeviceContext`]; its parts (allocator, compilers, program loader,
/// queues) belong to the current generation and are replaced by [`Device::reset`], so they
/// are reached through accessors, never held as fields.
pub struct Device {
    context: Arc<DeviceContext>,
    /// A human-readable description (model, driver) for `kiln devices`.
    description: String,
    /// What kernel generators may rely on ([`Device::with_properties`]).
    properties: DeviceProperties,
    build: PartsBuilder,
    current: RwLock<Arc<Generation>>,
    /// Loaded and compiled kernels; [`Device::compile`] goes through it.
    cache: Arc<KernelCache>,
    /// What a launch does with an access no proof reaches: [`BoundsPolicy::Refuse`] when set.
    refuse_unproven: AtomicBool,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({:?})", self.context)
    }
}

/// The longest kernel name [`Device::compile`] takes, in characters: names become symbols and
/// file names, which file systems cap at 255 bytes.
pub const MAX_KERNEL_NAME: usize = 128;

impl Device {
    /// Opens a device: `build` makes its first generation now and every later one at
    /// [`Device::reset`].
    ///
    /// # Errors
    /// The errors of `build`; [`Error::Invalid`] when it offers no renderer/compiler pair;
    /// [`Error::Config`] for a malformed `KILN_CACHE*` (or, with fault injection,
    /// `KILN_FAULTS`) variable; [`Error::Invalid`] for a malformed `KILN_BOUNDS`.
    pub fn new(
        spec: DeviceSpec,
        description: String,
        build: impl Fn(&DeviceContext) -> Result<DeviceParts> + Send + Sync + 'static,
    ) -> Result<Device> {
        let build: PartsBuilder = Arc::new(build);
        #[cfg(feature = "fault-injection")]
        let build = match crate::faults::FaultPlan::from_env()? {
            Some(plan) => crate::faults::injecting(build, plan),
            None => build,
        };
        Device::open(spec, description, build)
    }

    fn open(spec: DeviceSpec, description: String, build: PartsBuilder) -> Result<Device> {
        let context = DeviceContext::new(spec);
        let first = Generation::new(build(&context)?, context.stamp())?;
        // A malformed KILN_CACHE* variable is reported here rather than silently ignored.
        let cache = Arc::new(KernelCache::from_env()?);
        Ok(Device {
            context,
            description,
            properties: DeviceProperties::default(),
            build,
            current: RwLock::new(Arc::new(first)),
            cache,
            refuse_unproven: AtomicBool::new(BoundsPolicy::from_env()? == BoundsPolicy::Refuse),
        })
    }

    /// Sets what launches do with an access no proof reaches, for kernels compiled from now
    /// on ([`Kernel::refusing`] does it for one kernel). A device opens with the policy of
    /// `KILN_BOUNDS`, else [`BoundsPolicy::Guard`].
    pub fn set_bounds_policy(&self, policy: BoundsPolicy) {
        self.refuse_unproven.store(policy == BoundsPolicy::Refuse, Ordering::Relaxed);
    }

    /// What a launch does with an access no proof reaches ([`crate::guarded`]).
    pub fn bounds_policy(&self) -> BoundsPolicy {
        if self.refuse_unproven.load(Ordering::Relaxed) { BoundsPolicy::Refuse } else { BoundsPolicy::Guard }
    }

    /// This device with `cache` instead of the one configured from the environment (e.g. a
    /// memory-only cache, or one shared between devices whose programs are interchangeable).
    pub fn with_cache(mut self, cache: Arc<KernelCache>) -> Device {
        self.cache = cache;
        self
    }

    /// This device described by `properties` (instruction set, vector width, caches) instead of
    /// the empty [`DeviceProperties`] a device opens with.
    pub fn with_properties(mut self, properties: DeviceProperties) -> Device {
        self.properties = properties;
        self
    }

    /// A new device of the same backend and spec whose every generation injects the faults
    /// of `plan` ([`crate::faults`]): a new context at generation 0 and its own kernel cache
    /// (configured from the environment; [`Device::with_cache`] replaces it), so programs of
    /// the two devices never mix. Faults of `KILN_FAULTS` on `self` apply to it too.
    ///
    /// # Errors
    /// The errors of [`Device::new`] (the parts are built again, with the faults).
    #[cfg(feature = "fault-injection")]
    pub fn with_faults(&self, plan: Arc<crate::faults::FaultPlan>) -> Result<Device> {
        let build = crate::faults::injecting(self.build.clone(), plan);
        Ok(Device::open(self.spec().clone(), self.description.clone(), build)?.with_properties(self.properties.clone()))
    }

    fn current(&self) -> Arc<Generation> {
        // Nothing panics under this lock; a poisoned lock still holds a whole generation.
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The device's name and ordinal (`OPENCL:1`); the key of [`crate::open_device`]'s registry.
    pub fn spec(&self) -> &DeviceSpec {
        self.context.spec()
    }

    /// A human-readable description (model, driver), for listings; not an identity.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// What the device offers kernel generators (vector width, caches); see [`DeviceProperties`].
    pub fn properties(&self) -> &DeviceProperties {
        &self.properties
    }

    /// The device's identity, generation and health.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.context
    }

    /// The current generation (0 when opened, +1 per reset).
    pub fn generation(&self) -> u64 {
        self.context.generation()
    }

    /// Whether a fatal error lost the device (see [`Device::reset`]).
    pub fn is_lost(&self) -> bool {
        self.context.is_lost()
    }

    /// The current generation's allocator.
    pub fn allocator(&self) -> Arc<dyn Allocator> {
        self.current().allocator.clone()
    }

    /// The available (renderer, compiler) pairs; the first is the default.
    pub fn compilers(&self) -> Vec<CompilerPair> {
        self.current().compilers.clone()
    }

    /// The current generation's backend program loader, as the backend built it: its
    /// programs carry no generation ([`Device::loader`] loads kernels that do).
    pub fn runtime(&self) -> RuntimeFactory {
        self.current().runtime.clone()
    }

    /// The current generation's kernel loader: its kernels carry the generation's origin
    /// (generation check, launch gate, graphs) and their compiled form.
    pub fn loader(&self) -> Loader {
        self.current().loader.clone()
    }

    /// The current generation's queues and signals, if the backend offers them.
    pub fn queues(&self) -> Option<Arc<dyn DynQueueFactory>> {
        self.current().queues.clone()
    }

    /// The kernel cache [`Device::compile`] uses.
    pub fn cache(&self) -> &Arc<KernelCache> {
        &self.cache
    }

    /// The names of the device's (renderer, compiler) pairs, the default first.
    pub fn compiler_names(&self) -> Vec<String> {
        self.current().compilers.iter().map(|p| p.name.clone()).collect()
    }

    /// The default renderer (of the first pair) of the current generation.
    pub fn renderer(&self) -> Arc<dyn Renderer> {
        self.current().compilers[0].renderer.clone()
    }

    /// The default compiler (of the first pair) of the current generation.
    pub fn compiler(&self) -> Arc<dyn Compiler> {
        self.current().compilers[0].compiler.clone()
    }

    /// The pairs the backend has but cannot offer on this machine, each with why (the CPU's
    /// `llvm` where libLLVM is not installed).
    pub fn missing_compilers(&self) -> Vec<(String, String)> {
        self.current().missing.clone()
    }

    /// The index of the pair named `name`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] naming the device's pairs when it has none of that name, and why
    /// when it is one the backend cannot offer here.
    fn pair_index(&self, name: &str) -> Result<usize> {
        let names = self.compiler_names();
        names.iter().position(|n| n == name).ok_or_else(|| {
            let why = self.current().missing.iter().find(|(n, _)| n == name).map(|(_, why)| why.clone());
            Error::Unavailable(match why {
                Some(why) => format!("device {} cannot offer its compiler pair `{name}` here: {why}", self.spec()),
                None => format!(
                    "device {} has no compiler pair `{name}`; its pairs are: {} (`kiln devices` lists them)",
                    self.spec(),
                    names.join(", ")
                ),
            })
        })
    }

    /// A new device of the same backend and spec whose default pair is `name` (then the
    /// others, in their order), described by that pair's properties where it has its own: a
    /// new context at generation 0 and its own kernel cache, as [`Device::with_faults`]
    /// makes one. The conformance suite runs every pair this way, and `kiln --compiler`
    /// and Python's `kiln.Device(name, compiler=…)` open one.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the device has no pair `name`; the errors of
    /// [`Device::new`] (the parts are built again).
    pub fn with_default_compiler(&self, name: &str) -> Result<Device> {
        let index = self.pair_index(name)?;
        let properties = self.current().compilers[index].properties.clone().unwrap_or_else(|| self.properties.clone());
        let (inner, name) = (self.build.clone(), name.to_string());
        let build: PartsBuilder = Arc::new(move |context| {
            let mut parts = inner(context)?;
            if let Some(i) = parts.compilers.iter().position(|p| p.name == name) {
                let pair = parts.compilers.remove(i);
                parts.compilers.insert(0, pair);
            }
            Ok(parts)
        });
        Ok(Device::open(self.spec().clone(), self.description.clone(), build)?.with_properties(properties))
    }

    /// A lazily allocated buffer of `len` elements on this device, in the current generation
    /// (a reset makes it stale).
    ///
    /// # Errors
    /// The errors of [`Buffer::new`].
    pub fn buffer(&self, dtype: Scalar, len: usize) -> Result<Buffer> {
        Buffer::new(self.allocator(), dtype, len)
    }

    /// The loaded kernel for `sink` with the default pair: from the memory cache, else the
    /// disk cache, else rendered, compiled and loaded (and stored in both). Concurrent calls
    /// for one kernel compile it once. A disk-cache failure never fails the compile. After a
    /// [`Device::reset`] a kernel the cache holds is reloaded from its compiled form (the
    /// compiler is not called).
    ///
    /// A compile that joins one begun before a concurrent [`Device::reset`] gets that
    /// compile's outcome, which belongs to the ended generation (a stale kernel or its
    /// `DeviceLost` error); it is then loaded again for the current generation (from the
    /// cache, without compiling), up to [`Device::COMPILE_TRIES`] times while resets keep
    /// racing it.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a name over [`MAX_KERNEL_NAME`] characters;
    /// [`Error::DeviceFailed`] while the device is lost; the errors of
    /// [`KernelCache::get_or_compile`].
    pub fn compile(&self, sink: &Arc<UOp>, name: Option<&str>) -> Result<Kernel> {
        self.compile_on(0, sink, name)
    }

    /// [`Device::compile`] with the pair named `compiler` instead of the default. Its kernels
    /// are cached apart from every other pair's.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the device has no pair `compiler`; the errors of
    /// [`Device::compile`].
    pub fn compile_with(&self, compiler: &str, sink: &Arc<UOp>, name: Option<&str>) -> Result<Kernel> {
        self.compile_on(self.pair_index(compiler)?, sink, name)
    }

    fn compile_on(&self, pair: usize, sink: &Arc<UOp>, name: Option<&str>) -> Result<Kernel> {
        if let Some(name) = name
            && name.chars().count() > MAX_KERNEL_NAME
        {
            return Err(Error::Invalid(format!(
                "a kernel name of {} characters: names are at most {MAX_KERNEL_NAME} (they name files and symbols)",
                name.chars().count()
            )));
        }
        let mut tries = 1;
        loop {
            let result = self.compile_in_current_generation(pair, sink, name);
            let stale = match &result {
                Ok(kernel) => kernel.check_current().is_err(),
                Err(e) => e.class() == ErrorClass::DeviceLost,
            };
            if !stale || tries == Self::COMPILE_TRIES || self.context.stamp().check("the device").is_err() {
                return result;
            }
            tries += 1;
        }
    }

    /// How many times [`Device::compile`] loads a kernel whose generation a concurrent reset
    /// ended before it returns the stale outcome.
    pub const COMPILE_TRIES: usize = 3;

    fn compile_in_current_generation(&self, pair: usize, sink: &Arc<UOp>, name: Option<&str>) -> Result<Kernel> {
        self.context.stamp().check("the device")?;
        let current = self.current();
        let (Some(slot), Some(compilers)) = (current.toolchains.get(pair), current.compilers.get(pair)) else {
            return Err(Error::Invalid(format!("device {} has no compiler pair {pair}", self.spec())));
        };
        let toolchain = slot.get_or_init(|| Arc::new(Toolchain::of_pair(compilers, current.loader.clone())));
        let mut kernel = self.cache.get_or_compile(sink, name, self.spec(), toolchain)?;
        if kernel.spec.bounds.pending() > 0 && self.bounds_policy() == BoundsPolicy::Guard {
            // The guarded form compiles through the same cache and toolchain, on first need.
            let (cache, toolchain, spec) = (self.cache.clone(), toolchain.clone(), self.spec().clone());
            let name = kernel.spec.name.clone();
            let compile = move |guarded: &Arc<UOp>| cache.get_or_compile(guarded, Some(&name), &spec, &toolchain);
            kernel.fallback = Some(Arc::new(Fallback::new(Box::new(compile), current.allocator.clone())));
        }
        Ok(kernel)
    }

    /// [`Device::compile`] for a batch: one result per `(sink, name)` of `kernels`, in their
    /// order, the compiles spread over up to `available_parallelism` threads (a search that
    /// compiles many candidate kernels, or a plan whose kernels are not cached yet, pays
    /// about one compile per core instead of one per kernel).
    ///
    /// The contract, kernel by kernel, is that of [`Device::compile`]: each goes through the
    /// kernel cache, so a cached kernel is not compiled again, and a kernel given twice (the
    /// same graph and name) is compiled once and both results share its program. One
    /// kernel's error is its own result and does not stop the others. Blocks until every
    /// kernel is done; the calling thread compiles too. Threads are started only for two or
    /// more distinct kernels and live only during the call.
    pub fn compile_many(&self, kernels: &[(Arc<UOp>, Option<&str>)]) -> Vec<Result<Kernel>> {
        // Index of each kernel's first occurrence: hash-consed graphs are equal iff the same node.
        let mut first: HashMap<(*const UOp, Option<&str>), usize> = HashMap::new();
        let firsts: Vec<usize> = kernels
            .iter()
            .enumerate()
            .map(|(i, (sink, name))| *first.entry((Arc::as_ptr(sink), *name)).or_insert(i))
            .collect();
        let distinct: Vec<usize> = firsts.iter().enumerate().filter(|&(i, &f)| i == f).map(|(i, _)| i).collect();
        let compile = |i: usize| self.compile(&kernels[i].0, kernels[i].1);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(distinct.len());
        let mut done: Vec<Option<Result<Kernel>>> = (0..kernels.len()).map(|_| None).collect();
        if threads <= 1 {
            for &i in &distinct {
                done[i] = Some(compile(i));
            }
        } else {
            let next = AtomicUsize::new(0);
            let work = || {
                let mut mine = Vec::new();
                while let Some(&i) = distinct.get(next.fetch_add(1, Ordering::Relaxed)) {
                    mine.push((i, compile(i)));
                }
                mine
            };
            let results = std::thread::scope(|s| {
                let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
                let mut all = work();
                for h in helpers {
                    // A compile does not panic; if one did, its kernels are reported below.
                    all.extend(h.join().unwrap_or_default());
                }
                all
            });
            for (i, r) in results {
                done[i] = Some(r);
            }
        }
        firsts
            .iter()
            .map(|&f| {
                done[f].clone().unwrap_or_else(|| {
                    Err(Error::Compile {
                        message: format!("compiling kernel {f} of the batch panicked; see the message above"),
                        log: String::new(),
                        line: None,
                    })
                })
            })
            .collect()
    }

    /// Tears down the backend state and builds a new generation: new allocator pools,
    /// queues and program loader; the generation is bumped. Every object of the old
    /// generation (buffers, kernels, queues, signals, plans bound to them) then fails with
    /// [`Error::DeviceLost`] instead of touching the new state; the old generation's signals
    /// are failed so no waiter hangs. Kernels are reloaded from the kernel cache on their
    /// next [`Device::compile`], without compiling. Works on a lost device and on a healthy
    /// one. When the backend cannot rebuild, the device stays lost with that error.
    ///
    /// # Errors
    /// The backend's error from building the new generation (the device is then lost), or
    /// [`Error::Invalid`] when it offers no renderer/compiler pair.
    pub fn reset(&self) -> Result<()> {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        self.context.advance();
        let next = (self.build)(&self.context).and_then(|parts| Generation::new(parts, self.context.stamp()));
        match next {
            Ok(g) => {
                // The old generation stays alive only through stale handles; drop its cache.
                current.allocator.trim();
                *current = Arc::new(g);
                Ok(())
            }
            Err(e) => {
                self.context.mark_lost(e.clone());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::doubles::MockAllocator;

    use crate::cache::CacheConfig;
    use crate::doubles::{MockCompiler, MockRenderer, kernel, rig, runtime};

    /// A mock device of `spec` for tests of the registry: its allocators are not kept.
    pub(crate) fn registry_mock(spec: DeviceSpec) -> Device {
        mock_device_of(spec, &rig(MockCompiler::new("fp")), &Arc::new(Mutex::new(Vec::new())))
    }

    /// A mock `CPU` device whose every generation gets a fresh allocator (kept in `allocators`).
    fn mock_device(r: &crate::doubles::Rig, allocators: &Arc<Mutex<Vec<Arc<MockAllocator>>>>) -> Device {
        mock_device_of(DeviceSpec::new("CPU", 0), r, allocators)
    }

    /// [`mock_device`] of `spec`.
    fn mock_device_of(
        spec: DeviceSpec,
        r: &crate::doubles::Rig,
        allocators: &Arc<Mutex<Vec<Arc<MockAllocator>>>>,
    ) -> Device {
        let pair = CompilerPair::new("mock", Arc::new(MockRenderer), r.compiler.clone());
        let (loaded, allocators) = (r.loaded.clone(), allocators.clone());
        Device::new(spec, "mock".into(), move |_| {
            let a = MockAllocator::new(1 << 20);
            allocators.lock().unwrap().push(a.clone());
            Ok(DeviceParts::new(a, vec![pair.clone()], runtime(loaded.clone())))
        })
        .unwrap()
        .with_cache(Arc::new(KernelCache::new(CacheConfig::memory_only())))
    }

    /// A mock `CPU` device of the pairs `names` (each the rig's renderer and compiler).
    fn mock_device_with_pairs(r: &crate::doubles::Rig, names: &[&str]) -> Result<Device> {
        let pairs: Vec<CompilerPair> =
            names.iter().map(|n| CompilerPair::new(*n, Arc::new(MockRenderer), r.compiler.clone())).collect();
        let loaded = r.loaded.clone();
        let missing = vec![("absent".to_string(), "its library is not installed".to_string())];
        Device::new(DeviceSpec::new("CPU", 0), "mock".into(), move |_| {
            Ok(DeviceParts::new(MockAllocator::new(1 << 20), pairs.clone(), runtime(loaded.clone()))
                .with_missing(missing.clone()))
        })
        .map(|d| d.with_cache(Arc::new(KernelCache::new(CacheConfig::memory_only()))))
    }

    #[test]
    fn a_kernels_program_is_reached_as_its_own_type_only() {
        use crate::program::Program;
        struct Other;
        impl Program for Other {
            // Never called: the type only has to differ from the mock's program.
            unsafe fn execute(&self, _: &[crate::RawView], _: &[i64], _: &crate::LaunchDims) -> Result<()> {
                Ok(())
            }
            fn name(&self) -> &str {
                "other"
            }
        }
        let r = rig(MockCompiler::new("fp"));
        let dev = mock_device_with_pairs(&r, &["mock"]).unwrap();
        let k = dev.compile(&kernel(1.0), Some("k")).unwrap();
        assert_eq!(k.program_as::<crate::doubles::MockProgram>("the mock backend").unwrap().name(), "k");
        let err = k.program_as::<Other>("the other backend").err().unwrap();
        assert!(
            matches!(&err, Error::Launch(m) if m.contains("`k`") && m.contains("not by the other backend")),
            "{err}"
        );
    }

    #[test]
    fn compiler_pairs_are_picked_by_name_cached_apart_and_named_once() {
        let r = rig(MockCompiler::new("fp"));
        let dev = mock_device_with_pairs(&r, &["first", "second"]).unwrap();
        assert_eq!(dev.compiler_names(), ["first", "second"]);
        let sink = kernel(2.0);
        dev.compile(&sink, Some("k")).unwrap();
        dev.compile_with("first", &sink, Some("k")).unwrap();
        assert_eq!(r.compiles(), 1, "the default pair is `first`: one cache entry");
        dev.compile_with("second", &sink, Some("k")).unwrap();
        assert_eq!(r.compiles(), 2, "another pair's kernel is cached apart");
        let err = dev.compile_with("third", &sink, Some("k")).unwrap_err();
        assert!(matches!(&err, Error::Unavailable(m) if m.contains("`third`") && m.contains("first, second")), "{err}");

        let err = dev.compile_with("absent", &sink, Some("k")).unwrap_err();
        assert!(
            matches!(&err, Error::Unavailable(m) if m.contains("`absent`") && m.contains("not installed")),
            "{err}"
        );

        let second = dev.with_default_compiler("second").unwrap();
        assert_eq!(second.compiler_names(), ["second", "first"]);
        assert_eq!(second.missing_compilers(), dev.missing_compilers(), "a pair that is missing stays listed");
        assert!(matches!(dev.with_default_compiler("third"), Err(Error::Unavailable(_))));

        for names in [&["same", "same"][..], &[""][..]] {
            let err = mock_device_with_pairs(&r, names).unwrap_err();
            assert!(matches!(&err, Error::Invalid(m) if m.contains("a name of its own")), "{names:?}: {err}");
        }
    }

    #[test]
    fn reset_fails_stale_handles_and_reloads_kernels_without_compiling() {
        let r = rig(MockCompiler::new("fp"));
        let allocators = Arc::new(Mutex::new(Vec::new()));
        let dev = mock_device(&r, &allocators);
        let sink = kernel(3.0);
        let k = dev.compile(&sink, Some("k")).unwrap();
        let b = dev.buffer(Scalar::F32, 16).unwrap();
        b.copy_from_slice(&[1.0f32; 16]).unwrap();
        assert_eq!((r.compiles(), dev.generation()), (1, 0));

        dev.reset().unwrap();
        assert_eq!(dev.generation(), 1);
        let lost = |e: Error| matches!(e, Error::DeviceLost { minted: 0, current: 1, .. });
        assert!(lost(b.raw().unwrap_err()), "a stale buffer's view");
        assert!(lost(b.to_vec::<f32>().unwrap_err()), "a stale buffer's host read");
        assert!(lost(k.check(&[&b, &b], &[]).unwrap_err()), "a stale kernel");

        // The kernel comes back from the cache: loaded again, not compiled again.
        let k2 = dev.compile(&sink, Some("k")).unwrap();
        assert_eq!(r.compiles(), 1, "the compiler was called after the reset");
        assert_eq!(r.loaded.lock().unwrap().len(), 2);
        k2.check_current().unwrap();
        let fresh = dev.buffer(Scalar::F32, 16).unwrap();
        fresh.raw().unwrap();

        // A stale buffer's memory goes back to its own generation's allocator, never the new one.
        drop(b);
        let allocators = allocators.lock().unwrap();
        assert_eq!(
            (
                allocators[0].frees.load(std::sync::atomic::Ordering::SeqCst),
                allocators[0].live.load(std::sync::atomic::Ordering::SeqCst)
            ),
            (1, 0)
        );
        assert_eq!(allocators[1].frees.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    /// A compile that a reset overtakes returns a kernel of the current generation, loaded
    /// again from the cache, not a stale one.
    #[test]
    fn a_compile_overtaken_by_a_reset_returns_a_current_kernel() {
        let mut compiler = MockCompiler::new("fp");
        compiler.delay = std::time::Duration::from_millis(200);
        let r = rig(compiler);
        let dev = Arc::new(mock_device(&r, &Arc::new(Mutex::new(Vec::new()))));
        let sink = kernel(5.0);
        let early = {
            let (dev, sink) = (dev.clone(), sink.clone());
            std::thread::spawn(move || dev.compile(&sink, Some("k")))
        };
        // The compile is under way (200 ms) when the device is reset.
        std::thread::sleep(std::time::Duration::from_millis(50));
        dev.reset().unwrap();
        let early = early.join().unwrap().unwrap();
        early.check_current().unwrap();
        assert_eq!(dev.generation(), 1);
        dev.compile(&sink, Some("k")).unwrap().check_current().unwrap();
    }

    #[test]
    fn compile_many_answers_in_order_compiles_each_kernel_once_and_keeps_errors_per_kernel() {
        let mut compiler = MockCompiler::new("fp");
        // Slow compiles keep the batch's threads busy at once.
        compiler.delay = std::time::Duration::from_millis(30);
        let r = rig(compiler);
        let dev = mock_device(&r, &Arc::new(Mutex::new(Vec::new())));
        let (a, b, c) = (kernel(1.0), kernel(2.0), kernel(3.0));
        // Launch index axis 7 does not exist: this kernel fails to render.
        let mut k = kiln_ir::KernelBuilder::new();
        let p = k.param(0, Scalar::F32, 16);
        let i = k.special("gidx7", 16);
        k.store(&p.at(&i), &(p.at(&i).load() * 2.0));
        let bad = k.finish().unwrap();
        dev.compile(&c, Some("c")).unwrap();
        assert_eq!(r.compiles(), 1);
        let batch = [
            (a.clone(), Some("a")),
            (b.clone(), Some("b")),
            (a.clone(), Some("a")),
            (bad.clone(), Some("bad")),
            (c.clone(), Some("c")),
            (b.clone(), Some("b2")),
        ];
        let got = dev.compile_many(&batch);
        assert_eq!(got.len(), batch.len());
        for ((sink, name), result) in batch.iter().zip(&got) {
            if Arc::ptr_eq(sink, &bad) {
                assert!(matches!(result, Err(Error::Render(m)) if m.contains("gidx7")), "{result:?}");
                continue;
            }
            let k = result.as_ref().unwrap();
            assert_eq!(k.spec.name, name.unwrap());
            assert_eq!(k.spec.src, format!("// kernel {}", sink.content_hash().to_hex()));
        }
        let program = |i: usize| got[i].as_ref().unwrap().program().clone();
        assert!(Arc::ptr_eq(&program(0), &program(2)), "a duplicate shares the first one's program");
        // a, b and b2 compiled; the duplicate of a and the cached c were not.
        assert_eq!(r.compiles(), 4);
        let again = dev.compile_many(&batch);
        assert_eq!(r.compiles(), 4, "a batch of cached kernels compiles nothing");
        assert!(again[3].is_err() && again.iter().filter(|r| r.is_ok()).count() == 5);
        assert!(dev.compile_many(&[]).is_empty());
    }

    #[test]
    fn a_lost_device_refuses_work_until_reset() {
        let r = rig(MockCompiler::new("fp"));
        let dev = mock_device(&r, &Arc::new(Mutex::new(Vec::new())));
        let b = dev.buffer(Scalar::F32, 16).unwrap();
        dev.context().mark_lost(Error::Driver { backend: "mock", code: Some(-5), fatal: true, message: "gone".into() });
        assert!(dev.is_lost());
        let failed = |e: Error| matches!(&e, Error::DeviceFailed { cause, .. } if matches!(**cause, Error::Driver { code: Some(-5), .. }));
        assert!(failed(b.raw().unwrap_err()));
        assert!(failed(dev.compile(&kernel(1.0), None).unwrap_err()));
        assert!(failed(dev.buffer(Scalar::F32, 4).unwrap().raw().unwrap_err()));
        dev.reset().unwrap();
        assert!(!dev.is_lost());
        dev.compile(&kernel(1.0), None).unwrap();
        dev.buffer(Scalar::F32, 4).unwrap().raw().unwrap();
    }
}
