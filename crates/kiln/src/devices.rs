//! `kiln devices`: every device of every backend this binary knows, and why a backend is
//! unavailable when it is.

use std::fmt::Write;

use kiln_device::{AllocatorStats, CacheStats};
use kiln_ir::DeviceSpec;

use crate::error::CliError;
use crate::{cache, session};

/// `kiln devices [--verbose]`.
#[derive(Debug, Default, clap::Args)]
#[command(after_help = "Lists every device of every backend this kiln registers (the CPU and its instruction-set \
variants CPU-AVX2 and CPU-SSE2; OPENCL:n when an OpenCL driver is present; CUDA:n when the NVIDIA driver is present). \
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
    /// `CPU`, `OPENCL:1`, or the backend name when it has no usable device.
    pub name: String,
    /// The description, or why the device or backend is unavailable.
    pub status: Result<String, String>,
    pub stats: Option<AllocatorStats>,
    /// This process's kernel-cache counters of the device (when it was opened).
    pub cache: Option<CacheStats>,
}

/// Probes every backend of the device registry, in registration order, then lists the
/// backends this binary was built without. Opening a device is only needed for `--verbose`
/// (allocator stats) and for a backend without a probe of its own (the CPU, whose
/// availability depends on a C compiler being found).
pub fn probe(open: bool) -> Vec<DeviceRow> {
    let mut rows = Vec::new();
    for backend in kiln_device::backends() {
        match backend.devices() {
            Ok(list) if list.is_empty() => rows.push(unavailable(backend.name, "it reports no devices".into())),
            Ok(list) => rows.extend(list.into_iter().map(|(spec, description)| row(&spec, description, open))),
            Err(e) => rows.push(unavailable(backend.name, e.to_string())),
        }
    }
    for (name, feature) in session::left_out() {
        let why = format!("this kiln was built without the `{feature}` feature (cargo build --features {feature})");
        rows.push(unavailable(name, why));
    }
    rows
}

/// The row of a device its backend's probe found, opened (for its counters) when `open`.
fn row(spec: &DeviceSpec, description: String, open: bool) -> DeviceRow {
    let opened = if open { Some(kiln_device::open_device(&spec.to_string())) } else { None };
    let (status, stats, cache) = match opened {
        Some(Err(e)) => (Err(e.to_string()), None, None),
        Some(Ok(d)) => (Ok(d.description().to_string()), Some(d.allocator().stats()), Some(d.cache().stats())),
        None => (Ok(description), None, None),
    };
    DeviceRow { name: spec.to_string(), status, stats, cache }
}

/// The row of a backend that has no usable device, saying why.
fn unavailable(name: &str, why: String) -> DeviceRow {
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
        // Every registered backend: its devices, or one row saying why there are none.
        for b in kiln_device::backends() {
            assert!(rows.iter().any(|r| r.name.split(':').next() == Some(b.name)), "{}", b.name);
        }
        assert!(rows.iter().any(|r| r.name.starts_with("OPENCL")));
        assert!(rows.iter().any(|r| r.name.starts_with("CUDA")));
    }
}
