//! The entries: each verifies its output against a host reference, then times repetitions.
//! The device they run on is opened by [`super::run`]; this module only uses it.

mod collective;
mod compile;
mod gpu;
mod matmul;
mod process;
mod runtime;
mod streaming;

use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, Scalar, UOp};
use kiln_device::{BenchWork, Buffer, Device, Kernel};

pub(super) use process::disk_hit_child;

use super::baselines::matmul_inputs;
use super::report::{BenchResult, Row, Skipped, Stats};
use super::{BenchArgs, alloc_err, kernels, kiln_err, per_sec, scaled, time_reps, wrong};
use crate::error::CliError;

/// The device under test and the timed repetitions per entry.
pub(super) struct Bench {
    pub(super) device: Arc<Device>,
    pub(super) reps: usize,
    /// `--quick`: a smoke run, where an entry may also shrink its work (`compile_throughput`).
    pub(super) quick: bool,
}

impl Bench {
    pub(super) fn axis(&self) -> kernels::Axis {
        if *self.device.spec() == DeviceSpec::new("CPU", 0) { "gidx0" } else { "idx0" }
    }

    /// The f32 lanes of the add, sum and softmax kernels: the device's widest vector.
    pub(super) fn width(&self) -> u8 {
        kernels::width_for(self.device.properties().f32_lanes())
    }

    pub(super) fn compile<E: Into<kiln_device::Error>>(
        &self,
        sink: Result<Arc<UOp>, E>,
        name: &str,
    ) -> Result<Kernel, CliError> {
        let sink = sink.map_err(|e| kiln_err(&format!("building the {name} kernel"), e.into()))?;
        self.device.compile(&sink, Some(name)).map_err(|e| kiln_err(&format!("compiling the {name} kernel"), e))
    }

    /// `data` in a new buffer of the device; one the device cannot hold is
    /// [`CliError::CannotRun`] (see [`alloc_err`]).
    pub(super) fn upload(&self, data: &[f32]) -> Result<Buffer, CliError> {
        upload_to(&self.device, data)
    }

    /// A new buffer of `n` zeros (allocated now); one the device cannot hold is
    /// [`CliError::CannotRun`] (see [`alloc_err`]).
    pub(super) fn zeros(&self, n: usize) -> Result<Buffer, CliError> {
        let b = self.device.buffer(Scalar::F32, n).map_err(|e| alloc_err("allocating bench output", e))?;
        b.copy_from_slice(&vec![0f32; n]).map_err(|e| alloc_err("clearing bench output", e))?;
        Ok(b)
    }

    pub(super) fn launch(&self, k: &Kernel, bufs: &[&Buffer]) -> Result<(), CliError> {
        k.launch(bufs, &[]).map_err(|e| kiln_err(&format!("running {}", k.spec.name), e))
    }

    pub(super) fn read(&self, b: &Buffer) -> Result<Vec<f32>, CliError> {
        b.to_vec::<f32>().map_err(|e| kiln_err("reading bench output", e))
    }

    /// Whether entry `name` runs on this device: `matmul_f32_4096` is shaped for GPUs (see
    /// [`gpu`]) and runs where [`Bench::gpu_shaped`] holds; every other entry runs everywhere.
    pub(super) fn applies(&self, name: &str) -> bool {
        name != "matmul_f32_4096" || self.gpu_shaped()
    }

    /// Runs the entry `name` (one of [`super::ENTRIES`]): its rows (one, but for the
    /// collective entries: one per rank count and size), each measured or skipped with the
    /// reason it cannot run on this device ([`CliError::CannotRun`]; an entry that does not
    /// apply to it). Every other error, a wrong result first, is the run's error.
    pub(super) fn rows(&self, name: &'static str, args: &BenchArgs) -> Result<Vec<Row>, CliError> {
        match name {
            "allreduce_devices" => self.allreduce_devices(),
            "allreduce_mpi" => self.allreduce_mpi(),
            "matmul_f32_4096" if !self.gpu_shaped() => Ok(vec![Err(Skipped {
                name,
                reason: format!(
                    "shaped for GPUs (work groups sharing tiles in local memory), measured on CUDA devices; \
                     matmul_f32_1024 is {}'s matmul",
                    self.device.spec()
                ),
            })]),
            name => Ok(vec![skipped_if_cannot_run(name, self.entry(name, args))?]),
        }
    }

    /// Runs the entry `name` (one of [`super::ENTRIES`]), with the device's own baseline
    /// where its backend has one ([`Bench::own_baseline`]).
    pub(super) fn entry(&self, name: &'static str, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let result = match name {
            "bandwidth_limit" => self.bandwidth_limit(),
            "add_f32_16m" => self.add(),
            "add_f32_16m_guarded" => self.add_guarded(),
            "sum_f32_16m" => self.sum(),
            "matmul_f32_1024" => self.matmul(args),
            "matmul_f32_4096" => self.matmul_gpu(),
            "softmax_f32_4096x1024" => self.softmax(),
            "queue_roundtrip" => self.queue_roundtrip(),
            "plan_replay_per_kernel" => self.plan_replay(),
            "signal_wake" => self.signal_wake(),
            "two_queue_overlap" => self.two_queue_overlap(),
            "compile_cold" => self.compile_cold(),
            "compile_throughput" => self.compile_throughput(),
            "cache_mem_hit" => self.cache_mem_hit(),
            "cache_disk_hit" => self.cache_disk_hit(args),
            "warm_run_process" => self.warm_run_process(args),
            "alloc_cached" => self.alloc_cached(),
            "device_reset" => self.device_reset(),
            other => Err(CliError::Usage(format!("unknown bench entry `{other}`"))),
        }?;
        self.own_baseline(result)
    }

    /// `r` with its baseline replaced by the device's own for the same work, where its
    /// backend has one: checked (by the backend, or here against the host product when it
    /// hands its output back), then timed like kiln's figure and in the same unit.
    fn own_baseline(&self, r: BenchResult) -> Result<BenchResult, CliError> {
        let inputs = match r.name {
            "matmul_f32_1024" => Some((1024, matmul_inputs(1024))),
            "matmul_f32_4096" => Some((4096, matmul_inputs(4096))),
            _ => None,
        };
        let work = match (r.name, &inputs) {
            // c = a + b reads 8 and writes 4 bytes per element; a sum reads 4.
            ("add_f32_16m", _) => BenchWork::Stream { bytes: 12 << 24 },
            ("sum_f32_16m", _) => BenchWork::Stream { bytes: 4 << 24 },
            ("queue_roundtrip", _) => BenchWork::RoundTrip,
            (_, Some((n, (a, b)))) => BenchWork::Sgemm { n: *n, a, b },
            _ => return Ok(r),
        };
        let own = kiln_backends::baseline(&self.device, &work).map_err(|e| kiln_err("the device's own baseline", e))?;
        let Some(mut own) = own else { return Ok(r) };
        let mut run = || (own.run)().map_err(|e| kiln_err(&format!("the {} baseline", own.name), e));
        run()?;
        if let (Some(out), Some((n, (a, b)))) = (&own.output, &inputs) {
            let mut reference = vec![0f32; n * n];
            super::baselines::matmul(a, b, &mut reference, *n);
            if self.read(out)? != reference {
                return Err(wrong(r.name, format!("{} disagrees with the host product", own.name)));
            }
        }
        let figure = match work {
            BenchWork::Stream { bytes } => per_sec(&time_reps(self.reps, &mut run)?, bytes as f64 / 1e9),
            BenchWork::RoundTrip => {
                for _ in 0..10 {
                    run()?;
                }
                scaled(&time_reps(self.reps * 100, &mut run)?, 1e6)
            }
            BenchWork::Sgemm { n, .. } => per_sec(&time_reps(self.reps, &mut run)?, 2.0 * (n * n * n) as f64 / 1e9),
        };
        Ok(BenchResult { baseline: Some(Stats::of(figure)?), baseline_name: own.name.clone().into(), ..r })
    }
}

/// `data` in a new buffer of `device`; one the device cannot hold is [`CliError::CannotRun`]
/// (see [`alloc_err`]).
pub(super) fn upload_to(device: &Device, data: &[f32]) -> Result<Buffer, CliError> {
    Buffer::from_slice(device.allocator(), data).map_err(|e| alloc_err("uploading bench input", e))
}

/// The row of `name` from what its measurement returned: skipped, with the reason, when it
/// could not run on the device ([`CliError::CannotRun`]); else the result or the error.
pub(super) fn skipped_if_cannot_run(name: &'static str, r: Result<BenchResult, CliError>) -> Result<Row, CliError> {
    match r {
        Ok(result) => Ok(Ok(result)),
        Err(CliError::CannotRun(reason)) => Ok(Err(Skipped { name, reason })),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a buffer the device cannot hold (beyond a fixed limit, or its memory) becomes a
    /// skipped row, with the reason; a wrong result, a compile error and a malformed buffer
    /// request stay errors that end the run.
    #[test]
    fn only_cannot_run_conditions_become_skipped_rows() {
        let limit = kiln_device::Error::Limit { device: "WEBGPU:0".into(), message: "past the binding limit".into() };
        let oom = kiln_device::Error::OutOfMemory {
            device: "OPENCL:0".into(),
            requested: 1 << 30,
            in_use: 0,
            cached: 0,
            budget: None,
        };
        for (e, says) in [(limit, "past the binding limit"), (oom, "out of memory on OPENCL:0")] {
            match skipped_if_cannot_run("entry", Err(alloc_err("uploading", e))) {
                Ok(Err(Skipped { name: "entry", reason })) => {
                    assert!(reason.starts_with("uploading: ") && reason.contains(says), "{reason}")
                }
                other => panic!("expected a skipped row, got {other:?}"),
            }
        }
        let compile = kiln_device::Error::Compile { message: "bad".into(), log: String::new(), line: None };
        let failures = [
            wrong("entry", "element 3 is 2, want 1".into()),
            alloc_err("uploading", kiln_device::Error::Buffer("size mismatch".into())),
            alloc_err("compiling", compile),
        ];
        for failure in failures {
            let text = failure.report();
            assert!(skipped_if_cannot_run("entry", Err(failure)).is_err(), "{text} was skipped");
        }
    }
}
