//! The CPU device's LLVM pair: kernels rendered to LLVM IR and compiled in process by
//! libLLVM 16, loaded at run time ([`api`]), into ELF objects that kiln's own loader loads.

pub mod api;
pub mod compile;

pub use compile::LlvmCompiler;
