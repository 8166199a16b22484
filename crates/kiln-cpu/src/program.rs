//! Loading a compiled kernel (an object on x86-64, see [`crate::elf`]; a shared library
//! elsewhere) and running it over the core pool.

use std::ffi::{CStr, c_void};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use libloading::Library;

use kiln_device::kiln_ir::{Op, UOp};
use kiln_device::{CompiledSpec, Error, LaunchDims, Program, ProgramSpec, RawView, Result};

use crate::elf::Image;
use crate::pool::Pool;

/// The entry ABI of every CPU kernel (see [`crate::renderer`]).
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut c_void, vals: *const i64, core: i64, ncores: i64);

/// Below this many estimated loop iterations a launch runs inline on the caller: waking a
/// worker costs more than it saves.
const PARALLEL_MIN_WORK: u64 = 1 << 15;

/// Buffers passed without a heap allocation (more go through a `Vec`).
const INLINE_BUFS: usize = 16;

/// The size from which a write-only buffer is streamed: the level-2 caches of the threads that
/// run a launch (8 MiB where the machine does not say). Computed once.
pub fn stream_threshold() -> usize {
    static THRESHOLD: OnceLock<usize> = OnceLock::new();
    *THRESHOLD.get_or_init(|| {
        crate::isa::CacheSizes::host().l2.map_or(8 << 20, |l2| l2.saturating_mul(Pool::global().threads()))
    })
}

/// The streaming mask of a launch of `spec` over `bufs`, passed to every kernel in `vals` after
/// its variables: bit `slot` is set for a buffer the kernel writes and never reads
/// ([`ProgramSpec::outs`] but not `ins`) whose view is at least [`stream_threshold`] bytes. The
/// LLVM pair stores such a buffer non-temporally (where aligned): it cannot stay in the cores'
/// own caches anyway, and a store that bypasses them saves reading each line before it is
/// written. The C pair ignores it.
pub(crate) fn stream_mask(spec: &ProgramSpec, bufs: &[RawView]) -> i64 {
    let threshold = stream_threshold();
    spec.params
        .iter()
        .zip(bufs)
        .filter(|(p, b)| {
            p.slot < 64 && b.bytes >= threshold && spec.outs.contains(&p.slot) && !spec.ins.contains(&p.slot)
        })
        .fold(0u64, |mask, (p, _)| mask | 1 << p.slot) as i64
}

/// A loaded CPU kernel. `Send + Sync` and reentrant: the C entry keeps no state, and each
/// call works on the iterations its chunk index selects.
pub struct CpuProgram {
    entry: KernelFn,
    spec: Arc<ProgramSpec>,
    /// Extents of the kernel's loops (RANGEs) that are not constants, and the product of
    /// those that are: together an upper estimate of the work per launch index.
    loop_exprs: Vec<Arc<UOp>>,
    loop_const: u64,
    /// The threads its launches run on (its device's, see `crate::device_pool`).
    pool: &'static Pool,
    // Keeps the code `entry` points into mapped.
    _code: Code,
}

/// What keeps a kernel's code mapped.
enum Code {
    /// An object loaded by [`crate::elf`] (x86-64).
    Object { _image: Image },
    /// A shared library, and the in-memory file it was loaded from if it was (closed after
    /// the library: fields drop in declaration order).
    Library { _lib: Library, _memfd: Option<MemfdImage> },
}

impl std::fmt::Debug for CpuProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuProgram({})", self.spec.name)
    }
}

impl CpuProgram {
    /// Loads `compiled.bytes` and looks up the entry `compiled.spec.name`. On x86-64 the bytes
    /// are a relocatable object, loaded by [`crate::elf`]; elsewhere a shared library, loaded
    /// from memory or from a private folder (see `open_library`). Bytes of the other kind, or
    /// corrupt ones, are an [`Error::Load`].
    pub fn load(compiled: &CompiledSpec) -> Result<CpuProgram> {
        Self::load_on(compiled, Pool::global())
    }

    /// [`CpuProgram::load`] for a device whose launches run on `pool` (each CPU device has
    /// its own, see [`crate::open`]).
    pub fn load_on(compiled: &CompiledSpec, pool: &'static Pool) -> Result<CpuProgram> {
        let name = &compiled.spec.name;
        let (entry, code) = if crate::compiler::OBJECT {
            load_object(&compiled.bytes, name).map_err(|e| match e {
                Error::Load(m) => Error::Load(format!("kernel `{name}`: {m}")),
                e => e,
            })?
        } else {
            load_library(&compiled.bytes, name)?
        };
        let (mut loop_exprs, mut loop_const) = (Vec::new(), 1u64);
        for node in compiled.spec.ast.toposort() {
            if node.op() == Op::Range {
                let extent = &node.src()[0];
                match extent.arg_int() {
                    Some(n) if extent.op() == Op::Const => loop_const = loop_const.saturating_mul(n.max(1) as u64),
                    _ => loop_exprs.push(extent.clone()),
                }
            }
        }
        Ok(CpuProgram { entry, spec: compiled.spec.clone(), loop_exprs, loop_const, pool, _code: code })
    }

    /// How many chunks to split a launch into.
    fn chunks(&self, vals: &[i64], launch: &LaunchDims, pool: &Pool) -> usize {
        let axis0 = launch.global[0];
        if axis0 < 2 || pool.threads() < 2 {
            return 1;
        }
        let mut work =
            launch.global.iter().chain(launch.local.iter().flatten()).fold(1u64, |w, &d| w.saturating_mul(d as u64));
        work = work.saturating_mul(self.loop_const);
        for e in &self.loop_exprs {
            if work >= PARALLEL_MIN_WORK {
                break;
            }
            let n = self.spec.eval(e, vals).map_or(u64::MAX, |n| n.max(1) as u64);
            work = work.saturating_mul(n);
        }
        if work < PARALLEL_MIN_WORK { 1 } else { pool.threads().min(axis0) }
    }
}

/// Loads the object `bytes` and finds its entry `name`, binding its undefined symbols to the
/// libraries loaded globally (see [`load_global_libraries`]).
fn load_object(bytes: &[u8], name: &str) -> Result<(KernelFn, Code)> {
    let image = Image::load(bytes, global_symbol)?;
    let entry = image.function(name)?;
    // SAFETY: `name` is the entry point the CPU renderer emits with exactly the `KernelFn`
    // signature; the pointer is used only while `image` keeps the code mapped (same struct).
    let entry = unsafe { std::mem::transmute::<*mut c_void, KernelFn>(entry.as_ptr()) };
    Ok((entry, Code::Object { _image: image }))
}

/// The address of `symbol` in the libraries loaded globally (see [`load_global_libraries`]).
pub(crate) fn global_symbol(symbol: &CStr) -> Option<usize> {
    load_global_libraries();
    // SAFETY: dlsym only looks a NUL-terminated name up in the globally loaded libraries.
    let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) };
    (!addr.is_null()).then_some(addr as usize)
}

/// Loads the shared library `bytes` (see [`open_library`]) and finds its entry `name`.
fn load_library(bytes: &[u8], name: &str) -> Result<(KernelFn, Code)> {
    let (lib, image) = open_library(bytes).map_err(|e| Error::Load(format!("kernel `{name}`: {e}")))?;
    // SAFETY: the symbol is the entry point the CPU renderer emits with exactly the
    // `KernelFn` signature; the pointer is used only while `lib` is alive (same struct).
    let entry: KernelFn = unsafe {
        *lib.get::<KernelFn>(name.as_bytes())
            .map_err(|e| Error::Load(format!("symbol `{name}` not found in the compiled library: {e}")))?
    };
    Ok((entry, Code::Library { _lib: lib, _memfd: image }))
}

/// Loads a shared library from `bytes` without a path that another user could plant or race:
/// from an anonymous in-memory file (`memfd_create`, opened as `/proc/self/fd/N`), else, when
/// that is unavailable, from a new file in a fresh private (0700) folder that is deleted once
/// the library is loaded. The in-memory file, when used, must stay open while the library is
/// loaded (see [`MemfdImage`]). The error says why the bytes do not load.
fn open_library(bytes: &[u8]) -> std::result::Result<(Library, Option<MemfdImage>), String> {
    if let Some(image) = MemfdImage::new(bytes)
        && let Some(lib) = image.open()
    {
        return Ok((lib, Some(image)));
    }
    open_from_private_file(bytes).map(|lib| (lib, None))
}

/// Libraries kept open from memory at once; more load through private files, so that kiln
/// never holds more than this many file descriptors for its kernels.
const MAX_MEMFD_IMAGES: usize = 256;
static MEMFD_IMAGES: AtomicUsize = AtomicUsize::new(0);

/// A library's bytes in an anonymous in-memory file. glibc's `dlopen` returns an already loaded
/// library whose name matches the one asked for, and descriptor numbers are reused once closed:
/// the file stays open while its library is loaded, so its name `/proc/self/fd/N` is unique.
struct MemfdImage {
    fd: OwnedFd,
}

impl MemfdImage {
    /// `None` when memfd is unavailable (old kernel, sandbox, no descriptors left) or
    /// [`MAX_MEMFD_IMAGES`] are open. The limit is approximate under concurrent loads.
    fn new(bytes: &[u8]) -> Option<MemfdImage> {
        if MEMFD_IMAGES.load(Ordering::Relaxed) >= MAX_MEMFD_IMAGES {
            return None;
        }
        let mut file = File::from(rustix::fs::memfd_create("kiln-kernel", rustix::fs::MemfdFlags::CLOEXEC).ok()?);
        file.write_all(bytes).ok()?;
        MEMFD_IMAGES.fetch_add(1, Ordering::Relaxed);
        Some(MemfdImage { fd: file.into() })
    }

    /// Loads the library, or `None` when it does not load from here.
    fn open(&self) -> Option<Library> {
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        // SAFETY: RTLD_NOLOAD loads nothing: it only asks whether a library of this name is
        // loaded (one that outlived its descriptor, e.g. loaded by other code), whose handle
        // is then closed again. Such a name cannot be used: dlopen would return that library.
        let stale = unsafe { libloading::os::unix::Library::open(Some(&path), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if stale.is_ok() {
            return None;
        }
        load_kernel_library(&path).ok()
    }
}

impl Drop for MemfdImage {
    fn drop(&mut self) {
        MEMFD_IMAGES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Loads the library from a new file (`O_EXCL | O_NOFOLLOW`, mode 0600) in a fresh private
/// folder, deleted with the file once the library is loaded.
fn open_from_private_file(bytes: &[u8]) -> std::result::Result<Library, String> {
    let dir = crate::compiler::scratch_dir().map_err(|e| format!("cannot create a private temporary folder: {e}"))?;
    let path = dir.path().join("kernel.so");
    let write = || -> std::io::Result<()> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&path)?
            .write_all(bytes)
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    load_kernel_library(&path).map_err(|e| format!("not a loadable library: {e}"))
}

/// Makes libm and libgcc_s global libraries, once per process. Kernels link no C library (see
/// [`crate::compiler`]): the libm functions the compiler does not inline (`expf`, `sinf`,
/// `powf`, ...) and, in an object, libgcc's helpers (e.g. `__divti3`, should a compiler call
/// one; kernels spell f16 conversions themselves, see [`crate::renderer`]) are bound at load
/// from the libraries loaded globally. The Rust standard library usually links both already. Where one is
/// missing (a libc with the math functions inside; a static libgcc) nothing is done, and a
/// kernel that needs a symbol nobody defines fails to load, naming it.
fn load_global_libraries() {
    use libloading::os::unix::Library as UnixLibrary;
    static GLOBAL: OnceLock<Vec<UnixLibrary>> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        ["libm.so.6", "libgcc_s.so.1"]
            .into_iter()
            // SAFETY: the system math library and GCC's runtime support library, loaded into
            // most processes at start: their initialisers have no effect on kiln or its caller;
            // the handles are never closed.
            .filter_map(|name| unsafe { UnixLibrary::open(Some(name), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.ok())
            .collect()
    });
}

/// Loads a kernel's library with every symbol bound now (from the global libraries, see
/// [`load_global_libraries`]): a symbol that cannot be found is a load error instead of a
/// crash at its first call.
fn load_kernel_library(path: impl AsRef<std::ffi::OsStr>) -> std::result::Result<Library, libloading::Error> {
    use libloading::os::unix::Library as UnixLibrary;
    load_global_libraries();
    // SAFETY: the library is one kiln compiled from its own C source: it has no
    // initialisers, and loading it has no other side effects.
    unsafe { UnixLibrary::open(Some(path.as_ref()), libc::RTLD_NOW | libc::RTLD_LOCAL) }.map(Library::from)
}

impl CpuProgram {
    /// Runs the kernel split into exactly `chunks` chunks (1 = all on the calling thread),
    /// on the calling thread and the core pool. [`Program::execute`] picks `chunks` itself;
    /// this entry exists to check that every split gives the same result.
    ///
    /// # Safety
    /// As [`Program::execute`].
    pub unsafe fn execute_chunks(&self, bufs: &[RawView], vals: &[i64], chunks: usize) -> Result<()> {
        let spec = &self.spec;
        if bufs.len() != spec.params.len() || vals.len() != spec.vars.len() || chunks == 0 {
            return Err(Error::Launch(format!(
                "kernel `{}` takes {} buffer(s), {} variable(s) and at least one chunk, got {}, {} and {chunks}",
                spec.name,
                spec.params.len(),
                spec.vars.len(),
                bufs.len(),
                vals.len()
            )));
        }
        let mut inline = [std::ptr::null_mut::<c_void>(); INLINE_BUFS];
        let heap: Vec<*mut c_void>;
        let ptrs: &[*mut c_void] = if bufs.len() <= INLINE_BUFS {
            for (slot, b) in inline.iter_mut().zip(bufs) {
                *slot = b.host_ptr().cast();
            }
            &inline[..bufs.len()]
        } else {
            heap = bufs.iter().map(|b| b.host_ptr().cast()).collect();
            &heap
        };
        // The kernel reads the streaming mask after its variables.
        let mut inline_vals = [0i64; INLINE_BUFS + 1];
        let heap_vals: Vec<i64>;
        let vals: &[i64] = if vals.len() < inline_vals.len() {
            inline_vals[..vals.len()].copy_from_slice(vals);
            inline_vals[vals.len()] = stream_mask(spec, bufs);
            &inline_vals[..=vals.len()]
        } else {
            heap_vals = vals.iter().copied().chain([stream_mask(spec, bufs)]).collect();
            &heap_vals
        };
        let entry = self.entry;
        if chunks == 1 {
            // SAFETY: `ptrs` holds one live host pointer per parameter and `vals` one value per
            // variable (counts checked above, liveness and sizes by the caller's contract).
            unsafe { entry(ptrs.as_ptr(), vals.as_ptr(), 0, 1) };
            return Ok(());
        }
        /// The buffer addresses, shared with the pool's workers for one `Pool::run`.
        struct Addrs<'a>(&'a [*mut c_void]);
        // SAFETY: the pointers are plain addresses; the memory behind them is used by the
        // chunks only during `Pool::run`, which returns before this function does.
        unsafe impl Sync for Addrs<'_> {}
        let addrs = Addrs(ptrs);
        self.pool.run(chunks, &|core| {
            let addrs = &addrs;
            // SAFETY: as above; chunk `core` of `chunks` runs only its own iterations of
            // global axis 0, so concurrent chunks never write the same element.
            unsafe { entry(addrs.0.as_ptr(), vals.as_ptr(), core as i64, chunks as i64) }
        });
        Ok(())
    }
}

impl Program for CpuProgram {
    /// Runs the kernel on the calling thread and, for large launches, the core pool.
    ///
    /// # Safety
    /// As [`Program::execute`]: every view is live host memory (from a host allocator) of
    /// at least the parameter's size, `vals` are in bounds and `launch` comes from
    /// `launch_dims(vals)`.
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()> {
        let chunks = self.chunks(vals, launch, self.pool);
        // SAFETY: forwarded from this function's contract.
        unsafe { self.execute_chunks(bufs, vals, chunks) }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CCompiler;
    use kiln_device::Renderer;

    /// A library whose function `k` returns `value`.
    fn library(value: i32) -> Vec<u8> {
        shared_library(&format!("int k(void) {{ return {value}; }}\n"))
    }

    /// `src` built into a shared library, as kernels are where there is no object loader (so
    /// the dlopen path is tested on x86-64 too).
    fn shared_library(src: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let (c, so) = (dir.path().join("k.c"), dir.path().join("k.so"));
        std::fs::write(&c, src).unwrap();
        let cc = CCompiler::detect().unwrap();
        let out = std::process::Command::new(cc.path())
            .args(["-O2", "-fPIC", "-shared", "-nostdlib", "-o"])
            .arg(&so)
            .arg(&c)
            .arg("-lgcc")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read(&so).unwrap()
    }

    fn call_k(lib: &Library) -> i32 {
        // SAFETY: `library` defines `k` as `int k(void)`; `lib` outlives the call.
        unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"k").unwrap()() }
    }

    #[test]
    fn loading_never_writes_through_a_planted_link() {
        let victim_dir = tempfile::tempdir().unwrap();
        let victim = victim_dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        // Links at every name the old loader used for this process's first loads.
        let tmp = std::env::temp_dir();
        let links: Vec<_> = (0..64)
            .map(|n| {
                let link = tmp.join(format!("kiln-cpu-{}-{n}-k.so", std::process::id()));
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&victim, &link).unwrap();
                link
            })
            .collect();
        let bytes = library(7);
        // The entry `k` of these libraries is never run: loading is what is tested.
        let programs: Vec<_> = (0..4).map(|_| open_library(&bytes).unwrap()).collect();
        let fallback = open_from_private_file(&bytes).unwrap();
        assert_eq!(call_k(&fallback), 7);
        drop(programs);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the link's target is untouched");
        for link in links {
            assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
            std::fs::remove_file(link).unwrap();
        }
    }

    /// A kernel named `k` (its C entry is `k`).
    fn tiny_kernel() -> Arc<UOp> {
        use kiln_device::kiln_ir::{KernelBuilder, Scalar, Val};
        let mut b = KernelBuilder::new();
        let a = b.param(0, Scalar::F32, 4);
        let i = b.global(0, 4);
        b.store(&a.at(&i), &Val::f32(1.0));
        b.finish().unwrap()
    }

    #[test]
    fn libraries_of_one_name_each_load_their_own_code() {
        // Loaded from memory, one after another, the first still loaded (its descriptor
        // number must not be reused) and after it is unloaded (it may be).
        let (one, two) = (open_library(&library(1)).unwrap(), open_library(&library(2)).unwrap());
        assert!(one.1.is_some() && two.1.is_some(), "memfd is available on Linux");
        assert_eq!((call_k(&one.0), call_k(&two.0)), (1, 2));
        drop(one);
        let three = open_library(&library(3)).unwrap();
        assert_eq!((call_k(&two.0), call_k(&three.0)), (2, 3));
        // Through the private-file fallback as well.
        assert_eq!(call_k(&open_from_private_file(&library(4)).unwrap()), 4);
        assert!(open_from_private_file(b"not a library").is_err());
    }

    #[test]
    fn a_symbol_nothing_defines_is_a_load_error_and_libm_functions_bind() {
        // Kernel libraries link no C library: their undefined symbols are bound at load.
        let cc = CCompiler::detect().unwrap();
        let src = "float kiln_nowhere(float);\nfloat k(float x) { return kiln_nowhere(x); }\n";
        let compiled = |bytes| CompiledSpec {
            name: "k".into(),
            bytes,
            spec: Arc::new(crate::cpu_renderer().render(&tiny_kernel(), Some("k")).unwrap()),
        };
        match CpuProgram::load(&compiled(cc.compile_source("k", src).unwrap())) {
            Err(Error::Load(m)) => assert!(m.contains("kiln_nowhere"), "{m}"),
            other => panic!("expected a load error naming the symbol, got {other:?}"),
        }
        assert!(open_library(&shared_library(src)).is_err_and(|m| m.contains("kiln_nowhere")));
        let src = "float expf(float); float sinf(float); float powf(float, float);\n\
                   float k(float x) { return expf(x) + sinf(x) + powf(x, x); }\n";
        let lib = open_library(&shared_library(src)).unwrap().0;
        // SAFETY: `k` is `float k(float)` as compiled above; `lib` outlives the call.
        let k = unsafe { lib.get::<unsafe extern "C" fn(f32) -> f32>(b"k").unwrap() };
        // SAFETY: as above.
        assert_eq!(unsafe { k(0.5) }, 0.5f32.exp() + 0.5f32.sin() + 0.5f32.powf(0.5));
    }

    #[test]
    fn a_shared_library_given_to_the_object_loader_is_a_load_error() {
        if !crate::compiler::OBJECT {
            return;
        }
        let compiled = CompiledSpec {
            name: "k".into(),
            bytes: library(1),
            spec: Arc::new(crate::cpu_renderer().render(&tiny_kernel(), Some("k")).unwrap()),
        };
        match CpuProgram::load(&compiled) {
            Err(Error::Load(m)) => assert!(m.contains("kernel `k`") && m.contains("shared library"), "{m}"),
            other => panic!("expected a load error, got {other:?}"),
        }
    }
}
