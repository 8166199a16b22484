//! CUDA C++ → PTX with NVRTC, then PTX → a cubin for one `sm_XX`.
//!
//! Both steps run without a GPU. The cubin is what a device loads (no driver JIT at load
//! time); PTX is what `kiln compile --emit ptx` prints.
//! - **PTX**: NVRTC with `--gpu-architecture=compute_XX`.
//! - **cubin**: `ptxas -arch=sm_XX` on that PTX when a ptxas is found, else NVRTC directly
//!   with `--gpu-architecture=sm_XX` (NVRTC ≥ 11.1 assembles itself, so ptxas is optional).
//!
//! # Finding the tools
//! NVRTC (`libnvrtc.so`): `KILN_NVRTC` (a path to the library) if set, and only it; else the
//! first that loads of `libnvrtc.so`, `.so.13`, `.so.12` in `$CUDA_HOME/lib64`,
//! `$CUDA_PATH/lib64`, `/usr/local/cuda/lib64`, the NVIDIA PyPI wheels' folders
//! (`site-packages/nvidia/cuda_nvrtc/lib`, `site-packages/nvidia/cu13/lib`, under `$VIRTUAL_ENV`,
//! `$CONDA_PREFIX`, `~/.local`, `/usr/local`, `/usr`, `~/.pyenv/versions/*`), and finally the
//! dynamic loader's own search (`LD_LIBRARY_PATH`, `ldconfig`).
//!
//! ptxas: `KILN_PTXAS` (a path to the program) if set, and only it; else `ptxas` in
//! `$CUDA_HOME/bin`, `$CUDA_PATH/bin`, `/usr/local/cuda/bin`, the wheels'
//! `site-packages/nvidia/cuda_nvcc/bin` and `site-packages/nvidia/cu13/bin`, then `$PATH`.
//!
//! On Debian, `pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12` provides both.
//!
//! Code generation is strict IEEE (`--fmad=false`, no fast math): `a*b + c` rounds twice
//! unless the kernel says MULACC, as on the CPU and OpenCL backends.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kiln_device::{CompiledSpec, Compiler, Error, ProgramSpec, Result};

/// Options every NVRTC compile gets, besides the architecture.
pub const NVRTC_OPTIONS: [&str; 4] = ["--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"];

/// The environment variable naming the NVRTC library to use.
pub const NVRTC_ENV: &str = "KILN_NVRTC";
/// The environment variable naming the ptxas program to use.
pub const PTXAS_ENV: &str = "KILN_PTXAS";

/// A CUDA GPU architecture, `sm_XY` (compute capability X.Y).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    /// The number NVRTC and ptxas use: `sm_90` → 90.
    pub fn number(self) -> u32 {
        self.major * 10 + self.minor
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}", self.number())
    }
}

impl std::str::FromStr for Arch {
    type Err = Error;

    /// Accepts `sm_90`, `SM_86` or `90`: two or three digits, the last one the minor version.
    fn from_str(s: &str) -> Result<Arch> {
        let digits = s.strip_prefix("sm_").or_else(|| s.strip_prefix("SM_")).unwrap_or(s);
        let ok = (2..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit());
        let n: u32 = digits.parse().ok().filter(|_| ok).ok_or_else(|| {
            Error::Invalid(format!("`{s}` is not a CUDA architecture: write sm_XY, e.g. sm_90 (H100) or sm_86"))
        })?;
        Ok(Arch { major: n / 10, minor: n % 10 })
    }
}

/// What a [`CudaCompiler`] produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Output {
    /// PTX text for `compute_XX` (NUL-free UTF-8 bytes).
    Ptx,
    /// A cubin (ELF) for `sm_XX`.
    Cubin,
}

type NvrtcResult = c_int;
type NvrtcProgram = *mut c_void;

/// The NVRTC entry points kiln uses, resolved from one loaded library.
struct Nvrtc {
    path: PathBuf,
    version: (i32, i32),
    /// Architecture numbers this NVRTC can compile for (`nvrtcGetSupportedArchs`).
    archs: Vec<i32>,
    create: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcResult,
    log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    /// Keeps the library mapped while the function pointers above are in use.
    _lib: libloading::Library,
}

/// Folders under which the NVIDIA PyPI wheels install (`.../site-packages/nvidia/<sub>`).
fn wheel_dirs(subs: &[&str]) -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .chain(home.iter().map(|h| h.join(".local")))
        .chain([PathBuf::from("/usr/local"), PathBuf::from("/usr")])
        .collect();
    if let Some(versions) = home.map(|h| h.join(".pyenv/versions")) {
        prefixes.extend(sorted_entries(&versions));
    }
    let mut out = Vec::new();
    for prefix in prefixes {
        for python in sorted_entries(&prefix.join("lib")) {
            let is_python = python.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3"));
            for packages in ["site-packages", "dist-packages"].iter().filter(|_| is_python) {
                out.extend(subs.iter().map(|s| python.join(packages).join("nvidia").join(s)));
            }
        }
    }
    out
}

/// The entries of `dir`, sorted (empty when it cannot be read).
fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    v.sort();
    v
}

/// `$CUDA_HOME/<sub>`, `$CUDA_PATH/<sub>`, `/usr/local/cuda/<sub>`.
fn toolkit_dirs(sub: &str) -> Vec<PathBuf> {
    ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .chain([PathBuf::from("/usr/local/cuda")])
        .map(|d| d.join(sub))
        .collect()
}

/// Every library file NVRTC discovery tries, in order (see the module docs).
fn nvrtc_candidates() -> Vec<PathBuf> {
    const NAMES: [&str; 3] = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"];
    let dirs = toolkit_dirs("lib64").into_iter().chain(wheel_dirs(&["cuda_nvrtc/lib", "cu13/lib"]));
    let mut files: Vec<PathBuf> = dirs.flat_map(|d| NAMES.map(|n| d.join(n))).filter(|p| p.is_file()).collect();
    files.extend(NAMES.map(PathBuf::from));
    files
}

impl Nvrtc {
    /// Loads the library at `path` and resolves every entry point.
    fn open(path: &Path) -> std::result::Result<Nvrtc, String> {
        // SAFETY: loading NVRTC runs its initializers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is NVRTC's C function of that name; the field type it is
                // stored in is its prototype from nvrtc.h.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{} lacks {}: {e}", path.display(), $name))?
            };
        }
        let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult = sym!("nvrtcVersion");
        let num_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult = sym!("nvrtcGetNumSupportedArchs");
        let archs_fn: unsafe extern "C" fn(*mut c_int) -> NvrtcResult = sym!("nvrtcGetSupportedArchs");
        let (mut major, mut minor, mut n) = (0, 0, 0);
        // SAFETY: the out-pointers are valid for one write each.
        unsafe {
            version_fn(&mut major, &mut minor);
            num_archs(&mut n);
        }
        let mut archs = vec![0; n.max(0) as usize];
        // SAFETY: `archs` has room for the `n` values NVRTC reported.
        unsafe { archs_fn(archs.as_mut_ptr()) };
        Ok(Nvrtc {
            path: path.to_path_buf(),
            version: (major, minor),
            archs,
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            destroy: sym!("nvrtcDestroyProgram"),
            error_string: sym!("nvrtcGetErrorString"),
            _lib: lib,
        })
    }

    fn error(&self, call: &str, code: NvrtcResult) -> Error {
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr((self.error_string)(code)) }.to_string_lossy();
        Error::Driver {
            backend: "NVRTC",
            code: Some(code.into()),
            fatal: false,
            message: format!("{call} failed: {text} ({code})"),
        }
    }

    /// Compiles `src` with `arch_option` (`compute_90` or `sm_90`) and returns the PTX or
    /// the cubin. A rejected source is [`Error::Compile`] with NVRTC's log.
    fn build(&self, src: &str, name: &str, arch_option: &str, output: Output) -> Result<Vec<u8>> {
        let text = |s: &str, what: &str| {
            CString::new(s).map_err(|_| Error::Render(format!("the {what} of `{name}` contains a NUL byte")))
        };
        let (c_src, c_name) = (text(src, "source")?, text(&format!("{name}.cu"), "name")?);
        let arch = text(&format!("--gpu-architecture={arch_option}"), "architecture")?;
        let options: Vec<CString> = NVRTC_OPTIONS.iter().map(|o| text(o, "option")).collect::<Result<_>>()?;
        let mut ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        ptrs.push(arch.as_ptr());
        let mut prog: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and outlive the call; no headers are passed.
        let rc =
            unsafe { (self.create)(&mut prog, c_src.as_ptr(), c_name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        if rc != 0 {
            return Err(self.error("nvrtcCreateProgram", rc));
        }
        let program = Program { nvrtc: self, prog };
        // SAFETY: `prog` is live; `ptrs` holds `ptrs.len()` NUL-terminated options.
        let rc = unsafe { (self.compile)(program.prog, ptrs.len() as c_int, ptrs.as_ptr()) };
        if rc != 0 {
            let log = program.read(self.log_size, self.log, "nvrtcGetProgramLog").unwrap_or_default();
            let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim_end().to_string();
            return Err(Error::Compile {
                message: format!(
                    "NVRTC {}.{} rejected the CUDA C++ of `{name}` for {arch_option}",
                    self.version.0, self.version.1
                ),
                line: offending_line(&log, src),
                log,
            });
        }
        let mut bytes = match output {
            Output::Ptx => program.read(self.ptx_size, self.ptx, "nvrtcGetPTX")?,
            Output::Cubin => program.read(self.cubin_size, self.cubin, "nvrtcGetCUBIN")?,
        };
        if output == Output::Ptx {
            // The PTX is returned NUL-terminated; the artifact is the text alone.
            while bytes.last() == Some(&0) {
                bytes.pop();
            }
        }
        Ok(bytes)
    }
}

/// A live `nvrtcProgram`, destroyed on drop.
struct Program<'a> {
    nvrtc: &'a Nvrtc,
    prog: NvrtcProgram,
}

impl Program<'_> {
    /// Reads one of the program's outputs through its size/get pair.
    fn read(
        &self,
        size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
        get: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
        call: &str,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: `prog` is live and `n` is valid for one write.
        let rc = unsafe { size(self.prog, &mut n) };
        if rc != 0 {
            return Err(self.nvrtc.error(call, rc));
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` has the `n` bytes NVRTC said the output needs.
        let rc = unsafe { get(self.prog, buf.as_mut_ptr() as *mut c_char) };
        if rc != 0 {
            return Err(self.nvrtc.error(call, rc));
        }
        Ok(buf)
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed once.
        unsafe { (self.nvrtc.destroy)(&mut self.prog) };
    }
}

/// The source line an NVRTC log points at first (`name.cu(LINE): error: ...`).
fn offending_line(log: &str, src: &str) -> Option<String> {
    log.lines().filter(|l| l.contains("error")).find_map(|l| {
        let n: usize = l.split_once('(')?.1.split_once(')')?.0.parse().ok()?;
        let text = src.lines().nth(n.checked_sub(1)?)?;
        Some(format!("{n}: {}", text.trim()))
    })
}

/// The process's NVRTC, loaded once (see the module docs for where it is looked for), or
/// why there is none.
fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    let loaded = NVRTC.get_or_init(|| {
        if let Some(path) = std::env::var_os(NVRTC_ENV) {
            return Nvrtc::open(Path::new(&path))
                .map_err(|e| format!("{NVRTC_ENV} names a library that does not load: {e}"));
        }
        let mut tried = Vec::new();
        for candidate in nvrtc_candidates() {
            match Nvrtc::open(&candidate) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(e),
            }
        }
        Err(format!(
            "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc-cu12`, \
             or set {NVRTC_ENV} to the library's path (tried: {})",
            tried.join("; ")
        ))
    });
    loaded.as_ref().map_err(|e| Error::CompilerMissing(e.clone()))
}

/// The process's ptxas (see the module docs), with its version line, or `None`.
fn ptxas() -> Result<Option<&'static (PathBuf, String)>> {
    static PTXAS: OnceLock<std::result::Result<Option<(PathBuf, String)>, String>> = OnceLock::new();
    let found = PTXAS.get_or_init(|| {
        let version = |p: &Path| -> Option<String> {
            let out = std::process::Command::new(p).arg("--version").output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            out.status.success().then(|| text.lines().last().unwrap_or_default().trim().to_string())
        };
        if let Some(path) = std::env::var_os(PTXAS_ENV).map(PathBuf::from) {
            return match version(&path) {
                Some(v) => Ok(Some((path, v))),
                None => Err(format!("{PTXAS_ENV}={} does not run as `ptxas --version`", path.display())),
            };
        }
        let path_dirs: Vec<PathBuf> =
            std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
        let dirs = toolkit_dirs("bin").into_iter().chain(wheel_dirs(&["cuda_nvcc/bin", "cu13/bin"])).chain(path_dirs);
        Ok(dirs.map(|d| d.join("ptxas")).filter(|p| p.is_file()).find_map(|p| version(&p).map(|v| (p, v))))
    });
    found.as_ref().map(Option::as_ref).map_err(|e| Error::CompilerMissing(e.clone()))
}

/// Assembles `ptx` into a cubin for `arch` with the ptxas at `path`.
fn assemble(path: &Path, ptx: &[u8], arch: Arch, name: &str) -> Result<Vec<u8>> {
    let dir = tempfile::tempdir().map_err(|e| Error::CompilerMissing(format!("no temporary folder for ptxas: {e}")))?;
    let (input, output) = (dir.path().join("k.ptx"), dir.path().join("k.cubin"));
    std::fs::write(&input, ptx)
        .map_err(|e| Error::CompilerMissing(format!("cannot write {}: {e}", input.display())))?;
    let run = std::process::Command::new(path)
        .arg(format!("-arch={arch}"))
        .arg("-o")
        .arg(&output)
        .arg(&input)
        .output()
        .map_err(|e| Error::CompilerMissing(format!("cannot run {}: {e}", path.display())))?;
    if !run.status.success() {
        return Err(Error::Compile {
            message: format!("ptxas rejected the PTX of `{name}` for {arch} ({})", run.status),
            log: String::from_utf8_lossy(&[run.stdout, run.stderr].concat()).trim_end().to_string(),
            line: None,
        });
    }
    std::fs::read(&output).map_err(|e| Error::CompilerMissing(format!("ptxas wrote no {}: {e}", output.display())))
}

/// Compiles CUDA C++ for one architecture, to PTX or to a cubin. Needs no GPU.
#[derive(Debug, Clone)]
pub struct CudaCompiler {
    arch: Arch,
    output: Output,
}

impl CudaCompiler {
    /// A compiler for `arch`, or [`Error::CompilerMissing`] when NVRTC cannot be loaded, or
    /// [`Error::Invalid`] when this NVRTC cannot target `arch`.
    pub fn new(arch: Arch, output: Output) -> Result<CudaCompiler> {
        let n = nvrtc()?;
        if !n.archs.is_empty() && !n.archs.contains(&(arch.number() as i32)) {
            return Err(Error::Invalid(format!(
                "NVRTC {}.{} ({}) cannot compile for {arch}; it supports {}: use an NVRTC that does (KILN_NVRTC)",
                n.version.0,
                n.version.1,
                n.path.display(),
                n.archs.iter().map(|a| format!("sm_{a}")).collect::<Vec<_>>().join(", ")
            )));
        }
        if output == Output::Cubin {
            ptxas()?;
        }
        Ok(CudaCompiler { arch, output })
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Compiles CUDA C++ `src` whose entry point is `name`.
    pub fn compile_source(&self, src: &str, name: &str) -> Result<Vec<u8>> {
        let n = nvrtc()?;
        match self.output {
            Output::Ptx => n.build(src, name, &self.compute(), Output::Ptx),
            Output::Cubin => match ptxas()? {
                Some((path, _)) => assemble(path, &n.build(src, name, &self.compute(), Output::Ptx)?, self.arch, name),
                None => n.build(src, name, &self.arch.to_string(), Output::Cubin),
            },
        }
    }

    /// Both artifacts of `src` for this architecture, the source compiled once when ptxas
    /// is present: (PTX, cubin). Without ptxas NVRTC assembles the cubin itself.
    pub fn ptx_and_cubin(&self, src: &str, name: &str) -> Result<(Vec<u8>, Vec<u8>)> {
        let n = nvrtc()?;
        let ptx = n.build(src, name, &self.compute(), Output::Ptx)?;
        let cubin = match ptxas()? {
            Some((path, _)) => assemble(path, &ptx, self.arch, name)?,
            None => n.build(src, name, &self.arch.to_string(), Output::Cubin)?,
        };
        Ok((ptx, cubin))
    }

    /// The virtual architecture NVRTC emits PTX for (`compute_90`).
    fn compute(&self) -> String {
        format!("compute_{}", self.arch.number())
    }
}

impl Compiler for CudaCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let bytes = self.compile_source(&spec.src, &spec.name)?;
        Ok(CompiledSpec { name: spec.name.clone(), bytes, spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        match self.output {
            Output::Ptx => "cuda-ptx",
            Output::Cubin => "cuda-cubin",
        }
    }

    /// The architecture, the NVRTC version and options, and the assembler: a change of any
    /// of them never loads a binary built by the old one.
    fn fingerprint(&self) -> String {
        let nvrtc = nvrtc().map(|n| format!("{}.{}", n.version.0, n.version.1)).unwrap_or_else(|e| e.to_string());
        let assembler = match (self.output, ptxas()) {
            (Output::Ptx, _) => "none".to_string(),
            (Output::Cubin, Ok(Some((_, version)))) => format!("ptxas {version}"),
            (Output::Cubin, Ok(None)) => "nvrtc".into(),
            (Output::Cubin, Err(e)) => e.to_string(),
        };
        format!("cuda arch={} nvrtc={nvrtc} options={NVRTC_OPTIONS:?} assembler={assembler}", self.arch)
    }
}

/// Whether NVRTC can be loaded here, or why not (for skipping tests and `kiln devices`).
pub fn nvrtc_status() -> Result<String> {
    nvrtc().map(|n| format!("NVRTC {}.{} ({})", n.version.0, n.version.1, n.path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse_and_print() {
        let a: Arch = "sm_90".parse().unwrap();
        assert_eq!((a.major, a.minor, a.to_string()), (9, 0, "sm_90".to_string()));
        assert_eq!("86".parse::<Arch>().unwrap(), Arch { major: 8, minor: 6 });
        assert_eq!("sm_100".parse::<Arch>().unwrap(), Arch { major: 10, minor: 0 });
        for bad in ["", "sm_", "sm_9", "sm_9x", "compute_90", "sm_1000", "sm_+9"] {
            assert!(matches!(bad.parse::<Arch>(), Err(Error::Invalid(m)) if m.contains("sm_XY")), "{bad}");
        }
    }

    #[test]
    fn offending_line_is_found_in_an_nvrtc_log() {
        let src = "extern \"C\" __global__ void k() {\n  int x = ;\n}\n";
        let log = "k.cu(2): error: expected an expression\n\n1 error detected in the compilation of \"k.cu\".";
        assert_eq!(offending_line(log, src).as_deref(), Some("2: int x = ;"));
        assert_eq!(offending_line("warning: nothing", src), None);
    }

    /// Compiles a kernel to PTX and to a cubin when NVRTC is present; skipped otherwise
    /// unless `KILN_REQUIRE` names `cuda-compile`.
    #[test]
    fn kernels_compile_to_ptx_and_cubin_without_a_gpu() {
        use kiln_device::Renderer;
        use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar, Val};
        if let Err(e) = nvrtc_status() {
            kiln_device::testing::skip_unless_required("cuda-compile", "the PTX and cubin test", &e);
            return;
        }
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (a, c) = (k.param(0, Scalar::F16, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        let x = a.at(&i).load().cast(kiln_device::kiln_ir::DType::F32);
        k.store(&c.at(&i), &(x.exp2() * Val::f32(0.5)));
        let spec =
            crate::cuda_renderer(DeviceSpec::new(crate::BACKEND, 0)).render(&k.finish().unwrap(), Some("k")).unwrap();
        let arch: Arch = "sm_90".parse().unwrap();
        let ptx = CudaCompiler::new(arch, Output::Ptx).unwrap().compile(&spec).unwrap().bytes;
        let text = String::from_utf8(ptx).unwrap();
        assert!(text.contains(".target sm_90") && text.contains(".entry k("), "{text}");
        let cubin = CudaCompiler::new(arch, Output::Cubin).unwrap().compile(&spec).unwrap().bytes;
        assert_eq!(&cubin[..4], b"\x7fELF");
        let bad = ProgramSpec { src: "extern \"C\" __global__ void k() {\n  int x = ;\n}\n".into(), ..spec };
        let err = CudaCompiler::new(arch, Output::Ptx).unwrap().compile(&bad).unwrap_err();
        assert!(matches!(&err, Error::Compile { line: Some(l), .. } if l.starts_with("2:")), "{err}");
    }
}
