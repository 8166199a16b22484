//! Loading a compiled kernel (`.so` bytes) and running it over the core pool.

use std::ffi::c_void;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_device::kiln_ir::{Op, UOp};
use kiln_device::{CompiledSpec, Error, LaunchDims, Program, ProgramSpec, RawView, Result};

use crate::pool::Pool;

/// The entry ABI of every CPU kernel (see [`crate::renderer`]).
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut c_void, vals: *const i64, core: i64, ncores: i64);

/// Below this many estimated loop iterations a launch runs inline on the caller: waking a
/// worker costs more than it saves.
const PARALLEL_MIN_WORK: u64 = 1 << 15;

/// Buffers passed without a heap allocation (more go through a `Vec`).
const INLINE_BUFS: usize = 16;

/// A loaded CPU kernel. `Send + Sync` and reentrant: the C entry keeps no state, and each
/// call works on the iterations its chunk index selects.
pub struct CpuProgram {
    entry: KernelFn,
    spec: Arc<ProgramSpec>,
    /// Extents of the kernel's loops (RANGEs) that are not constants, and the product of
    /// those that are: together an upper estimate of the work per launch index.
    loop_exprs: Vec<Arc<UOp>>,
    loop_const: u64,
    // Keeps the code `entry` points into mapped. Declared last: dropped after everything else.
    _lib: libloading::Library,
}

impl std::fmt::Debug for CpuProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuProgram({})", self.spec.name)
    }
}

impl CpuProgram {
    /// Loads `compiled.bytes` (a shared library) and looks up the entry `compiled.spec.name`.
    /// The library is written to a temporary file, opened, and the file is deleted again.
    pub fn load(compiled: &CompiledSpec) -> Result<CpuProgram> {
        let name = compiled.spec.name.clone();
        let path = std::env::temp_dir().join(format!("kiln-cpu-{}-{}-{name}.so", std::process::id(), unique()));
        let write = || -> std::io::Result<()> { std::fs::File::create(&path)?.write_all(&compiled.bytes) };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&path);
            return Err(Error::Load(format!("kernel `{name}`: cannot write {}: {e}", path.display())));
        }
        // SAFETY: the library is one kiln compiled from its own C source: it has no
        // initialisers besides the C runtime's, and loading it has no other side effects.
        let lib = unsafe { libloading::Library::new(&path) };
        let _ = std::fs::remove_file(&path);
        let lib = lib.map_err(|e| Error::Load(format!("kernel `{name}`: not a loadable library: {e}")))?;
        // SAFETY: the symbol is the entry point the CPU renderer emits with exactly the
        // `KernelFn` signature; the pointer is used only while `lib` is alive (same struct).
        let entry: KernelFn = unsafe {
            *lib.get::<KernelFn>(name.as_bytes())
                .map_err(|e| Error::Load(format!("symbol `{name}` not found in the compiled library: {e}")))?
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
        Ok(CpuProgram { entry, spec: compiled.spec.clone(), loop_exprs, loop_const, _lib: lib })
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

fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
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
        Pool::global().run(chunks, &|core| {
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
        let chunks = self.chunks(vals, launch, Pool::global());
        // SAFETY: forwarded from this function's contract.
        unsafe { self.execute_chunks(bufs, vals, chunks) }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }
}
