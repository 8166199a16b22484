//! The part of LLVM 16's C API the LLVM pair calls, loaded from `libLLVM-16` at run time.
//!
//! kiln links no LLVM: the library is opened with `dlopen` by the LLVM pair's first compile
//! ([`Llvm::get`]), not when the CPU device opens: whether the device offers the pair, and how
//! the pair's kernels are keyed in the cache, come from probing the file ([`super::library`]),
//! so a process whose kernels all come from the cache never maps LLVM. `KILN_LIBLLVM` names the
//! library to open instead of the usual names.
//!
//! Every function pointer is resolved when the library opens, and its `LLVMGetVersion` must say
//! 16: a library that lacks a function or is another LLVM is refused then, naming the symbol or
//! the version.

use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

use kiln_device::{Error, Result};

pub use super::library::{LIBLLVM_ENV, LIBRARY_NAMES};
use super::library::{Library, REQUIRED_MAJOR};

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
    /// The process's LLVM, opened (and its host target initialized) on first use: the library
    /// [`Library::find`] found, checked to be LLVM 16 by its own `LLVMGetVersion`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no `libLLVM-16` was found or it could not be opened (saying
    /// which names were tried and how to install or name one), when it lacks a function of
    /// LLVM 16's C API or is another version, or when kiln has no LLVM target for this
    /// architecture. The same error every call.
    pub fn get() -> Result<&'static Llvm> {
        static LLVM: OnceLock<std::result::Result<Llvm, Error>> = OnceLock::new();
        LLVM.get_or_init(|| {
            let library = Library::find()?;
            let path = library.path.display().to_string();
            // SAFETY: opening libLLVM runs its static constructors, which only register
            // LLVM's own passes and options.
            let opened = unsafe { libloading::Library::new(&library.path) }.map_err(|e| {
                Error::Unavailable(format!("{path} (found as {}) could not be opened: {e}", library.name))
            })?;
            check_version(&opened, &path)?;
            Llvm::resolve(opened, &path)?.initialize()
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

/// Checks that the opened `library` says it is LLVM [`REQUIRED_MAJOR`] (`LLVMGetVersion`, which
/// LLVM 16's C API has and 15's lacks) before any other function is looked up, so that a file
/// whose name claims 16 but is another LLVM is refused naming its version.
fn check_version(library: &libloading::Library, path: &str) -> Result<()> {
    let wrong = |what: String| {
        Error::Unavailable(format!(
            "{path} is {what}, not LLVM {REQUIRED_MAJOR}; kiln's LLVM pair needs LLVM {REQUIRED_MAJOR}: install it \
             (Debian: apt-get install libllvm{REQUIRED_MAJOR}) or name it with {LIBLLVM_ENV}=/path/to/libLLVM-{REQUIRED_MAJOR}.so.1"
        ))
    };
    // SAFETY: `LLVMGetVersion(unsigned *, unsigned *, unsigned *)` in every LLVM that has it;
    // the library stays open while the pointer is used, below.
    let get = unsafe { library.get::<unsafe extern "C" fn(*mut u32, *mut u32, *mut u32)>(b"LLVMGetVersion\0") }
        .map_err(|_| wrong("an LLVM older than 16 or no LLVM (it has no LLVMGetVersion)".into()))?;
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: the function writes three unsigned ints through the pointers it is given.
    unsafe { get(&mut major, &mut minor, &mut patch) };
    if major != REQUIRED_MAJOR {
        return Err(wrong(format!("LLVM {major}.{minor}.{patch} (its LLVMGetVersion says so)")));
    }
    Ok(())
}

fn missing(path: &str, symbol: &str, e: &libloading::Error) -> Error {
    Error::Unavailable(format!(
        "{path} lacks {symbol} ({e}); kiln's LLVM pair needs LLVM {REQUIRED_MAJOR}'s C API (LLVM {REQUIRED_MAJOR} has it)"
    ))
}
