//! OpenBLAS's `cblas_sgemm`, loaded at run time, as the matmul baseline: the reference a
//! BLAS user would compare kiln with. kiln does not link it, so kiln builds and benches
//! without it; then the baseline is the `matrixmultiply` crate.
//!
//! OpenBLAS starts one thread per core by default; it is set to the thread count kiln uses,
//! so that both sides of the ratio run on the same cores.

use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;

use libloading::Library;

/// The names tried, in order (the versioned name is what the runtime package installs).
pub const LIBRARY_NAMES: &[&str] = &["libopenblas.so.0", "libopenblas.so"];

/// Which matmul baseline to use: `matrixmultiply` (the fallback, even where OpenBLAS loads),
/// `openblas` (fail when it does not load, for CI), unset or `auto` (OpenBLAS if it loads).
pub const BASELINE_ENV: &str = "KILN_BENCH_MATMUL_BASELINE";

/// The matmul baseline the bench measures kiln against.
#[derive(Clone, Copy)]
pub enum MatmulBaseline {
    OpenBlas(&'static OpenBlas),
    /// The `matrixmultiply` crate, threaded (its own thread count).
    MatrixMultiply,
}

impl MatmulBaseline {
    /// OpenBLAS with `threads` threads when it loads, else matrixmultiply, as [`BASELINE_ENV`]
    /// says. Err: the variable's value is not one of the above, or it asks for OpenBLAS and
    /// OpenBLAS does not load (the message says why).
    pub fn select(threads: usize) -> Result<MatmulBaseline, String> {
        let wanted = std::env::var(BASELINE_ENV).unwrap_or_default();
        match wanted.as_str() {
            "matrixmultiply" => Ok(MatmulBaseline::MatrixMultiply),
            "" | "auto" => Ok(OpenBlas::get(threads).map_or(MatmulBaseline::MatrixMultiply, MatmulBaseline::OpenBlas)),
            "openblas" => OpenBlas::get(threads)
                .map(MatmulBaseline::OpenBlas)
                .map_err(|e| format!("{BASELINE_ENV}=openblas: {e}")),
            other => Err(format!("{BASELINE_ENV}={other:?}: expected auto, openblas or matrixmultiply")),
        }
    }

    /// What the report calls this baseline.
    pub fn name(self) -> &'static str {
        match self {
            MatmulBaseline::OpenBlas(blas) => &blas.name,
            MatmulBaseline::MatrixMultiply => "matrixmultiply 0.3 sgemm, threaded",
        }
    }

    /// `c = a · b` for n×n row-major matrices; leaves `c` alone when a slice is too short.
    pub fn matmul(&self, a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
        match self {
            MatmulBaseline::OpenBlas(blas) => blas.matmul(a, b, c, n),
            MatmulBaseline::MatrixMultiply => super::baseline::matmul(a, b, c, n),
        }
    }
}

/// `CblasRowMajor` and `CblasNoTrans` from cblas.h.
const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;

type Sgemm = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    f32,
    *mut f32,
    c_int,
);

/// A loaded OpenBLAS. Never unloaded: OpenBLAS keeps worker threads, and unloading a
/// library under them is not supported by every build.
pub struct OpenBlas {
    sgemm: Sgemm,
    /// E.g. "OpenBLAS 0.3.21 (Zen) cblas_sgemm, 2 threads".
    name: String,
    _lib: Library,
}

impl OpenBlas {
    /// The process's OpenBLAS, set to `threads` threads when first loaded, or why it does
    /// not load.
    pub fn get(threads: usize) -> Result<&'static OpenBlas, &'static str> {
        static LOADED: OnceLock<Result<OpenBlas, String>> = OnceLock::new();
        LOADED.get_or_init(|| OpenBlas::load(LIBRARY_NAMES, threads)).as_ref().map_err(String::as_str)
    }

    /// Loads the first of `names` that opens and has `cblas_sgemm`, set to `threads` threads.
    pub fn load(names: &[&str], threads: usize) -> Result<OpenBlas, String> {
        let mut why = Vec::new();
        for name in names {
            // SAFETY: OpenBLAS's initialisers only read the environment and set up its
            // thread pool; loading it has no other effect on this process.
            match unsafe { Library::new(name) } {
                Ok(lib) => return OpenBlas::from_library(lib, threads),
                Err(e) => why.push(format!("{name}: {e}")),
            }
        }
        Err(format!("OpenBLAS not found ({})", why.join("; ")))
    }

    fn from_library(lib: Library, threads: usize) -> Result<OpenBlas, String> {
        // SAFETY: the type is cblas_sgemm's prototype in cblas.h with 32-bit `blasint`,
        // which the config check below ensures; the pointer stays valid while `lib` is kept.
        let sgemm: Sgemm = *unsafe { lib.get::<Sgemm>(b"cblas_sgemm\0") }.map_err(|e| e.to_string())?;
        // SAFETY: `char *openblas_get_config(void)` returns a static NUL-terminated string.
        let config = unsafe { lib.get::<unsafe extern "C" fn() -> *const c_char>(b"openblas_get_config\0") }
            .ok()
            .map(|f| unsafe { CStr::from_ptr(f()) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        if config.contains("USE64BITINT") {
            return Err(format!("this OpenBLAS takes 64-bit integers ({config}), which the baseline does not call"));
        }
        let threads = c_int::try_from(threads.max(1)).unwrap_or(1);
        // SAFETY: `void openblas_set_num_threads(int)` and `int openblas_get_num_threads(void)`,
        // called before any other thread uses this library.
        let used = unsafe {
            if let Ok(set) = lib.get::<unsafe extern "C" fn(c_int)>(b"openblas_set_num_threads\0") {
                set(threads);
            }
            lib.get::<unsafe extern "C" fn() -> c_int>(b"openblas_get_num_threads\0").map(|get| get()).ok()
        };
        // SAFETY: `char *openblas_get_corename(void)` returns a static NUL-terminated string.
        let core = unsafe { lib.get::<unsafe extern "C" fn() -> *const c_char>(b"openblas_get_corename\0") }
            .ok()
            .map(|f| unsafe { CStr::from_ptr(f()) }.to_string_lossy().into_owned());
        let version: Vec<&str> = config.split_whitespace().take(2).collect();
        let mut name =
            if version.len() == 2 && version[0] == "OpenBLAS" { version.join(" ") } else { "OpenBLAS".into() };
        if let Some(core) = core {
            name += &format!(" ({core})");
        }
        name += " cblas_sgemm";
        match used {
            Some(n) => name += &format!(", {n} threads"),
            None => name += ", its default threads",
        }
        Ok(OpenBlas { sgemm, name, _lib: lib })
    }

    /// What the report calls this baseline.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `c = a · b` for n×n row-major matrices; does nothing if a slice is shorter than n²
    /// or n does not fit OpenBLAS's `int` (the caller's verification then reports it).
    pub fn matmul(&self, a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
        let Ok(ni) = c_int::try_from(n) else { return };
        if n.checked_mul(n).is_none_or(|nn| a.len() < nn || b.len() < nn || c.len() < nn) {
            return;
        }
        // SAFETY: the three slices hold n×n elements (checked above), row-major with leading
        // dimension n; `c` does not alias `a` or `b` (it is `&mut`).
        unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                NO_TRANS,
                NO_TRANS,
                ni,
                ni,
                ni,
                1.0,
                a.as_ptr(),
                ni,
                b.as_ptr(),
                ni,
                0.0,
                c.as_mut_ptr(),
                ni,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where OpenBLAS is installed, the baseline computes the exact product (inputs in 1/8
    /// steps, so every summation order is exact) and says which library and threads it is.
    #[test]
    fn openblas_when_present_computes_the_product() {
        let blas = match OpenBlas::load(LIBRARY_NAMES, 2) {
            Ok(b) => b,
            Err(e) => return println!("skipped: {e}"),
        };
        assert!(
            blas.name().starts_with("OpenBLAS") && blas.name().ends_with("cblas_sgemm, 2 threads"),
            "{}",
            blas.name()
        );
        let n = 96;
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.75).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.125 - 0.625).collect();
        let want: Vec<f32> = (0..n * n).map(|ij| (0..n).map(|k| a[ij / n * n + k] * b[k * n + ij % n]).sum()).collect();
        let mut c = vec![f32::NAN; n * n];
        blas.matmul(&a, &b, &mut c, n);
        assert_eq!(c, want);
        let mut short = vec![7f32; 4];
        blas.matmul(&a, &b, &mut short, n);
        assert_eq!(short, [7.0; 4], "a short output is left alone, not overrun");
    }

    /// A library that does not load is a reason, not a panic (the bench then uses
    /// matrixmultiply: see `matmul_baseline_falls_back_without_openblas` in the bench).
    #[test]
    fn a_missing_library_is_an_error() {
        let Err(e) = OpenBlas::load(&["libkiln-no-such-blas.so.0"], 2) else { panic!("a missing library loaded") };
        assert!(e.contains("OpenBLAS not found") && e.contains("libkiln-no-such-blas.so.0"), "{e}");
    }
}
