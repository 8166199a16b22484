//! kiln-cuda: the CUDA backend.
//!
//! The rooms, read top to bottom:
//! - [`renderer`]: CUDA C++ from the kernel IR (the shared C-family core plus a dialect).
//! - [`compiler`]: NVRTC → PTX → cubin for one `sm_XX`; needs no GPU.

pub mod compiler;
pub mod renderer;

pub use compiler::{Arch, CudaCompiler, Output};
pub use renderer::CudaRenderer;
