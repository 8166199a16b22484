//! The CPU device's LLVM pair: kernels rendered to LLVM IR text ([`render::LlvmRenderer`]) and
//! compiled in process by libLLVM 16, loaded at run time by the pair's first compile ([`api`]),
//! into ELF objects that kiln's own loader loads ([`compile::LlvmCompiler`]). Whether the pair
//! is offered is decided without loading LLVM ([`library`], [`available`]).

pub mod api;
mod code;
pub mod compile;
pub mod library;
pub mod render;
mod vmath;
mod wmma;

pub use compile::LlvmCompiler;
pub use library::Library;
pub use render::LlvmRenderer;

/// The libLLVM this process's LLVM pair will use, if it can offer the pair: found and its
/// version read from its file ([`Library::find`]) without opening it, unless its names do not
/// tell its version, when it is opened to ask ([`api::Llvm::get`]).
///
/// # Errors
/// [`kiln_device::Error::Unavailable`] saying why the pair cannot be offered: no library found,
/// one of another LLVM version, or (for a library opened to ask) one that does not open or
/// is not LLVM 16.
pub fn available() -> kiln_device::Result<&'static Library> {
    let library = Library::find()?;
    if library.major.is_none() {
        api::Llvm::get()?;
    }
    Ok(library)
}
