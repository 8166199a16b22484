//! Entries that time whole `kiln` processes: the disk cache hit and a warm `kiln run`.

use std::io::Write as _;
use std::process::Command as Process;
use std::time::Instant;

use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Device};

use super::compile::add_const_kernel;
use super::{Bench, BenchArgs};
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kiln_err, kiln_exe, wrong};
use crate::error::CliError;
use crate::npy::{self, NpyArray};

impl Bench {
    /// A new `kiln` process loads a kernel from a disk cache filled by an earlier process.
    pub(super) fn cache_disk_hit(&self, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let (exe, dir) = exe_and_private_dir("kiln-bench-disk-")?;
        let child = |expect_hit: bool| -> Result<f64, CliError> {
            let mut cmd = Process::new(&exe);
            cmd.args(["bench", "--disk-hit-child", "--device", &args.device.to_string()]);
            for compiler in &args.compiler {
                cmd.args(["--compiler", compiler]);
            }
            let out = cmd
                .env("KILN_CACHE_DIR", dir.path())
                .env_remove("KILN_CACHE")
                .output()
                .map_err(|e| CliError::Io { action: "starting", path: exe.clone(), source: e })?;
            let text = String::from_utf8_lossy(&out.stdout);
            let (kind, ms) = text.trim().split_once(' ').unwrap_or(("", ""));
            let ms: f64 = ms.parse().unwrap_or(f64::NAN);
            if !out.status.success() || kind != if expect_hit { "hit" } else { "miss" } || !ms.is_finite() {
                return Err(wrong(
                    "cache_disk_hit",
                    format!(
                        "the child process reported `{}` (expected a {}): {}",
                        text.trim(),
                        if expect_hit { "disk hit" } else { "miss" },
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                ));
            }
            Ok(ms)
        };
        let result = (|| {
            child(false)?;
            let samples: Result<Vec<f64>, CliError> = (0..self.reps.min(7)).map(|_| child(true)).collect();
            samples
        })();
        Ok(BenchResult {
            name: "cache_disk_hit",
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(result?)?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// The wall time of a whole `kiln run` process of an 8-element add on a warm kernel cache
    /// (a private `KILN_CACHE_DIR` filled by one run first): process start, parsing, opening
    /// the device, the disk-cache hit, the `.npy` inputs and output. Every run's output file is
    /// checked. The baseline, timed alternately with it, is a bare `kiln --version` process:
    /// the difference is what `kiln run` itself costs.
    pub(super) fn warm_run_process(&self, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let name = "warm_run_process";
        let (exe, dir) = exe_and_private_dir("kiln-bench-warm-")?;
        let path = |file: &str| dir.path().join(file);
        let n = 8;
        let (a, b): (Vec<f32>, Vec<f32>) = ((0..n).map(|i| i as f32).collect(), vec![1.0; n]);
        let npy_of = |file: &str, data: &[f32]| {
            let array = NpyArray::from_bytes(Scalar::F32, data.iter().flat_map(|x| x.to_le_bytes()).collect());
            array.and_then(|a| npy::write(&a)).map_err(|source| CliError::Npy { path: path(file), source })
        };
        // Written over in place (as `kiln run` writes its outputs), not truncated first.
        let write = |file: &str, bytes: &[u8]| {
            let p = path(file);
            std::fs::File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .and_then(|mut f| f.write_all(bytes).and_then(|()| f.set_len(bytes.len() as u64)))
                .map_err(|e| CliError::io("writing", &p, e))
        };
        write("add.kiln", include_str!("../../../../../examples/kernels/add.kiln").as_bytes())?;
        write("a.npy", &npy_of("a.npy", &a)?)?;
        write("b.npy", &npy_of("b.npy", &b)?)?;
        // Each run's output replaces this, so a run that wrote nothing is caught.
        let poison = npy_of("c.npy", &[f32::NAN; 8])?;
        let slot = |i: usize, file: &str| format!("{i}={}", path(file).display());
        let compiler = args.compiler.iter().flat_map(|c| ["--compiler".to_string(), c.clone()]);
        let run_args: Vec<String> = [
            "run".into(),
            path("add.kiln").display().to_string(),
            "--device".into(),
            args.device.to_string(),
            "--var".into(),
            format!("n={n}"),
            "--in".into(),
            slot(0, "a.npy"),
            "--in".into(),
            slot(1, "b.npy"),
            "--out".into(),
            slot(2, "c.npy"),
        ]
        .into_iter()
        .chain(compiler)
        .collect();
        // Times one child process (started, run to its end); its stdout is dropped.
        let timed = |args: &[String]| -> Result<f64, CliError> {
            let mut cmd = Process::new(&exe);
            cmd.args(args).env("KILN_CACHE_DIR", path("cache")).env_remove("KILN_CACHE");
            let t = Instant::now();
            let done = cmd.stdout(std::process::Stdio::null()).output();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let done = done.map_err(|e| CliError::Io { action: "starting", path: exe.clone(), source: e })?;
            if !done.status.success() {
                let why = String::from_utf8_lossy(&done.stderr);
                return Err(wrong(name, format!("`kiln {}` failed ({}): {}", args.join(" "), done.status, why.trim())));
            }
            Ok(ms)
        };
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let out = path("c.npy");
        // Checks the output of the run just made, then poisons it for the next one.
        let check = || -> Result<(), CliError> {
            let bytes = std::fs::read(&out).map_err(|e| CliError::io("reading", &out, e))?;
            let got = npy::read(&bytes).map_err(|source| CliError::Npy { path: out.clone(), source })?;
            let got: Vec<f32> =
                got.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if got != want {
                return Err(wrong(name, format!("`kiln run` wrote {got:?}, expected {want:?}")));
            }
            write("c.npy", &poison)
        };
        // The first run compiles and fills the cache; the timed ones load from it.
        timed(&run_args)?;
        check()?;
        let version = ["--version".to_string()];
        let reps = self.reps * 2 - 1;
        let (mut samples, mut bare) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            samples.push(timed(&run_args)?);
            check()?;
            bare.push(timed(&version)?);
        }
        Ok(BenchResult {
            name,
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: Some(Stats::of(bare)?),
            baseline_name: "`kiln --version` process".into(),
        })
    }
}

/// The child side of `cache_disk_hit`: compile the probe kernel from the disk cache named by
/// KILN_CACHE_DIR, time it, verify it, and print `hit MS` or `miss MS`.
pub(in crate::bench) fn disk_hit_child(device: &Device) -> Result<String, CliError> {
    let sink = add_const_kernel(7.0).map_err(|e| kiln_err("building the probe kernel", e.into()))?;
    let t = Instant::now();
    let k = device.compile(&sink, Some("disk_probe")).map_err(|e| kiln_err("compiling", e))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let stats = device.cache().stats();
    let x = Buffer::from_slice(device.allocator(), &[1.0f32, 2.0]).map_err(|e| kiln_err("uploading", e))?;
    k.launch(&[&x], &[]).map_err(|e| kiln_err("running", e))?;
    if x.to_vec::<f32>().map_err(|e| kiln_err("reading", e))? != [8.0, 9.0] {
        return Err(wrong("cache_disk_hit", "the kernel loaded from disk computed a wrong result".into()));
    }
    let kind = if stats.disk_hits == 1 && stats.misses == 0 { "hit" } else { "miss" };
    Ok(format!("{kind} {ms}\n"))
}

/// This `kiln` executable, for entries that time child processes, and a private folder with an
/// unpredictable name starting with `prefix` (removed when it drops).
fn exe_and_private_dir(prefix: &str) -> Result<(std::path::PathBuf, tempfile::TempDir), CliError> {
    let exe = kiln_exe()?;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| CliError::io("creating a folder in", &std::env::temp_dir(), e))?;
    Ok((exe, dir))
}
