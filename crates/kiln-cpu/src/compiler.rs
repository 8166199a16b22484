//! The system C compiler: C source → a shared library (`.so` bytes).
//!
//! Which compiler: `KILN_CC` (a name looked up on `PATH`, or a path) when set, else `clang`
//! when it is on `PATH`, else `cc`.
//!
//! Flags, and why:
//! - `-O3 -march=native`: kernels are built on the machine that runs them, so they may use
//!   every instruction it has. The binary is then only valid for this CPU: the
//!   [`Compiler::fingerprint`] includes the CPU model and a hash of its feature flags, so a
//!   cache shared between machines never serves a binary built for another CPU.
//! - `-fwrapv`: signed integer arithmetic wraps, as the IR says (no UB on overflow).
//! - `-fno-strict-aliasing`: two parameters may be views of one allocation with different
//!   element types.
//! - `-ffp-contract=off`: `a*b + c` is rounded twice unless the kernel says MULACC, so results
//!   are the same at every optimisation level and match a scalar reference exactly.
//! - `-fno-math-errno`: `sqrt` and friends may be single instructions (errno is never read).
//! - `-fPIC -shared -lm`: a loadable library using libm.
//! - `-std=gnu11`: GNU vector extensions, `_Float16` (gcc ≥ 12, clang ≥ 15).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_device::{CompiledSpec, Compiler, Error, ProgramSpec, Result};
use sha2::{Digest, Sha256};

/// The environment variable naming the C compiler to use.
pub const CC_ENV: &str = "KILN_CC";

const FLAGS: &[&str] = &[
    "-std=gnu11",
    "-O3",
    "-march=native",
    "-fPIC",
    "-shared",
    "-fwrapv",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-fno-math-errno",
];

/// A located, working C compiler.
#[derive(Debug, Clone)]
pub struct CCompiler {
    path: PathBuf,
    family: &'static str,
    version: String,
    target: String,
}

impl CCompiler {
    /// Finds the compiler as described in the module docs and checks that it runs.
    pub fn detect() -> Result<CCompiler> {
        match std::env::var_os(CC_ENV) {
            Some(cc) if !cc.is_empty() => Self::with_path(PathBuf::from(cc)),
            _ => match find_on_path("clang") {
                Some(clang) => Self::with_path(clang),
                None => Self::with_path("cc"),
            },
        }
    }

    /// Uses the compiler `program` (a path, or a name looked up on `PATH`); runs
    /// `program --version` to check that it works and to identify it.
    pub fn with_path(program: impl Into<PathBuf>) -> Result<CCompiler> {
        let program = program.into();
        let path = if program.components().count() == 1 {
            find_on_path(&program.to_string_lossy()).unwrap_or(program)
        } else {
            program
        };
        let out = Command::new(&path).arg("--version").output().map_err(|e| missing(&path, &e.to_string()))?;
        if !out.status.success() {
            return Err(missing(&path, &format!("`--version` exited with {}", out.status)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.lines().next().unwrap_or("").trim().to_string();
        let lower = text.to_ascii_lowercase();
        let family = if lower.contains("clang") {
            "clang"
        } else if lower.contains("gcc") || lower.contains("free software foundation") {
            "gcc"
        } else {
            "cc"
        };
        Ok(CCompiler { path, family, version, target: cpu_target() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first line of `--version`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Compiles `src` into a shared library and returns its bytes. `name` names the
    /// temporary files (and appears in diagnostics).
    pub fn compile_source(&self, name: &str, src: &str) -> Result<Vec<u8>> {
        let dir = TempDir::new()?;
        let stem: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        let c_file = dir.path.join(format!("{stem}.c"));
        let so_file = dir.path.join(format!("{stem}.so"));
        std::fs::write(&c_file, src).map_err(|e| Error::Compile {
            message: format!("writing {}: {e}", c_file.display()),
            log: String::new(),
            line: None,
        })?;
        let out = Command::new(&self.path)
            .args(FLAGS)
            .arg("-o")
            .arg(&so_file)
            .arg(&c_file)
            .arg("-lm")
            .output()
            .map_err(|e| missing(&self.path, &e.to_string()))?;
        if !out.status.success() {
            let log = String::from_utf8_lossy(&out.stderr).into_owned();
            let line = offending_line(&log, &format!("{stem}.c"), src);
            return Err(Error::Compile {
                message: format!("{} ({}) rejected kernel `{name}`: {}", self.path.display(), self.version, out.status),
                log,
                line,
            });
        }
        std::fs::read(&so_file).map_err(|e| Error::Compile {
            message: format!("{} reported success but {} cannot be read: {e}", self.path.display(), so_file.display()),
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
            line: None,
        })
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
        format!("{} | {} | {} | {}", self.path.display(), self.version, FLAGS.join(" "), self.target)
    }
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

/// The CPU the binaries are built for: model name and a hash of the feature flags.
fn cpu_target() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
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

/// A private directory under the system temp dir, removed (with its contents) on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new() -> Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let path = base.join(format!("kiln-cpu-{}-{n}-{nanos}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(Error::Compile {
                        message: format!("cannot create a temporary directory in {}: {e}", base.display()),
                        log: String::new(),
                        line: None,
                    });
                }
            }
        }
        Err(Error::Compile {
            message: format!("cannot create a unique temporary directory in {}", base.display()),
            log: String::new(),
            line: None,
        })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in /tmp is harmless.
        let _ = std::fs::remove_dir_all(&self.path);
    }
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
        assert!(cc.fingerprint().contains(cc.version()));
        assert!(["gcc", "clang", "cc"].contains(&cc.cache_key()));
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
}
