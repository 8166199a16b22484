//! The LLVM pair's compiler: a kernel's LLVM IR text to an ELF object in memory, in process,
//! loaded like the C pair's objects by kiln's own ELF loader ([`crate::elf`]).
//!
//! Each compile parses the module in a fresh LLVM context, verifies it, runs LLVM's standard
//! [`PIPELINE`] (without the SLP vectorizer or IndVarSimplify for a module the renderer marks,
//! see [`super::render`]'s "Large kernels") for the pair's target machine (the host CPU and its features, or the pair's
//! instruction set), and emits a relocatable object (PIC, small code model) to a memory buffer.
//! No file and no process.
//!
//! # Why O3
//! The C pair compiles with `-O3`, so the LLVM pair runs the same level: LLVM's `default<O3>`
//! pipeline with loop and SLP vectorization, and aggressive code generation, as clang's `-O3`.
//! Measured on a 2-core Xeon (issue 32's note): O3 compiles kiln's kernels about as fast as O2
//! (per-function passes and code generation dominate either way); on real ONNX models through
//! tinygrad, O2's kernels were slower than the C pair's and O3's at its speed. A lighter
//! pipeline (SROA, InstCombine, SimplifyCFG, LICM, GVN, SLP) halved compile times but slowed
//! ResNet-50 by 14%.
//!
//! # Threads
//! Compiles run on LLVM worker threads, one per core, each with its own target machines; a
//! caller hands its module over and waits for the object, so `compile_many` from several
//! threads uses every core.
//!
//! # Failure
//! IR LLVM rejects (a parse or verifier error, a failed pass pipeline or code generation) is
//! [`Error::Compile`] naming the kernel, with LLVM's message as the log. LLVM reports the errors
//! it cannot recover from through its fatal-error handler, after which it would exit the
//! process. kiln installs its own: on a worker it sends the error to the waiting caller as
//! [`Error::Compile`] and parks that worker for good, without returning to LLVM (the thread's
//! stack and context are leaked, and a new worker takes its place), so the caller's process
//! lives on. A fatal error raised on a thread that is not a kiln worker is left to LLVM.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CString, c_char};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use kiln_device::{CompiledSpec, Compiler, Error, ProgramSpec, Result};

use super::api::{self, Llvm};
use super::library::Library;
use super::render::{NO_INDVARS, NO_SLP};
use crate::isa::{Isa, IsaTarget};

/// What a target machine is built for: the triple, CPU name and feature string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    triple: String,
    cpu: String,
    features: String,
}

/// Compiles LLVM IR text to ELF objects for one target, in process (see the module docs).
///
/// Making one loads no LLVM: the library is opened, and the target machine's CPU and features
/// asked of it, by the first compile. Its [`Compiler::fingerprint`] needs neither: it names the
/// library file (path, size, mtime, inode), its version, the host CPU as the C pair's does and
/// the instruction set, which together decide what LLVM builds.
#[derive(Debug, Clone)]
pub struct LlvmCompiler {
    isa: IsaTarget,
    library: &'static Library,
    /// The target machine's triple, CPU and features, asked of LLVM by the first compile.
    target: Arc<OnceLock<std::result::Result<Arc<Target>, Error>>>,
}

impl LlvmCompiler {
    /// A compiler for `isa`: the host CPU with all its features when it is not forced, else
    /// the generic CPU of that instruction set level (`x86-64-v3` for AVX2). Loads no LLVM
    /// where the library's names tell its version ([`super::available`]).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no libLLVM 16 is found ([`super::available`]).
    pub fn new(isa: IsaTarget) -> Result<LlvmCompiler> {
        let library = super::available()?;
        Ok(LlvmCompiler { isa, library, target: Arc::default() })
    }

    /// The library this compiler opens at its first compile.
    pub fn library(&self) -> &'static Library {
        self.library
    }

    /// The CPU name LLVM compiles for (`sapphirerapids`, `x86-64-v3`): asked of LLVM, which
    /// this opens if no compile has.
    ///
    /// # Errors
    /// As the first compile's: [`Error::Unavailable`] when LLVM cannot be opened or cannot
    /// target this CPU.
    pub fn cpu(&self) -> Result<String> {
        Ok(self.target()?.cpu.clone())
    }

    /// The target machine's description, asked of LLVM (opened here) once per compiler; a
    /// target LLVM cannot build fails here, once, with the same error every call.
    fn target(&self) -> Result<Arc<Target>> {
        self.target
            .get_or_init(|| {
                let llvm = Llvm::get()?;
                // SAFETY: each call returns a new message that `take_message` frees.
                let (triple, host_cpu, host_features) = unsafe {
                    (
                        llvm.take_message((llvm.LLVMGetDefaultTargetTriple)()),
                        llvm.take_message((llvm.LLVMGetHostCPUName)()),
                        llvm.take_message((llvm.LLVMGetHostCPUFeatures)()),
                    )
                };
                let (cpu, features) = match (self.isa.forced, self.isa.isa) {
                    (false, _) | (true, Isa::Generic) => (host_cpu, host_features),
                    (true, Isa::Avx512) => ("x86-64-v4".into(), String::new()),
                    (true, Isa::Avx2) => ("x86-64-v3".into(), String::new()),
                    (true, Isa::Sse2) => ("x86-64".into(), String::new()),
                    (true, Isa::Neon) => ("generic".into(), "+neon".into()),
                };
                let target = Target { triple, cpu, features };
                let machine = create_machine(llvm, &target)?;
                // SAFETY: created above, used by nothing else.
                unsafe { (llvm.LLVMDisposeTargetMachine)(machine) };
                Ok(Arc::new(target))
            })
            .clone()
    }

    /// Compiles the module `ir` (LLVM IR text) of kernel `name` to an ELF object's bytes,
    /// opening LLVM if no compile has.
    ///
    /// # Errors
    /// [`Error::Compile`] naming the kernel when LLVM rejects the module or fails on it (see
    /// the module docs); [`Error::Unavailable`] when LLVM cannot be opened, is not LLVM 16 or
    /// cannot target this CPU.
    pub fn compile_ir(&self, name: &str, ir: &str) -> Result<Vec<u8>> {
        self.compile_with(name, ir, Pipeline::of(ir))
    }

    /// [`LlvmCompiler::compile_ir`] through `pipeline`.
    fn compile_with(&self, name: &str, ir: &str, pipeline: Pipeline) -> Result<Vec<u8>> {
        let llvm = Llvm::get()?;
        let target = self.target()?;
        let (reply, answer) = mpsc::channel();
        let job = Job { name: name.to_string(), ir: ir.to_string(), target, pipeline, reply };
        workers(llvm).send(job).map_err(|_| compile_error(name, "the LLVM workers are gone", String::new()))?;
        answer.recv().map_err(|_| compile_error(name, "the LLVM worker stopped without an answer", String::new()))?
    }
}

impl Compiler for LlvmCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let bytes = self.compile_ir(&spec.name, &spec.src)?;
        Ok(CompiledSpec { name: spec.name.clone(), bytes, spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        "llvm"
    }

    fn fingerprint(&self) -> String {
        let version = self.library.major.map_or_else(|| "version from LLVMGetVersion".into(), |m| m.to_string());
        let isa = match self.isa {
            IsaTarget { forced: true, isa, .. } => format!("forced {isa}"),
            IsaTarget { forced: false, .. } => "host CPU and features".to_string(),
        };
        format!(
            "LLVM {version} | {} | {} | {isa} | {} | codegen O3 | pic small",
            self.library.identity,
            crate::compiler::cpu_target(),
            PIPELINE.to_string_lossy()
        )
    }
}

/// The pass pipeline every module runs (see the module docs), but one marked [`NO_SLP`] or
/// [`NO_INDVARS`], which runs [`Pipeline::Lighter`].
const PIPELINE: &std::ffi::CStr = c"default<O3>";

/// LLVM 16's `default<O3>` module pipeline spelled out, as `opt-16 -passes='default<O3>'
/// -print-pipeline-passes` prints it: the pipeline every module runs (a test checks that it
/// builds the same objects as `default<O3>`), and with its one `slp-vectorizer` or `indvars`
/// taken out, the pipeline of a module marked [`NO_SLP`] or [`NO_INDVARS`]. LLVM 16's `default<O3>` runs the SLP
/// vectorizer whatever `LLVMPassBuilderOptionsSetSLPVectorization` says (measured: off, it still
/// took 4.8 s of a 5.4 s compile), so leaving it out takes a pipeline of one's own.
const O3_SPELLED: &str = concat!(
    "annotation2metadata,forceattrs,inferattrs,coro-early,function<eager-inv>(lower-expect,",
    "simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;no-switch-range-to-icmp;",
    "no-switch-to-lookup;keep-loops;no-hoist-common-insts;no-sink-common-insts>,sroa<modify-cfg>,",
    "early-cse<>,callsite-splitting),openmp-opt,ipsccp,called-value-propagation,globalopt,",
    "function(mem2reg),function<eager-inv>(instcombine,simplifycfg<bonus-inst-threshold=1;",
    "no-forward-switch-cond;switch-range-to-icmp;no-switch-to-lookup;keep-loops;",
    "no-hoist-common-insts;no-sink-common-insts>),require<globals-aa>,function(invalidate<aa>),",
    "require<profile-summary>,cgscc(devirt<4>(inline<only-mandatory>,inline,function-attrs,",
    "argpromotion,openmp-opt-cgscc,function<eager-inv>(sroa<modify-cfg>,early-cse<memssa>,",
    "speculative-execution,jump-threading,correlated-propagation,simplifycfg<bonus-inst-threshold=1;",
    "no-forward-switch-cond;switch-range-to-icmp;no-switch-to-lookup;keep-loops;",
    "no-hoist-common-insts;no-sink-common-insts>,instcombine,aggressive-instcombine,",
    "libcalls-shrinkwrap,tailcallelim,simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;",
    "switch-range-to-icmp;no-switch-to-lookup;keep-loops;no-hoist-common-insts;no-sink-common-insts>,",
    "reassociate,require<opt-remark-emit>,loop-mssa(loop-instsimplify,loop-simplifycfg,",
    "licm<no-allowspeculation>,loop-rotate,licm<allowspeculation>,simple-loop-unswitch<nontrivial;",
    "trivial>),simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;switch-range-to-icmp;",
    "no-switch-to-lookup;keep-loops;no-hoist-common-insts;no-sink-common-insts>,instcombine,",
    "loop(loop-idiom,indvars,loop-deletion,loop-unroll-full),sroa<modify-cfg>,vector-combine,",
    "mldst-motion<no-split-footer-bb>,gvn<>,sccp,bdce,instcombine,jump-threading,",
    "correlated-propagation,adce,memcpyopt,dse,loop-mssa(licm<allowspeculation>),coro-elide,",
    "simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;switch-range-to-icmp;",
    "no-switch-to-lookup;keep-loops;hoist-common-insts;sink-common-insts>,instcombine),coro-split)),",
    "deadargelim,coro-cleanup,globalopt,globaldce,elim-avail-extern,rpo-function-attrs,",
    "recompute-globalsaa,function<eager-inv>(float2int,lower-constant-intrinsics,loop(loop-rotate,",
    "loop-deletion),loop-distribute,inject-tli-mappings,loop-vectorize<no-interleave-forced-only;",
    "no-vectorize-forced-only;>,loop-load-elim,instcombine,simplifycfg<bonus-inst-threshold=1;",
    "forward-switch-cond;switch-range-to-icmp;switch-to-lookup;no-keep-loops;hoist-common-insts;",
    "sink-common-insts>,slp-vectorizer,vector-combine,instcombine,loop-unroll<O3>,transform-warning,",
    "sroa<preserve-cfg>,instcombine,require<opt-remark-emit>,loop-mssa(licm<allowspeculation>),",
    "alignment-from-assumptions,loop-sink,instsimplify,div-rem-pairs,tailcallelim,",
    "simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;switch-range-to-icmp;",
    "no-switch-to-lookup;keep-loops;no-hoist-common-insts;no-sink-common-insts>),globaldce,",
    "constmerge,cg-profile,rel-lookup-table-converter,function(annotation-remarks),verify",
);

/// The pass pipeline a module runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pipeline {
    /// [`PIPELINE`]: every module the renderer did not mark.
    O3,
    /// [`O3_SPELLED`] less the passes a marked module is spared (see [`super::render`]'s "Large
    /// kernels"): the SLP vectorizer, IndVarSimplify.
    Lighter { slp: bool, indvars: bool },
    /// [`O3_SPELLED`] as it is, which the tests check against [`PIPELINE`].
    #[cfg(test)]
    O3Spelled,
}

impl Pipeline {
    /// The pipeline of the module `ir`, by the renderer's marks.
    fn of(ir: &str) -> Pipeline {
        let (slp, indvars) = (!super::render::marked(ir, NO_SLP), !super::render::marked(ir, NO_INDVARS));
        if slp && indvars { Pipeline::O3 } else { Pipeline::Lighter { slp, indvars } }
    }

    fn text(self) -> &'static std::ffi::CStr {
        static LIGHTER: [OnceLock<CString>; 4] = [const { OnceLock::new() }; 4];
        match self {
            Pipeline::O3 => PIPELINE,
            Pipeline::Lighter { slp, indvars } => {
                LIGHTER[usize::from(slp) * 2 + usize::from(indvars)].get_or_init(|| {
                    let mut text = O3_SPELLED.to_string();
                    if !slp {
                        text = text.replacen("slp-vectorizer,", "", 1);
                    }
                    if !indvars {
                        text = text.replacen("indvars,", "", 1);
                    }
                    CString::new(text).unwrap_or_else(|_| PIPELINE.into())
                })
            }
            #[cfg(test)]
            Pipeline::O3Spelled => {
                static SPELLED: OnceLock<CString> = OnceLock::new();
                SPELLED.get_or_init(|| CString::new(O3_SPELLED).unwrap_or_else(|_| PIPELINE.into()))
            }
        }
    }
}

/// One compile handed to a worker.
struct Job {
    name: String,
    ir: String,
    target: Arc<Target>,
    /// The pass pipeline it runs: lighter for a module the renderer marked (see
    /// [`super::render`]'s "Large kernels").
    pipeline: Pipeline,
    reply: Reply,
}

/// Where a compile's answer goes.
type Reply = Sender<Result<Vec<u8>>>;
/// The workers' end of the job queue.
type Jobs = Arc<Mutex<Receiver<Job>>>;

/// The workers' end of the job queue, kept for the fatal-error handler to start a worker in
/// place of the one it parks.
static JOBS: OnceLock<Jobs> = OnceLock::new();

/// The queue of the worker threads, started (one per core) with the first compile.
fn workers(llvm: &'static Llvm) -> &'static Sender<Job> {
    static QUEUE: OnceLock<Sender<Job>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        // SAFETY: installs a handler with the signature LLVM calls (see `on_fatal_error`).
        unsafe { (llvm.LLVMInstallFatalErrorHandler)(on_fatal_error) };
        let (queue, jobs) = mpsc::channel();
        let jobs = JOBS.get_or_init(|| Arc::new(Mutex::new(jobs)));
        for _ in 0..std::thread::available_parallelism().map_or(1, usize::from) {
            spawn_worker(llvm, jobs.clone());
        }
        queue
    })
}

thread_local! {
    /// On a worker: the compile in progress, its kernel name and where its answer goes.
    static CURRENT: Cell<Option<(String, Reply)>> = const { Cell::new(None) };
    /// On a worker: the errors LLVM reported for the compile in progress through its context's
    /// diagnostic handler (an inline assembly error, for one), which without a handler would
    /// exit the process.
    static DIAGNOSED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// On a worker: its target machines, by target.
    static MACHINES: RefCell<HashMap<Target, api::TargetMachine>> = RefCell::new(HashMap::new());
}

/// Starts a worker taking jobs from `jobs` until the queue closes. A worker that cannot be
/// started leaves the others to do the work (the first compile fails if there are none).
fn spawn_worker(llvm: &'static Llvm, jobs: Jobs) {
    let work = move || {
        loop {
            let job = match jobs.lock() {
                Ok(queue) => queue.recv(),
                Err(_) => return,
            };
            let Ok(job) = job else { return };
            CURRENT.set(Some((job.name.clone(), job.reply.clone())));
            let result = compile_module(llvm, &job);
            CURRENT.set(None);
            let _ = job.reply.send(result);
        }
    };
    let _ = std::thread::Builder::new().name("kiln-llvm".into()).spawn(work);
}

/// LLVM's fatal-error handler (see the module docs): on a worker, answers the compile in
/// progress with the error and parks the thread forever.
extern "C" fn on_fatal_error(reason: *const c_char) {
    let Some((name, reply)) = CURRENT.take() else { return };
    let reason = if reason.is_null() {
        String::new()
    } else {
        // SAFETY: LLVM passes a NUL-terminated message, live during the call.
        unsafe { std::ffi::CStr::from_ptr(reason) }.to_string_lossy().into_owned()
    };
    let _ = reply.send(Err(compile_error(&name, "LLVM hit a fatal error", reason)));
    if let (Ok(llvm), Some(jobs)) = (Llvm::get(), JOBS.get()) {
        spawn_worker(llvm, jobs.clone());
    }
    loop {
        std::thread::park();
    }
}

/// The diagnostic handler of every context a worker creates: keeps the errors, ignores the
/// rest (warnings, remarks), and returns to LLVM, which then goes on without exiting.
extern "C" fn on_diagnostic(info: api::DiagnosticInfo, _: *mut std::ffi::c_void) {
    let Ok(llvm) = Llvm::get() else { return };
    // SAFETY: `info` is live during the call; the description is ours to free.
    let (severity, text) =
        unsafe { ((llvm.LLVMGetDiagInfoSeverity)(info), llvm.take_message((llvm.LLVMGetDiagInfoDescription)(info))) };
    if severity == api::DIAGNOSTIC_ERROR {
        let _ = DIAGNOSED.try_with(|d| d.try_borrow_mut().map(|mut d| d.push(text)));
    }
}

fn compile_error(name: &str, what: &str, log: String) -> Error {
    Error::Compile { message: format!("{what} compiling kernel `{name}` (LLVM pair)"), log, line: None }
}

/// Runs `f` with this thread's target machine for `target`, creating it on first use.
fn with_machine<T>(llvm: &Llvm, target: &Target, f: impl FnOnce(api::TargetMachine) -> Result<T>) -> Result<T> {
    let machine = MACHINES.with_borrow_mut(|machines| -> Result<api::TargetMachine> {
        if let Some(&m) = machines.get(target) {
            return Ok(m);
        }
        let m = create_machine(llvm, target)?;
        machines.insert(target.clone(), m);
        Ok(m)
    })?;
    f(machine)
}

fn create_machine(llvm: &Llvm, target: &Target) -> Result<api::TargetMachine> {
    let c = |s: &str| CString::new(s).map_err(|_| Error::Invalid(format!("LLVM target field `{s}` holds a NUL")));
    let (triple, cpu, features) = (c(&target.triple)?, c(&target.cpu)?, c(&target.features)?);
    let unavailable =
        |why: String| Error::Unavailable(format!("LLVM cannot target {} ({}): {why}", target.triple, target.cpu));
    let mut t: api::Target = std::ptr::null_mut();
    let mut message = std::ptr::null_mut();
    // SAFETY: valid C strings and out-pointers; the message is freed by `take_message`.
    if unsafe { (llvm.LLVMGetTargetFromTriple)(triple.as_ptr(), &mut t, &mut message) } != 0 {
        // SAFETY: as above.
        return Err(unavailable(unsafe { llvm.take_message(message) }));
    }
    // SAFETY: `t` is a registered target; the strings are copied by LLVM.
    let machine = unsafe {
        (llvm.LLVMCreateTargetMachine)(
            t,
            triple.as_ptr(),
            cpu.as_ptr(),
            features.as_ptr(),
            api::CODEGEN_O3,
            api::RELOC_PIC,
            api::CODE_MODEL_SMALL,
        )
    };
    if machine.is_null() {
        return Err(unavailable("LLVMCreateTargetMachine returned none".into()));
    }
    Ok(machine)
}

/// Owns a module or context, disposing of it when dropped.
struct Owned(*mut std::ffi::c_void, unsafe extern "C" fn(*mut std::ffi::c_void));

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer was created by LLVM for this disposer and is disposed once.
            unsafe { (self.1)(self.0) }
        }
    }
}

/// Parses, verifies, optimizes and emits `job`'s module on this worker.
fn compile_module(llvm: &Llvm, job: &Job) -> Result<Vec<u8>> {
    let fail = |what: &str, log: String| compile_error(&job.name, what, log);
    let buffer_name = CString::new(job.name.replace('\0', "")).unwrap_or_default();
    with_machine(llvm, &job.target, |machine| {
        // SAFETY: a new context, disposed (after the module) when `context` drops.
        let context = Owned(unsafe { (llvm.LLVMContextCreate)() }, llvm.LLVMContextDispose);
        DIAGNOSED.take();
        // SAFETY: a live context; the handler reads no context data.
        unsafe { (llvm.LLVMContextSetDiagnosticHandler)(context.0, on_diagnostic, std::ptr::null_mut()) };
        // SAFETY: LLVM copies the text; the buffer is owned by the parse below.
        let buffer = unsafe {
            (llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy)(job.ir.as_ptr().cast(), job.ir.len(), buffer_name.as_ptr())
        };
        let (mut module, mut message) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the parse takes the buffer; the module belongs to `context`.
        let failed = unsafe { (llvm.LLVMParseIRInContext)(context.0, buffer, &mut module, &mut message) } != 0;
        // SAFETY: the message (if any) is ours to free.
        let parse_log = unsafe { llvm.take_message(message) };
        if failed {
            return Err(fail("LLVM could not parse the module", parse_log));
        }
        let module = Owned(module, llvm.LLVMDisposeModule);
        let triple = CString::new(job.target.triple.as_str()).unwrap_or_default();
        // SAFETY: a live module and target machine; the data layout is copied into the module.
        unsafe {
            (llvm.LLVMSetTarget)(module.0, triple.as_ptr());
            let layout = (llvm.LLVMCreateTargetDataLayout)(machine);
            (llvm.LLVMSetModuleDataLayout)(module.0, layout);
            (llvm.LLVMDisposeTargetData)(layout);
        }
        let mut message = std::ptr::null_mut();
        // SAFETY: verification reports (never aborts) and leaves a message we free.
        let invalid = unsafe { (llvm.LLVMVerifyModule)(module.0, api::VERIFY_RETURN_STATUS, &mut message) } != 0;
        // SAFETY: as above.
        let verify_log = unsafe { llvm.take_message(message) };
        if invalid {
            return Err(fail("LLVM's verifier rejected the module", verify_log));
        }
        // SAFETY: new options, disposed right after the run; the pipeline text is a C string.
        let pass_error = unsafe {
            let options = (llvm.LLVMCreatePassBuilderOptions)();
            (llvm.LLVMPassBuilderOptionsSetLoopVectorization)(options, 1);
            (llvm.LLVMPassBuilderOptionsSetSLPVectorization)(options, 1);
            let pipeline = job.pipeline.text();
            let mut error = llvm.take_error((llvm.LLVMRunPasses)(module.0, pipeline.as_ptr(), machine, options));
            if !error.is_empty() && job.pipeline != Pipeline::O3 {
                // A pipeline LLVM cannot parse leaves the module as it was: run the default one.
                error = llvm.take_error((llvm.LLVMRunPasses)(module.0, PIPELINE.as_ptr(), machine, options));
            }
            (llvm.LLVMDisposePassBuilderOptions)(options);
            error
        };
        if !pass_error.is_empty() {
            return Err(fail("LLVM's O3 pipeline failed", pass_error));
        }
        let (mut object, mut message) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: live module and machine; the object buffer is ours to dispose.
        let failed = unsafe {
            (llvm.LLVMTargetMachineEmitToMemoryBuffer)(machine, module.0, api::OBJECT_FILE, &mut message, &mut object)
        } != 0;
        // SAFETY: as above.
        let emit_log = unsafe { llvm.take_message(message) };
        let diagnosed = DIAGNOSED.take();
        if failed || object.is_null() || !diagnosed.is_empty() {
            let log = [emit_log].into_iter().chain(diagnosed).filter(|l| !l.is_empty()).collect::<Vec<_>>();
            // SAFETY: an object buffer of a failed emit is still ours to dispose.
            drop(Owned(object, llvm.LLVMDisposeMemoryBuffer));
            return Err(fail("LLVM could not emit an object", log.join("\n")));
        }
        let object = Owned(object, llvm.LLVMDisposeMemoryBuffer);
        // SAFETY: the buffer holds `size` bytes from `start` until it is disposed (after the copy).
        let bytes = unsafe {
            let (start, size) = ((llvm.LLVMGetBufferStart)(object.0), (llvm.LLVMGetBufferSize)(object.0));
            std::slice::from_raw_parts(start.cast::<u8>(), size).to_vec()
        };
        drop((object, module, context));
        Ok(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::Image;
    use crate::program::global_symbol;

    /// The LLVM pair's compiler for `isa`, or `None` (the test is skipped, saying why) when this
    /// machine has no libLLVM 16, unless `KILN_REQUIRE` names `cpu-llvm`.
    fn compiler(isa: IsaTarget) -> Option<LlvmCompiler> {
        kiln_device::testing::or_skip("cpu-llvm", "this LLVM test", LlvmCompiler::new(isa))
    }

    /// A row softmax (a max and a sum loop, an exp), in kiln's text.
    const SOFTMAX_ROW: &str = include_str!("../../../../examples/kernels/softmax.kiln");

    /// `out[i] = expf(in[i]) * 2` for `i < n`: a loop O3 vectorizes, with a libm call.
    const SCALE: &str = r#"
declare float @expf(float)
define void @scale(ptr noalias %out, ptr noalias %in, i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %done, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %src = getelementptr float, ptr %in, i64 %i
  %x = load float, ptr %src
  %e = call float @expf(float %x)
  %y = fmul float %e, 2.0
  %dst = getelementptr float, ptr %out, i64 %i
  store float %y, ptr %dst
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}
"#;

    /// A module compiles in process to an object kiln's ELF loader loads, and it computes what
    /// it says, from many threads at once (each compile on an LLVM worker).
    #[test]
    fn ir_compiles_to_an_object_that_loads_and_runs() {
        let Some(llvm) = compiler(IsaTarget::native()) else { return };
        let objects: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|_| s.spawn(|| llvm.compile_ir("scale", SCALE).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(objects.iter().all(|o| o == &objects[0]), "the same module gives the same object");
        let image = Image::load(&objects[0], global_symbol).unwrap();
        let scale = image.function("scale").unwrap();
        // SAFETY: `scale` is `void(float*, const float*, i64)` as defined above.
        let scale: unsafe extern "C" fn(*mut f32, *const f32, i64) = unsafe { std::mem::transmute(scale.as_ptr()) };
        let input: Vec<f32> = (0..37).map(|i| i as f32 * 0.1 - 1.0).collect();
        let mut out = vec![0f32; input.len()];
        // SAFETY: both buffers hold `input.len()` floats.
        unsafe { scale(out.as_mut_ptr(), input.as_ptr(), input.len() as i64) };
        let expected: Vec<f32> = input.iter().map(|x| x.exp() * 2.0).collect();
        assert_eq!(out, expected);
    }

    /// [`O3_SPELLED`] is LLVM 16's `default<O3>`: both build the same objects from rendered
    /// kernels of every shape (a launch loop, a reduction loop, straight-line code, libm calls),
    /// so the pipeline without the SLP vectorizer differs from the default in that pass alone.
    #[test]
    fn the_spelled_pipeline_builds_what_default_o3_builds() {
        let Some(llvm) = compiler(IsaTarget::native()) else { return };
        let renderer = super::super::LlvmRenderer::for_isa(IsaTarget::native().isa);
        let mut modules = vec![("scale".to_string(), SCALE.to_string())];
        for (name, sink) in [
            ("double", crate::testing::double_in_place()),
            ("products", crate::testing::products(64)),
            ("softmax", kiln_device::kiln_ir::parse_kernel(SOFTMAX_ROW).unwrap()),
        ] {
            let spec = kiln_device::Renderer::render(&renderer, &sink, Some(name)).unwrap();
            modules.push((spec.name.clone(), spec.src));
        }
        for (name, ir) in &modules {
            let default = llvm.compile_with(name, ir, Pipeline::O3).unwrap();
            let spelled = llvm.compile_with(name, ir, Pipeline::O3Spelled).unwrap();
            assert!(default == spelled, "{name}: the spelled pipeline built another object");
        }
    }

    /// Four neighbouring scalar multiplies the SLP vectorizer makes one vector multiply: the
    /// pipeline without it leaves them scalar (LLVM 16's `default<O3>` ran it even with
    /// `LLVMPassBuilderOptionsSetSLPVectorization` off), and both objects compute the same.
    #[test]
    fn the_pipeline_without_slp_runs_no_slp_vectorizer() {
        let Some(llvm) = compiler(IsaTarget::native()) else { return };
        let mut ir = String::from("define void @four(ptr noalias %out, ptr noalias %in) {\n");
        for i in 0..4 {
            ir += &format!(
                "  %p{i} = getelementptr float, ptr %in, i64 {i}\n  %x{i} = load float, ptr %p{i}\n  \
                 %y{i} = fmul float %x{i}, 3.0\n  %q{i} = getelementptr float, ptr %out, i64 {i}\n  \
                 store float %y{i}, ptr %q{i}\n"
            );
        }
        ir += "  ret void\n}\n";
        let with = llvm.compile_with("four", &ir, Pipeline::O3).unwrap();
        let without = llvm.compile_with("four", &ir, Pipeline::Lighter { slp: false, indvars: true }).unwrap();
        assert!(with != without, "the SLP vectorizer changed nothing");
        for object in [&with, &without] {
            let image = Image::load(object, global_symbol).unwrap();
            let four = image.function("four").unwrap();
            // SAFETY: `four` is `void(float*, const float*)` as defined above.
            let four: unsafe extern "C" fn(*mut f32, *const f32) = unsafe { std::mem::transmute(four.as_ptr()) };
            let (input, mut out) = ([1.5f32, -2.0, 0.25, 8.0], [0f32; 4]);
            // SAFETY: both buffers hold the four floats the function touches.
            unsafe { four(out.as_mut_ptr(), input.as_ptr()) };
            assert_eq!(out, [4.5, -6.0, 0.75, 24.0]);
        }
    }

    /// Every way LLVM can reject a module is a typed compile error naming the kernel, with
    /// LLVM's message, and the process lives on: a parse error, a verifier error, an inline
    /// assembly error at code generation (reported through the context's diagnostics), and a
    /// fatal error (an AVX-512 intrinsic compiled for SSE2, which LLVM's
    /// code generator cannot lower), after which compiles still work.
    #[test]
    fn rejected_modules_are_compile_errors_and_the_process_lives_on() {
        let Some(llvm) = compiler(IsaTarget::native()) else { return };
        let cases = [
            ("parse", "define void @k( {".to_string(), "expected"),
            (
                "verify",
                "define i32 @k(i1 %c) {\nentry:\n  br i1 %c, label %a, label %b\na:\n  %x = add i32 1, 2\n  br label %b\n\
                 b:\n  ret i32 %x\n}\n"
                    .into(),
                "dominate",
            ),
            (
                "asm",
                "define void @k() {\n  call void asm sideeffect \"not_an_instruction %eax\", \"\"()\n  ret void\n}\n".into(),
                "invalid instruction",
            ),
        ];
        for (name, ir, says) in cases {
            match llvm.compile_ir(name, &ir) {
                Err(Error::Compile { message, log, .. }) => {
                    assert!(message.contains(&format!("`{name}`")), "{message}");
                    assert!(log.contains(says), "{name}: {log}");
                }
                other => panic!("{name}: expected a compile error, got {other:?}"),
            }
        }
        let Ok(sse2) = IsaTarget::force(Isa::Sse2) else { return };
        let Some(old) = compiler(sse2) else { return };
        let fatal = "declare <16 x float> @llvm.x86.avx512.rsqrt14.ps.512(<16 x float>, <16 x float>, i16)\n\
                     define <16 x float> @k(<16 x float> %x) {\n\
                     \x20 %r = call <16 x float> @llvm.x86.avx512.rsqrt14.ps.512(<16 x float> %x, <16 x float> %x, i16 -1)\n\
                     \x20 ret <16 x float> %r\n}\n";
        match old.compile_ir("fatal", fatal) {
            Err(Error::Compile { message, log, .. }) => {
                assert!(message.contains("fatal") && message.contains("`fatal`"), "{message}");
                assert!(!log.is_empty(), "LLVM's reason is the log");
            }
            other => panic!("expected LLVM's fatal error as a compile error, got {other:?}"),
        }
        assert!(llvm.compile_ir("scale", SCALE).is_ok(), "compiles go on after a fatal error");
    }
}
