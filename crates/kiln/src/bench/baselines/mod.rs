//! The baselines kiln's figures are compared with, each measured in the same run: plain Rust
//! on all cores, the matrixmultiply crate, OpenBLAS in a process of its own ([`openblas`]),
//! the streaming bandwidth limit ([`stream`]) and, where a backend has them, the device's own
//! (its driver's, [`kiln_device::Driver::baseline`]: a device copy, cuBLAS, an empty dispatch).

pub mod openblas;
pub(super) mod stream;

use std::process::Command as Process;

use super::{BenchArgs, kiln_exe, time_reps, wrong};
use crate::error::CliError;

/// The side of the matmul entry: n×n.
pub(in crate::bench) const MATMUL_N: usize = 1024;

/// The matmul entry's inputs, the same in the parent and the baseline child: multiples of 1/8
/// with small numerators, so that every summation order gives the exact product.
pub(in crate::bench) fn matmul_inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..n * n).map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.75).collect();
    let b = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.125 - 0.625).collect();
    (a, b)
}

/// The threads `device`'s kernels run on (the CPU's core pool), else the host's cores: the
/// OpenBLAS baseline gets as many.
fn kiln_threads(device: &kiln_device::Device) -> usize {
    device.properties().threads.unwrap_or_else(threads)
}

/// The host's cores: the Rust baselines run one thread on each.
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Sum streamed on all cores, sixteen independent lanes per thread so the compiler
/// vectorizes it.
pub(super) fn sum(a: &[f32]) -> f32 {
    let chunk = a.len().div_ceil(threads());
    std::thread::scope(|s| {
        let parts: Vec<_> = a
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut lanes = [0f32; 16];
                    let mut it = part.chunks_exact(16);
                    for v in &mut it {
                        for (l, x) in lanes.iter_mut().zip(v) {
                            *l += x;
                        }
                    }
                    lanes.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
                })
            })
            .collect();
        parts.into_iter().map(|p| p.join().unwrap_or(f32::NAN)).sum()
    })
}

/// `c = a · b` (n×n, row-major) with the matrixmultiply crate (threaded).
pub(super) fn matmul(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
    if a.len() < n * n || b.len() < n * n || c.len() < n * n {
        return; // leaves `c` as it was: the caller's verification reports it
    }
    // SAFETY: the three slices hold n×n elements (checked above), row-major with row
    // stride n and column stride 1, and `c` does not alias `a` or `b` (it is `&mut`).
    unsafe {
        matrixmultiply::sgemm(
            n,
            n,
            n,
            1.0,
            a.as_ptr(),
            n as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Runs `kiln bench --baseline-child matmul_f32_1024` on kiln's thread count and reads its
/// report. OPENBLAS_CORETYPE
/// is set from the CPU's widest ISA ([`openblas::core_type`]) unless the user set it.
pub(super) fn openblas_in_child(
    args: &BenchArgs,
    device: &kiln_device::Device,
) -> Result<openblas::ChildReport, CliError> {
    let threads = kiln_threads(device);
    let exe = kiln_exe()?;
    let mut cmd = Process::new(&exe);
    cmd.args(["bench", "--baseline-child", "matmul_f32_1024", "--baseline-threads", &threads.to_string()]);
    if args.quick {
        cmd.arg("--quick");
    }
    let core = openblas::core_type().filter(|_| std::env::var_os(openblas::CORETYPE_ENV).is_none());
    if let Some(core) = core {
        cmd.env(openblas::CORETYPE_ENV, core);
    }
    let out = cmd.output().map_err(|e| CliError::Io { action: "starting", path: exe.clone(), source: e })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(wrong(
            "matmul_f32_1024",
            format!(
                "the OpenBLAS baseline process failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    openblas::ChildReport::parse(&stdout).map_err(|e| wrong("matmul_f32_1024", e))
}

/// The child side of the matmul entry's OpenBLAS baseline: load OpenBLAS with `threads`
/// threads, verify its product against matrixmultiply's (exact, see [`matmul_inputs`]), time
/// `reps` products and print one [`openblas::ChildReport`] line. Fails on a wrong product.
pub(super) fn matmul_baseline_child(threads: usize, reps: usize) -> Result<String, CliError> {
    let blas = match openblas::OpenBlas::load(openblas::LIBRARY_NAMES, threads) {
        Ok(blas) => blas,
        Err(why) => return Ok(openblas::ChildReport::Unavailable { why }.to_line()),
    };
    let n = MATMUL_N;
    let (a, b) = matmul_inputs(n);
    let mut reference = vec![0f32; n * n];
    matmul(&a, &b, &mut reference, n);
    let mut out = vec![f32::NAN; n * n];
    blas.matmul(&a, &b, &mut out, n);
    let check = |out: &[f32]| match (0..n * n).find(|&i| out[i] != reference[i]) {
        Some(i) => Err(wrong(
            "matmul_f32_1024",
            format!(
                "the baseline ({}) gives C[{}, {}] = {}, the reference {}",
                blas.name(),
                i / n,
                i % n,
                out[i],
                reference[i]
            ),
        )),
        None => Ok(()),
    };
    check(&out)?;
    out.fill(f32::NAN);
    let seconds = time_reps(reps, || {
        blas.matmul(&a, &b, &mut out, n);
        Ok(())
    })?;
    check(&out)?;
    let name = format!("{}, own process", blas.name());
    Ok(openblas::ChildReport::Timed { name, seconds }.to_line())
}
