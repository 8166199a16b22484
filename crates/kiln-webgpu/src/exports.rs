//! The WebGPU backend as the rest of kiln sees it ([`DRIVER`]): its registration, its
//! conformance entry, the offline `webgpu` target (WGSL for an adapter with f16 and i64,
//! validated and translated by naga to SPIR-V or MSL, no device needed) and its own bench
//! baselines, measured in the same run with wgpu itself:
//! - streaming entries: a device copy moving the same bytes (the allocator's
//!   `copy_buffer_to_buffer`, waited for): the bandwidth a streaming kernel can reach here;
//! - queue round trip: one empty compute dispatch submitted and waited for, on a wgpu device
//!   of its own: the round trip wgpu and the driver cost without kiln.
//!
//! On lavapipe (Mesa's software Vulkan) these measure the runtime's overhead on the CPU, not a GPU.

use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, UOp};
use kiln_device::{Baseline, BenchWork, Conformance, Device, Driver, Error, OfflineTarget, Renderer, Result};

use crate::{BACKEND, Caps, Emit, EmptyDispatch, WgslRenderer, translate};

/// Why this backend skips `bitcasts_half`: WGSL reinterprets an f16 only as half of a
/// `vec2<f16>` (naga's `bitcast` keeps the component count, so a lone f16 has no bitcast to
/// an integer), and the way through its f32 value quiets a signalling NaN (f16 0xfc4d reads
/// back as 0xfe4d). Every other f16 and bf16 bitcast of the group is exact.
const WGSL_F16_BITS: &str = "WGSL cannot reinterpret a lone f16's bits; through f32, a signalling f16 NaN is quieted";

/// The WebGPU backend's driver, for kiln-backends' list.
pub const DRIVER: Driver = Driver {
    register: crate::register,
    conformance: &[Conformance {
        name: "webgpu",
        peer: "cpu",
        unsupported: &[("bitcasts_half", WGSL_F16_BITS)],
        pair: None,
    }],
    targets: &[OfflineTarget {
        name: "webgpu",
        usage: "webgpu",
        formats: &[("wgsl", false), ("spirv", true), ("msl", false)],
        check_arch: |arch| match arch {
            "" => Ok(()),
            _ => Err(Error::Invalid(format!("the webgpu target has no architecture, got `{arch}`"))),
        },
        compile: compile_offline,
    }],
    baseline,
};

/// Renders `sink` as WGSL and, given a format, validates it with naga and writes it in that
/// language (MSL with a final newline).
fn compile_offline(
    _arch: &str,
    sink: &Arc<UOp>,
    name: &str,
    format: Option<&str>,
) -> Result<kiln_device::TargetOutput> {
    let caps = Caps { f16: true, int64: true };
    let spec = WgslRenderer::new(DeviceSpec::new(BACKEND, 0), caps).render(sink, Some(name))?;
    let emit = match format {
        Some("spirv") => Emit::Spirv,
        Some("msl") => Emit::Msl,
        Some(_) => Emit::Wgsl,
        None => return Ok((spec, None)),
    };
    let mut out = translate(&spec.src, caps, emit, &spec.name)?;
    if emit == Emit::Msl {
        out.push(b'\n');
    }
    Ok((spec, Some(out)))
}

/// The WebGPU device's own baseline for `work` on `device`, where one applies.
fn baseline(device: &Arc<Device>, work: &BenchWork<'_>) -> Result<Option<Baseline>> {
    if device.spec().base_type() != BACKEND {
        return Ok(None);
    }
    match *work {
        BenchWork::Stream { bytes } => Baseline::device_copy(device, bytes).map(Some),
        BenchWork::RoundTrip => {
            let empty = EmptyDispatch::new(device.spec())?;
            let run = Box::new(move || empty.run());
            Ok(Some(Baseline { name: "wgpu empty dispatch + wait".into(), run, output: None }))
        }
        BenchWork::Sgemm { .. } => Ok(None),
    }
}
