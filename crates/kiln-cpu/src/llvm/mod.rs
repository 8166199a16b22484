//! The CPU's LLVM pair: kernels rendered to LLVM IR text ([`render::LlvmRenderer`]).

mod code;
pub mod render;
mod vmath;
mod wmma;
