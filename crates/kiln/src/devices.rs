//! `kiln devices`: every device of every backend this binary knows, and why a backend is
//! unavailable when it is.

use std::fmt::Write;

use kiln_device::{AllocatorStats, CacheStats};
use kiln_ir::DeviceSpec;

use crate::cache;
use crate::error::CliError;

/// `kiln devices [--verbose]`.
#[derive(Debug, Default, clap::Args)]
#[command(after_help = "Lists every device of every backend (CPU always; OPENCL:n when an OpenCL driver is present; \
CUDA:n when the NVIDIA driver is present). \
A backend that cannot be used is listed as unavailable with the reason. \
The CPU row names the C compiler its kernels are built with and why that one: KILN_CC when set, \
else clang when it is on PATH, else cc.")]
pub struct DevicesArgs {
    /// Also open each device and show its allocator counters and the kernel cache
    #[arg(short, long)]
    pub verbose: bool,
}

/// One line of the listing.
#[derive(Debug)]
pub struct DeviceRow {
    /// `CPU`, `OPENCL:0`, or the backend name when it has no usable device.
    pub name: String,
    /// The description, or why the device or backend is unavailable.
    pub status: Result<String, String>,
    pub stats: Option<AllocatorStats>,
    /// This process's kernel-cache counters of the device (when it was opened).
    pub cache: Option<CacheStats>,
}

/// Probes every backend. Opening a device is only needed for `--verbose` (allocator stats)
/// and for the CPU (whose availability depends on a C compiler being found).
pub fn probe(open: bool) -> Vec<DeviceRow> {
    let mut rows = Vec::new();
    let row = |spec: &DeviceSpec, described: Option<String>| {
        let opened = if open || described.is_none() { Some(kiln_device::open_device(&spec.to_string())) } else { None };
        let (status, stats, cache) = match (described, opened) {
            (_, Some(Err(e))) => (Err(e.to_string()), None, None),
            (_, Some(Ok(d))) => (Ok(d.description().to_string()), Some(d.allocator().stats()), Some(d.cache().stats())),
            (Some(desc), None) => (Ok(desc), None, None),
            (None, None) => (Err("not probed".into()), None, None),
        };
        DeviceRow { name: spec.to_string(), status, stats, cache }
    };
    if cfg!(feature = "cpu") {
        rows.push(row(&DeviceSpec::new("CPU", 0), None));
    } else {
        rows.push(not_built("CPU", "cpu"));
    }
    #[cfg(feature = "opencl")]
    match kiln_opencl::probe() {
        Ok(list) if list.is_empty() => rows.push(DeviceRow {
            name: "OPENCL".into(),
            status: Err("the OpenCL loader reports no devices".into()),
            stats: None,
            cache: None,
        }),
        Ok(list) => {
            for (spec, desc) in list {
                rows.push(row(&spec, Some(desc)));
            }
        }
        Err(e) => rows.push(DeviceRow { name: "OPENCL".into(), status: Err(e.to_string()), stats: None, cache: None }),
    }
    #[cfg(not(feature = "opencl"))]
    rows.push(not_built("OPENCL", "opencl"));
    #[cfg(feature = "cuda")]
    match kiln_cuda::probe() {
        Ok(list) => {
            for (spec, desc) in list {
                rows.push(row(&spec, Some(desc)));
            }
        }
        Err(e) => rows.push(DeviceRow { name: "CUDA".into(), status: Err(e.to_string()), stats: None, cache: None }),
    }
    #[cfg(not(feature = "cuda"))]
    rows.push(not_built("CUDA", "cuda"));
    rows
}

/// The row of a backend this binary was built without (its cargo `feature` was off).
fn not_built(name: &str, feature: &str) -> DeviceRow {
    let why = format!("this kiln was built without the `{feature}` feature (cargo build --features {feature})");
    DeviceRow { name: name.into(), status: Err(why), stats: None, cache: None }
}

/// Runs `kiln devices`; returns the text for stdout.
pub fn run(args: &DevicesArgs) -> Result<String, CliError> {
    let rows = probe(args.verbose);
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for r in &rows {
        match &r.status {
            Ok(desc) => {
                let _ = writeln!(out, "{:<width$}  available    {desc}", r.name);
            }
            Err(why) => {
                let _ = writeln!(out, "{:<width$}  unavailable  {}", r.name, why.replace('\n', " "));
            }
        }
        if let (true, Some(s)) = (args.verbose, r.stats) {
            let budget = s.budget.map(bytes).unwrap_or_else(|| "none".into());
            let _ = writeln!(
                out,
                "{:<width$}    memory: allocated {}, cached {}, high-water {}, hits {}, misses {}, budget {budget}",
                "",
                bytes(s.in_use),
                bytes(s.cached),
                bytes(s.high_water),
                s.hits,
                s.misses
            );
        }
        if let (true, Some(c)) = (args.verbose, r.cache) {
            let _ = writeln!(out, "{:<width$}    kernel cache: {}", "", cache::counters(&c));
        }
    }
    if args.verbose {
        out.push_str(&cache::stats_text()?);
    }
    Ok(out)
}

/// `1536` → `1.5 KiB`.
pub fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_read_well() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn every_backend_has_a_row() {
        crate::session::register_backends();
        let rows = probe(false);
        assert_eq!(rows[0].name, "CPU");
        assert!(rows.iter().any(|r| r.name.starts_with("OPENCL")));
        // CUDA: its devices, or one row saying why there are none.
        assert!(rows.iter().any(|r| r.name.starts_with("CUDA")));
    }
}
