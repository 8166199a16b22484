//! The process-wide backend registry: each backend registers its name, how to list its
//! devices and how to open one, once; everything that names devices by text (the CLI, the
//! bench, the conformance suite, [`open_device`]) reads the registry instead of knowing
//! backends by name. `KILN_REQUIRE`, which says which backends must be present, is read here
//! ([`required`]) and nowhere else.
//!
//! **Registration is a call.** A backend crate's `register()` adds its [`Backend`] entries;
//! a program calls it once for every backend it links (the `kiln` CLI does so in
//! `session::register_backends`). Registering without a call would need code that runs
//! before `main` (a global constructor, as the `ctor` crate makes) or a linker-assembled
//! list (as `linkme` makes); both are platform-specific, and neither helps here anyway: the
//! linker drops a crate nothing references, so "linked" would not mean "registered".
//! Instead, opening a device of a backend nobody registered fails with an error that names
//! the call that is missing ([`open_device`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kiln_ir::DeviceSpec;

use crate::device::Device;
use crate::error::{Error, Result};

/// The environment variable naming the backends that must be present: a comma list of
/// backend names, case-insensitive (`cpu,opencl,cuda-compile`). A test of a required backend
/// that cannot be opened fails instead of being skipped.
pub const REQUIRE_ENV: &str = "KILN_REQUIRE";

/// Opens one device of a backend, given its full spec (with ordinal).
pub type DeviceOpener = fn(&DeviceSpec) -> Result<Arc<Device>>;

/// Lists a backend's devices with their descriptions (model, driver), or says why it has none.
pub type DeviceProbe = fn() -> Result<Vec<(DeviceSpec, String)>>;

/// One backend as the registry knows it.
#[derive(Clone, Copy)]
pub struct Backend {
    /// The name its devices are spelled with, upper case (`CPU`, `OPENCL`); `KILN_REQUIRE`
    /// names it in any case.
    pub name: &'static str,
    /// Lists its devices, or says why there are none (no driver, no device). `None` for a
    /// backend of one device, `NAME` (ordinal 0), which is listed by opening it
    /// ([`Backend::devices`]).
    pub probe: Option<DeviceProbe>,
    /// Opens one of its devices.
    pub open: DeviceOpener,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backend({})", self.name)
    }
}

impl Backend {
    /// Its devices with their descriptions, or why it has none: its probe's answer, or for
    /// a backend without one, its one device `NAME` (opened through [`open_device`]).
    ///
    /// # Errors
    /// The probe's errors, or those of opening the one device.
    pub fn devices(&self) -> Result<Vec<(DeviceSpec, String)>> {
        match self.probe {
            Some(probe) => probe(),
            None => {
                let device = open_device(self.name)?;
                Ok(vec![(DeviceSpec::new(self.name, 0), device.description().to_string())])
            }
        }
    }
}

struct Registry {
    /// In registration order, one entry per name.
    backends: Vec<Backend>,
    open: HashMap<DeviceSpec, Arc<Device>>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry { backends: Vec::new(), open: HashMap::new() }))
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    // Nothing panics under this lock; a poisoned one still holds whole entries.
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `backend`; registering a name again replaces its entry (so a backend's
/// `register()` may be called any number of times).
pub fn register_backend(backend: Backend) {
    let mut r = lock();
    match r.backends.iter_mut().find(|b| b.name == backend.name) {
        Some(b) => *b = backend,
        None => r.backends.push(backend),
    }
}

/// Every registered backend, in registration order.
pub fn backends() -> Vec<Backend> {
    lock().backends.clone()
}

/// The registered backend called `name` (case-insensitive).
pub fn find_backend(name: &str) -> Option<Backend> {
    lock().backends.iter().find(|b| b.name.eq_ignore_ascii_case(name)).copied()
}

/// The registered backends' names as help text lists them: `CPU, OPENCL, CUDA or WEBGPU` (a device
/// is one of these, with `:n` for a backend's device `n`).
pub fn device_names() -> String {
    let names: Vec<&str> = backends().iter().map(|b| b.name).collect();
    match names.split_last() {
        None => "no backend is registered".into(),
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// Whether `KILN_REQUIRE` names backend `name` (case-insensitive, comma separated).
pub fn required(name: &str) -> bool {
    required_in(std::env::var(REQUIRE_ENV).ok().as_deref(), name)
}

/// Whether the `KILN_REQUIRE` value `value` names `name`.
fn required_in(value: Option<&str>, name: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|item| item.trim().eq_ignore_ascii_case(name)))
}

/// Every backend name `KILN_REQUIRE` lists, lower case, in its order.
pub fn required_names() -> Vec<String> {
    std::env::var(REQUIRE_ENV)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Opens `name` (e.g. `"CPU"`, `"OPENCL:1"`) once per process and returns the shared device.
/// A device that a fatal error lost is reset in place before it is handed out again.
///
/// # Errors
/// [`Error::Ir`] when `name` is not a device name; [`Error::Unavailable`] when no backend of
/// that name is registered (the message names the registered ones and the call that
/// registers the missing one); the opener's errors (e.g. [`Error::Unavailable`] for a
/// missing device); the errors of [`Device::reset`] for a lost device.
pub fn open_device(name: &str) -> Result<Arc<Device>> {
    let spec: DeviceSpec = name.parse()?;
    let opener = {
        let r = lock();
        if let Some(d) = r.open.get(&spec) {
            let d = d.clone();
            drop(r);
            if d.is_lost() {
                d.reset()?;
            }
            return Ok(d);
        }
        let found = r.backends.iter().find(|b| b.name == spec.base_type());
        match found {
            Some(b) => b.open,
            None => return Err(unregistered(&spec, &r.backends)),
        }
    };
    // Open outside the lock: opening may be slow (driver start-up).
    let device = opener(&spec)?;
    Ok(lock().open.entry(spec).or_insert(device).clone())
}

/// The device `spec` if [`open_device`] has opened it in this process (a listing that must
/// not open devices can still describe those that are open).
pub fn opened_device(spec: &DeviceSpec) -> Option<Arc<Device>> {
    lock().open.get(spec).cloned()
}

/// The error for a device whose backend is not registered: which backends are, and the call
/// that registers this one if its crate is linked.
fn unregistered(spec: &DeviceSpec, registered: &[Backend]) -> Error {
    let crate_name = format!("kiln_{}", spec.base_type().to_ascii_lowercase().replace('-', "_"));
    let known = match registered {
        [] => "none is registered yet".to_string(),
        _ => format!("registered: {}", registered.iter().map(|b| b.name).collect::<Vec<_>>().join(", ")),
    };
    Error::Unavailable(format!(
        "no {} backend is registered in this process ({known}): link the {crate_name} crate and call \
         `{crate_name}::register()` once before opening its devices",
        spec.base_type()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend nobody registered names the crate and the call that registers it.
    #[test]
    fn an_unregistered_backend_says_which_call_registers_it() {
        let e = open_device("OPENCL:3").unwrap_err().to_string();
        assert!(e.contains("no OPENCL backend is registered") && e.contains("`kiln_opencl::register()`"), "{e}");
    }

    #[test]
    fn kiln_require_is_a_case_insensitive_comma_list_of_whole_names() {
        let v = Some(" CPU, opencl ,cuda-compile");
        assert!(required_in(v, "cpu") && required_in(v, "OPENCL") && required_in(v, "cuda-compile"));
        // A name is never matched by a part of another one.
        assert!(!required_in(v, "cuda") && !required_in(v, "cl"));
        assert!(!required_in(None, "cpu") && !required_in(Some(""), "cpu"));
    }

    #[test]
    fn the_registry_lists_backends_once_in_order_and_resets_a_lost_device_in_place() {
        fn probe() -> Result<Vec<(DeviceSpec, String)>> {
            Ok(vec![(DeviceSpec::new("MOCK-TWO", 1), "mock".into())])
        }
        fn open(spec: &DeviceSpec) -> Result<Arc<Device>> {
            let d = crate::device::tests::registry_mock(spec.clone());
            Ok(Arc::new(d))
        }
        register_backend(Backend { name: "MOCK", probe: Some(probe), open });
        register_backend(Backend { name: "MOCK-TWO", probe: Some(probe), open });
        register_backend(Backend { name: "MOCK", probe: None, open });
        let names: Vec<&str> = backends().iter().map(|b| b.name).filter(|n| n.starts_with("MOCK")).collect();
        assert_eq!(names, ["MOCK", "MOCK-TWO"]);
        assert!(device_names().contains("MOCK, MOCK-TWO") || device_names().contains("MOCK or MOCK-TWO"));
        let two = find_backend("mock-two").unwrap();
        assert_eq!(two.devices().unwrap()[0].0.to_string(), "MOCK-TWO:1", "its own probe");
        // Without a probe, the one device is listed by opening it.
        let one = find_backend("MOCK").unwrap().devices().unwrap();
        assert_eq!((one[0].0.to_string(), one[0].1.as_str()), ("MOCK".to_string(), "mock"));

        let d = open_device("mock").unwrap();
        d.context().mark_lost(Error::Driver { backend: "mock", code: None, fatal: true, message: "gone".into() });
        let again = open_device("MOCK:0").unwrap();
        assert!(Arc::ptr_eq(&d, &again) && !again.is_lost());
        assert_eq!(again.generation(), 1);
        let e = open_device("TPU").unwrap_err().to_string();
        assert!(e.contains("registered: ") && e.contains("MOCK-TWO") && e.contains("`kiln_tpu::register()`"), "{e}");
    }
}
