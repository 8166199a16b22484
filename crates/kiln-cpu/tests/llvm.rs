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
        let io = |e: std::io::Error| Error::Compile {
            message: format!("scratch file: {e}"),
            log: String::new(),
            line: None,
        };
        let dir = tempfile::tempdir().map_err(io)?;
        let (ll, bc, obj) = (dir.path().join("k.ll"), dir.path().join("k.bc"), dir.path().join("k.o"));
        std::fs::write(&ll, &spec.src).map_err(io)?;
        let os = OsStr::new;
        let target = [os("-mtriple=x86_64-unknown-linux-gnu"), os("-mcpu=native")];
        Self::run(
            "opt-16",
            &[&target[..], &[os("-O2"), ll.as_os_str(), os("-o"), bc.as_os_str()]].concat(),
            &spec.src,
        )?;
        let llc =
            [os("-O2"), os("-filetype=obj"), os("-relocation-model=pic"), bc.as_os_str(), os("-o"), obj.as_os_str()];
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

/// Deterministic pseudo-random 64-bit words.
fn words(n: usize, seed: u64) -> Vec<u64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect()
}

/// `n` inputs of `s` as bytes: the special values (zeros, infinities, NaN, subnormals, the
/// edges of exp's range), values spread over the magnitudes the math functions reduce, and
/// random bit patterns.
fn inputs(s: Scalar, n: usize, seed: u64) -> Vec<u8> {
    let special =
        [0.0, -0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-310, -1e-40, 88.7, -103.9, 709.9];
    let w = words(n, seed);
    let mut out = Vec::with_capacity(n * s.size());
    for (i, r) in w.iter().enumerate() {
        let spread = ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * [2.0, 20.0, 200.0, 2000.0][i % 4];
        let v = if i < special.len() { special[i] } else { spread };
        match s {
            Scalar::F32 if i % 3 == 2 => out.extend_from_slice(&(*r as u32).to_le_bytes()),
            Scalar::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            Scalar::F64 if i % 3 == 2 => out.extend_from_slice(&r.to_le_bytes()),
            Scalar::F64 => out.extend_from_slice(&v.to_le_bytes()),
            _ => out.extend_from_slice(&(*r as u16).to_le_bytes()),
        }
    }
    out
}

/// Whether the math kernel `op` reads a second operand.
fn binary(op: &str) -> bool {
    matches!(op, "max" | "min" | "pow" | "mulacc")
}

/// `y = op(x)` (or `op(x, z)`) on `w`-lane vectors of `s`, over `n` elements.
fn math_kernel(s: Scalar, w: u8, n: i64, op: &str) -> Arc<kiln_device::kiln_ir::UOp> {
    let mut k = KernelBuilder::new();
    let (x, y) = (k.param(0, s, n), k.param(1, s, n));
    let i = k.global(0, n / i64::from(w));
    let at = &i * i64::from(w);
    let a = x.at_vec(&at, w).load();
    let b = if binary(op) { k.param(2, s, n).at_vec(&at, w).load() } else { a.clone() };
    let r = match op {
        "exp" => a.exp(),
        "exp2" => a.exp2(),
        "log" => a.log(),
        "log2" => a.log2(),
        "sin" => a.sin(),
        "cos" => a.cos(),
        "sqrt" => a.sqrt(),
        "max" => a.max(&b),
        "min" => a.min(&b),
        "pow" => a.pow(&b),
        _ => a.mul_acc(&b, &a),
    };
    k.store(&y.at_vec(&at, w), &r);
    k.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// The transcendental and MAX/MIN kernels give the C pair's bits exactly: libm where it calls
/// libm, its vector math on f32/f64 vectors (every width, padded ones and those wider than a
/// register included), its `maxps` forms, f16 through f32.
#[test]
fn math_matches_the_c_pair_bit_for_bit() {
    let Some(llvm) = device("math_matches_the_c_pair_bit_for_bit") else { return };
    let c = kiln_cpu::open(&kiln_cpu::CPU).unwrap_or_else(|e| panic!("{e}"));
    let n = 96 * 32;
    let ops = ["exp", "exp2", "log", "log2", "sin", "cos", "sqrt", "max", "min", "pow", "mulacc"];
    let cases: [(Scalar, &[u8]); 4] = [
        (Scalar::F32, &[1, 2, 3, 4, 8, 16, 32]),
        (Scalar::F64, &[1, 2, 3, 4, 8]),
        (Scalar::F16, &[1, 4]),
        (Scalar::BF16, &[8]),
    ];
    let mut bad = Vec::new();
    for (s, widths) in cases {
        let (x, z) = (inputs(s, n, 1), inputs(s, n, 2));
        for &w in widths {
            for op in ops {
                let sink = math_kernel(s, w, n as i64, op);
                let name = format!("m_{op}_{}x{w}", s.name());
                let run = |dev: &Arc<Device>| {
                    let kernel = dev.compile(&sink, Some(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let data: &[&Vec<u8>] = if binary(op) { &[&x, &x, &z] } else { &[&x, &x] };
                    let bufs: Vec<Buffer> = data
                        .iter()
                        .map(|bytes| {
                            let b = dev.buffer(s, n).unwrap_or_else(|e| panic!("{e}"));
                            b.copyin(bytes).unwrap_or_else(|e| panic!("{e}"));
                            b
                        })
                        .collect();
                    let views: Vec<&Buffer> = bufs.iter().collect();
                    kernel.launch(&views, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let mut out = vec![0u8; n * s.size()];
                    bufs[1].copyout(&mut out).unwrap_or_else(|e| panic!("{e}"));
                    out
                };
                let (want, got) = (run(&c), run(&llvm));
                if let Some(e) = (0..n).find(|e| want[e * s.size()..][..s.size()] != got[e * s.size()..][..s.size()]) {
                    let lane = |b: &[u8]| b[e * s.size()..][..s.size()].to_vec();
                    bad.push(format!("{name}: element {e}: C {:02x?}, LLVM {:02x?}", lane(&want), lane(&got)));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} kernel(s) differ:\n{}", bad.len(), bad.join("\n"));
}

/// llc's objects (constant pools in `.rodata.cst*` sections, libm calls through PLT32
/// relocations) load with kiln's ELF loader.
#[test]
fn llc_objects_with_constant_pools_and_libm_calls_load() {
    let test = "llc_objects_with_constant_pools_and_libm_calls_load";
    if device(test).is_none() {
        return;
    }
    let spec = LlvmRenderer::for_isa(IsaTarget::native().isa)
        .render(&math_kernel(Scalar::F32, 8, 64, "exp"), Some("pools"))
        .unwrap_or_else(|e| panic!("{e}"));
    let compiled = LlcCompiler.compile(&spec).unwrap_or_else(|e| panic!("{e}"));
    let has = |needle: &[u8]| compiled.bytes.windows(needle.len()).any(|w| w == needle);
    assert!(spec.src.contains("define internal <8 x float> @kiln_exp_f32x8("), "{}", spec.src);
    assert!(has(b".rodata.cst"), "the exp polynomial's constants are in a constant pool");
    CpuProgram::load(&compiled).unwrap_or_else(|e| panic!("{e}"));
    let spec = LlvmRenderer::for_isa(IsaTarget::native().isa)
        .render(&math_kernel(Scalar::F32, 1, 64, "sin"), Some("libm"))
        .unwrap_or_else(|e| panic!("{e}"));
    let compiled = LlcCompiler.compile(&spec).unwrap_or_else(|e| panic!("{e}"));
    assert!(spec.src.contains("declare float @sinf(float)"), "{}", spec.src);
    CpuProgram::load(&compiled).unwrap_or_else(|e| panic!("{e}"));
}
