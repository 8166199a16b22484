//! Backend identity: each backend names its device, stream and event types, so code generic
//! over backends (a plan, a recovery policy) can hold them without type erasure.
//!
//! A backend is a zero-sized marker type implementing [`AccelBackend`]. Its device handle
//! reports the ordinal and the current generation (bumped by [`Device::reset`]); its stream
//! records and waits on events, the two primitives every GPU-like ordering is built from.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Error, Result};

/// One backend (CPU, OpenCL, CUDA): its name and native types.
pub trait AccelBackend: Send + Sync + 'static {
    /// The device family, as in device names (`"CPU"`, `"OPENCL"`).
    const NAME: &'static str;
    /// The backend's device handle; its `Backend` is this backend, so device, stream and
    /// event types of two backends cannot be mixed.
    type Device: AccelDevice<Backend = Self>;
    /// An in-order stream of commands (a queue).
    type Stream: AccelStream<Backend = Self>;
    /// A marker a stream records after some work; other streams wait on it.
    type Event: Debug + Send + Sync + 'static;
    /// The backend's error, convertible to kiln's.
    type Error: std::error::Error + Send + Sync + Into<Error> + 'static;
}

/// A device of one backend.
pub trait AccelDevice: Send + Sync + 'static {
    /// The backend this device belongs to.
    type Backend: AccelBackend;

    /// The ordinal within the backend (`OPENCL:1` is 1; the CPU is 0).
    fn device_id(&self) -> u32;

    /// The generation of the device's context: objects minted under an older one fail with
    /// [`Error::DeviceLost`].
    fn generation(&self) -> u64;
}

/// An in-order stream of one backend.
pub trait AccelStream: Send + 'static {
    /// The backend this stream belongs to; its events are the only ones it can wait on.
    type Backend: AccelBackend;

    /// An event that completes when everything enqueued on this stream so far has finished.
    ///
    /// # Errors
    /// The backend's driver error ([`Error::Driver`]), or [`Error::DeviceLost`] /
    /// [`Error::DeviceFailed`] when the stream's device was reset or failed.
    fn record_event(&mut self) -> Result<<Self::Backend as AccelBackend>::Event>;

    /// Later work on this stream waits for `event` (recorded on any stream of the backend).
    /// Only enqueues the dependency: the host does not block.
    ///
    /// # Errors
    /// The backend's driver error ([`Error::Driver`]), or [`Error::DeviceLost`] when `event`
    /// was recorded under an older generation of the device.
    fn wait_event(&mut self, event: &<Self::Backend as AccelBackend>::Event) -> Result<()>;
}

/// A kiln [`Device`] with its backend named: the `AccelBackend::Device` of every backend.
pub struct DeviceOf<B> {
    device: Arc<Device>,
    _backend: PhantomData<fn() -> B>,
}

impl<B> DeviceOf<B> {
    /// `device` as a device of backend `B`.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `device` belongs to another backend.
    pub fn new(device: Arc<Device>) -> Result<DeviceOf<B>>
    where
        B: AccelBackend,
    {
        if device.spec().base_type() != B::NAME {
            return Err(Error::Invalid(format!("{} is not a {} device", device.spec(), B::NAME)));
        }
        Ok(DeviceOf { device, _backend: PhantomData })
    }

    /// The kiln device behind this handle, shared: cloning it keeps the device open.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl<B: AccelBackend<Device = DeviceOf<B>>> AccelDevice for DeviceOf<B> {
    type Backend = B;

    fn device_id(&self) -> u32 {
        self.device.spec().ordinal()
    }

    fn generation(&self) -> u64 {
        self.device.generation()
    }
}
