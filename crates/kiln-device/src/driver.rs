//! What a backend crate hands the rest of kiln, in one value: a [`Driver`], as an IREE
//! driver module carries its registration and its test lists. `kiln-backends` lists every
//! backend's driver once; the command line, the bench and the conformance suite read those
//! lists instead of knowing backends by name.
//!
//! A driver holds only data and plain functions: registering its devices ([`Driver::register`]),
//! how the conformance suite runs on it ([`Conformance`]), the offline compile targets it offers
//! (`kiln compile --target`, [`OfflineTarget`]) and its own bench baselines ([`Baseline`]).

use std::sync::Arc;

use kiln_ir::{Scalar, UOp};

use crate::buffer::Buffer;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::program::ProgramSpec;

/// One backend crate, as kiln-backends lists it.
#[derive(Clone, Copy)]
pub struct Driver {
    /// Registers its backends with the device registry (idempotent).
    pub register: fn(),
    /// How the conformance suite runs on each of its registry backends.
    pub conformance: &'static [Conformance],
    /// The targets it compiles for without a device.
    pub targets: &'static [OfflineTarget],
    /// Its own baseline for a bench entry's work on one of its devices, or `None` where the
    /// host's stays (another backend's device, or work it has no baseline for).
    pub baseline: BaselineFn,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.conformance.iter().map(|c| c.name).collect();
        write!(f, "Driver({})", names.join(", "))
    }
}

/// How one backend runs the conformance suite, in the style of IREE's CTS: its peer for the
/// cross-device checks, and every test it does not support, each with the reason.
#[derive(Debug, Clone, Copy)]
pub struct Conformance {
    /// The backend's name as `KILN_REQUIRE` spells it (lower case).
    pub name: &'static str,
    /// The backend whose device the cross-device checks pair with this one.
    pub peer: &'static str,
    /// `(test, reason)`: the tests (by their function name in kiln-conformance's
    /// `tests/conformance.rs`) that this backend reports as skipped, with why.
    pub unsupported: &'static [(&'static str, &'static str)],
    /// `Some((backend, pair))`: the entry is registry backend `backend`'s device compiling
    /// with its compiler pair `pair` ([`Device::with_default_compiler`]), so the suite runs
    /// every pair; `None`: the registry backend `name`, with its default pair.
    pub pair: Option<(&'static str, &'static str)>,
}

/// A target a backend compiles for without opening a device (`kiln compile --target NAME:ARCH`).
#[derive(Clone, Copy)]
pub struct OfflineTarget {
    /// Lower case, as `--target` spells it before the colon (`cuda`).
    pub name: &'static str,
    /// How `--target` spells it in full, for messages: `cuda:sm_XY (e.g. cuda:sm_90)`.
    pub usage: &'static str,
    /// The formats it writes besides the rendered source, each `(name, binary)`: a binary
    /// one is written only to a file. The first is what `--check` compiles to.
    pub formats: &'static [(&'static str, bool)],
    /// Checks the part after the colon (empty when there is none).
    pub check_arch: fn(&str) -> Result<()>,
    /// Renders `sink` as kernel `name` for architecture `arch` and, given one of
    /// [`OfflineTarget::formats`], compiles it to that format: the bytes to write.
    pub compile: fn(arch: &str, sink: &Arc<UOp>, name: &str, format: Option<&str>) -> Result<TargetOutput>,
}

/// What an [`OfflineTarget`] made of a kernel.
pub type TargetOutput = (ProgramSpec, Option<Vec<u8>>);

impl std::fmt::Debug for OfflineTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OfflineTarget({})", self.name)
    }
}

/// The work of a bench entry, as a backend's own baseline repeats it.
#[derive(Debug, Clone, Copy)]
pub enum BenchWork<'a> {
    /// A streaming entry that reads and writes `bytes` bytes in all.
    Stream {
        /// Bytes read plus bytes written.
        bytes: usize,
    },
    /// One empty launch, submitted and waited for.
    RoundTrip,
    /// `c = a · b` on `n`×`n` row-major f32 matrices.
    Sgemm {
        /// The matrices' side.
        n: usize,
        /// The left factor.
        a: &'a [f32],
        /// The right factor.
        b: &'a [f32],
    },
}

/// A backend's own measure of some [`BenchWork`]: what it is, and one repetition of it.
/// Like every bench figure it is checked before it is timed: by the backend when it made it,
/// or, where it has an `output`, by the caller against its own reference after one run.
pub struct Baseline {
    /// What the bench table calls it (`cuBLAS sgemm`).
    pub name: String,
    /// One repetition, waited for.
    pub run: Box<dyn FnMut() -> Result<()>>,
    /// The buffer a repetition writes, for the caller to check (the product of an sgemm).
    pub output: Option<Buffer>,
}

impl std::fmt::Debug for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Baseline({})", self.name)
    }
}

/// A driver's [`Driver::baseline`].
pub type BaselineFn = fn(&Arc<Device>, &BenchWork<'_>) -> Result<Option<Baseline>>;

/// A driver without baselines of its own.
pub fn no_baseline(_: &Arc<Device>, _: &BenchWork<'_>) -> Result<Option<Baseline>> {
    Ok(None)
}

impl Baseline {
    /// The device copy of a GPU backend: a device-to-device copy of `bytes / 2` bytes (the
    /// same bytes read and written as the streaming entry), through the allocator's device
    /// copy, which waits for it as every bench launch waits for its kernel. Checked once.
    ///
    /// # Errors
    /// Allocation, copy and read-back errors; [`Error::Invalid`] when the copy does not copy.
    pub fn device_copy(device: &Device, bytes: usize) -> Result<Baseline> {
        let n = bytes / 8;
        let src: Vec<f32> = (0..n).map(|i| (i % 1021) as f32).collect();
        let from = Buffer::from_slice(device.allocator(), &src)?;
        let to = device.buffer(Scalar::F32, n)?;
        to.copy_from_slice(&vec![0f32; n])?;
        to.copy_from(&from)?;
        if to.to_vec::<f32>()? != src {
            return Err(Error::Invalid("the device copy baseline did not copy its input".into()));
        }
        Ok(Baseline {
            name: "device copy, same bytes".into(),
            run: Box::new(move || to.copy_from(&from)),
            output: None,
        })
    }
}
