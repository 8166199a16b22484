//! The conformance suite, instantiated once per backend.
//!
//! Every test body lives in `kiln_conformance::suite`; this file only lists them once
//! (`suite!`) and instantiates the list per backend (`backends!`). Adding a backend is its
//! registration in its driver (`kiln_device::Conformance`: peer, unsupported tests) and one
//! line in `backends!`; `every_registered_backend_runs_the_suite` fails until both exist. Adding a
//! check is one line in the `suite!` list.
//!
//! A test whose backend is not present, or which its registration lists as unsupported,
//! writes `SKIPPED <test>: <reason>` beside its `ok`, unless `KILN_REQUIRE` names the backend
//! (then an absent backend fails). Cross-device checks run against the registration's peer
//! backend and are skipped the same way when the peer is missing.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use kiln_conformance::{Failure, Outcome, backend, unsupported};
use kiln_device::Device;
use kiln_device::testing::report_skip;

/// The longest one test body may take before it counts as hung. Far above any healthy run
/// (the whole suite takes seconds); it turns a deadlock into a failure naming the test
/// instead of a stuck CI job.
const BODY_LIMIT: Duration = Duration::from_secs(180);

/// Runs `body` on a watchdog thread and panics with its failure, or when it hangs.
fn watched(label: String, body: impl FnOnce() -> Outcome + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(BODY_LIMIT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("[{label}] {e}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let why = worker.join().err().map_or_else(String::new, |p| match p.downcast_ref::<&str>() {
                Some(s) => s.to_string(),
                None => p.downcast_ref::<String>().cloned().unwrap_or_default(),
            });
            panic!("[{label}] the test body panicked: {why}")
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("[{label}] {}", Failure::Violation(format!("the test body hung for {BODY_LIMIT:?}")))
        }
    }
}

/// The device of backend `name` for `test` (`module::function`), or `None` once the test is
/// reported as skipped: its registration lists it as unsupported, or the backend is absent.
fn device_for(name: &str, test: &str) -> Option<Arc<Device>> {
    let function = test.rsplit("::").next().unwrap_or(test);
    if let Some(why) = unsupported(name, function) {
        report_skip(test, &format!("unsupported by {name}: {why}"));
        return None;
    }
    backend(name, test)
}

/// Runs `body` on backend `name`, panicking with the failure (this is the test harness).
fn run(name: &str, test: &str, body: fn(&Arc<Device>) -> Outcome) {
    let Some(dev) = device_for(name, test) else { return };
    watched(name.to_string(), move || body(&dev));
}

/// Runs `body` on backend `name` with its registration's peer as the other device.
fn run_pair(name: &str, test: &str, body: fn(&Arc<Device>, &Arc<Device>) -> Outcome) {
    let Some(dev) = device_for(name, test) else { return };
    let peer = kiln_conformance::registration(name).map_or("", |r| r.peer);
    let Some(other) = backend(peer, test) else { return };
    watched(format!("{name} with {peer}"), move || body(&dev, &other));
}

macro_rules! suite {
    ($name:literal) => {
        use kiln_conformance::suite::{bounds, buffers, collectives, errors, matrix, plans, programs, queues, signals, workgroups};
        use kiln_device::kiln_ir::Scalar;

        suite!(@single $name;
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

            collective_all_reduce => collectives::all_reduce,
            collective_gather_scatter_broadcast_send => collectives::gather_scatter_broadcast_send,
            collective_checks => collectives::checks,
            collective_failures => collectives::failures,

            error_kernel_text => errors::kernel_text,
            error_malformed_graphs => errors::malformed_graphs,
            error_launch_checks => errors::launch_checks,
            error_values_fit_their_dtypes => errors::values_fit_their_dtypes,
            error_oversized_work_group => errors::oversized_work_group,
        );

        suite!(@pair $name;
            buffer_cross_device_copies => buffers::cross_device_copies,
            queue_cross_device => queues::cross_device,
            error_foreign_buffer => errors::foreign_buffer,
            plan_cross_device_copies => plans::cross_device_copies,
        );
    };
    (@single $name:literal; $($test:ident => $body:expr),* $(,)?) => {
        /// The names of this module's single-device tests.
        pub const SINGLE: &[&str] = &[$(stringify!($test)),*];
        $(
            #[test]
            fn $test() {
                super::run($name, concat!(module_path!(), "::", stringify!($test)), $body);
            }
        )*
    };
    (@pair $name:literal; $($test:ident => $body:expr),* $(,)?) => {
        /// The names of this module's cross-device tests.
        pub const PAIR: &[&str] = &[$(stringify!($test)),*];
        $(
            #[test]
            fn $test() {
                super::run_pair($name, concat!(module_path!(), "::", stringify!($test)), $body);
            }
        )*
    };
}

/// The CUDA warp WMMA forms compiled to PTX and an sm_90 cubin (NVRTC and ptxas, no GPU),
/// when the `cuda-compile` backend is present; required when `KILN_REQUIRE` names it.
#[test]
fn cuda_compile_wmma_warp_shapes() {
    run("cuda-compile", "cuda_compile_wmma_warp_shapes", |_| kiln_conformance::cuda_compile::wmma_warp_shapes());
}

/// One line per backend: module name and backend name (as in `KILN_REQUIRE`); also lists
/// every instantiated backend with its tests, for the check below.
macro_rules! backends {
    ($($module:ident: $name:literal),* $(,)?) => {
        $(
            mod $module {
                suite!($name);
            }
        )*

        /// Every backend this file runs the suite on, with its tests' names.
        const INSTANTIATED: &[(&str, &[&str], &[&str])] = &[$(($name, $module::SINGLE, $module::PAIR)),*];
    };
}

/// The fault scenarios, on the CPU, OpenCL, CUDA and WebGPU backends (each on a fresh device of its
/// own; the injected faults leave the CUDA context healthy, so a reset there keeps it).
#[cfg(feature = "fault-injection")]
macro_rules! faults {
    ($module:ident, $name:literal) => {
        mod $module {
            use kiln_conformance::suite::faults;

            suite!(@single $name;
                fault_compile_failure => faults::compile_failure,
                fault_alloc_failure => faults::alloc_failure,
                fault_kernel_fault => faults::kernel_fault,
                fault_signal_timeout => faults::signal_timeout,
                fault_device_loss => faults::device_loss,
                fault_collective_peer => faults::collective_peer_fault,
            );
        }
    };
}

#[cfg(feature = "fault-injection")]
faults!(cpu_faults, "cpu");
#[cfg(feature = "fault-injection")]
faults!(opencl_faults, "opencl");
#[cfg(feature = "fault-injection")]
faults!(cuda_faults, "cuda");
#[cfg(feature = "fault-injection")]
faults!(webgpu_faults, "webgpu");

/// The fault scenarios' names (the same on every backend that runs them).
#[cfg(feature = "fault-injection")]
const FAULT_TESTS: [&[&str]; 4] =
    [cpu_faults::SINGLE, opencl_faults::SINGLE, cuda_faults::SINGLE, webgpu_faults::SINGLE];
#[cfg(not(feature = "fault-injection"))]
const FAULT_TESTS: [&[&str]; 0] = [];

backends! {
    cpu: "cpu",
    cpu_guarded: "cpu-guarded",
    cpu_avx2: "cpu-avx2",
    cpu_sse2: "cpu-sse2",
    cpu_cc: "cpu-cc",
    cpu_llvm: "cpu-llvm",
    opencl: "opencl",
    cuda: "cuda",
    cuda_compile: "cuda-compile",
    webgpu: "webgpu",
}

/// Every backend of the registry and of the suite's own runs the suite, every
/// unsupported test a registration lists is a test of it, and `KILN_REQUIRE` names only
/// backends the suite runs (a misspelt name would otherwise require nothing).
#[test]
fn every_registered_backend_runs_the_suite() {
    kiln_conformance::register_backends();
    let instantiated = |name: &str| INSTANTIATED.iter().find(|(n, ..)| *n == name);
    for b in kiln_device::backends() {
        let name = b.name.to_ascii_lowercase();
        assert!(
            kiln_conformance::registration(&name).is_some(),
            "registered backend `{name}` has no Conformance entry"
        );
        assert!(instantiated(&name).is_some(), "registered backend `{name}` has no line in backends!");
    }
    for r in kiln_conformance::registrations() {
        let Some((_, single, pair)) = instantiated(r.name) else { panic!("`{}` has no line in backends!", r.name) };
        assert!(instantiated(r.peer).is_some(), "`{}`'s peer `{}` is not a backend of the suite", r.name, r.peer);
        for (test, _) in r.unsupported {
            let known = single.contains(test) || pair.contains(test) || FAULT_TESTS.iter().any(|f| f.contains(test));
            assert!(known, "`{}` lists `{test}`, which is no test", r.name);
        }
    }
    for name in kiln_device::required_names() {
        assert!(
            instantiated(&name).is_some(),
            "{} names `{name}`, which the suite does not run",
            kiln_device::REQUIRE_ENV
        );
    }
}
