//! The CUDA backend as the rest of kiln sees it ([`DRIVER`]): its registration, its
//! conformance entry, the offline `cuda:sm_XY` target (PTX or a cubin through NVRTC, no GPU
//! needed) and its own bench baselines, measured in the same run as kiln's figure: a device
//! copy of the same bytes for the streaming entries, and cuBLAS `sgemm` for the matmuls
//! (where libcublas loads; without it the host baseline stays). Each is checked before it is timed.

use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, UOp};
use kiln_device::{Baseline, BenchWork, Compiler, Conformance, Device, Driver, OfflineTarget, Renderer, Result};

use crate::{Arch, BACKEND, CudaCompiler, Output, cuda_renderer};

/// The CUDA backend's driver, for kiln-backends' list.
pub const DRIVER: Driver = Driver {
    register: crate::register,
    conformance: &[Conformance { name: "cuda", peer: "cpu", unsupported: &[], pair: None }],
    targets: &[OfflineTarget {
        name: "cuda",
        usage: "cuda:sm_XY (e.g. cuda:sm_90)",
        formats: &[("cubin", true), ("ptx", false)],
        check_arch: |arch| arch.parse::<Arch>().map(|_| ()),
        compile: compile_offline,
    }],
    baseline,
};

/// Renders `sink` as CUDA C++ and, given a format, compiles it for `arch` with NVRTC: PTX text
/// (with a final newline) or a cubin.
fn compile_offline(arch: &str, sink: &Arc<UOp>, name: &str, format: Option<&str>) -> Result<kiln_device::TargetOutput> {
    let arch: Arch = arch.parse()?;
    let spec = cuda_renderer(DeviceSpec::new(BACKEND, 0)).render(sink, Some(name))?;
    let output = match format {
        Some("ptx") => Output::Ptx,
        Some(_) => Output::Cubin,
        None => return Ok((spec, None)),
    };
    let mut bytes = CudaCompiler::new(arch, output)?.compile(&spec)?.bytes;
    if output == Output::Ptx {
        bytes.push(b'\n');
    }
    Ok((spec, Some(bytes)))
}

/// The CUDA device's own baseline for `work` on `device`, where one applies.
fn baseline(device: &Arc<Device>, work: &BenchWork<'_>) -> Result<Option<Baseline>> {
    if device.spec().base_type() != BACKEND {
        return Ok(None);
    }
    match *work {
        BenchWork::Stream { bytes } => Baseline::device_copy(device, bytes).map(Some),
        #[cfg(feature = "cublas")]
        BenchWork::Sgemm { n, a, b } => sgemm(device, n, a, b),
        _ => Ok(None),
    }
}

/// cuBLAS sgemm on n×n matrices, its product left for the caller to check; `None` when
/// libcublas does not load.
#[cfg(feature = "cublas")]
fn sgemm(device: &Device, n: usize, a: &[f32], b: &[f32]) -> Result<Option<Baseline>> {
    use kiln_device::Buffer;
    use kiln_device::kiln_ir::Scalar;
    let sgemm = match crate::blas::Sgemm::new(device.spec()) {
        Ok(s) => s,
        Err(kiln_device::Error::Unavailable(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let (ba, bb) = (Buffer::from_slice(device.allocator(), a)?, Buffer::from_slice(device.allocator(), b)?);
    let bc = device.buffer(Scalar::F32, n * n)?;
    let output = Some(bc.clone());
    let run = Box::new(move || sgemm.row_major(&ba, &bb, &bc, n));
    Ok(Some(Baseline { name: "cuBLAS sgemm".into(), run, output }))
}
