//! kiln-cpu: the CPU backend. Kernels are rendered to LLVM IR and compiled in process by
//! libLLVM 16, or rendered to C and compiled by the system C compiler, into a relocatable
//! object loaded by kiln's own loader (x86-64; a C compiler's shared library is loaded with
//! `dlopen` elsewhere), and run on a persistent pool of threads.
//!
//! It is one of kiln's backends (see `docs/architecture.md`): it implements the contracts of
//! [`kiln_device`] and builds the [`DeviceParts`] of its one device, [`CPU`] (all the host's
//! cores). Open it with [`open`], or [`register`] it and open it by name with
//! [`kiln_device::open_device`]. Its compiler pairs are LLVM in process ([`LLVM_PAIR`], the
//! default where libLLVM 16 is installed; loaded by its first compile), the C compiler for the host's widest instruction set
//! ([`CC_PAIR`]) and for older ones ([`ISA_PAIRS`]). The main types are [`CpuRenderer`],
//! [`CCompiler`] (which C compiler, why, and its flags), [`CpuProgram`], [`CpuAllocator`],
//! [`CpuQueueFactory`] and [`Pool`].
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_device::{Buffer, kiln_ir::{KernelBuilder, Scalar}};
//! let device = kiln_cpu::open(&kiln_cpu::CPU)?;
//! println!("{}", device.description()); // the CPU, its threads, the default pair, the C compiler, the ISA
//! // y[i] = x[i]·x[i] over n elements
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1 << 20);
//! let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! let v = x.at(&i).load();
//! k.store(&y.at(&i), &(&v * &v));
//! let square = device.compile(&k.finish()?, Some("square"))?; // LLVM IR (or C) → object → loaded
//! let a = Buffer::from_slice(device.allocator(), &[1.0f32, 2.0, 3.0, 4.0])?;
//! let b = device.buffer(Scalar::F32, 4)?;
//! square.launch(&[&a, &b], &[4])?;
//! assert_eq!(b.to_vec::<f32>()?, [1.0, 4.0, 9.0, 16.0]);
//! # Ok(())
//! # }
//! ```
//!
//! The rooms, read top to bottom:
//! - [`renderer`]: the C dialect of the shared C-family core and the kernel entry ABI.
//! - [`compiler`]: finding the C compiler, its flags, compiling to object or `.so` bytes.
//! - [`elf`]: loading an x86-64 relocatable object: layout, relocation, W^X protection.
//! - [`llvm`]: kernels rendered to LLVM IR, the second compiler pair's language.
//! - [`isa`]: the instruction set kernels are compiled for (`KILN_CPU_ISA`) and the caches.
//! - [`program`]: loading the bytes and running a launch over the core pool.
//! - [`pool`]: the persistent thread pool that runs the chunks of one launch.
//! - [`queue`]: hardware queues, each with one worker thread running its batches in order.
//! - [`signal`]: the host timeline signal the queues wait on and signal.
//! - [`allocator`]: 64-byte aligned host memory.
//! - [`guard`]: host memory whose buffers end at an inaccessible page, for tests and fuzzing.

pub mod allocator;
pub mod compiler;
pub mod elf;
pub mod guard;
pub mod isa;
pub mod llvm;
pub mod pool;
pub mod program;
pub mod queue;
pub mod renderer;
pub mod signal;
mod vmath;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{
    Allocator, Backend, CompilerPair, Device, DeviceParts, Error, LruAllocator, Program, Result, RuntimeFactory,
    register_backend,
};

pub use allocator::CpuAllocator;
pub use compiler::{CC_ENV, CCompiler, COMPILE_TIMEOUT_ENV, DEFAULT_COMPILE_TIMEOUT};
pub use guard::GuardPageAllocator;
pub use isa::{CPU_ISA_ENV, CacheSizes, Isa, IsaTarget, MatrixUnits};
pub use pool::Pool;
pub use program::CpuProgram;
pub use queue::{CpuQueue, CpuQueueFactory};
pub use renderer::{CpuDialect, CpuRenderer, cpu_renderer, cpu_renderer_for};

/// The backend's name in device specs, in `KILN_REQUIRE` (lower case) and in the registry.
pub const BACKEND: &str = "CPU";

/// The CPU backend's one device (all the host's cores), printed `CPU`.
pub static CPU: DeviceSpec = DeviceSpec::new(BACKEND, 0);

/// The name of the CPU device's C pair: the C compiler ([`CCompiler`]) for the instruction set
/// `KILN_CPU_ISA` picks (the host's widest by default). The default pair where LLVM is missing,
/// where `KILN_CC` names the C compiler, and for [`open_with_compiler`].
pub const CC_PAIR: &str = "cc";

/// The name of the CPU device's LLVM pair: kernels rendered to LLVM IR and compiled in process
/// by libLLVM 16 ([`llvm`]), for the same instruction set as [`CC_PAIR`]. Offered where libLLVM
/// 16 can be opened, and then the default pair; elsewhere `kiln devices` says why it is missing
/// ([`Device::missing_compilers`]).
pub const LLVM_PAIR: &str = "llvm";

/// The environment variable that picks the CPU device's default pair: any pair name the device
/// takes for `--compiler` or `compiler=` (`llvm`, `cc`, `cc-avx2`, `cc-sse2`). Unset, the default
/// is `llvm` where libLLVM 16 is installed and `KILN_CC` is unset, else `cc`. A name this machine
/// cannot offer (no libLLVM 16, a CPU without AVX2) is a configuration error saying why.
pub const CPU_COMPILER_ENV: &str = "KILN_CPU_COMPILER";

/// The pair [`CPU_COMPILER_ENV`] asks for, if it names one: any of the device's pair names
/// ([`CC_PAIR`], [`LLVM_PAIR`], the [`ISA_PAIRS`]), as `--compiler` and `compiler=` take them.
///
/// # Errors
/// [`Error::Config`] for a value that names no CPU pair, listing those that exist.
fn asked_pair() -> Result<Option<String>> {
    match std::env::var(CPU_COMPILER_ENV).ok().as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(name) if pair_names().any(|p| p == name) => Ok(Some(name.to_string())),
        Some(other) => Err(Error::Config(format!(
            "{CPU_COMPILER_ENV}=`{other}`: use one of the CPU's compiler pairs: {} (`{CC_PAIR}`: the system C compiler; \
             `{LLVM_PAIR}`: LLVM in process; the others: the C compiler for an older instruction set)",
            pair_names().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Every compiler pair name a CPU device may have, whether or not this machine offers it.
fn pair_names() -> impl Iterator<Item = &'static str> {
    [LLVM_PAIR, CC_PAIR].into_iter().chain(ISA_PAIRS.iter().map(|&(name, _)| name))
}

/// The CPU device's other compiler pairs: the same C compiler building for an older
/// instruction set than the host's widest ([`IsaTarget::force`]), so that the conformance
/// suite and `kiln run --compiler cc-avx2` check the code paths an older machine takes. Each
/// pair carries that set's [`kiln_device::DeviceProperties`] (its vector width); a set this
/// CPU cannot run (or of another architecture) is not offered.
pub const ISA_PAIRS: &[(&str, Isa)] = &[("cc-avx2", Isa::Avx2), ("cc-sse2", Isa::Sse2)];

/// Opens the CPU device `spec`: `CPU` (the same as `CPU:0`), or a further virtual device
/// `CPU:1` .. `CPU:63` over the same cores and memory, with its own thread pool (its share of
/// the cores, see [`DEVICES_ENV`]), queues and buffers, as tinygrad's `CPU:0..3` for running
/// multi-device programs on one machine. Each is over a cached ([`LruAllocator`], budget
/// from `KILN_MEMORY_BUDGET`) [`CpuAllocator`], with its C pairs and its LLVM pair. Without a
/// C compiler on `PATH` it compiles with LLVM alone. Fails with [`Error::Unavailable`] for
/// another backend's spec or an ordinal of 64 or more, with [`Error::CompilerMissing`] when
/// it has neither compiler (or `KILN_CC` names no usable compiler), and with [`Error::Config`]
/// when `KILN_CPU_ISA` is malformed or names an instruction set this CPU lacks, when
/// `KILN_CPU_COMPILER` names no pair or one this machine cannot offer, or when
/// `KILN_CPU_DEVICES` is malformed. Starts no process: the description names the compiler by
/// path and says why it was chosen ([`CCompiler::choice`]; its version is
/// [`CCompiler::version`], which runs it). The device's
/// [`Device::properties`] give the instruction set, its vector width, the cache sizes and
/// its threads.
pub fn open(spec: &DeviceSpec) -> Result<Arc<Device>> {
    if spec.base_type() != BACKEND || spec.ordinal() >= MAX_DEVICES {
        return Err(Error::Unavailable(format!(
            "the CPU backend has the devices CPU (CPU:0) to CPU:{}, not {spec}",
            MAX_DEVICES - 1
        )));
    }
    let device = spec.clone();
    open_with(spec.clone(), detect_c_compiler()?, c_named(), move || {
        Ok(Arc::new(LruAllocator::from_env(Arc::new(CpuAllocator::for_device(device.clone())))?))
    })
}

/// Opens a CPU device (as [`open`]) whose kernels are compiled for `isa` whatever
/// `KILN_CPU_ISA` says, e.g. `IsaTarget::force(Isa::Avx2)?` to build and check the AVX2 code
/// path on a CPU with AVX-512 in a process that also uses the native device. Its kernel
/// cache keys differ from the native device's (the compiler flags are in the fingerprint).
pub fn open_with_isa(isa: IsaTarget) -> Result<Arc<Device>> {
    open_with(CPU.clone(), Ok(CCompiler::detect()?.with_isa(isa)), c_named(), || {
        Ok(Arc::new(LruAllocator::from_env(Arc::new(CpuAllocator::new()))?))
    })
}

/// Opens a CPU device (as [`open`]) whose kernels are compiled by `compiler` whatever
/// `KILN_CC` and `PATH` say, e.g. `CCompiler::with_path("gcc")?` to check kernels with each
/// compiler installed in one process. Its kernel cache keys differ from those of devices with
/// another compiler (the compiler's identity is in the fingerprint).
pub fn open_with_compiler(compiler: CCompiler) -> Result<Arc<Device>> {
    open_with(CPU.clone(), Ok(compiler), true, || Ok(Arc::new(LruAllocator::from_env(Arc::new(CpuAllocator::new()))?)))
}

/// Opens the CPU device with buffers from `allocator`, which must be a host allocator
/// ([`Allocator::is_host`]) of the `CPU` device: e.g. a [`GuardPageAllocator`] (used
/// directly, without an `LruAllocator`) so that tests and fuzzers run kernels on buffers
/// that fault at the first byte past their end. The same allocator serves every device
/// generation: host memory stays valid across [`Device::reset`].
pub fn open_with_allocator(allocator: Arc<dyn Allocator>) -> Result<Arc<Device>> {
    if *allocator.device() != crate::CPU || !allocator.is_host() {
        return Err(Error::Invalid(format!(
            "the CPU device needs a host allocator of CPU, not one of {} (host: {})",
            allocator.device(),
            allocator.is_host()
        )));
    }
    open_with(CPU.clone(), detect_c_compiler()?, c_named(), move || Ok(allocator.clone()))
}

/// The C compiler [`CCompiler::detect`] finds, or, when none is found on `PATH` and
/// `KILN_CC` does not name one, why not (the device then compiles with LLVM alone). A
/// `KILN_CC` that names no usable compiler, and a bad `KILN_CPU_ISA` or timeout, stay errors.
fn detect_c_compiler() -> Result<std::result::Result<CCompiler, Error>> {
    match CCompiler::detect() {
        Ok(cc) => Ok(Ok(cc)),
        Err(e @ Error::CompilerMissing(_)) if std::env::var_os(CC_ENV).is_none_or(|v| v.is_empty()) => Ok(Err(e)),
        Err(e) => Err(e),
    }
}

/// Whether `KILN_CC` names the C compiler: the caller chose it, so the C pair is the default
/// unless [`CPU_COMPILER_ENV`] says otherwise.
fn c_named() -> bool {
    std::env::var_os(CC_ENV).is_some_and(|v| !v.is_empty())
}

/// Why a pair is missing, as `kiln devices` prints it: the message without its error kind.
fn reason(e: &Error) -> String {
    match e {
        Error::CompilerMissing(m) | Error::Unavailable(m) => m.clone(),
        other => other.to_string(),
    }
}

/// The CPU device `spec` compiling with `compiler` (the C pairs; none when it is an error, as
/// [`detect_c_compiler`] allows) and LLVM where libLLVM 16 is found (not loaded: see
/// [`llvm::available`]), whose every generation
/// allocates through `make_allocator()`. Its default pair is the one [`CPU_COMPILER_ENV`]
/// names, else the C pair when `c_first` (the caller chose the C compiler) or LLVM is
/// missing, else LLVM.
fn open_with(
    spec: DeviceSpec,
    compiler: std::result::Result<CCompiler, Error>,
    c_first: bool,
    make_allocator: impl Fn() -> Result<Arc<dyn Allocator>> + Send + Sync + 'static,
) -> Result<Arc<Device>> {
    let caches = CacheSizes::host();
    let pool = device_pool(spec.ordinal())?;
    let threads = pool.threads();
    let target = match &compiler {
        Ok(cc) => cc.isa(),
        Err(_) => IsaTarget::from_env()?,
    };
    let c_pair = |name: &str, compiler: Arc<CCompiler>| {
        let target = compiler.isa();
        let renderer = Arc::new(cpu_renderer_for(target.isa.vector_bytes().unwrap_or(16)));
        CompilerPair::new(name, renderer, compiler).with_properties(isa::properties(target, caches, threads))
    };
    let (mut pairs, mut missing) = (Vec::new(), Vec::new());
    let compiler_text = match &compiler {
        Ok(cc) => {
            pairs.push(c_pair(CC_PAIR, Arc::new(cc.clone())));
            format!("C compiler {} ({})", cc.path().display(), cc.choice())
        }
        Err(e) => {
            missing.push((CC_PAIR.to_string(), reason(e)));
            "no C compiler".to_string()
        }
    };
    match llvm::LlvmCompiler::new(target) {
        Ok(llvm) => pairs.push(
            CompilerPair::new(LLVM_PAIR, Arc::new(llvm::LlvmRenderer::for_isa(target.isa)), Arc::new(llvm))
                .with_properties(isa::properties(target, caches, threads)),
        ),
        Err(e) => missing.push((LLVM_PAIR.to_string(), reason(&e))),
    }
    let why = |pair: &str| missing.iter().find(|(p, _)| p == pair).map(|(_, why)| why.clone()).unwrap_or_default();
    if pairs.is_empty() {
        return Err(Error::CompilerMissing(format!(
            "the CPU device has neither a C compiler ({}) nor LLVM ({})",
            why(CC_PAIR),
            why(LLVM_PAIR)
        )));
    }
    // The older instruction sets' C pairs; why one is not offered goes into a refusal of
    // `KILN_CPU_COMPILER` naming it, not into `missing` (a set this CPU lacks is no fault).
    let mut unoffered = Vec::new();
    for &(name, set) in ISA_PAIRS {
        match (&compiler, IsaTarget::force(set)) {
            (Ok(cc), Ok(older)) => pairs.push(c_pair(name, Arc::new(cc.clone().with_isa(older)))),
            (Err(_), _) => unoffered.push((name, format!("it is the C compiler's, and {}", why(CC_PAIR)))),
            (_, Err(e)) => unoffered.push((name, reason(&e))),
        }
    }
    let has = |pair: &str| pairs.iter().any(|p| p.name == pair);
    let default = match asked_pair()? {
        Some(pair) if !has(&pair) => {
            let why = unoffered.iter().find(|(p, _)| *p == pair).map_or_else(|| why(&pair), |(_, w)| w.clone());
            return Err(Error::Config(format!(
                "{CPU_COMPILER_ENV}={pair}, but the CPU device has no `{pair}` pair: {why}"
            )));
        }
        Some(pair) => pair,
        None if c_first && has(CC_PAIR) => CC_PAIR.to_string(),
        None if has(LLVM_PAIR) => LLVM_PAIR.to_string(),
        None => CC_PAIR.to_string(),
    };
    let first = pairs.iter().position(|p| p.name == default).unwrap_or(0);
    let default_pair = pairs.remove(first);
    // The device describes itself (its instruction set, vector width) as its default pair
    // compiles: an older set's C pair compiles for that set.
    let default_target = ISA_PAIRS
        .iter()
        .find(|(name, _)| *name == default)
        .and_then(|&(_, set)| IsaTarget::force(set).ok())
        .unwrap_or(target);
    pairs.insert(0, default_pair);
    let description = format!(
        "{} ({} threads), default pair {default}, {compiler_text}, {}",
        cpu_model(),
        threads,
        isa::describe(default_target, caches)
    );
    // The renderers and compilers hold no device state and survive a reset; memory, queues
    // and loaded programs are built anew for every generation.
    let device = Device::new(spec.clone(), description, move |_| {
        let runtime: RuntimeFactory =
            Arc::new(move |compiled| Ok(Arc::new(CpuProgram::load_on(compiled, pool)?) as Arc<dyn Program>));
        Ok(DeviceParts::new(make_allocator()?, pairs.clone(), runtime)
            .with_queues(Arc::new(CpuQueueFactory::for_device(spec.clone())))
            .with_missing(missing.clone()))
    })?
    .with_properties(isa::properties(default_target, caches, threads));
    Ok(Arc::new(device))
}

/// Environment variable: how many CPU devices split the cores. With `KILN_CPU_DEVICES=4`,
/// each of `CPU:0` .. `CPU:3` runs its launches on a quarter of the threads (of
/// `KILN_CPU_THREADS`, else one per core), so four devices busy at once share the machine
/// instead of oversubscribing it. Unset (or 1), every CPU device runs on all the threads.
pub const DEVICES_ENV: &str = "KILN_CPU_DEVICES";

/// The CPU devices one process can open: `CPU:0` .. `CPU:63`.
pub const MAX_DEVICES: u32 = 64;

/// The thread pool of device `CPU:ordinal`: its share of the threads (see [`DEVICES_ENV`]),
/// made once per ordinal and kept for the life of the process (at most [`MAX_DEVICES`]
/// pools, whose workers start when a launch first needs them). `CPU` itself runs on
/// [`Pool::global`] unless the threads are split.
///
/// # Errors
/// [`Error::Config`] for a [`DEVICES_ENV`] that is not a count from 1 to [`MAX_DEVICES`].
fn device_pool(ordinal: u32) -> Result<&'static Pool> {
    let devices = match std::env::var(DEVICES_ENV).ok().as_deref().map(str::trim) {
        None | Some("") => 1,
        Some(v) => v.parse::<u32>().ok().filter(|n| (1..=MAX_DEVICES).contains(n)).ok_or_else(|| {
            Error::Config(format!("{DEVICES_ENV}=`{v}`: give how many CPU devices split the cores, 1 to {MAX_DEVICES}"))
        })?,
    };
    if devices == 1 && ordinal == 0 {
        return Ok(Pool::global());
    }
    static POOLS: OnceLock<Mutex<HashMap<u32, &'static Pool>>> = OnceLock::new();
    let threads = (Pool::global().threads() / devices as usize).max(1);
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    Ok(*pools.entry(ordinal).or_insert_with(|| Box::leak(Box::new(Pool::new(threads)))))
}

/// Registers the `CPU` backend ([`open`]) with the device registry
/// ([`kiln_device::open_device`]). Idempotent.
pub fn register() {
    register_backend(Backend { name: BACKEND, probe: None, open });
}

/// Why a backend whose devices are the CPU's cannot run `error_foreign_buffer`.
pub const SAME_DEVICE_PEER: (&str, &str) =
    ("error_foreign_buffer", "its peer is the CPU backend, whose buffers its kernels accept as their own");

/// The CPU backend's driver, for kiln-backends' list: the CPU with its default pair and with
/// each of its pairs, [`CC_PAIR`], [`ISA_PAIRS`] and [`LLVM_PAIR`] (whose peer is the CPU itself), no offline
/// target, no baseline of its own (the host's are the bench's).
pub const DRIVER: kiln_device::Driver = kiln_device::Driver {
    register,
    conformance: &[
        kiln_device::Conformance { name: "cpu", peer: "opencl", unsupported: &[], pair: None },
        kiln_device::Conformance {
            name: "cpu-cc",
            peer: "cpu",
            unsupported: &[SAME_DEVICE_PEER],
            pair: Some((BACKEND, CC_PAIR)),
        },
        kiln_device::Conformance {
            name: "cpu-avx2",
            peer: "cpu",
            unsupported: &[SAME_DEVICE_PEER],
            pair: Some((BACKEND, "cc-avx2")),
        },
        kiln_device::Conformance {
            name: "cpu-sse2",
            peer: "cpu",
            unsupported: &[SAME_DEVICE_PEER],
            pair: Some((BACKEND, "cc-sse2")),
        },
        kiln_device::Conformance {
            name: "cpu-llvm",
            peer: "cpu",
            unsupported: &[SAME_DEVICE_PEER],
            pair: Some((BACKEND, LLVM_PAIR)),
        },
    ],
    targets: &[],
    baseline: kiln_device::no_baseline,
};

/// The CPU model name from `/proc/cpuinfo` (or the architecture when unavailable).
pub fn cpu_model() -> String {
    cpuinfo()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// `/proc/cpuinfo` (empty when it cannot be read), read once per process: the kernel formats
/// every CPU's entry on each read (about 50 µs on 2 cores, more on big machines), and opening
/// the device needs it twice, for its description and for the compiler's fingerprint.
pub(crate) fn cpuinfo() -> &'static str {
    static INFO: OnceLock<String> = OnceLock::new();
    INFO.get_or_init(|| std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use kiln_device::kiln_ir::{DeviceSpec, Scalar};

    /// `CPU:1` and `CPU:2` are devices of their own (buffers, queues, kernels) over the same
    /// memory: a kernel runs on each, and a buffer of one copies into the other.
    #[test]
    fn virtual_cpu_devices_run_kernels_and_copy_between_them() {
        let one = super::open(&DeviceSpec::new("CPU", 1)).unwrap();
        let two = super::open(&DeviceSpec::new("CPU", 2)).unwrap();
        assert_eq!(one.spec().to_string(), "CPU:1");
        assert!(one.properties().threads.is_some_and(|t| t >= 1));
        let a = one.buffer(Scalar::F32, 8).unwrap();
        a.copy_from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).unwrap();
        assert_eq!(a.device().to_string(), "CPU:1");
        let kernel = one.compile(&crate::testing::double_in_place(), None).unwrap();
        kernel.launch(&[&a], &[]).unwrap();
        let b = two.buffer(Scalar::F32, 8).unwrap();
        b.copy_from(&a).unwrap();
        two.compile(&crate::testing::double_in_place(), None).unwrap().launch(&[&b], &[]).unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), [4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0]);
        assert_eq!(a.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0]);
    }

    #[test]
    fn cpu_ordinals_end_at_63_and_other_backends_are_refused() {
        for bad in ["CPU:64", "OPENCL"] {
            let spec: DeviceSpec = bad.parse().unwrap();
            let e = super::open(&spec).unwrap_err();
            assert!(matches!(e, kiln_device::Error::Unavailable(_)), "{bad}: {e}");
            assert!(e.to_string().contains("CPU:63"), "{e}");
        }
    }

    #[test]
    fn cpuinfo_is_read_once_and_gives_the_model() {
        assert!(std::ptr::eq(super::cpuinfo(), super::cpuinfo()), "one read per process");
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let model = info.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':'));
            if let Some((_, model)) = model {
                assert_eq!(super::cpu_model(), model.trim());
            }
        }
    }
}
