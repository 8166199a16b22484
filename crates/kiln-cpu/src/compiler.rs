//! The system C compiler: C source → a relocatable object (x86-64) or a shared library (`.so`
//! bytes, elsewhere).
//!
//! Which compiler: `KILN_CC` (a name looked up on `PATH`, or a path) when set, else `clang`
//! when it is on `PATH`, else `cc`. [`CCompiler::choice`] says which rule picked it (the CPU
//! device's description, and so `kiln devices`, shows it). Every compiler that accepts GNU C11
//! with vector extensions works: gcc ≥ 12 and clang ≥ 14 are tested; kernels need no
//! `_Float16` (see [`crate::renderer`]), which clang before 15 lacks on x86-64.
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
//!   that links no C library and no start files, only libgcc's helpers (e.g. 128-bit
//!   division, should a compiler call one). Kernels include no system header either (the
//!   renderer declares what they use): the libm functions the compiler does not inline
//!   (`expf`, `sinf`, `powf`, ...) are bound when the kernel is loaded (see [`crate::program`]).
//! - `-fno-asynchronous-unwind-tables`: no `.eh_frame`; kernels are never unwound through.
//! - `-pipe`: the assembler reads the compiler's output from a pipe, not a temporary file
//!   (also when the commands are replayed: the pipe is made here).
//! - `-std=gnu11`: GNU vector extensions (gcc ≥ 12, clang ≥ 14).
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
//! **The driver runs once per compiler, not once per kernel.** `gcc`/`clang` are drivers: they
//! work out the commands of a compile (`cc1 | as`, then `collect2`/`ld`; `clang -cc1`, then
//! `ld`), detect `-march=native` and start each one. The first compile asks the driver for
//! those commands once (`-###`, with `TMPDIR` pointing at a private folder, on a source named
//! like a kernel's), and every compile then runs them itself, with its own scratch folder and
//! file names in place of the probe's (the driver's temporary names lie in the probe's folder,
//! so they become private per compile too) and the variables the driver would set
//! (`COLLECT_GCC_OPTIONS`, `COMPILER_PATH`, ...). Whatever commands the flags produce are
//! replayed, with or without a link. A listing whose shape is not recognised (see
//! `recognise`), or a probe the compiler rejects, leaves every compile to the driver as
//! before. Measured (gcc 12, the `compile_cold` kernel, CPU time of the process tree, median
//! of 15 interleaved runs on the loaded 2-core machine): the driver path 30.8 ms, the replay
//! 28.6 (`cc1` 21, of which 9.5 for an empty file; `as` 2.5; `collect2` + `ld` 4.5); for
//! clang 14 (unpacked, libLLVM loaded per process) 67 ms against 39. Not taken, because
//! they measured the same within noise: `-fno-asynchronous-unwind-tables` (`cc1` and `as`),
//! and feeding the source to `cc1` on its standard input instead of a file.
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
//! (`KILN_COMPILE_TIMEOUT` seconds, default 60, for all the commands of a compile together)
//! is killed with every process it started (each pipeline of commands runs in its own process
//! group) and the compile fails with [`Error::Compile`].
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
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant};

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

/// Linked after the source: libgcc (static) for the helpers the compiler may call (e.g.
/// 128-bit division). An object links nothing: the loader binds those helpers to
/// `libgcc_s.so.1` (see [`crate::program`]).
const LIBS: &[&str] = if OBJECT { &[] } else { &["-lgcc"] };

/// A located C compiler. Locating it starts no process (see the module docs).
#[derive(Debug, Clone)]
pub struct CCompiler {
    /// Canonical: the file that actually runs.
    path: PathBuf,
    family: &'static str,
    /// Why this compiler: which rule of [`CCompiler::detect`] picked it (see [`CCompiler::choice`]).
    choice: String,
    /// The path with the file's size, mtime, device and inode.
    identity: String,
    target: String,
    /// The instruction set kernels are compiled for (its `-march` flags).
    isa: IsaTarget,
    timeout: Duration,
    /// The first line of `--version`, read on first use.
    version: OnceLock<String>,
    /// How kernels are compiled, decided by the first compile (see [`CCompiler::plan`]);
    /// shared by clones, reset by [`CCompiler::with_isa`] (other flags, other commands).
    plan: Arc<Mutex<Option<Arc<Plan>>>>,
}

impl CCompiler {
    /// Finds the compiler as described in the module docs, with the timeout from
    /// `KILN_COMPILE_TIMEOUT` and the instruction set from `KILN_CPU_ISA`. A malformed timeout
    /// is an [`Error::Invalid`], a bad or unsupported instruction set an [`Error::Config`].
    pub fn detect() -> Result<CCompiler> {
        let timeout = compile_timeout(std::env::var(COMPILE_TIMEOUT_ENV).ok().as_deref())?;
        let isa = IsaTarget::from_env()?;
        let (cc, choice) = match std::env::var_os(CC_ENV) {
            Some(cc) if !cc.is_empty() => {
                let choice = format!("{CC_ENV}={}", cc.to_string_lossy());
                (Self::with_path(PathBuf::from(cc))?, choice)
            }
            _ => match find_on_path("clang") {
                Some(clang) => (Self::with_path(clang)?, format!("clang found on PATH; {CC_ENV} unset")),
                None => (Self::with_path("cc")?, format!("cc found on PATH, no clang; {CC_ENV} unset")),
            },
        };
        Ok(CCompiler { choice, ..cc }.with_timeout(timeout).with_isa(isa))
    }

    /// Uses the compiler `program` (a path, or a name looked up on `PATH`) with the default
    /// timeout. Fails with [`Error::CompilerMissing`] when it is not an executable file;
    /// whether it works is found out by the first compile.
    pub fn with_path(program: impl Into<PathBuf>) -> Result<CCompiler> {
        let program = program.into();
        let choice = format!("given as {}", program.display());
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
        let identity = file_identity(&path, &meta);
        Ok(CCompiler {
            family: family(&path),
            choice,
            path,
            identity,
            target: cpu_target(),
            isa: IsaTarget::native(),
            timeout: DEFAULT_COMPILE_TIMEOUT,
            version: OnceLock::new(),
            plan: Arc::default(),
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
        self.plan = Arc::default();
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

    /// Why this compiler is the one used, for people reading a device description or a
    /// failure: `KILN_CC=gcc`, `clang found on PATH; KILN_CC unset`, `cc found on PATH, no
    /// clang; KILN_CC unset`, or `given as PATH` for [`CCompiler::with_path`]. The resolved
    /// file is [`CCompiler::path`]: `cc` or `clang` is often a link to a versioned compiler.
    pub fn choice(&self) -> &str {
        &self.choice
    }

    /// The first line of `--version`, or why it could not be read. Runs the compiler on the
    /// first call only.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| {
            let mut cmd = Command::new(&self.path);
            cmd.arg("--version");
            match self.run(cmd, "--version") {
                Ok(out) if out.status.success() => {
                    String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string()
                }
                Ok(out) => format!("version unknown: `--version` exited with {}", out.status),
                Err(e) => format!("version unknown: {e}"),
            }
        })
    }

    /// Compiles `src` into an object or a shared library (`OBJECT`) and returns its bytes. `name` names the
    /// temporary files (and appears in diagnostics).
    pub fn compile_source(&self, name: &str, src: &str) -> Result<Vec<u8>> {
        let stem: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        let plan = self.plan()?;
        self.compile_with(&plan, name, &stem, src)
    }

    /// [`Self::compile_source`] the way `plan` says.
    fn compile_with(&self, plan: &Plan, name: &str, stem: &str, src: &str) -> Result<Vec<u8>> {
        let dir = scratch_dir().map_err(|e| scratch_err("cannot create a private scratch folder", e))?;
        let (c_file, out_file) = kernel_files(dir.path(), stem);
        fs::write(&c_file, src).map_err(|e| scratch_err(&format!("writing {}", c_file.display()), e))?;
        let what = format!("compiling kernel `{name}`");
        let out = match plan {
            Plan::Driver => self.run(self.kernel_command(&c_file, &out_file), &what)?,
            Plan::Replay { stages, probe_dir } => {
                let here = dir.path().to_str().ok_or_else(|| {
                    scratch_err("the scratch folder's path is not UTF-8", std::io::ErrorKind::InvalidInput.into())
                })?;
                let fill = |text: &str| replay_text(text, probe_dir, here, stem);
                // `parse_commands` accepted no trailing pipe: every pipeline ends.
                let (mut pipelines, mut pipeline) = (Vec::new(), Vec::new());
                for stage in stages {
                    let mut cmd = Command::new(&stage.program);
                    cmd.args(stage.args.iter().map(|a| fill(a)));
                    cmd.envs(stage.env.iter().map(|(k, v)| (k, fill(v))));
                    pipeline.push(cmd);
                    if !stage.pipe {
                        pipelines.push(std::mem::take(&mut pipeline));
                    }
                }
                self.run_pipelines(pipelines, &what)?
            }
        };
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
        fs::read(&out_file).map_err(|e| Error::Compile {
            message: format!("{} reported success but {} cannot be read: {e}", self.path.display(), out_file.display()),
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
            line: None,
        })
    }

    /// How this compiler's kernel compiles run: found out by the first compile (one `-###`
    /// run of the driver), then kept. A probe that could not run (a missing or hung compiler)
    /// is an error and is tried again by the next compile.
    fn plan(&self) -> Result<Arc<Plan>> {
        let mut slot = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(plan) = &*slot {
            return Ok(plan.clone());
        }
        let plan = Arc::new(self.probe()?);
        *slot = Some(plan.clone());
        Ok(plan)
    }

    /// Asks the driver (`-###`, with `TMPDIR` set to a private folder) which commands it runs
    /// for a kernel compile, on an empty source named like a kernel's. [`Plan::Driver`] when it
    /// fails or prints a shape [`recognise`] does not accept.
    fn probe(&self) -> Result<Plan> {
        let dir = scratch_dir().map_err(|e| scratch_err("cannot create a private scratch folder", e))?;
        let (c_file, out_file) = kernel_files(dir.path(), PROBE_STEM);
        fs::write(&c_file, "").map_err(|e| scratch_err(&format!("writing {}", c_file.display()), e))?;
        let mut cmd = self.kernel_command(&c_file, &out_file);
        cmd.arg("-###").env("TMPDIR", dir.path());
        let out = self.run(cmd, "listing the commands of a compile (`-###`)")?;
        let (Some(probe_dir), Some(c_file), Some(out_file)) = (dir.path().to_str(), c_file.to_str(), out_file.to_str())
        else {
            return Ok(Plan::Driver);
        };
        let stages = out
            .status
            .success()
            .then(|| parse_commands(&String::from_utf8_lossy(&out.stderr)))
            .flatten()
            .and_then(|stages| recognise(stages, probe_dir, c_file, out_file, &resolve_program, &|p| p.exists()));
        Ok(stages.map_or(Plan::Driver, |stages| Plan::Replay { stages, probe_dir: probe_dir.to_string() }))
    }

    /// The compiler with the flags of every kernel compile: [`FLAGS`] and the instruction
    /// set's `-march` flags.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.args(FLAGS).args(self.isa.march_flags());
        cmd
    }

    /// The driver command compiling `c_file` into `out_file`.
    fn kernel_command(&self, c_file: &Path, out_file: &Path) -> Command {
        let mut cmd = self.command();
        cmd.arg("-o").arg(out_file).arg(c_file).args(LIBS);
        cmd
    }

    /// Runs the compiler as `cmd` (doing `what`), as [`Self::run_pipelines`] does.
    fn run(&self, cmd: Command, what: &str) -> Result<Output> {
        self.run_pipelines(vec![vec![cmd]], what)
    }

    /// Runs `pipelines` one after another, up to the first that fails, all within the timeout.
    /// In a pipeline each command's standard output feeds the next one's input; they form one
    /// process group, and at the deadline that group and every process it started are killed.
    /// The last commands' standard output and every command's standard error go to unnamed
    /// temporary files (never pipes, which a surviving grandchild could hold open). The
    /// status is the first failing command's, else the last one's.
    fn run_pipelines(&self, pipelines: Vec<Vec<Command>>, what: &str) -> Result<Output> {
        let capture_err = |e: std::io::Error| Error::Compile {
            message: format!("cannot create a temporary file for the compiler's output: {e}"),
            log: String::new(),
            line: None,
        };
        let (mut stdout, mut stderr) =
            (tempfile::tempfile().map_err(capture_err)?, tempfile::tempfile().map_err(capture_err)?);
        let deadline = Instant::now() + self.timeout;
        let mut status = None;
        for pipeline in pipelines {
            let done = self.run_pipeline(pipeline, &stdout, &stderr, deadline, what)?;
            status = Some(done);
            if !done.success() {
                break;
            }
        }
        let status = status.ok_or_else(|| missing(&self.path, "there was no command to run"))?;
        Ok(Output { status, stdout: read_capture(&mut stdout), stderr: read_capture(&mut stderr) })
    }

    /// One pipeline of [`Self::run_pipelines`].
    fn run_pipeline(
        &self,
        cmds: Vec<Command>,
        stdout: &File,
        stderr: &File,
        deadline: Instant,
        what: &str,
    ) -> Result<ExitStatus> {
        let capture_err = |e: std::io::Error| Error::Compile {
            message: format!("cannot share the compiler's output file: {e}"),
            log: String::new(),
            line: None,
        };
        let last = cmds.len().saturating_sub(1);
        let mut children: Vec<Child> = Vec::with_capacity(cmds.len());
        let mut group: Option<Pid> = None;
        let mut feed: Option<ChildStdout> = None;
        for (i, mut cmd) in cmds.into_iter().enumerate() {
            let out = if i == last { Stdio::from(stdout.try_clone().map_err(capture_err)?) } else { Stdio::piped() };
            cmd.stdin(feed.take().map_or_else(Stdio::null, Stdio::from))
                .stdout(out)
                .stderr(stderr.try_clone().map_err(capture_err)?)
                .process_group(group.map_or(0, |g| g.as_raw_nonzero().get()));
            match cmd.spawn() {
                Ok(mut child) => {
                    group = group.or(Pid::from_raw(child.id() as i32));
                    feed = child.stdout.take();
                    children.push(child);
                }
                Err(e) => {
                    kill_all(group, &children);
                    children.iter_mut().for_each(|c| drop(c.wait()));
                    return Err(missing(Path::new(cmd.get_program()), &e.to_string()));
                }
            }
            // `cmd` drops here, closing this process's copy of the pipe's read end.
        }
        drop(feed);
        let pids: Vec<Pid> = children.iter().filter_map(|c| Pid::from_raw(c.id() as i32)).collect();
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let statuses: std::io::Result<Vec<ExitStatus>> = children.iter_mut().map(Child::wait).collect();
            tx.send(statuses)
        });
        let statuses = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(statuses) => statuses,
            Err(RecvTimeoutError::Timeout) => {
                // Each pipeline leads its own process group: killing the group reaches the
                // compiler proper, the assembler and the linker they started. Its commands
                // are killed too, in case one left the group.
                kill_pids(group, &pids);
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
        let failed = statuses.iter().find(|s| !s.success());
        failed.or(statuses.last()).copied().ok_or_else(|| missing(&self.path, "there was no command to run"))
    }
}

/// How kernel compiles run (decided by [`CCompiler::probe`]).
#[derive(Debug)]
enum Plan {
    /// The commands the driver printed for the probe, with the probe's scratch folder and
    /// file stem replaced by the kernel's in every argument and variable (see [`replay_text`]).
    Replay { stages: Vec<Stage>, probe_dir: String },
    /// The driver itself, as `$CC <flags> -o <out> <source>`.
    Driver,
}

/// One command of a compile as the driver's `-###` printed it.
#[derive(Debug, Clone, PartialEq)]
struct Stage {
    program: String,
    args: Vec<String>,
    /// The variables the driver sets before it (`NAME=value` lines of `-###`).
    env: Vec<(String, String)>,
    /// Its standard output is the next command's input (the line ends with ` |`).
    pipe: bool,
}

/// The file stem of the probe's source and output, replaced by each kernel's.
const PROBE_STEM: &str = "kiln_probe_kernel";

/// What ends a path inside an argument or variable of a `-###` listing (`-o /a/b`,
/// `-fresolution=/a/b`, `COLLECT_GCC_OPTIONS='-o' '/a/b'`).
const PATH_ENDS: [char; 5] = [' ', '=', ':', '\'', '"'];

/// `text`, an argument or variable of the probe's commands, for a kernel's compile: the probe's
/// scratch folder `probe_dir` becomes the kernel's `here`, and the probe's file stem becomes
/// `stem` where it is a file name (the last component of a path, `kiln_probe_kernel.c`,
/// `kiln_probe_kernel-a43536.o`), never in a folder's name. One pass, left to right, so that
/// neither replacement sees the other's output: a `TMPDIR` such as `/tmp/kiln_probe_kernel`
/// (which both scratch folders lie in) is left alone.
fn replay_text(text: &str, probe_dir: &str, here: &str, stem: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix(probe_dir).filter(|_| !probe_dir.is_empty()) {
            out.push_str(here);
            rest = after;
        } else if let Some(after) = rest.strip_prefix(PROBE_STEM)
            && !after.split(PATH_ENDS).next().is_some_and(|tail| tail.contains('/'))
        {
            out.push_str(stem);
            rest = after;
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// A kernel's source and output files in the scratch folder `dir`.
/// A file as a cache key sees it: its path, size, modification time and inode, so a program or
/// library replaced in place (an upgrade) never serves binaries the old one made.
pub(crate) fn file_identity(path: &Path, meta: &fs::Metadata) -> String {
    format!(
        "{} size={} mtime={}.{:09} dev={} ino={}",
        path.display(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.dev(),
        meta.ino()
    )
}

fn kernel_files(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{stem}.c")), dir.join(format!("{stem}.{}", if OBJECT { "o" } else { "so" })))
}

fn scratch_err(what: &str, e: std::io::Error) -> Error {
    Error::Compile { message: format!("{what}: {e}; set TMPDIR to a writable folder"), log: String::new(), line: None }
}

/// Kills process group `group` and the processes `pids` (best effort: they may be gone).
fn kill_pids(group: Option<Pid>, pids: &[Pid]) {
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    }
    for &pid in pids {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
}

fn kill_all(group: Option<Pid>, children: &[Child]) {
    let pids: Vec<Pid> = children.iter().filter_map(|c| Pid::from_raw(c.id() as i32)).collect();
    kill_pids(group, &pids);
}

/// The commands in the output of `$CC ... -###`: lines that start with a space are commands
/// (quoted as gcc and clang quote them: `"..."` with backslash escapes), `NAME=value` lines
/// set a variable for the commands after them, and anything else (version, target, ...) is
/// information. `None` when a command line cannot be split, there is no command, or the last
/// one pipes into nothing.
fn parse_commands(text: &str) -> Option<Vec<Stage>> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut stages = Vec::new();
    for line in text.lines() {
        if let Some(command) = line.strip_prefix(' ') {
            let command = command.trim();
            // clang says which commands it would run in its own process; all run as processes here.
            if command == "(in-process)" {
                continue;
            }
            let (command, pipe) = command.strip_suffix(" |").map_or((command, false), |c| (c, true));
            let mut words = split_words(command)?.into_iter();
            let program = words.next()?;
            stages.push(Stage { program, args: words.collect(), env: env.clone(), pipe });
        } else if let Some((name, value)) = line.split_once('=') {
            let is_name = name.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
                && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if is_name {
                env.retain(|(n, _)| n != name);
                env.push((name.to_string(), value.to_string()));
            }
        }
    }
    (!stages.is_empty() && stages.last().is_some_and(|s| !s.pipe)).then_some(stages)
}

/// `line` split into words: blanks separate them, `"..."` quotes (in which `\` escapes the
/// next character). `None` for an unterminated quote.
fn split_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    let mut word: Option<String> = None;
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => words.extend(word.take()),
            '"' => {
                let word = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => word.push(chars.next()?),
                        c => word.push(c),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Some(words)
}

/// The probe's `stages` when they can be replayed for every kernel: the source `c_file` is an
/// argument of one of them, the output `out_file` an argument of the last, every program is
/// found (`resolve`: its absolute path), and no argument or variable names a file in a
/// temporary folder other than the probe's `probe_dir` that does not exist (`exists`): a
/// name invented per run, which concurrent compiles would share.
fn recognise(
    mut stages: Vec<Stage>,
    probe_dir: &str,
    c_file: &str,
    out_file: &str,
    resolve: &dyn Fn(&str) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Option<Vec<Stage>> {
    let temp_dirs = [std::env::temp_dir().to_string_lossy().into_owned(), "/tmp".to_string()];
    let invented = |text: &str| {
        text.split(PATH_ENDS).any(|word| {
            let word = word.strip_prefix("-L").or_else(|| word.strip_prefix("-I")).unwrap_or(word);
            let in_temp = temp_dirs.iter().any(|t| Path::new(word).starts_with(t));
            in_temp && !Path::new(word).starts_with(probe_dir) && !exists(Path::new(word))
        })
    };
    let reads_source = stages.iter().any(|s| s.args.iter().any(|a| a == c_file));
    let writes_output = stages.last()?.args.iter().any(|a| a == out_file);
    if !reads_source || !writes_output {
        return None;
    }
    for stage in &mut stages {
        if stage.args.iter().any(|a| invented(a)) || stage.env.iter().any(|(_, v)| invented(v)) {
            return None;
        }
        stage.program = resolve(&stage.program)?;
    }
    Some(stages)
}

/// A program of a `-###` command as an absolute path: an absolute path that is an executable
/// file, or a bare name found on `PATH` (as the driver looks it up).
fn resolve_program(program: &str) -> Option<String> {
    let path = if program.contains('/') { PathBuf::from(program) } else { find_on_path(program)? };
    let meta = fs::metadata(&path).ok()?;
    let runnable = path.is_absolute() && meta.is_file() && meta.mode() & 0o111 != 0;
    runnable.then(|| path.to_str().map(str::to_string)).flatten()
}

impl Compiler for CCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let bytes = self.compile_source(&spec.name, &spec.src)?;
        Ok(CompiledSpec { name: spec.name.clone(), bytes, spec: Arc::new(spec.clone()) })
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
pub(crate) fn cpu_target() -> String {
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
    fn the_choice_of_compiler_is_explained() {
        let cc = CCompiler::detect().unwrap();
        match std::env::var_os(CC_ENV).filter(|v| !v.is_empty()) {
            Some(v) => assert_eq!(cc.choice(), format!("{CC_ENV}={}", v.to_string_lossy())),
            None if find_on_path("clang").is_some() => assert_eq!(cc.choice(), "clang found on PATH; KILN_CC unset"),
            None => assert_eq!(cc.choice(), "cc found on PATH, no clang; KILN_CC unset"),
        }
        let given = CCompiler::with_path(cc.path()).unwrap();
        assert_eq!(given.choice(), format!("given as {}", cc.path().display()));
    }

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
        let src = crate::cpu_renderer().render(&b.finish().unwrap(), Some("wide")).unwrap().src;
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

    /// The bf16 and f16 WMMA micro-tiles use AVX512-BF16's `vdpbf16ps` and AVX512-FP16's
    /// `vfmadd231ph` where the host has them, and a forced AVX-512 build (`x86-64-v4`, which
    /// has neither) the portable f32 body.
    #[test]
    fn wmma_tiles_use_the_matrix_instructions_the_cpu_has() {
        use crate::isa::{Isa, IsaTarget, MatrixUnits};
        use kiln_device::Renderer;
        use kiln_device::kiln_ir::{KernelBuilder, Scalar, Wmma};
        let mut b = KernelBuilder::new();
        for (slot, (input, acc)) in [(Scalar::BF16, Scalar::F32), (Scalar::F16, Scalar::F16)].into_iter().enumerate() {
            let w = Wmma::single(4, 16, 4, input, acc);
            let p = |b: &mut KernelBuilder, i: usize, s: Scalar| b.param(4 * slot + i, s, 64);
            let (pa, pb, pc, pd) = (p(&mut b, 0, input), p(&mut b, 1, input), p(&mut b, 2, acc), p(&mut b, 3, acc));
            let zero = kiln_device::kiln_ir::Val::int(0);
            let (a, bb, c) = (pa.at_vec(&zero, 16).load(), pb.at_vec(&zero, 64).load(), pc.at_vec(&zero, 64).load());
            b.store(&pd.at_vec(&zero, 64), &a.wmma(&bb, &c, w));
        }
        let src = crate::cpu_renderer().render(&b.finish().unwrap(), Some("k")).unwrap().src;
        let cc = CCompiler::detect().unwrap();
        let native = assembly(&cc, &src);
        let units = MatrixUnits::of(IsaTarget::native());
        assert_eq!(native.contains("vdpbf16ps"), units.avx512_bf16, "{units:?}");
        assert_eq!(native.contains("vfmadd231ph"), units.avx512_fp16, "{units:?}");
        if let Ok(avx512) = IsaTarget::force(Isa::Avx512) {
            let forced = assembly(&cc.with_isa(avx512), &src);
            assert!(!forced.contains("vdpbf16ps") && !forced.contains("vfmadd231ph"));
        }
    }

    #[test]
    fn kernels_include_no_system_header_and_declare_every_math_function() {
        use kiln_cstyle::MathFn;
        use kiln_device::Renderer;
        use kiln_device::kiln_ir::{KernelBuilder, Scalar};
        let mut b = KernelBuilder::new();
        let a = b.param(0, Scalar::F32, 8);
        let i = b.special("gidx0", 8);
        b.store(&a.at(&i), &(a.at(&i).load() * 2.0));
        let src = crate::cpu_renderer().render(&b.finish().unwrap(), Some("k")).unwrap().src;
        assert!(!src.contains("#include"), "{src}");
        use MathFn::*;
        // (MAX and MIN are kiln's own functions: `CpuDialect::max_min`)
        for f in [Sqrt, Exp2, Log2, Exp, Log, Sin, Cos, Trunc, Fabs, Pow, Fma] {
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
        // Each compiler is asked for its commands (`-###`) first; good-cc's are then replayed,
        // bad-cc fails that and runs as the driver.
        let seen = lines(&log);
        assert_eq!(seen.len(), 3, "{seen:?}");
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
        // The compiler lists no command (so it runs as the driver), starts a child (as gcc
        // starts cc1) and both hang.
        let body =
            format!("{LISTS_NOTHING}\n{FIND_OUTPUT}\nsleep 600 &\necho \"$scratch $!\" > '{}'\nwait", log.display());
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

    /// Shell that answers `-###` with no command, so the compiler runs as the driver.
    const LISTS_NOTHING: &str = "for a in \"$@\"; do [ \"$a\" = '-###' ] && exit 0; done";

    const PROBE_DIR: &str = "/tmp/kiln-cpu-4242-AbC123";
    const PROBE_C: &str = "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.c";
    const PROBE_SO: &str = "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so";

    /// `gcc-12 <FLAGS> -march=native -o PROBE_SO PROBE_C -lgcc -###` with `TMPDIR=PROBE_DIR`
    /// (long lines shortened).
    const GCC_SHARED: &str = r#"Using built-in specs.
COLLECT_GCC=gcc
COLLECT_LTO_WRAPPER=/usr/lib/gcc/x86_64-linux-gnu/12/lto-wrapper
OFFLOAD_TARGET_NAMES=nvptx-none:amdgcn-amdhsa
Target: x86_64-linux-gnu
Configured with: ../src/configure -v --with-pkgversion='Debian 12.2.0-14+deb12u1' --enable-languages=c,ada,c++
Thread model: posix
Supported LTO compression algorithms: zlib zstd
gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) 
COLLECT_GCC_OPTIONS='-std=gnu11' '-O3' '-fPIC' '-shared' '-nostdlib' '-pipe' '-march=native' '-o' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so' '-dumpdir' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so-'
 /usr/lib/gcc/x86_64-linux-gnu/12/cc1 -quiet -imultiarch x86_64-linux-gnu /tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.c "-march=znver3" -mmmx -mno-avx512fp16 --param "l1-cache-size=32" "-mtune=znver3" -quiet -dumpdir /tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so- -dumpbase kiln_probe_kernel.c -dumpbase-ext .c -O3 "-std=gnu11" -fPIC -fwrapv "-ffp-contract=off" -fasynchronous-unwind-tables -o - |
 as --64 -o /tmp/kiln-cpu-4242-AbC123/ccnhz2yI.o
COMPILER_PATH=/usr/lib/gcc/x86_64-linux-gnu/12/:/usr/lib/gcc/x86_64-linux-gnu/
LIBRARY_PATH=/usr/lib/gcc/x86_64-linux-gnu/12/:/lib/x86_64-linux-gnu/:/usr/lib/
COLLECT_GCC_OPTIONS='-std=gnu11' '-O3' '-fPIC' '-shared' '-nostdlib' '-pipe' '-march=native' '-o' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so' '-dumpdir' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so.'
 /usr/lib/gcc/x86_64-linux-gnu/12/collect2 -plugin /usr/lib/gcc/x86_64-linux-gnu/12/liblto_plugin.so "-plugin-opt=/usr/lib/gcc/x86_64-linux-gnu/12/lto-wrapper" "-plugin-opt=-fresolution=/tmp/kiln-cpu-4242-AbC123/ccfj6l2l.res" --build-id --eh-frame-hdr -m elf_x86_64 "--hash-style=gnu" --as-needed -shared -o /tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so -L/usr/lib/gcc/x86_64-linux-gnu/12 -L/lib/../lib /tmp/kiln-cpu-4242-AbC123/ccnhz2yI.o -lgcc
COLLECT_GCC_OPTIONS='-std=gnu11' '-O3' '-fPIC' '-shared' '-nostdlib' '-pipe' '-march=native' '-o' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so' '-dumpdir' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so.'
"#;

    /// `gcc-12 <FLAGS with -c, not -shared> -o PROBE_SO PROBE_C -###` (an object: no link).
    const GCC_OBJECT: &str = r#"gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) 
COLLECT_GCC_OPTIONS='-std=gnu11' '-O3' '-fPIC' '-c' '-pipe' '-o' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so' '-dumpdir' '/tmp/kiln-cpu-4242-AbC123/'
 /usr/lib/gcc/x86_64-linux-gnu/12/cc1 -quiet -imultiarch x86_64-linux-gnu /tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.c -quiet -dumpdir /tmp/kiln-cpu-4242-AbC123/ -dumpbase kiln_probe_kernel.c -dumpbase-ext .c -O3 "-std=gnu11" -fPIC -fasynchronous-unwind-tables -o - |
 as --64 -o /tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so
COMPILER_PATH=/usr/lib/gcc/x86_64-linux-gnu/12/:/usr/lib/gcc/x86_64-linux-gnu/
LIBRARY_PATH=/usr/lib/gcc/x86_64-linux-gnu/12/:/lib/x86_64-linux-gnu/:/usr/lib/
COLLECT_GCC_OPTIONS='-std=gnu11' '-O3' '-fPIC' '-c' '-pipe' '-o' '/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so' '-dumpdir' '/tmp/kiln-cpu-4242-AbC123/'
"#;

    /// `clang-14 <FLAGS> -march=native -c -o PROBE_SO PROBE_C -###` (an object, no link; long
    /// lines shortened).
    const CLANG_OBJECT: &str = r#"Debian clang version 14.0.6
Target: x86_64-pc-linux-gnu
Thread model: posix
InstalledDir: /usr/lib/llvm-14/bin
 (in-process)
 "/usr/lib/llvm-14/bin/clang" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-emit-obj" "-main-file-name" "kiln_probe_kernel.c" "-target-cpu" "znver3" "-target-feature" "+avx512f" "-fcoverage-compilation-dir=/work" "-resource-dir" "/usr/lib/llvm-14/lib/clang/14.0.6" "-internal-externc-isystem" "/include" "-O3" "-std=gnu11" "-D__GCC_HAVE_DWARF2_CFI_ASM=1" "-o" "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so" "-x" "c" "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.c"
"#;

    /// `clang-14 <FLAGS> -march=native -shared -o PROBE_SO PROBE_C -lgcc -###` (shortened).
    const CLANG_SHARED: &str = r#"Debian clang version 14.0.6
Target: x86_64-pc-linux-gnu
Thread model: posix
InstalledDir: /usr/lib/llvm-14/bin
 "/usr/lib/llvm-14/bin/clang" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-emit-obj" "-main-file-name" "kiln_probe_kernel.c" "-O3" "-o" "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel-a43536.o" "-x" "c" "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.c"
 "/usr/bin/ld" "--hash-style=both" "--build-id" "-m" "elf_x86_64" "-shared" "-o" "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so" "-L/usr/lib/gcc/x86_64-linux-gnu/12" "/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel-a43536.o" "-lgcc"
"#;

    /// Every program resolves (bare names to /usr/bin) and no file exists.
    fn recognise_anything(stages: Vec<Stage>) -> Option<Vec<Stage>> {
        let resolve = |p: &str| Some(if p.starts_with('/') { p.to_string() } else { format!("/usr/bin/{p}") });
        recognise(stages, PROBE_DIR, PROBE_C, PROBE_SO, &resolve, &|_| false)
    }

    #[test]
    fn gcc_listings_are_parsed_into_a_pipe_and_a_link() {
        let stages = recognise_anything(parse_commands(GCC_SHARED).unwrap()).unwrap();
        let programs: Vec<&str> = stages.iter().map(|s| s.program.as_str()).collect();
        assert_eq!(
            programs,
            ["/usr/lib/gcc/x86_64-linux-gnu/12/cc1", "/usr/bin/as", "/usr/lib/gcc/x86_64-linux-gnu/12/collect2"]
        );
        assert_eq!(stages.iter().map(|s| s.pipe).collect::<Vec<_>>(), [true, false, false]);
        let cc1 = &stages[0].args;
        assert_eq!(&cc1[..4], ["-quiet", "-imultiarch", "x86_64-linux-gnu", PROBE_C]);
        assert!(cc1.iter().any(|a| a == "-march=znver3") && cc1.iter().any(|a| a == "l1-cache-size=32"), "{cc1:?}");
        assert_eq!(&cc1[cc1.len() - 2..], ["-o", "-"]);
        assert_eq!(stages[1].args, ["--64", "-o", "/tmp/kiln-cpu-4242-AbC123/ccnhz2yI.o"]);
        assert!(stages[2].args.contains(&"-plugin-opt=-fresolution=/tmp/kiln-cpu-4242-AbC123/ccfj6l2l.res".into()));
        let env = |stage: &Stage, name: &str| stage.env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        assert_eq!(env(&stages[0], "COLLECT_GCC").as_deref(), Some("gcc"));
        assert!(env(&stages[0], "COLLECT_GCC_OPTIONS").unwrap().ends_with("kiln_probe_kernel.so-'"));
        assert_eq!(env(&stages[0], "COMPILER_PATH"), None, "set after cc1 and as");
        assert!(env(&stages[2], "COLLECT_GCC_OPTIONS").unwrap().ends_with("kiln_probe_kernel.so.'"));
        assert!(env(&stages[2], "COMPILER_PATH").is_some() && env(&stages[2], "LIBRARY_PATH").is_some());
        let object = recognise_anything(parse_commands(GCC_OBJECT).unwrap()).unwrap();
        let programs: Vec<&str> = object.iter().map(|s| s.program.as_str()).collect();
        assert_eq!(programs, ["/usr/lib/gcc/x86_64-linux-gnu/12/cc1", "/usr/bin/as"], "no link with -c");
        assert_eq!(object[1].args, ["--64", "-o", PROBE_SO]);
        for info in ["Target", "Thread model", "Configured with"] {
            assert!(stages.iter().all(|s| s.env.iter().all(|(n, _)| !n.starts_with(info))), "{info}");
        }
    }

    #[test]
    fn clang_listings_are_parsed_with_every_argument_unquoted() {
        let object = recognise_anything(parse_commands(CLANG_OBJECT).unwrap()).unwrap();
        assert_eq!(object.len(), 1, "`(in-process)` is not a command");
        assert_eq!(object[0].program, "/usr/lib/llvm-14/bin/clang");
        assert_eq!(&object[0].args[..3], ["-cc1", "-triple", "x86_64-pc-linux-gnu"]);
        assert_eq!(object[0].args.last().map(String::as_str), Some(PROBE_C));
        assert!(object[0].env.is_empty() && !object[0].pipe);
        let shared = recognise_anything(parse_commands(CLANG_SHARED).unwrap()).unwrap();
        assert_eq!(
            shared.iter().map(|s| s.program.as_str()).collect::<Vec<_>>(),
            ["/usr/lib/llvm-14/bin/clang", "/usr/bin/ld"]
        );
        assert!(shared[1].args.contains(&"/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel-a43536.o".to_string()));
    }

    #[test]
    fn words_are_split_as_gcc_and_clang_quote_them() {
        assert_eq!(split_words(r#"a "b c" "-D\"x\"" d\e "" "\\""#).unwrap(), ["a", "b c", "-D\"x\"", "d\\e", "", "\\"]);
        assert_eq!(split_words("  a\tb  ").unwrap(), ["a", "b"]);
        assert_eq!(split_words(r#"a "b"#), None);
        assert_eq!(split_words(r#"a "b\"#), None);
    }

    /// Shapes that are not replayed: the compile then runs as the driver.
    #[test]
    fn unrecognised_listings_are_not_replayed() {
        let recognised = |text: &str| parse_commands(text).and_then(recognise_anything).is_some();
        assert!(recognised(GCC_SHARED) && recognised(CLANG_SHARED));
        let gcc_c = GCC_SHARED.replace("/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.c", "k.c");
        let clang_out = CLANG_SHARED.replace("\"-o\" \"/tmp/kiln-cpu-4242-AbC123/kiln_probe_kernel.so\"", "");
        let trailing_pipe = GCC_SHARED.lines().take(11).collect::<Vec<_>>().join("\n");
        for (why, text) in [
            ("no command", "gcc version 12\nTarget: x86_64-linux-gnu\n".to_string()),
            ("nothing", String::new()),
            ("an unterminated quote", CLANG_OBJECT.replace("kernel.c\"\n", "kernel.c\n")),
            ("the last command pipes into nothing", trailing_pipe),
            ("the source is not an argument", gcc_c),
            ("the output is not the last command's", clang_out),
            ("a temporary file outside the probe's folder", GCC_SHARED.replace("AbC123/ccnhz2yI.o", "X/ccnhz2yI.o")),
            (
                "a temporary file in a variable",
                GCC_SHARED.replace("'-dumpdir' '/tmp/kiln-cpu-4242-AbC123", "'/tmp/ccX"),
            ),
        ] {
            assert!(!recognised(&text), "replayed although {why}");
        }
        let stages = parse_commands(GCC_SHARED).unwrap();
        let no_as = |p: &str| (p != "as").then(|| p.to_string());
        assert!(recognise(stages.clone(), PROBE_DIR, PROBE_C, PROBE_SO, &no_as, &|_| true).is_none(), "`as` missing");
        // A compiler installed in a temporary folder is no file invented per run.
        let in_tmp = parse_commands(&CLANG_OBJECT.replace("/usr/lib/llvm-14", "/tmp/llvm")).unwrap();
        let all = |p: &str| Some(p.to_string());
        assert!(
            recognise(in_tmp.clone(), PROBE_DIR, PROBE_C, PROBE_SO, &all, &|p| p.starts_with("/tmp/llvm")).is_some()
        );
        assert!(recognise(in_tmp, PROBE_DIR, PROBE_C, PROBE_SO, &all, &|_| false).is_none());
    }

    /// A C compiler that logs each run's arguments to `log` and forwards to the real one.
    fn logging_compiler(dir: &Path, log: &Path) -> CCompiler {
        let real = CCompiler::detect().unwrap();
        let body = format!("echo \"$*\" >> '{}'\nexec '{}' \"$@\"", log.display(), real.path().display());
        CCompiler::with_path(script(dir, "logging-cc", &body)).unwrap()
    }

    #[test]
    fn the_driver_is_asked_once_and_its_commands_are_replayed() {
        let dir = test_dir();
        let log = dir.path().join("runs.log");
        let cc = logging_compiler(dir.path(), &log);
        for value in 1..=3 {
            let bytes = cc.compile_source("k", &format!("int k(void) {{ return {value}; }}\n")).unwrap();
            assert_eq!(&bytes[..4], b"\x7fELF");
        }
        let runs = lines(&log);
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert!(runs[0].ends_with("-###"), "{runs:?}");
        assert!(matches!(cc.plan().unwrap().as_ref(), Plan::Replay { .. }));
        let clone = cc.clone();
        clone.compile_source("k", "int k(void) { return 4; }\n").unwrap();
        assert_eq!(lines(&log).len(), 1, "clones share the plan");
        if let Ok(avx2) = IsaTarget::force(crate::isa::Isa::Avx2) {
            cc.with_isa(avx2).compile_source("k", "int k(void) { return 5; }\n").unwrap();
            assert_eq!(lines(&log).len(), 2, "another instruction set asks again");
        }
    }

    /// The replayed commands build the same library as the driver, and report a bad source
    /// the same way.
    #[test]
    fn replayed_compiles_build_what_the_driver_builds() {
        let cc = CCompiler::detect().unwrap();
        let replay = cc.plan().unwrap();
        assert!(matches!(replay.as_ref(), Plan::Replay { .. }), "{replay:?}");
        let src = "float scale(float x) { return x * 3.0f; }\nint twice(int x) { return 2 * x; }\n";
        let replayed = cc.compile_with(&replay, "add k", "add_k", src).unwrap();
        let driven = cc.compile_with(&Plan::Driver, "add k", "add_k", src).unwrap();
        assert!(replayed == driven, "the replayed library differs from the driver's");
        let bad = "int ok(void) { return 1; }\nint broken(void) { return undefined_name; }\n";
        for plan in [&replay, &Arc::new(Plan::Driver)] {
            match cc.compile_with(plan, "bad", "bad", bad) {
                Err(Error::Compile { log, line, message }) => {
                    assert!(log.contains("undefined_name") && message.contains("rejected kernel `bad`"), "{log}");
                    assert_eq!(line.as_deref(), Some("2: int broken(void) { return undefined_name; }"));
                }
                other => panic!("{plan:?}: expected a compile error, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_compiler_whose_listing_is_not_recognised_runs_as_the_driver() {
        let dir = test_dir();
        let log = dir.path().join("runs.log");
        let real = CCompiler::detect().unwrap();
        let body = format!(
            "echo \"$*\" >> '{}'\nfor a in \"$@\"; do [ \"$a\" = '-###' ] && {{ echo ' \"unterminated'; exit 0; }}; done\n\
             exec '{}' \"$@\"",
            log.display(),
            real.path().display()
        );
        let cc = CCompiler::with_path(script(dir.path(), "odd-cc", &body)).unwrap();
        assert_eq!(
            cc.compile_source("k", "int k(void) { return 1; }\n").unwrap(),
            real.compile_source("k", "int k(void) { return 1; }\n").unwrap()
        );
        match cc.compile_source("bad", "int ok;\nint broken(void) { return undefined_name; }\n") {
            Err(Error::Compile { line, .. }) => {
                assert_eq!(line.as_deref(), Some("2: int broken(void) { return undefined_name; }"))
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
        // The error message runs `--version`.
        let runs: Vec<String> = lines(&log).into_iter().filter(|r| r != "--version").collect();
        assert_eq!(runs.len(), 3, "asked once, then the driver for each kernel: {runs:?}");
        assert!(runs[0].ends_with("-###") && !runs[1].contains("-###") && !runs[2].contains("-###"), "{runs:?}");
    }

    const TMPDIR_CHILD_ENV: &str = "KILN_CC_TEST_TMPDIR_CHILD";

    /// A `TMPDIR` whose path holds the probe's file stem, in a folder's name: the replayed
    /// commands keep the folders and give only the file names the kernel's stem. `TMPDIR` is
    /// read from the process's environment, so the compile runs in a child process (this
    /// test again, with the variables set).
    #[test]
    fn a_tmpdir_named_like_the_probe_is_kept_in_replayed_commands() {
        if std::env::var_os(TMPDIR_CHILD_ENV).is_some() {
            assert!(std::env::temp_dir().to_string_lossy().contains(PROBE_STEM), "{:?}", std::env::temp_dir());
            let cc = CCompiler::detect().unwrap();
            assert!(matches!(cc.plan().unwrap().as_ref(), Plan::Replay { .. }), "{:?}", cc.plan());
            let bytes = cc.compile_source("k", "int k(void) { return 1; }\n").unwrap();
            assert_eq!(&bytes[..4], b"\x7fELF");
            return;
        }
        let here = "/t/kiln_probe_kernel/x_kiln_probe_kernel/kiln-cpu-1-B";
        for (probe, kernel) in [
            ("/t/kiln_probe_kernel/x_kiln_probe_kernel/kiln-cpu-1-A/kiln_probe_kernel.c", format!("{here}/add_k.c")),
            (
                "'-o' '/t/kiln_probe_kernel/x_kiln_probe_kernel/kiln-cpu-1-A/kiln_probe_kernel.o'",
                format!("'-o' '{here}/add_k.o'"),
            ),
            ("-dumpbase kiln_probe_kernel.c", "-dumpbase add_k.c".into()),
            (
                "/t/kiln_probe_kernel/x_kiln_probe_kernel/kiln-cpu-1-A/kiln_probe_kernel-a43536.o",
                format!("{here}/add_k-a43536.o"),
            ),
            ("-L/opt/kiln_probe_kernel/lib", "-L/opt/kiln_probe_kernel/lib".into()),
        ] {
            let replayed = replay_text(probe, "/t/kiln_probe_kernel/x_kiln_probe_kernel/kiln-cpu-1-A", here, "add_k");
            assert_eq!(replayed, kernel);
        }
        let dir = test_dir();
        let tmp = dir.path().join(format!("{PROBE_STEM}/x_{PROBE_STEM}_y"));
        fs::create_dir_all(&tmp).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "compiler::tests::a_tmpdir_named_like_the_probe_is_kept_in_replayed_commands"])
            .env(TMPDIR_CHILD_ENV, "1")
            .env("TMPDIR", &tmp)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the child failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("1 passed"), "the child ran the test: {stdout}");
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0, "the child's scratch folders were removed");
    }

    /// A replayed pipeline that hangs is killed at the deadline, every command of it.
    #[test]
    fn a_hung_replayed_pipeline_is_killed_at_the_deadline() {
        let dir = test_dir();
        let pids = dir.path().join("pids.log");
        // The first stage starts a child and hangs; the second waits for its input.
        let first = script(dir.path(), "stage1", &format!("sleep 600 &\necho $! >> '{}'\nwait", pids.display()));
        let second = script(dir.path(), "stage2", &format!("echo $$ >> '{}'\ncat > /dev/null", pids.display()));
        let listing = format!(
            "[ \"$1\" = --version ] && {{ echo 'test-cc 1.0'; exit 0; }}\nsrc=''; out=''; prev=''\n\
             for a in \"$@\"; do [ \"$prev\" = -o ] && out=\"$a\"; case \"$a\" in *.c) src=\"$a\";; esac; prev=\"$a\"; done\n\
             echo \" '{}' \\\"$src\\\" -o - |\" >&2\necho \" '{}' -o \\\"$out\\\"\" >&2",
            first.display(),
            second.display()
        );
        let listing = listing.replace('\'', "");
        let cc = CCompiler::with_path(script(dir.path(), "listing-cc", &listing))
            .unwrap()
            .with_timeout(Duration::from_millis(500));
        assert!(matches!(cc.plan().unwrap().as_ref(), Plan::Replay { stages, .. } if stages.len() == 2));
        match cc.compile_source("k", "int k(void) { return 1; }\n") {
            Err(Error::Compile { message, .. }) => {
                assert!(message.contains("did not finish") && message.contains(COMPILE_TIMEOUT_ENV), "{message}")
            }
            other => panic!("expected a timeout error, got {other:?}"),
        }
        let seen = lines(&pids);
        assert_eq!(seen.len(), 2, "{seen:?}");
        for pid in &seen {
            assert!(dies(pid), "process {pid} of the pipeline was killed");
        }
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

    /// No renderer version is part of the kernel cache's key: the rendered source is, and
    /// besides it the compiler's identity and flags, so compiling the same source for another
    /// instruction set is another entry.
    #[test]
    fn the_disk_key_follows_the_compiler_flags() {
        use crate::isa::{Isa, IsaTarget};
        use kiln_device::{Program, Renderer, RuntimeFactory, Toolchain};
        let Ok(sse2) = IsaTarget::force(Isa::Sse2) else {
            println!("skipped: this CPU has no SSE2");
            return;
        };
        let cc = CCompiler::detect().unwrap();
        if cc.isa() == sse2 {
            println!("skipped: SSE2 is already this compiler's target");
            return;
        }
        let sink = crate::testing::double_in_place();
        let src = crate::cpu_renderer().render(&sink, None).unwrap().src;
        let key = |cc: CCompiler| {
            let runtime: RuntimeFactory = Arc::new(|c| Ok(Arc::new(crate::CpuProgram::load(c)?) as Arc<dyn Program>));
            Toolchain::new(Arc::new(crate::cpu_renderer()), Arc::new(cc), runtime.into())
                .disk_key(&sink, None, "CPU", &src)
        };
        assert_eq!(key(cc.clone()), key(cc.clone()), "the key is stable");
        assert_ne!(key(cc.clone()), key(cc.with_isa(sse2)), "the flags are part of the key");
    }

    #[test]
    fn a_warm_disk_cache_never_starts_the_compiler() {
        use kiln_device::{CacheConfig, KernelCache, Program, Renderer, RuntimeFactory, Toolchain};
        let dir = test_dir();
        let log = dir.path().join("runs.log");
        let real = CCompiler::detect().unwrap();
        let cc = script(
            dir.path(),
            "logging-cc",
            &format!("echo \"$1\" >> '{}'\nexec '{}' \"$@\"", log.display(), real.path().display()),
        );
        let sink = crate::testing::double_in_place();
        // What a new process does: locate the compiler, open the cache, ask for the kernel.
        let process = || {
            let renderer: Arc<dyn Renderer> = Arc::new(crate::cpu_renderer());
            let runtime: RuntimeFactory = Arc::new(|c| Ok(Arc::new(crate::CpuProgram::load(c)?) as Arc<dyn Program>));
            let toolchain = Toolchain::new(renderer, Arc::new(CCompiler::with_path(&cc).unwrap()), runtime.into());
            let cache = KernelCache::new(CacheConfig::at(dir.path().join("cache")));
            cache.get_or_compile(&sink, None, &crate::CPU, &toolchain).unwrap();
            cache.stats()
        };
        assert_eq!(process().misses, 1);
        assert_eq!(lines(&log).len(), 1, "the cold process compiles once: {:?}", lines(&log));
        assert_eq!(process().disk_hits, 1);
        assert_eq!(lines(&log).len(), 1, "the warm process starts no compiler: {:?}", lines(&log));
    }
}
