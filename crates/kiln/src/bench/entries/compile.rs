//! Compiler and cache entries: cold compiles, batch throughput, memory hits and reset.

use std::sync::Arc;
use std::time::Instant;

use kiln_device::Kernel;
use kiln_device::kiln_ir::{Scalar, UOp};

use super::Bench;
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kiln_err, wrong};
use crate::error::CliError;

/// Kernels per sample of `compile_throughput`.
const THROUGHPUT_KERNELS: usize = 64;

/// The batch of `compile_throughput` under `--quick`, compiled once: a smoke run checks that
/// batches compile and compute, in seconds on a device whose compiler takes a quarter second
/// a kernel (PoCL), where the full entry takes minutes.
const QUICK_THROUGHPUT_KERNELS: usize = 8;

/// `x[i] += c` over two elements: a kernel whose identity changes with `c`.
pub(super) fn add_const_kernel(c: f32) -> Result<Arc<UOp>, kiln_device::kiln_ir::IrError> {
    let mut k = kiln_device::kiln_ir::KernelBuilder::new();
    let x = k.param(0, Scalar::F32, 2usize);
    let i = k.global(0, 2usize);
    let v = x.at(&i).load() + c;
    k.store(&x.at(&i), &v);
    k.finish()
}

impl Bench {
    /// Render + compile + load of kernels no cache has seen (a fresh constant in each).
    pub(super) fn compile_cold(&self) -> Result<BenchResult, CliError> {
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let reps = self.reps.min(5);
        let mut samples = Vec::with_capacity(reps);
        for r in 0..reps {
            let c = ((nonce % 1_000_000) as f32) + r as f32;
            let sink = add_const_kernel(c).map_err(|e| kiln_err("building the compile kernel", e.into()))?;
            let t = Instant::now();
            let spec =
                self.device.renderer().render(&sink, Some("compile_cold")).map_err(|e| kiln_err("rendering", e))?;
            let compiled = self.device.compiler().compile(&spec).map_err(|e| kiln_err("compiling", e))?;
            let program = (self.device.runtime())(&compiled).map_err(|e| kiln_err("loading", e))?;
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            let k = Kernel::new(compiled.spec.clone(), program);
            let x = self.upload(&[1.0, 2.0])?;
            self.launch(&k, &[&x])?;
            if self.read(&x)? != [1.0 + c, 2.0 + c] {
                return Err(wrong("compile_cold", "the freshly compiled kernel computed a wrong result".into()));
            }
        }
        Ok(BenchResult {
            name: "compile_cold",
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// Kernels compiled per second, cold: a batch of [`THROUGHPUT_KERNELS`] distinct small
    /// kernels through `Device::compile_many` (all cores), against the baseline of as many
    /// other ones compiled one after another with `Device::compile`, alternately in one run.
    /// Every kernel is new to the cache (its constant comes from the clock and the sample's
    /// index), and every one is launched once and checked. `--quick` compiles one batch of
    /// [`QUICK_THROUGHPUT_KERNELS`] each way.
    pub(super) fn compile_throughput(&self) -> Result<BenchResult, CliError> {
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let (n, reps) = if self.quick { (QUICK_THROUGHPUT_KERNELS, 1) } else { (THROUGHPUT_KERNELS, self.reps.min(3)) };
        // Distinct integers below 2^24, exact in f32 (also plus 1 and 2).
        let mut next = (nonce % 60_000) as usize * 4 * n;
        let mut fresh = || -> Result<Vec<(f32, Arc<UOp>)>, CliError> {
            (0..n)
                .map(|_| {
                    next += 1;
                    let c = next as f32;
                    add_const_kernel(c).map(|k| (c, k)).map_err(|e| kiln_err("building a compile kernel", e.into()))
                })
                .collect()
        };
        // Every kernel was compiled (none came from a cache) and computes x + c.
        let check = |compiled: Vec<Kernel>, kernels: &[(f32, Arc<UOp>)], misses: u64| -> Result<(), CliError> {
            let compiles = self.device.cache().stats().misses - misses;
            if compiles != n as u64 {
                return Err(wrong(
                    "compile_throughput",
                    format!("{compiles} of {n} kernels were compiled, the rest cached"),
                ));
            }
            for (k, &(c, _)) in compiled.iter().zip(kernels) {
                let x = self.upload(&[1.0, 2.0])?;
                self.launch(k, &[&x])?;
                if self.read(&x)? != [1.0 + c, 2.0 + c] {
                    return Err(wrong("compile_throughput", format!("kernel {} computed a wrong result", k.spec.name)));
                }
            }
            Ok(())
        };
        let (mut batch, mut one_by_one) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let kernels = fresh()?;
            let names: Vec<String> = (0..n).map(|i| format!("throughput{i}")).collect();
            let jobs: Vec<(Arc<UOp>, Option<&str>)> =
                kernels.iter().zip(&names).map(|((_, k), name)| (k.clone(), Some(name.as_str()))).collect();
            let misses = self.device.cache().stats().misses;
            let t = Instant::now();
            let compiled = self.device.compile_many(&jobs).into_iter().collect::<Result<Vec<_>, _>>();
            batch.push(n as f64 / t.elapsed().as_secs_f64());
            check(compiled.map_err(|e| kiln_err("compiling a batch", e))?, &kernels, misses)?;

            let kernels = fresh()?;
            let misses = self.device.cache().stats().misses;
            let t = Instant::now();
            let compiled = jobs
                .iter()
                .zip(&kernels)
                .map(|((_, name), (_, k))| self.device.compile(k, *name))
                .collect::<Result<Vec<_>, _>>();
            one_by_one.push(n as f64 / t.elapsed().as_secs_f64());
            check(compiled.map_err(|e| kiln_err("compiling", e))?, &kernels, misses)?;
        }
        Ok(BenchResult {
            name: "compile_throughput",
            unit: "kernels/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(batch)?,
            baseline: Some(Stats::of(one_by_one)?),
            baseline_name: "one by one (Device::compile)".into(),
        })
    }

    pub(super) fn cache_mem_hit(&self) -> Result<BenchResult, CliError> {
        let sink = add_const_kernel(3.0).map_err(|e| kiln_err("building the cache kernel", e.into()))?;
        let first = self.device.compile(&sink, Some("cache_probe")).map_err(|e| kiln_err("compiling", e))?;
        let before = self.device.cache().stats();
        let n = 1000;
        let mut samples = Vec::with_capacity(self.reps);
        let mut last = None;
        for _ in 0..self.reps {
            let t = Instant::now();
            for _ in 0..n {
                last = Some(self.device.compile(&sink, Some("cache_probe")).map_err(|e| kiln_err("compiling", e))?);
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        let after = self.device.cache().stats();
        let hits = after.memory_hits - before.memory_hits;
        let same = last.is_some_and(|k| Arc::ptr_eq(k.program(), first.program()));
        if hits != (n * self.reps) as u64 || after.misses != before.misses || !same {
            return Err(wrong("cache_mem_hit", format!("{hits} memory hits for {} lookups", n * self.reps)));
        }
        let x = self.upload(&[1.0, 2.0])?;
        self.launch(&first, &[&x])?;
        if self.read(&x)? != [4.0, 5.0] {
            return Err(wrong("cache_mem_hit", "the cached kernel computed a wrong result".into()));
        }
        Ok(BenchResult {
            name: "cache_mem_hit",
            unit: "µs",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// `Device::reset` and 10 cached kernels running again (reloaded without compiling),
    /// each verified; runs last, since it ends the generation of everything made before.
    pub(super) fn device_reset(&self) -> Result<BenchResult, CliError> {
        let sinks = (1..=10)
            .map(|c| add_const_kernel(c as f32))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| kiln_err("building the reset kernels", e.into()))?;
        // A reset reloads every kernel the device holds: measure it with exactly these ten,
        // whatever the entries before this one loaded.
        self.device.cache().clear_memory();
        for s in &sinks {
            self.device.compile(s, Some("reset_probe")).map_err(|e| kiln_err("compiling", e))?;
        }
        let before = self.device.cache().stats();
        let mut samples = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let t = Instant::now();
            self.device.reset().map_err(|e| kiln_err("resetting the device", e))?;
            let mut outs = Vec::with_capacity(sinks.len());
            for s in &sinks {
                let k = self.device.compile(s, Some("reset_probe")).map_err(|e| kiln_err("compiling", e))?;
                let x = self.upload(&[1.0, 2.0])?;
                self.launch(&k, &[&x])?;
                outs.push(x);
            }
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            for (c, x) in (1..).zip(&outs) {
                if self.read(x)? != [1.0 + c as f32, 2.0 + c as f32] {
                    return Err(wrong("device_reset", format!("kernel {c} computed a wrong result after the reset")));
                }
            }
        }
        if self.device.cache().stats().misses != before.misses {
            return Err(wrong("device_reset", "a kernel was compiled again after the reset".into()));
        }
        Ok(BenchResult {
            name: "device_reset",
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "".into(),
        })
    }
}
