//! OpenBLAS's `cblas_sgemm`, loaded at run time, as the matmul baseline: the reference a
//! BLAS user would compare kiln with. kiln does not link it, so kiln builds and benches
//! without it; then the baseline is the `matrixmultiply` crate.
//!
//! OpenBLAS starts one thread per core by default; it is set to the thread count kiln uses,
//! so that both sides of the ratio run on the same cores. It runs in a child process (the
//! bench's hidden `--baseline-child`): loaded beside kiln, its idle threads took a core from
//! kiln's workers and halved kiln's own figure on a 2-core machine.

use std::ffi::{CStr, c_char, c_int};

use libloading::Library;

/// The names tried, in order (the versioned name is what the runtime package installs).
pub const LIBRARY_NAMES: &[&str] = &["libopenblas.so.0", "libopenblas.so"];

/// Which matmul baseline to use: `matrixmultiply` (the fallback, even where OpenBLAS loads),
/// `openblas` (fail when it does not load, for CI), unset or `auto` (OpenBLAS if it loads).
pub const BASELINE_ENV: &str = "KILN_BENCH_MATMUL_BASELINE";

/// OpenBLAS's own override of the kernel set it picks (read when the library loads).
pub const CORETYPE_ENV: &str = "OPENBLAS_CORETYPE";

/// What [`BASELINE_ENV`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// OpenBLAS where it loads, else matrixmultiply.
    Auto,
    /// OpenBLAS, or an error.
    OpenBlas,
    /// The `matrixmultiply` crate, threaded (its own thread count).
    MatrixMultiply,
}

impl Wanted {
    /// [`BASELINE_ENV`]'s value, read before anything is timed so that a typo fails at once.
    pub fn from_env() -> Result<Wanted, String> {
        Wanted::parse(&std::env::var(BASELINE_ENV).unwrap_or_default())
    }

    fn parse(value: &str) -> Result<Wanted, String> {
        match value {
            "" | "auto" => Ok(Wanted::Auto),
            "openblas" => Ok(Wanted::OpenBlas),
            "matrixmultiply" => Ok(Wanted::MatrixMultiply),
            other => Err(format!("{BASELINE_ENV}={other:?}: expected auto, openblas or matrixmultiply")),
        }
    }
}

/// What the report calls the matrixmultiply baseline.
pub const MATRIXMULTIPLY_NAME: &str = "matrixmultiply 0.3 sgemm, threaded";

/// The `OPENBLAS_CORETYPE` for this CPU's widest ISA: `SkylakeX` with AVX-512 (F, CD, BW, DQ,
/// VL: what OpenBLAS's SkylakeX kernels use), `Haswell` with AVX2 and FMA, else none (OpenBLAS
/// picks). Set because OpenBLAS 0.3.21 picks its Haswell kernels on some AVX-512 CPUs, where
/// the SkylakeX ones are faster: the baseline should be the best OpenBLAS does here.
pub fn core_type() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx512 = has!("avx512f") && has!("avx512cd") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl");
        core_type_for(avx512, has!("avx2") && has!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// [`core_type`] for a CPU with (or without) AVX-512 and AVX2.
pub fn core_type_for(avx512: bool, avx2: bool) -> Option<&'static str> {
    if avx512 {
        Some("SkylakeX")
    } else if avx2 {
        Some("Haswell")
    } else {
        None
    }
}

/// What the baseline child process prints on stdout, one line of JSON: OpenBLAS's name and
/// seconds per rep, or why OpenBLAS did not load (which `auto` turns into matrixmultiply).
/// A wrong product is not a report: the child then fails, with the reason on stderr.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildReport {
    Timed { name: String, seconds: Vec<f64> },
    Unavailable { why: String },
}

impl ChildReport {
    /// The line the child prints.
    pub fn to_line(&self) -> String {
        // A struct of strings and floats always serialises; NaN becomes null, which
        // `parse` then rejects.
        serde_json::to_string(self).unwrap_or_default() + "\n"
    }

    /// The child's stdout. Err: not one report, or a timed one with no samples or a
    /// non-finite or non-positive sample.
    pub fn parse(stdout: &str) -> Result<ChildReport, String> {
        let report: ChildReport = serde_json::from_str(stdout.trim())
            .map_err(|e| format!("the baseline process printed `{}` ({e})", stdout.trim()))?;
        match &report {
            ChildReport::Timed { seconds, .. }
                if seconds.is_empty() || seconds.iter().any(|s| !s.is_finite() || *s <= 0.0) =>
            {
                Err(format!("the baseline process reported the samples {seconds:?}"))
            }
            _ => Ok(report),
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

    /// A library that does not load is a reason, not a panic (the child then reports it
    /// unavailable and `auto` uses matrixmultiply).
    #[test]
    fn a_missing_library_is_an_error() {
        let Err(e) = OpenBlas::load(&["libkiln-no-such-blas.so.0"], 2) else { panic!("a missing library loaded") };
        assert!(e.contains("OpenBLAS not found") && e.contains("libkiln-no-such-blas.so.0"), "{e}");
    }

    /// The core type follows the widest ISA: OpenBLAS's SkylakeX kernels on AVX-512, Haswell
    /// on AVX2, and OpenBLAS's own pick below that.
    #[test]
    fn the_core_type_follows_the_isa() {
        assert_eq!(core_type_for(true, true), Some("SkylakeX"));
        assert_eq!(core_type_for(false, true), Some("Haswell"));
        assert_eq!(core_type_for(false, false), None);
    }

    /// The child's line round-trips; anything else, or samples that are no time, is an error
    /// the bench reports rather than a figure.
    #[test]
    fn the_child_report_parses_and_rejects_garbage() {
        let timed = ChildReport::Timed { name: "OpenBLAS 0.3.21 (SkylakeX), \"x\"".into(), seconds: vec![0.01, 0.02] };
        assert_eq!(ChildReport::parse(&timed.to_line()), Ok(timed));
        let gone = ChildReport::Unavailable { why: "OpenBLAS not found".into() };
        assert_eq!(ChildReport::parse(&gone.to_line()), Ok(gone));
        for bad in [
            "",
            "0.01 0.02",
            r#"{"timed":{"name":"x","seconds":[]}}"#,
            r#"{"timed":{"name":"x","seconds":[null]}}"#,
            r#"{"timed":{"name":"x","seconds":[-1.0]}}"#,
        ] {
            assert!(ChildReport::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    /// The variable's values, and a typo is an error naming it.
    #[test]
    fn the_baseline_variable_parses() {
        assert_eq!(Wanted::parse(""), Ok(Wanted::Auto));
        assert_eq!(Wanted::parse("auto"), Ok(Wanted::Auto));
        assert_eq!(Wanted::parse("openblas"), Ok(Wanted::OpenBlas));
        assert_eq!(Wanted::parse("matrixmultiply"), Ok(Wanted::MatrixMultiply));
        assert!(Wanted::parse("blas").is_err_and(|e| e.contains(BASELINE_ENV)));
    }
}
