//! The system C compiler: C source → a relocatable object (x86-64) or a shared library (`.so`
//! bytes, elsewhere).
//!
//! Which compiler: `KILN_CC` (a name looked up on `PATH`, or a path) when set, else `clang`
//! when it is on `PATH`, else `cc`.
//!
//! Flags, and why:
//! - `-O3 -march=native`: kernels are built on the machine that runs them, so they may use
//!   every instruction it has. The binary is then only valid for this CPU: the
//!   [`Compiler::fingerprint`] includes the CPU model and a hash of its feature flags, so a
//!   cache shared between machines never serves a binary built for another CPU.
//!   `KILN_CPU_ISA` replaces `-march=native` with an older level ([`crate::isa`]); those
//!   flags are in the fingerprint too.
//! - `-fwrapv`: signed integer arithmetic wraps, as the IR says (no UB on overflow).
//! - `-fno-strict-aliasing`: two parameters may be views of one allocation with different
//!   element types.
//! - `-ffp-contract=off`: `a*b + c` is rounded twice unless the kernel says MULACC, so results
//!   are the same at every optimisation level and match a scalar reference exactly.
//! - `-fno-math-errno`: `sqrt` and friends may be single instructions (errno is never read).
//! - `-c` on x86-64: no link at all (it cost 4-7 ms of a cold compile); the object is loaded
//!   by [`crate::elf`]. Elsewhere `-fPIC -shared -nostdlib` and `-lgcc`: a loadable library
//!   that links no C library and no start files, only libgcc's helpers (e.g. `_Float16`
//!   conversions). Kernels include no system header either (the renderer declares what they
//!   use): the libm functions the compiler does not inline (`expf`, `sinf`, `powf`, ...) are
//!   bound when the kernel is loaded (see [`crate::program`]).
//! - `-fno-asynchronous-unwind-tables`: no `.eh_frame`; kernels are never unwound through.
//! - `-pipe`: the assembler reads the compiler's output from a pipe, not a temporary file.
//! - `-std=gnu11`: GNU vector extensions, `_Float16` (gcc ≥ 12, clang ≥ 15).
//!
//! **Where a cold compile's time goes** (gcc 12, the 20-line `add` kernel, CPU time of the
//! whole process tree, median of 20 interleaved runs on the shared 2-core machine under load,
//! so read the shares, not the absolute figures): with the four system headers and the
//! default link it took 52-58 ms: starting the driver and `cc1` (an empty file) 12-15 ms;
//! `cc1`'s back end, initialised for the first function, about 6; optimising and emitting
//! `add` at `-O3` about 5 (`-O2`, `-O1`, no `-march=native`: within noise; vectorising: ~0);
//! parsing `stdbool/stdint/string/math.h` 11-13; `as` 3-4; `collect2` + `ld` with the C
//! runtime, libc and libm 15-18, of which `-nostdlib` saves 7-10 (`ld.gold`: no faster;
//! `-l:libm.so.6`: +3). Without the headers and with `-nostdlib` it takes 30-34 ms; what is
//! left is the floor of three processes (`cc1`, `as`, `ld`) and two drivers. `<immintrin.h>`,
//! which vector kernels with FMA/max/min/movemask intrinsics include, costs far more than all
//! of that (about 200 ms under `-march=native` on this machine).
//!
//! **No child process before the first compile.** The [`Compiler::fingerprint`] (part of every
//! kernel-cache key) identifies the compiler by its resolved path with the file's size, mtime,
//! device and inode, so a process whose kernels all come from the disk cache never starts
//! the compiler; `--version` runs only when [`CCompiler::version`] is asked for. Installing
//! another compiler at that path changes the fingerprint; a wrapper script that forwards to
//! another compiler is identified by the script itself (edit or touch it when the compiler
//! behind it changes, or clear the cache).
//!
//! **A deadline on every run.** A compiler that does not finish within the compile timeout
//! (`KILN_COMPILE_TIMEOUT` seconds, default 60) is killed with every process it started (it
//! runs in its own process group) and the compile fails with [`Error::Compile`].
//!
//! **Private scratch.** Sources and libraries are written to a fresh 0700 folder under the
//! system temp dir, `kiln-cpu-<pid>-XXXXXX`, removed when the compile ends however it ends.
//! A process killed mid-compile cannot remove its folder, so the first compile of each process
//! deletes the folders of dead kiln processes owned by the same user.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use kiln_device::{CompiledSpec, Compiler, Error, ProgramSpec, Result};

use crate::isa::IsaTarget;
use rustix::process::{Pid, Signal};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

/// The environment variable naming the C compiler to use.
pub const CC_ENV: &str = "KILN_CC";
/// The environment variable bounding one compiler run, in seconds.
pub const COMPILE_TIMEOUT_ENV: &str = "KILN_COMPILE_TIMEOUT";
/// The compile timeout when [`COMPILE_TIMEOUT_ENV`] is not set.
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(60);

/// Scratch folders are `<SCRATCH_PREFIX><pid>-<random>` in the system temp dir.
const SCRATCH_PREFIX: &str = "kiln-cpu-";
/// At most this much of a compiler's output is kept for the error message.
const MAX_LOG_BYTES: u64 = 1 << 20;

/// Whether kernels are relocatable objects (`-c`: the compiler does not link), loaded by
/// [`crate::elf`]: on x86-64. Elsewhere they are shared libraries loaded with `dlopen`.
pub(crate) const OBJECT: bool = cfg!(target_arch = "x86_64");

const FLAGS: &[&str] = &[
    "-std=gnu11",
    "-O3",
    "-fPIC",
    if OBJECT { "-c" } else { "-shared" },
    "-nostdlib",
    "-fno-asynchronous-unwind-tables",
    "-pipe",
    "-fwrapv",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-fno-math-errno",
];

/// Linked after the source: libgcc (static) for the helpers the compiler may call, e.g. the
/// `_Float16` conversions on targets without native ones. An object links nothing: the loader
/// binds those helpers to `libgcc_s.so.1` (see [`crate::program`]).
const LIBS: &[&str] = if OBJECT { &[] } else { &["-lgcc"] };

/// A located C compiler. Locating it starts no process (see the module docs).
#[derive(Debug, Clone)]
pub struct CCompiler {
    /// Canonical: the file that actually runs.
    path: PathBuf,
    family: &'static str,
    /// The path with the file's size, mtime, device and inode.
    identity: String,
    target: String,
    /// The instruction set kernels are compiled for (its `-march` flags).
    isa: IsaTarget,
    timeout: Duration,
    /// The first line of `--version`, read on first use.
    version: OnceLock<String>,
}

impl CCompiler {
    /// Finds the compiler as described in the module docs, with the timeout from
    /// `KILN_COMPILE_TIMEOUT` and the instruction set from `KILN_CPU_ISA`. A malformed timeout
    /// is an [`Error::Invalid`], a bad or unsupported instruction set an [`Error::Config`].
    pub fn detect() -> Result<CCompiler> {
        let timeout = compile_timeout(std::env::var(COMPILE_TIMEOUT_ENV).ok().as_deref())?;
        let isa = IsaTarget::from_env()?;
        let cc = match std::env::var_os(CC_ENV) {
            Some(cc) if !cc.is_empty() => Self::with_path(PathBuf::from(cc)),
            _ => match find_on_path("clang") {
                Some(clang) => Self::with_path(clang),
                None => Self::with_path("cc"),
            },
        }?;
        Ok(cc.with_timeout(timeout).with_isa(isa))
    }

    /// Uses the compiler `program` (a path, or a name looked up on `PATH`) with the default
    /// timeout. Fails with [`Error::CompilerMissing`] when it is not an executable file;
    /// whether it works is found out by the first compile.
    pub fn with_path(program: impl Into<PathBuf>) -> Result<CCompiler> {
        let program = program.into();
        let located = if program.components().count() == 1 {
            find_on_path(&program.to_string_lossy()).ok_or_else(|| missing(&program, "not found on PATH"))?
        } else {
            program
        };
        let path = fs::canonicalize(&located).map_err(|e| missing(&located, &e.to_string()))?;
        let meta = fs::metadata(&path).map_err(|e| missing(&located, &e.to_string()))?;
        if !meta.is_file() || meta.mode() & 0o111 == 0 {
            return Err(missing(&located, "not an executable file"));
        }
        let identity = format!(
            "{} size={} mtime={}.{:09} dev={} ino={}",
            path.display(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.dev(),
            meta.ino()
        );
        Ok(CCompiler {
            family: family(&path),
            path,
            identity,
            target: cpu_target(),
            isa: IsaTarget::native(),
            timeout: DEFAULT_COMPILE_TIMEOUT,
            version: OnceLock::new(),
        })
    }

    /// This compiler with every run bounded by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> CCompiler {
        self.timeout = timeout;
        self
    }

    /// This compiler building kernels for `isa` (by default the host's, `-march=native`).
    pub fn with_isa(mut self, isa: IsaTarget) -> CCompiler {
        self.isa = isa;
        self
    }

    /// The instruction set kernels are compiled for.
    pub fn isa(&self) -> IsaTarget {
        self.isa
    }

    /// The resolved (canonical) path of the compiler.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first line of `--version`, or why it could not be read. Runs the compiler on the
    /// first call only.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| match self.run(Command::new(&self.path).arg("--version"), "--version") {
            Ok(out) if out.status.success() => {
                String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string()
            }
            Ok(out) => format!("version unknown: `--version` exited with {}", out.status),
            Err(e) => format!("version unknown: {e}"),
        })
    }

    /// Compiles `src` into an object or a shared library ([`OBJECT`]) and returns its bytes. `name` names the
    /// temporary files (and appears in diagnostics).
    pub fn compile_source(&self, name: &str, src: &str) -> Result<Vec<u8>> {
        let scratch_err = |what: String, e: std::io::Error| Error::Compile {
            message: format!("{what}: {e}; set TMPDIR to a writable folder"),
            log: String::new(),
            line: None,
        };
        let dir = scratch_dir().map_err(|e| scratch_err("cannot create a private scratch folder".into(), e))?;
        let stem: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        let c_file = dir.path().join(format!("{stem}.c"));
        let so_file = dir.path().join(format!("{stem}.{}", if OBJECT { "o" } else { "so" }));
        fs::write(&c_file, src).map_err(|e| scratch_err(format!("writing {}", c_file.display()), e))?;
        let mut cmd = self.command();
        cmd.arg("-o").arg(&so_file).arg(&c_file).args(LIBS);
        let out = self.run(&mut cmd, &format!("compiling kernel `{name}`"))?;
        if !out.status.success() {
            let log = String::from_utf8_lossy(&out.stderr).into_owned();
            let line = offending_line(&log, &format!("{stem}.c"), src);
            return Err(Error::Compile {
                message: format!(
                    "{} ({}) rejected kernel `{name}`: {}",
                    self.path.display(),
                    self.version(),
                    out.status
                ),
                log,
                line,
            });
        }
        fs::read(&so_file).map_err(|e| Error::Compile {
            message: format!("{} reported success but {} cannot be read: {e}", self.path.display(), so_file.display()),
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
            line: None,
        })
    }

    /// The compiler with the flags of every kernel compile: [`FLAGS`] and the instruction
    /// set's `-march` flags.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.args(FLAGS).args(self.isa.march_flags());
        cmd
    }

    /// Runs the compiler as `cmd` (doing `what`) to completion, or until the timeout, when it
    /// and every process it started are killed. Output goes to unnamed temporary files (never
    /// pipes, which a surviving grandchild could hold open).
    fn run(&self, cmd: &mut Command, what: &str) -> Result<Output> {
        let capture_err = |e: std::io::Error| Error::Compile {
            message: format!("cannot create a temporary file for the compiler's output: {e}"),
            log: String::new(),
            line: None,
        };
        let (mut stdout, mut stderr) =
            (tempfile::tempfile().map_err(capture_err)?, tempfile::tempfile().map_err(capture_err)?);
        cmd.stdin(Stdio::null())
            .stdout(stdout.try_clone().map_err(capture_err)?)
            .stderr(stderr.try_clone().map_err(capture_err)?)
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| missing(&self.path, &e.to_string()))?;
        let group = Pid::from_raw(child.id() as i32);
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || tx.send(child.wait()));
        let status = match rx.recv_timeout(self.timeout) {
            Ok(status) => status,
            Err(RecvTimeoutError::Timeout) => {
                // The compiler leads its own process group: killing the group reaches the
                // compiler proper, the assembler and the linker it started.
                // The compiler itself is killed too, in case it left the group.
                if let Some(group) = group {
                    let _ = rustix::process::kill_process_group(group, Signal::KILL);
                    let _ = rustix::process::kill_process(group, Signal::KILL);
                }
                let _ = waiter.join();
                return Err(Error::Compile {
                    message: format!(
                        "{} did not finish {what} within {:?} and was stopped; if it needs longer, set \
                         {COMPILE_TIMEOUT_ENV} to the seconds to allow",
                        self.path.display(),
                        self.timeout
                    ),
                    log: String::new(),
                    line: None,
                });
            }
            Err(RecvTimeoutError::Disconnected) => Err(std::io::Error::other("the waiting thread failed")),
        }
        .map_err(|e| missing(&self.path, &e.to_string()))?;
        let _ = waiter.join();
        Ok(Output { status, stdout: read_capture(&mut stdout), stderr: read_capture(&mut stderr) })
    }
}

impl Compiler for CCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let bytes = self.compile_source(&spec.name, &spec.src)?;
        Ok(CompiledSpec { name: spec.name.clone(), src: Some(spec.src.clone()), bytes, spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        self.family
    }

    fn fingerprint(&self) -> String {
        format!(
            "{} | {} {} {} | {}",
            self.identity,
            FLAGS.join(" "),
            self.isa.march_flags().join(" "),
            LIBS.join(" "),
            self.target
        )
    }
}

/// Parses `KILN_COMPILE_TIMEOUT` (seconds, fractions allowed); unset or empty means the default.
pub fn compile_timeout(value: Option<&str>) -> Result<Duration> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(DEFAULT_COMPILE_TIMEOUT) };
    v.parse::<f64>().ok().filter(|s| *s > 0.0).and_then(|s| Duration::try_from_secs_f64(s).ok()).ok_or_else(|| {
        Error::Invalid(format!(
            "{COMPILE_TIMEOUT_ENV}=`{v}`: use a positive number of seconds (e.g. 120 or 0.5); the default is {}",
            DEFAULT_COMPILE_TIMEOUT.as_secs()
        ))
    })
}

/// The compiler family from its file name, for cache keys (`clang-18` → clang).
fn family(path: &Path) -> &'static str {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if name.contains("clang") {
        "clang"
    } else if name.contains("gcc") {
        "gcc"
    } else {
        "cc"
    }
}

fn read_capture(file: &mut File) -> Vec<u8> {
    let mut bytes = Vec::new();
    // A capture that cannot be read back only loses the compiler's message.
    let _ = file.seek(SeekFrom::Start(0)).and_then(|_| file.take(MAX_LOG_BYTES).read_to_end(&mut bytes));
    bytes
}

fn missing(path: &Path, why: &str) -> Error {
    Error::CompilerMissing(format!(
        "cannot run the C compiler `{}` ({why}); install one (e.g. `apt-get install gcc` or `apt-get install clang`) \
         or set {CC_ENV} to the compiler's path",
        path.display()
    ))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// A fresh private (0700) folder `kiln-cpu-<pid>-XXXXXX` in the system temp dir, deleted with
/// its contents on drop. The first call of each process sweeps dead processes' leftovers.
pub(crate) fn scratch_dir() -> std::io::Result<TempDir> {
    static SWEEP: Once = Once::new();
    let base = std::env::temp_dir();
    SWEEP.call_once(|| sweep_stale_scratch(&base));
    tempfile::Builder::new()
        .prefix(&format!("{SCRATCH_PREFIX}{}-", std::process::id()))
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir_in(&base)
}

/// Deletes the scratch folders in `base` left by kiln processes that are gone: named
/// `kiln-cpu-<pid>-...`, a real folder (not a link) owned by this user, and no process `pid`.
fn sweep_stale_scratch(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else { return };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .and_then(Pid::from_raw);
        let Some(pid) = pid else { continue };
        // `DirEntry::metadata` does not follow a symbolic link.
        let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
        if ours && rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH) {
            // Best effort: what cannot be deleted now is tried again by the next process.
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// The CPU the binaries are built for: model name and a hash of the feature flags.
fn cpu_target() -> String {
    let info = crate::cpuinfo();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let hash: String = Sha256::digest(flags.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{} {} [{}] flags:{hash}", std::env::consts::ARCH, std::env::consts::OS, field("model name"))
}

/// The source line a compiler log points at (`FILE:LINE:COL: error ...`), as `LINE: text`.
pub fn offending_line(log: &str, file: &str, src: &str) -> Option<String> {
    let locate = |l: &str| -> Option<usize> {
        let rest = &l[l.find(file)? + file.len()..];
        let rest = rest.strip_prefix(':')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let line_no =
        log.lines().filter(|l| l.contains("error")).find_map(locate).or_else(|| log.lines().find_map(locate))?;
    let text = src.lines().nth(line_no.checked_sub(1)?)?;
    Some(format!("{line_no}: {}", text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_compiler_is_a_typed_error() {
        let err = CCompiler::with_path("/nonexistent/kiln-cc").unwrap_err();
        assert!(matches!(&err, Error::CompilerMissing(m) if m.contains("KILN_CC")), "{err}");
    }

    #[test]
    fn compile_errors_carry_the_log_and_the_line() {
        let cc = CCompiler::detect().unwrap();
        let src = "int ok(void) { return 1; }\nint broken(void) { return undefined_name; }\n";
        match cc.compile_source("bad", src) {
            Err(Error::Compile { log, line, .. }) => {
                assert!(log.contains("undefined_name"), "{log}");
                assert_eq!(line.as_deref(), Some("2: int broken(void) { return undefined_name; }"));
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }

    #[test]
    fn good_source_compiles_to_a_shared_object() {
        let cc = CCompiler::detect().unwrap();
        let bytes = cc.compile_source("good", "int good(void) { return 1; }\n").unwrap();
        assert_eq!(&bytes[..4], b"\x7fELF");
        assert!(cc.fingerprint().contains(&cc.path().display().to_string()));
        assert!(["gcc", "clang", "cc"].contains(&cc.cache_key()));
    }

    /// The assembly `cc` makes of `src` with the flags of a real compile (`-S`).
    fn assembly(cc: &CCompiler, src: &str) -> String {
        let dir = test_dir();
        let c_file = dir.path().join("k.c");
        fs::write(&c_file, src).unwrap();
        let out = cc.command().arg("-S").arg("-o").arg("-").arg(&c_file).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// With `KILN_CPU_ISA=avx2` a 16-lane kernel (FMA, MAX, EXP: what AVX-512 would run in
    /// zmm registers) compiles to AVX2 code only: no zmm and no mask register. Forced AVX-512
    /// on a CPU that has it does use zmm (so the check can see them), and the two targets
    /// have different fingerprints.
    #[test]
    fn forced_avx2_emits_no_avx512_instruction() {
        use crate::isa::{Isa, IsaTarget};
        use kiln_device::Renderer;
        use kiln_device::kiln_ir::{DType, KernelBuilder, Scalar};
        let Ok(avx2) = IsaTarget::force(Isa::Avx2) else {
            println!("skipped: this CPU has no AVX2");
            return;
        };
        let mut b = KernelBuilder::new();
        let (x, y) = (b.param(0, Scalar::F32, 1024), b.param(1, Scalar::F32, 1024));
        let i = b.special("gidx0", 64);
        let v = x.at_vec(&(&i * 16), 16).load();
        let r = v.mul_acc(&v, &v).max(v.exp()).min(v.lt(v.gep(3).broadcast(16)).select(&v, &(&v * 2.0)));
        assert_eq!(r.dtype(), DType::vec(Scalar::F32, 16));
        b.store(&y.at_vec(&(&i * 16), 16), &r);
        let src = crate::CpuRenderer::new().render(&b.finish().unwrap(), Some("wide")).unwrap().src;
        let cc = CCompiler::detect().unwrap();
        let asm = assembly(&cc.clone().with_isa(avx2), &src);
        assert!(asm.contains("ymm"), "the AVX2 build uses 32-byte vectors");
        for avx512 in ["zmm", "%k1", "{%k"] {
            assert!(!asm.contains(avx512), "`{avx512}` in the forced-AVX2 assembly");
        }
        if let Ok(avx512) = IsaTarget::force(Isa::Avx512) {
            assert!(assembly(&cc.clone().with_isa(avx512), &src).contains("zmm"), "AVX-512 builds use zmm");
            assert_ne!(cc.clone().with_isa(avx2).fingerprint(), cc.with_isa(avx512).fingerprint());
        }
    }

    #[test]
    fn kernels_include_no_system_header_and_declare_every_math_function() {
        use kiln_device::Renderer;
        use kiln_device::cstyle::MathFn;
        use kiln_device::kiln_ir::{KernelBuilder, Scalar};
        let mut b = KernelBuilder::new();
        let a = b.param(0, Scalar::F32, 8);
        let i = b.special("gidx0", 8);
        b.store(&a.at(&i), &(a.at(&i).load() * 2.0));
        let src = crate::CpuRenderer::new().render(&b.finish().unwrap(), Some("k")).unwrap().src;
        assert!(!src.contains("#include"), "{src}");
        use MathFn::*;
        for f in [Sqrt, Exp2, Log2, Exp, Log, Sin, Cos, Trunc, Fabs, Pow, Fmax, Fmin, Fma] {
            for name in [format!("float {}f(", f.c_name()), format!("double {}(", f.c_name())] {
                assert!(src.contains(&name), "`{name}` is not declared:\n{src}");
            }
        }
        let bytes = CCompiler::detect().unwrap().compile_source("k", &src).unwrap();
        assert_eq!(&bytes[..4], b"\x7fELF");
    }

    #[test]
    fn offending_line_parses_gcc_and_clang_logs() {
        let src = "a\nb\nc\n";
        assert_eq!(offending_line("/tmp/x/k.c:3:5: error: bad", "k.c", src).as_deref(), Some("3: c"));
        assert_eq!(
            offending_line("/tmp/x/k.c:1:1: warning: w\n/tmp/x/k.c:2:9: error: e", "k.c", src).as_deref(),
            Some("2: b")
        );
        assert_eq!(offending_line("ld: cannot find -lfoo", "k.c", src), None);
    }

    /// A fresh private folder for a test's scripts and logs.
    fn test_dir() -> TempDir {
        tempfile::Builder::new().prefix("kiln-cc-test-").tempdir().unwrap()
    }

    /// An executable shell script `name` in `dir`.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Shell that answers `--version`, else sets `$out` to the argument after `-o` and
    /// `$scratch` to its folder.
    const FIND_OUTPUT: &str = "[ \"$1\" = --version ] && { echo 'test-cc 1.0'; exit 0; }\nout=''; prev=''\nfor a in \"$@\"; do [ \"$prev\" = -o ] && out=\"$a\"; prev=\"$a\"; done\n\
                               scratch=$(dirname \"$out\")";

    fn lines(path: &Path) -> Vec<String> {
        fs::read_to_string(path).map(|t| t.lines().map(str::to_owned).collect()).unwrap_or_default()
    }

    /// Whether process `pid` exits (or becomes a zombie) within a minute: a killed process
    /// takes a moment to go.
    fn dies(pid: &str) -> bool {
        let dead = || {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        };
        for _ in 0..6000 {
            if dead() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn scratch_is_private_and_removed_after_success_and_failure() {
        let dir = test_dir();
        let log = dir.path().join("scratch.log");
        let real = CCompiler::detect().unwrap();
        let body = |tail: &str| {
            format!("{FIND_OUTPUT}\necho \"$scratch $(stat -c %a \"$scratch\")\" >> '{}'\n{tail}", log.display())
        };
        let good = script(dir.path(), "good-cc", &body(&format!("exec '{}' \"$@\"", real.path().display())));
        let bad = script(dir.path(), "bad-cc", &body("echo 'k.c:1:1: error: no' >&2; exit 1"));
        CCompiler::with_path(&good).unwrap().compile_source("k", "int k(void) { return 1; }\n").unwrap();
        let err = CCompiler::with_path(&bad).unwrap().compile_source("k", "int k(void) { return 1; }\n");
        assert!(matches!(err, Err(Error::Compile { .. })), "{err:?}");
        let seen = lines(&log);
        assert_eq!(seen.len(), 2, "{seen:?}");
        for line in &seen {
            let (scratch, mode) = line.rsplit_once(' ').unwrap();
            assert_eq!(mode, "700", "the scratch folder {scratch} is private");
            let folder = Path::new(scratch).file_name().unwrap().to_string_lossy().into_owned();
            assert!(folder.starts_with(&format!("{SCRATCH_PREFIX}{}-", std::process::id())), "{folder}");
            assert!(!Path::new(scratch).exists(), "{scratch} was removed");
        }
    }

    #[test]
    fn a_hung_compiler_is_killed_at_the_deadline() {
        let dir = test_dir();
        let log = dir.path().join("hung.log");
        // The compiler starts a child (as gcc starts cc1) and both hang.
        let body = format!("{FIND_OUTPUT}\nsleep 600 &\necho \"$scratch $!\" > '{}'\nwait", log.display());
        let cc = CCompiler::with_path(script(dir.path(), "hung-cc", &body))
            .unwrap()
            .with_timeout(Duration::from_millis(300));
        match cc.compile_source("k", "int k(void) { return 1; }\n") {
            Err(Error::Compile { message, .. }) => {
                assert!(message.contains("did not finish") && message.contains(COMPILE_TIMEOUT_ENV), "{message}")
            }
            other => panic!("expected a timeout error, got {other:?}"),
        }
        let seen = lines(&log);
        let (scratch, child) = seen[0].split_once(' ').unwrap();
        assert!(dies(child), "the compiler's child {child} was killed");
        assert!(!Path::new(scratch).exists(), "{scratch} was removed");
    }

    #[test]
    fn compile_timeout_comes_from_the_environment_value() {
        assert_eq!(compile_timeout(None).unwrap(), DEFAULT_COMPILE_TIMEOUT);
        assert_eq!(compile_timeout(Some(" ")).unwrap(), DEFAULT_COMPILE_TIMEOUT);
        assert_eq!(compile_timeout(Some("120")).unwrap(), Duration::from_secs(120));
        assert_eq!(compile_timeout(Some("0.5")).unwrap(), Duration::from_millis(500));
        for bad in ["0", "-3", "ten", "1e400", "NaN", "inf", "5s"] {
            match compile_timeout(Some(bad)) {
                Err(Error::Invalid(m)) => assert!(m.contains(COMPILE_TIMEOUT_ENV) && m.contains(bad), "{m}"),
                other => panic!("`{bad}`: expected an invalid-value error, got {other:?}"),
            }
        }
    }

    #[test]
    fn stale_scratch_of_dead_processes_is_swept() {
        let base = test_dir();
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let make = |name: &str| {
            let p = base.path().join(name);
            fs::create_dir(&p).unwrap();
            fs::write(p.join("k.c"), "int k;").unwrap();
            p
        };
        let stale = make(&format!("{SCRATCH_PREFIX}{dead}-a1b2c3"));
        let live = make(&format!("{SCRATCH_PREFIX}{}-d4e5f6", std::process::id()));
        let foreign = make(&format!("other-{dead}-a1b2c3"));
        let target = make("link-target");
        let link = base.path().join(format!("{SCRATCH_PREFIX}{dead}-link"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        sweep_stale_scratch(base.path());
        assert!(!stale.exists(), "a dead process's scratch is deleted");
        assert!(live.exists() && foreign.exists(), "a live process's scratch and other folders stay");
        assert!(link.exists() && target.join("k.c").exists(), "a link is neither followed nor deleted");
    }

    #[test]
    fn locating_the_compiler_starts_no_process() {
        let dir = test_dir();
        let log = dir.path().join("runs.log");
        let real = CCompiler::detect().unwrap();
        let cc = script(
            dir.path(),
            "logging-cc",
            &format!("echo \"$1\" >> '{}'\nexec '{}' \"$@\"", log.display(), real.path().display()),
        );
        let cc = CCompiler::with_path(&cc).unwrap();
        let (fingerprint, key) = (cc.fingerprint(), cc.cache_key());
        assert!(fingerprint.contains("logging-cc") && fingerprint.contains("ino="), "{fingerprint}");
        assert_eq!(key, "cc");
        assert!(lines(&log).is_empty(), "no process was started: {:?}", lines(&log));
        assert!(!cc.version().is_empty());
        assert!(!cc.version().starts_with("version unknown"), "{}", cc.version());
        assert_eq!(lines(&log), ["--version"], "`--version` runs once, when asked for");
    }

    #[test]
    fn a_warm_disk_cache_never_starts_the_compiler() {
        use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar};
        use kiln_device::{CacheConfig, KernelCache, Program, Renderer, RuntimeFactory, Toolchain};
        let dir = test_dir();
        let log = dir.path().join("runs.log");
        let real = CCompiler::detect().unwrap();
        let cc = script(
            dir.path(),
            "logging-cc",
            &format!("echo \"$1\" >> '{}'\nexec '{}' \"$@\"", log.display(), real.path().display()),
        );
        let mut b = KernelBuilder::new();
        let a = b.param(0, Scalar::F32, 8);
        let i = b.special("gidx0", 8);
        let v = a.at(&i).load();
        b.store(&a.at(&i), &(v * 2.0));
        let sink = b.finish().unwrap();
        // What a new process does: locate the compiler, open the cache, ask for the kernel.
        let process = || {
            let renderer: Arc<dyn Renderer> = Arc::new(crate::CpuRenderer::new());
            let runtime: RuntimeFactory = Arc::new(|c| Ok(Arc::new(crate::CpuProgram::load(c)?) as Arc<dyn Program>));
            let toolchain = Toolchain::new(renderer, Arc::new(CCompiler::with_path(&cc).unwrap()), runtime);
            let cache = KernelCache::new(CacheConfig::at(dir.path().join("cache")));
            cache.get_or_compile(&sink, None, &DeviceSpec::Cpu, &toolchain).unwrap();
            cache.stats()
        };
        assert_eq!(process().misses, 1);
        assert_eq!(lines(&log).len(), 1, "the cold process compiles once: {:?}", lines(&log));
        assert_eq!(process().disk_hits, 1);
        assert_eq!(lines(&log).len(), 1, "the warm process starts no compiler: {:?}", lines(&log));
    }
}
