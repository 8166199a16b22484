//! The part of LLVM 16's C API the LLVM pair calls, loaded from `libLLVM-16` at run time.
//!
//! kiln links no LLVM: the library is opened with `dlopen` the first time the CPU device
//! asks for it ([`Llvm::get`]), so the CLI and the Python wheel start on a machine without
//! it, and the CPU device then offers its C pair alone and says why ([`Llvm::get`]'s error).
//! `KILN_LIBLLVM` names the library to open instead of the usual names.
//!
//! Every function pointer is resolved when the library opens; a library that lacks one (an
//! LLVM other than 16) is refused then, naming the symbol.

use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

use kiln_device::{Error, Result};

/// The environment variable naming the `libLLVM` to open (a path or a file name) instead of
/// [`LIBRARY_NAMES`].
pub const LIBLLVM_ENV: &str = "KILN_LIBLLVM";

/// The names tried, in order, when [`LIBLLVM_ENV`] is unset: Debian's and LLVM's own.
pub const LIBRARY_NAMES: &[&str] =
    &["libLLVM-16.so.1", "libLLVM-16.so", "libLLVM.so.16", "/usr/lib/llvm-16/lib/libLLVM-16.so.1"];

pub type Context = *mut c_void;
pub type Module = *mut c_void;
pub type MemoryBuffer = *mut c_void;
pub type Target = *mut c_void;
pub type TargetMachine = *mut c_void;
pub type TargetData = *mut c_void;
pub type PassBuilderOptions = *mut c_void;
pub type ErrorRef = *mut c_void;
pub type DiagnosticInfo = *mut c_void;
/// `LLVMBool`: nonzero is true (for most calls: failed).
pub type Bool = i32;

/// `LLVMCodeGenOptLevel::LLVMCodeGenLevelAggressive` (-O3).
pub const CODEGEN_O3: i32 = 3;
/// `LLVMRelocMode::LLVMRelocPIC`, as kernels are built with `-fPIC`.
pub const RELOC_PIC: i32 = 2;
/// `LLVMCodeModel::LLVMCodeModelSmall`.
pub const CODE_MODEL_SMALL: i32 = 3;
/// `LLVMCodeGenFileType::LLVMObjectFile`.
pub const OBJECT_FILE: i32 = 1;
/// `LLVMDiagnosticSeverity::LLVMDSError`.
pub const DIAGNOSTIC_ERROR: i32 = 0;
/// `LLVMVerifierFailureAction::LLVMReturnStatusAction`: report, never abort.
pub const VERIFY_RETURN_STATUS: i32 = 2;

/// Declares the table: one field per C function, resolved by its own name.
macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The loaded library and its functions.
        #[allow(non_snake_case)]
        pub struct Llvm {
            $(pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            /// Keeps the functions above valid; never unloaded.
            _library: libloading::Library,
        }

        impl Llvm {
            #[allow(non_snake_case)]
            fn resolve(library: libloading::Library, path: &str) -> Result<Llvm> {
                $(
                    // SAFETY: the symbol is LLVM 16's C function of that name, whose C
                    // signature the field's type spells; the library outlives the pointer
                    // (it is stored beside it and never unloaded).
                    let $name = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(concat!(stringify!($name), "\0").as_bytes())
                            .map_err(|e| missing(path, stringify!($name), &e))?
                    };
                )*
                Ok(Llvm { $($name,)* _library: library })
            }
        }
    };
}

api! {
    LLVMContextCreate: fn() -> Context;
    LLVMContextDispose: fn(Context);
    LLVMCreateMemoryBufferWithMemoryRangeCopy: fn(*const c_char, usize, *const c_char) -> MemoryBuffer;
    LLVMParseIRInContext: fn(Context, MemoryBuffer, *mut Module, *mut *mut c_char) -> Bool;
    LLVMVerifyModule: fn(Module, i32, *mut *mut c_char) -> Bool;
    LLVMDisposeModule: fn(Module);
    LLVMDisposeMessage: fn(*mut c_char);
    LLVMSetTarget: fn(Module, *const c_char);
    LLVMSetModuleDataLayout: fn(Module, TargetData);
    LLVMGetDefaultTargetTriple: fn() -> *mut c_char;
    LLVMGetHostCPUName: fn() -> *mut c_char;
    LLVMGetHostCPUFeatures: fn() -> *mut c_char;
    LLVMGetTargetFromTriple: fn(*const c_char, *mut Target, *mut *mut c_char) -> Bool;
    LLVMCreateTargetMachine: fn(Target, *const c_char, *const c_char, *const c_char, i32, i32, i32) -> TargetMachine;
    LLVMDisposeTargetMachine: fn(TargetMachine);
    LLVMCreateTargetDataLayout: fn(TargetMachine) -> TargetData;
    LLVMDisposeTargetData: fn(TargetData);
    LLVMCreatePassBuilderOptions: fn() -> PassBuilderOptions;
    LLVMPassBuilderOptionsSetLoopVectorization: fn(PassBuilderOptions, Bool);
    LLVMPassBuilderOptionsSetSLPVectorization: fn(PassBuilderOptions, Bool);
    LLVMDisposePassBuilderOptions: fn(PassBuilderOptions);
    LLVMRunPasses: fn(Module, *const c_char, TargetMachine, PassBuilderOptions) -> ErrorRef;
    LLVMGetErrorMessage: fn(ErrorRef) -> *mut c_char;
    LLVMDisposeErrorMessage: fn(*mut c_char);
    LLVMTargetMachineEmitToMemoryBuffer: fn(TargetMachine, Module, i32, *mut *mut c_char, *mut MemoryBuffer) -> Bool;
    LLVMGetBufferStart: fn(MemoryBuffer) -> *const c_char;
    LLVMGetBufferSize: fn(MemoryBuffer) -> usize;
    LLVMDisposeMemoryBuffer: fn(MemoryBuffer);
    LLVMInstallFatalErrorHandler: fn(extern "C" fn(*const c_char));
    LLVMContextSetDiagnosticHandler: fn(Context, extern "C" fn(DiagnosticInfo, *mut c_void), *mut c_void);
    LLVMGetDiagInfoDescription: fn(DiagnosticInfo) -> *mut c_char;
    LLVMGetDiagInfoSeverity: fn(DiagnosticInfo) -> i32;
}

/// The host architecture's name in LLVM's target initializers (`LLVMInitializeX86Target`).
const ARCH: Option<&str> = if cfg!(target_arch = "x86_64") {
    Some("X86")
} else if cfg!(target_arch = "aarch64") {
    Some("AArch64")
} else {
    None
};

impl Llvm {
    /// The process's LLVM, opened (and its host target initialized) on first use.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no `libLLVM-16` could be opened (saying which names were
    /// tried and how to install or name one), when it lacks a function of LLVM 16's C API, or
    /// when kiln has no LLVM target for this architecture. The same error every call.
    pub fn get() -> Result<&'static Llvm> {
        static LLVM: OnceLock<std::result::Result<Llvm, Error>> = OnceLock::new();
        LLVM.get_or_init(|| {
            let configured = std::env::var(LIBLLVM_ENV).ok().filter(|v| !v.trim().is_empty());
            let names: Vec<&str> = match &configured {
                Some(v) => vec![v.trim()],
                None => LIBRARY_NAMES.to_vec(),
            };
            let mut why = Vec::new();
            for name in &names {
                // SAFETY: opening libLLVM runs its static constructors, which only register
                // LLVM's own passes and options.
                match unsafe { libloading::Library::new(name) } {
                    Ok(library) => return Llvm::resolve(library, name).and_then(Llvm::initialize),
                    Err(e) => why.push(format!("{name}: {e}")),
                }
            }
            Err(Error::Unavailable(format!(
                "libLLVM 16 could not be opened ({}); install it (Debian: apt-get install libllvm16) or name it \
                 with {LIBLLVM_ENV}=/path/to/libLLVM-16.so.1",
                why.join("; ")
            )))
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Initializes the host architecture's target, machine code layer, object writer and
    /// assembly parser (for inline assembly).
    fn initialize(self) -> Result<Llvm> {
        let arch = ARCH.ok_or_else(|| {
            Error::Unavailable(format!("kiln's LLVM pair has no target for {}", std::env::consts::ARCH))
        })?;
        for part in ["TargetInfo", "Target", "TargetMC", "AsmPrinter", "AsmParser"] {
            let symbol = format!("LLVMInitialize{arch}{part}\0");
            // SAFETY: `LLVMInitialize<Arch><Part>` take no argument and return nothing; they
            // register the target with LLVM's registry (idempotent).
            unsafe {
                let init = self
                    ._library
                    .get::<unsafe extern "C" fn()>(symbol.as_bytes())
                    .map_err(|e| missing("libLLVM", symbol.trim_end_matches('\0'), &e))?;
                init();
            }
        }
        Ok(self)
    }

    /// Takes an LLVM-allocated message (`LLVMDisposeMessage` frees it) as a `String`;
    /// empty for a null pointer.
    ///
    /// # Safety
    /// `message` is null or a NUL-terminated string LLVM allocated and nothing else frees.
    pub unsafe fn take_message(&self, message: *mut c_char) -> String {
        if message.is_null() {
            return String::new();
        }
        // SAFETY: per the contract, a live NUL-terminated string owned by the caller.
        let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
        // SAFETY: allocated by LLVM, freed once here.
        unsafe { (self.LLVMDisposeMessage)(message) };
        text
    }

    /// The message of an `LLVMErrorRef` (consumed); empty for success (null).
    ///
    /// # Safety
    /// `error` is null or an unconsumed error LLVM returned.
    pub unsafe fn take_error(&self, error: ErrorRef) -> String {
        if error.is_null() {
            return String::new();
        }
        // SAFETY: consumes the error, returning a message owned by the caller.
        let message = unsafe { (self.LLVMGetErrorMessage)(error) };
        // SAFETY: `LLVMGetErrorMessage` returns a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
        // SAFETY: the message is freed with its own disposer, once.
        unsafe { (self.LLVMDisposeErrorMessage)(message) };
        text
    }
}

fn missing(path: &str, symbol: &str, e: &libloading::Error) -> Error {
    Error::Unavailable(format!("{path} lacks {symbol} ({e}); kiln's LLVM pair needs LLVM 16's C API"))
}
