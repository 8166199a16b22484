//! Test support for backends (feature `testing`): a backend's tests run on its device where the
//! machine has one and are skipped, saying why, where it has none, unless `KILN_REQUIRE` names
//! the backend (then its absence fails the test). CI names every backend it installs.

use std::sync::Arc;

use crate::cache::{CacheConfig, KernelCache};
use crate::device::Device;
use crate::error::Result;
use crate::registry::{REQUIRE_ENV, required};

/// The device `built` for `backend`'s tests, with a memory-only kernel cache so that every test
/// really exercises the compiler; `None` (the test returns early) when it could not be opened.
///
/// # Panics
/// When it could not be opened and `KILN_REQUIRE` names `backend`.
pub fn device_or_skip(backend: &str, test: &str, built: Result<Device>) -> Option<Arc<Device>> {
    let memory_only = || Arc::new(KernelCache::new(CacheConfig::memory_only()));
    or_skip(backend, test, built).map(|d| Arc::new(d.with_cache(memory_only())))
}

/// What `opened` holds (a device, a context of `backend`), or `None` (the test returns early)
/// after [`skip_unless_required`] said why not.
///
/// # Panics
/// When `opened` failed and `KILN_REQUIRE` names `backend`.
pub fn or_skip<T>(backend: &str, test: &str, opened: Result<T>) -> Option<T> {
    opened.map_err(|e| skip_unless_required(backend, test, &e)).ok()
}

/// For a test that needs backend `backend` and cannot run because of `why` (the backend is
/// absent): [`report_skip`], unless `KILN_REQUIRE` names the backend.
///
/// # Panics
/// When `KILN_REQUIRE` names `backend`: a required backend that is absent fails the test.
pub fn skip_unless_required(backend: &str, test: &str, why: &dyn std::fmt::Display) {
    assert!(!required(backend), "{REQUIRE_ENV} names `{backend}` but {test} cannot run: {why}");
    report_skip(test, why);
}

/// Reports `test` as skipped: writes `SKIPPED <test>: <why>` on the process's standard error,
/// past the test harness's output capture (which takes `print!` and `eprint!`, not writes to
/// the stream itself), so that the line shows beside the test's `ok` in the test output.
pub fn report_skip(test: &str, why: &dyn std::fmt::Display) {
    let line = format!("SKIPPED {test}: {why}\n");
    // A failed write to stderr has nowhere better to be reported.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}
