//! The CPU device's LLVM pair: kernels rendered to LLVM IR text ([`render::LlvmRenderer`]) and
//! compiled in process by libLLVM 16, loaded at run time ([`api`]), into ELF objects that
//! kiln's own loader loads ([`compile::LlvmCompiler`]).

pub mod api;
mod code;
pub mod compile;
pub mod render;
mod vmath;
mod wmma;

pub use compile::LlvmCompiler;
pub use render::LlvmRenderer;
