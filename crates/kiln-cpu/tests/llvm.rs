//! The LLVM renderer ([`kiln_cpu::llvm::render::LlvmRenderer`]) checked end to end without the
//! in-process compiler: its IR is optimized by `opt-16 -O2` and compiled by `llc-16 -O2` into
//! a relocatable object for this CPU, which kiln's ELF loader loads and [`CpuProgram`] runs.
//! Every single-device conformance body runs on a CPU device whose only pair is that route,
//! and a few kernels compare its bits with the C pair's. Without `llc-16` and `opt-16` on
//! `PATH` every test reports itself skipped (failing instead when `KILN_REQUIRE` names `llc`).

use std::ffi::OsStr;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use kiln_conformance::Outcome;
use kiln_cpu::isa::{CacheSizes, IsaTarget};
use kiln_cpu::llvm::render::LlvmRenderer;
use kiln_cpu::{CpuAllocator, CpuProgram, CpuQueueFactory};
use kiln_device::kiln_ir::{KernelBuilder, Scalar};
use kiln_device::testing::skip_unless_required;
use kiln_device::{
    Buffer, CompiledSpec, Compiler, CompilerPair, Device, DeviceParts, Error, LruAllocator, Program, ProgramSpec,
    Renderer, Result, RuntimeFactory,
};

/// A test-only compiler: `opt-16 -O2` then `llc-16 -O2` to an x86-64 object for this CPU
/// (position-independent, as the C pair's objects are).
struct LlcCompiler;

impl LlcCompiler {
    /// Runs `program` with `args`, failing with its output and the kernel's source.
    fn run(program: &str, args: &[&OsStr], src: &str) -> Result<()> {
        let out = Command::new(program)
            .args(args)
            .output()
            .map_err(|e| Error::CompilerMissing(format!("cannot run {program}: {e}")))?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Compile {
            message: format!("{program} rejected the kernel: {}", out.status),
            log: format!("{}\n--- source ---\n{src}", String::from_utf8_lossy(&out.stderr)),
            line: None,
        })
    }
}

impl Compiler for LlcCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        let io = |e: std::io::Error| Error::Compile { message: format!("scratch file: {e}"), log: String::new(), line: None };
        let dir = tempfile::tempdir().map_err(io)?;
        let (ll, bc, obj) = (dir.path().join("k.ll"), dir.path().join("k.bc"), dir.path().join("k.o"));
        std::fs::write(&ll, &spec.src).map_err(io)?;
        let os = OsStr::new;
        let target = [os("-mtriple=x86_64-unknown-linux-gnu"), os("-mcpu=native")];
        Self::run("opt-16", &[&target[..], &[os("-O2"), ll.as_os_str(), os("-o"), bc.as_os_str()]].concat(), &spec.src)?;
        let llc = [os("-O2"), os("-filetype=obj"), os("-relocation-model=pic"), bc.as_os_str(), os("-o"), obj.as_os_str()];
        Self::run("llc-16", &[&target[..], &llc[..]].concat(), &spec.src)?;
        let bytes = std::fs::read(&obj).map_err(io)?;
        Ok(CompiledSpec { name: spec.name.clone(), bytes, spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        "llc-16"
    }

    fn fingerprint(&self) -> String {
        format!("llc-16 opt-16 -O2 native {}", kiln_cpu::cpu_model())
    }
}

/// Whether `llc-16` and `opt-16` run; else why not.
fn toolchain() -> std::result::Result<(), String> {
    for tool in ["llc-16", "opt-16"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => return Err(format!("`{tool} --version` exited with {}", out.status)),
            Err(e) => return Err(format!("{tool} is not on PATH ({e})")),
        }
    }
    Ok(())
}

/// The CPU device whose one pair is (LLVM renderer, llc), or `None` after reporting `test`
/// skipped.
fn device(test: &str) -> Option<Arc<Device>> {
    static DEVICE: OnceLock<std::result::Result<Arc<Device>, String>> = OnceLock::new();
    let dev = DEVICE.get_or_init(|| {
        toolchain()?;
        let target = IsaTarget::native();
        let properties = kiln_cpu::isa::properties(target, CacheSizes::host());
        let renderer = Arc::new(LlvmRenderer::for_isa(target.isa));
        let pair = CompilerPair::new("llvm-llc", renderer, Arc::new(LlcCompiler)).with_properties(properties.clone());
        let device = Device::new(kiln_cpu::CPU.clone(), "CPU through LLVM IR and llc-16".into(), move |_| {
            let runtime: RuntimeFactory =
                Arc::new(|compiled| Ok(Arc::new(CpuProgram::load(compiled)?) as Arc<dyn Program>));
            let allocator = Arc::new(LruAllocator::from_env(Arc::new(CpuAllocator::new()))?);
            Ok(DeviceParts::new(allocator, vec![pair.clone()], runtime).with_queues(Arc::new(CpuQueueFactory::new())))
        })
        .map_err(|e| e.to_string())?
        .with_properties(properties);
        Ok(Arc::new(device))
    });
    match dev {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            skip_unless_required("llc", test, why);
            None
        }
    }
}

fn run(test: &str, body: fn(&Arc<Device>) -> Outcome) {
    let Some(dev) = device(test) else { return };
    if let Err(e) = body(&dev) {
        panic!("[llvm-llc] {test}: {e}");
    }
}

/// Runs `body` with the C pair's CPU device as the other device.
fn run_pair(test: &str, body: fn(&Arc<Device>, &Arc<Device>) -> Outcome) {
    let Some(dev) = device(test) else { return };
    let peer = kiln_cpu::open(&kiln_cpu::CPU).unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = body(&dev, &peer) {
        panic!("[llvm-llc with cpu] {test}: {e}");
    }
}

/// One test per conformance body, as `tests/conformance.rs` of kiln-conformance lists them.
macro_rules! suite {
    (single: $($test:ident => $body:expr),* $(,)?; pair: $($ptest:ident => $pbody:expr),* $(,)?) => {
        mod conformance {
            use super::*;
            use kiln_conformance::suite::{bounds, buffers, errors, matrix, plans, programs, queues, signals, workgroups};
            $(
                #[test]
                fn $test() {
                    run(stringify!($test), $body);
                }
            )*
            $(
                #[test]
                fn $ptest() {
                    run_pair(stringify!($ptest), $pbody);
                }
            )*
        }
    };
}

suite!(
    single:
            signal_ordering => signals::ordering,
            signal_timeout => signals::timeout,
            signal_failure_propagation => signals::failure_propagation,

            queue_nothing_runs_before_submit => queues::nothing_runs_before_submit,
            queue_two_queue_chain => queues::two_queue_chain,
            queue_copies => queues::copies,
            queue_memory_barrier => queues::memory_barrier,
            queue_recording_error_submits_nothing => queues::recording_error_submits_nothing,
            queue_failure_propagates => queues::failure_propagates,
            queue_buffers_outlive_handles => queues::buffers_outlive_handles,
            queue_signal_never_lowers => queues::signal_never_lowers,

            buffer_views => buffers::views,
            buffer_exact_size_transfers => buffers::exact_size_transfers,
            buffer_copies => buffers::copies,
            buffer_dtype_checked_access => buffers::dtype_checked_access,
            buffer_oversized_allocation => buffers::oversized_allocation,

            alu_bool => |d| programs::alu(d, Scalar::Bool),
            alu_i8 => |d| programs::alu(d, Scalar::I8),
            alu_i16 => |d| programs::alu(d, Scalar::I16),
            alu_i32 => |d| programs::alu(d, Scalar::I32),
            alu_i64 => |d| programs::alu(d, Scalar::I64),
            alu_u8 => |d| programs::alu(d, Scalar::U8),
            alu_u16 => |d| programs::alu(d, Scalar::U16),
            alu_u32 => |d| programs::alu(d, Scalar::U32),
            alu_u64 => |d| programs::alu(d, Scalar::U64),
            alu_f16 => |d| programs::alu(d, Scalar::F16),
            alu_bf16 => |d| programs::alu(d, Scalar::BF16),
            alu_f32 => |d| programs::alu(d, Scalar::F32),
            alu_f64 => |d| programs::alu(d, Scalar::F64),
            alu_f32x4 => |d| programs::alu_lanes(d, Scalar::F32, 4),
            alu_f32x8 => |d| programs::alu_lanes(d, Scalar::F32, 8),
            alu_f32x16 => |d| programs::alu_lanes(d, Scalar::F32, 16),
            alu_f64x2 => |d| programs::alu_lanes(d, Scalar::F64, 2),
            alu_f64x4 => |d| programs::alu_lanes(d, Scalar::F64, 4),
            alu_f64x8 => |d| programs::alu_lanes(d, Scalar::F64, 8),
            alu_i8x16 => |d| programs::alu_lanes(d, Scalar::I8, 16),
            alu_u8x16 => |d| programs::alu_lanes(d, Scalar::U8, 16),
            alu_i32x4 => |d| programs::alu_lanes(d, Scalar::I32, 4),
            alu_i32x16 => |d| programs::alu_lanes(d, Scalar::I32, 16),
            alu_i64x2 => |d| programs::alu_lanes(d, Scalar::I64, 2),
            alu_i64x8 => |d| programs::alu_lanes(d, Scalar::I64, 8),
            alu_f16x4 => |d| programs::alu_lanes(d, Scalar::F16, 4),
            alu_bf16x4 => |d| programs::alu_lanes(d, Scalar::BF16, 4),
            alu_boolx4 => |d| programs::alu_lanes(d, Scalar::Bool, 4),
            integer_division_i8 => |d| programs::integer_division(d, Scalar::I8),
            integer_division_i16 => |d| programs::integer_division(d, Scalar::I16),
            integer_division_i32 => |d| programs::integer_division(d, Scalar::I32),
            integer_division_i64 => |d| programs::integer_division(d, Scalar::I64),
            integer_division_u8 => |d| programs::integer_division(d, Scalar::U8),
            integer_division_u16 => |d| programs::integer_division(d, Scalar::U16),
            integer_division_u32 => |d| programs::integer_division(d, Scalar::U32),
            integer_division_u64 => |d| programs::integer_division(d, Scalar::U64),
            casts => programs::casts,
            casts_f64 => |d| programs::casts_with(d, Scalar::F64),
            casts_f16 => |d| programs::casts_with(d, Scalar::F16),
            casts_bf16 => |d| programs::casts_with(d, Scalar::BF16),
            bitcasts => programs::bitcasts,
            bitcasts_half => programs::bitcasts_half,
            bitcasts_f64 => programs::bitcasts_f64,
            vectors => programs::vectors,
            vectors_wide => programs::vectors_wide,
            variables => programs::variables,
            launch_dims => programs::launch_dims,
            odd_launch_sizes => programs::odd_launch_sizes,
            launch_on_views => programs::launch_on_views,
            nontemporal_stores => programs::nontemporal_stores,
            concurrent_launches => programs::concurrent_launches,
            gated_access => programs::gated_access,

            workgroup_tiled_matmul => workgroups::tiled_matmul,
            workgroup_two_level_reduction => workgroups::two_level_reduction,
            workgroup_if_blocks => workgroups::if_blocks,
            workgroup_guarded_local_memory => workgroups::guarded_local_memory,

            wmma_tile_f32 => |d| matrix::tile(d, Scalar::F32, Scalar::F32),
            wmma_tile_f16_f32 => |d| matrix::tile(d, Scalar::F16, Scalar::F32),
            wmma_tile_bf16_f32 => |d| matrix::tile(d, Scalar::BF16, Scalar::F32),
            wmma_tile_f16 => |d| matrix::tile(d, Scalar::F16, Scalar::F16),
            wmma_tile_bf16 => |d| matrix::tile(d, Scalar::BF16, Scalar::BF16),
            wmma_warp_m16n8k16_f16_f32 => |d| matrix::warp(d, 0),
            wmma_warp_m16n8k16_bf16_f32 => |d| matrix::warp(d, 1),
            wmma_warp_m16n8k16_f16_f16 => |d| matrix::warp(d, 2),
            wmma_warp_m16n8k8_f16_f32 => |d| matrix::warp(d, 3),
            wmma_warp_m16n8k8_f16_f16 => |d| matrix::warp(d, 4),
            wmma_warp_m16n8k8_tf32_f32 => |d| matrix::warp(d, 5),

            bounds_launch_refuses_out_of_bounds => bounds::launch_refuses_out_of_bounds,
            bounds_queue_exec_refuses_out_of_bounds => bounds::queue_exec_refuses_out_of_bounds,
            bounds_plan_refuses_out_of_bounds => bounds::plan_refuses_out_of_bounds,
            bounds_launch_guards_out_of_bounds => bounds::launch_guards_out_of_bounds,
            bounds_queue_guards_out_of_bounds => bounds::queue_guards_out_of_bounds,
            bounds_plan_guards_out_of_bounds => bounds::plan_guards_out_of_bounds,
            bounds_unprovable_correct_kernel_runs => bounds::unprovable_correct_kernel_runs,
            bounds_tinygrad_cumsum_runs => bounds::tinygrad_cumsum_runs,

            plan_hazards => plans::hazards,
            plan_independent_nodes => plans::independent_nodes,
            plan_replay_with_new_values => plans::replay_with_new_values,

            error_kernel_text => errors::kernel_text,
            error_malformed_graphs => errors::malformed_graphs,
            error_launch_checks => errors::launch_checks,
            error_values_fit_their_dtypes => errors::values_fit_their_dtypes,
            error_oversized_work_group => errors::oversized_work_group;
    pair:
            buffer_cross_device_copies => buffers::cross_device_copies,
            queue_cross_device => queues::cross_device,
            plan_cross_device_copies => plans::cross_device_copies
);
