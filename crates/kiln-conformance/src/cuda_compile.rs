//! The `cuda-compile` backend: the CPU device, with a compiler that first renders every
//! kernel as CUDA C++ and compiles it to PTX and an `sm_90` cubin, then compiles it for
//! the CPU. Running the suite on it compiles every conformance kernel with the CUDA
//! toolchain on a machine without a GPU (CI); a CUDA render or compile error fails the
//! test that compiled the kernel. Needs NVRTC (and uses ptxas when present).

use std::sync::Arc;

use kiln_cuda::{Arch, CudaCompiler, CudaRenderer, Output, cuda_renderer};
use kiln_device::kiln_ir::{DeviceSpec, Scalar, Wmma};
use kiln_device::{
    CacheConfig, CompiledSpec, Compiler, CompilerPair, Device, DeviceParts, Error, KernelCache, ProgramSpec, Renderer,
    Result,
};

/// The architecture every kernel is compiled for (H100).
pub const ARCH: Arch = Arch { major: 9, minor: 0 };

struct CrossCompiler {
    cpu: Arc<dyn Compiler>,
    cuda: Arc<CudaCompiler>,
    renderer: CudaRenderer,
}

impl Compiler for CrossCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let cuda = self.renderer.render(&spec.ast, Some(&spec.name))?;
        self.cuda.ptx_and_cubin(&cuda.src, &cuda.name)?;
        self.cpu.compile(spec)
    }

    fn cache_key(&self) -> &'static str {
        "cpu+cuda-compile"
    }

    fn fingerprint(&self) -> String {
        format!("{} | {}", self.cpu.fingerprint(), self.cuda.fingerprint())
    }
}

/// Every warp WMMA form ([`Wmma::warp_shapes`], tinygrad's `tc.cuda_sm80` list) in the
/// conformance warp kernel ([`crate::suite::matrix::warp_kernel`]), rendered as CUDA C++ and
/// compiled to PTX and an [`ARCH`] cubin: the `mma.sync` spellings checked by NVRTC and
/// ptxas without a GPU. (The `cuda-compile` device itself is the CPU's, which refuses the
/// warp forms, so its suite run cannot reach them.) Also checks that the CUDA renderer
/// refuses the one-thread form with a render error.
pub fn wmma_warp_shapes() -> crate::Outcome {
    let cuda = CudaCompiler::new(ARCH, Output::Cubin)?;
    let renderer = cuda_renderer(DeviceSpec::new("CUDA", 0));
    for w in Wmma::warp_shapes() {
        let sink = crate::suite::matrix::warp_kernel(w)?;
        let name = format!("wmma_{}_{}_{}", w.shape_name(), w.input.name(), w.acc.name());
        let spec = renderer.render(&sink, Some(&name))?;
        crate::ensure!(
            spec.src.contains(&format!("mma.sync.aligned.{}.row.col.", w.shape_name())),
            "{w}: {}",
            spec.src
        );
        cuda.ptx_and_cubin(&spec.src, &spec.name).map_err(|e| {
            crate::Failure::Violation(format!("WMMA {w} does not compile for {ARCH}: {e}\n{}", spec.src))
        })?;
    }
    let single = crate::suite::matrix::tile_kernel(Wmma::single(4, 4, 4, Scalar::F32, Scalar::F32))?;
    crate::expect_err(
        "the one-thread WMMA on CUDA",
        renderer.render(&single, Some("wmma_single")),
        |e| matches!(e, Error::Render(m) if m.contains("unsupported op WMMA")),
    )?;
    Ok(())
}

/// Opens the `cuda-compile` device: a fresh CPU device (its own allocator) with the cross
/// compiler and a memory-only kernel cache, so every kernel really goes through NVRTC.
pub fn open() -> Result<Arc<Device>> {
    let cuda = Arc::new(CudaCompiler::new(ARCH, Output::Cubin)?);
    let cpu = kiln_cpu::open(&DeviceSpec::new("CPU", 0))?;
    let description = format!("{} + CUDA {ARCH} compile", cpu.description());
    // Each generation takes the CPU device's current parts, with the cross compiler in front.
    let device = Device::new(DeviceSpec::new("CPU", 0), description, move |_| {
        let cpu_pair = cpu.compilers().first().cloned().ok_or_else(|| Error::Invalid("no CPU compiler".into()))?;
        let cross = Arc::new(CrossCompiler {
            cpu: cpu_pair.compiler,
            cuda: cuda.clone(),
            renderer: cuda_renderer(DeviceSpec::new("CUDA", 0)),
        });
        let parts = DeviceParts::new(
            cpu.allocator(),
            vec![CompilerPair::new("cc+nvrtc", cpu_pair.renderer, cross)],
            cpu.runtime(),
        );
        Ok(match cpu.queues() {
            Some(q) => parts.with_queues(q),
            None => parts,
        })
    })?
    .with_cache(Arc::new(KernelCache::new(CacheConfig::memory_only())));
    Ok(Arc::new(device))
}
