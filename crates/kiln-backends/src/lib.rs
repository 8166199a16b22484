//! kiln-backends: the one list of kiln's backends. Each backend crate describes itself as a
//! [`Driver`] (its registration, conformance entry, offline targets and bench baselines);
//! this crate owns a cargo feature per backend, lists the drivers built in ([`DRIVERS`]),
//! registers them in one call ([`register_all`]) and says which were left out and why
//! ([`left_out`]). The command line, the conformance suite and the Python package depend on
//! it and on no backend by name; adding a backend is one line in [`drivers!`] and its feature.
//!
//! ```
//! kiln_backends::register_all();
//! for row in kiln_backends::probe(false) {
//!     println!("{}: {:?}", row.name, row.status);
//! }
//! ```

use std::sync::Arc;

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{AllocatorStats, Baseline, BenchWork, CacheStats, Conformance, Device, Driver, OfflineTarget};

/// One line per backend: its cargo feature, the name its devices are spelled with, its crate.
macro_rules! drivers {
    ($($feature:literal => $name:literal: $krate:ident,)*) => {
        /// The driver of every backend this build has, in registration order.
        pub const DRIVERS: &[Driver] = &[$(#[cfg(feature = $feature)] $krate::DRIVER,)*];

        /// Every backend kiln has, built in or not: `(name, feature, built)`.
        const ALL: &[(&str, &str, bool)] = &[$(($name, $feature, cfg!(feature = $feature)),)*];
    };
}

drivers! {
    "cpu" => "CPU": kiln_cpu,
    "opencl" => "OPENCL": kiln_opencl,
    "cuda" => "CUDA": kiln_cuda,
    "webgpu" => "WEBGPU": kiln_webgpu,
}

/// Registers every backend of this build with the device registry. Idempotent. Everything
/// that names devices by text (`kiln devices`, `--device`, `kiln.Device("OPENCL:0")`) then
/// reads the registry.
pub fn register_all() {
    for driver in DRIVERS {
        (driver.register)();
    }
}

/// A backend this build leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut {
    /// The name its devices are spelled with (`WEBGPU`).
    pub name: &'static str,
    /// The kiln-backends feature (and the Python package's) that builds it in.
    pub feature: &'static str,
}

/// The backends this build was made without, with the feature that adds each.
pub fn left_out() -> Vec<LeftOut> {
    ALL.iter().filter(|(.., built)| !built).map(|&(name, feature, _)| LeftOut { name, feature }).collect()
}

/// How the conformance suite runs on every registry backend of this build.
pub fn conformance() -> impl Iterator<Item = &'static Conformance> {
    DRIVERS.iter().flat_map(|d| d.conformance)
}

/// Every offline compile target of this build (`kiln compile --target`).
pub fn targets() -> impl Iterator<Item = &'static OfflineTarget> {
    DRIVERS.iter().flat_map(|d| d.targets)
}

/// The backend's own baseline for `work` on `device`, when its driver has one.
///
/// # Errors
/// The errors of setting the baseline up and of its check.
pub fn baseline(device: &Arc<Device>, work: &BenchWork<'_>) -> kiln_device::Result<Option<Baseline>> {
    for driver in DRIVERS {
        if let Some(b) = (driver.baseline)(device, work)? {
            return Ok(Some(b));
        }
    }
    Ok(None)
}

/// One device of the listing ([`probe`]).
#[derive(Debug)]
pub struct DeviceRow {
    /// `CPU`, `OPENCL:1`, or the backend name when it has no usable device.
    pub name: String,
    /// The description, or why the device or backend is unavailable.
    pub status: Result<String, String>,
    /// The allocator's counters (when the device was opened).
    pub stats: Option<AllocatorStats>,
    /// This process's kernel-cache counters of the device (when it was opened).
    pub cache: Option<CacheStats>,
    /// The device's compiler pairs, the default first (when it is open: always for the CPU,
    /// which is listed by opening it).
    pub compilers: Vec<String>,
    /// The pairs the device cannot offer on this machine, each with why (when it is open).
    pub missing: Vec<(String, String)>,
}

/// Every device of every registered backend, in registration order, then the backends this
/// build was made without. Opening a device is only needed when `open` asks for its counters
/// and for a backend without a probe of its own (the CPU, whose availability depends on a C
/// compiler being found).
pub fn probe(open: bool) -> Vec<DeviceRow> {
    let mut rows = Vec::new();
    for backend in kiln_device::backends() {
        match backend.devices() {
            Ok(list) if list.is_empty() => rows.push(unavailable(backend.name, "it reports no devices".into())),
            Ok(list) => rows.extend(list.into_iter().map(|(spec, description)| row(&spec, description, open))),
            Err(e) => rows.push(unavailable(backend.name, e.to_string())),
        }
    }
    for LeftOut { name, feature } in left_out() {
        let why = format!("this kiln was built without the `{feature}` feature (cargo build --features {feature})");
        rows.push(unavailable(name, why));
    }
    rows
}

/// The row of a device its backend's probe found, opened (for its counters) when `open`.
fn row(spec: &DeviceSpec, description: String, open: bool) -> DeviceRow {
    let opened = if open { Some(kiln_device::open_device(&spec.to_string())) } else { None };
    let pairs = kiln_device::opened_device(spec).map(|d| (d.compiler_names(), d.missing_compilers()));
    let (compilers, missing) = pairs.unwrap_or_default();
    let (status, stats, cache) = match opened {
        Some(Err(e)) => (Err(e.to_string()), None, None),
        Some(Ok(d)) => (Ok(d.description().to_string()), Some(d.allocator().stats()), Some(d.cache().stats())),
        None => (Ok(description), None, None),
    };
    DeviceRow { name: spec.to_string(), status, stats, cache, compilers, missing }
}

/// The row of a backend that has no usable device, saying why.
fn unavailable(name: &str, why: String) -> DeviceRow {
    DeviceRow {
        name: name.into(),
        status: Err(why),
        stats: None,
        cache: None,
        compilers: Vec::new(),
        missing: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_is_built_in_or_left_out_and_every_registered_one_has_a_row() {
        register_all();
        assert_eq!(DRIVERS.len() + left_out().len(), ALL.len());
        let rows = probe(false);
        for b in kiln_device::backends() {
            assert!(rows.iter().any(|r| r.name.split(':').next() == Some(b.name)), "{}", b.name);
        }
        for l in left_out() {
            let row = rows.iter().find(|r| r.name == l.name).expect("a left-out backend has a row");
            assert!(row.status.as_ref().is_err_and(|why| why.contains(l.feature)), "{row:?}");
        }
        // Every conformance entry names a backend once.
        let names: Vec<&str> = conformance().map(|c| c.name).collect();
        assert!(names.iter().all(|n| names.iter().filter(|m| *m == n).count() == 1), "{names:?}");
    }
}
