//! Backend identity: a stream backend (OpenCL, CUDA) names its device, stream and event
//! types, and these are the traits it implements: the stream-queue skeleton
//! ([`crate::StreamQueue`]) is generic over the backend ([`AccelBackend`]), so its queues,
//! signals and events are typed by it and two backends' types cannot be mixed.
//!
//! A backend is a zero-sized marker type implementing [`AccelBackend`]. Its device handle
//! reports the ordinal and the current generation (bumped by [`Device::reset`]); its stream
//! ([`AccelStream`]) enqueues kernels and copies and records and waits on events, the
//! primitives every GPU-like ordering is built from.

use std::marker::PhantomData;
use std::sync::Arc;

use kiln_ir::DeviceSpec;

use crate::buffer::{Buffer, RawView};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::program::LaunchDims;
use crate::queue::CommandTimer;
use crate::ring::BackendEvent;

/// One stream backend (OpenCL, CUDA): its name and native types.
pub trait AccelBackend: Send + Sync + 'static {
    /// The device family, as in device names (`"OPENCL"`, `"CUDA"`).
    const NAME: &'static str;
    /// The backend's device handle; its `Backend` is this backend, so device, stream and
    /// event types of two backends cannot be mixed.
    type Device: AccelDevice<Backend = Self>;
    /// An in-order stream of commands (a queue).
    type Stream: AccelStream<Backend = Self>;
    /// A marker a stream records after some work; other streams wait on it.
    type Event: BackendEvent;
    /// The backend's error, convertible to kiln's.
    type Error: std::error::Error + Send + Sync + Into<Error> + 'static;
}

/// A device of one backend.
pub trait AccelDevice: Send + Sync + 'static {
    /// The backend this device belongs to.
    type Backend: AccelBackend;

    /// The ordinal within the backend (`OPENCL:1` is 1).
    fn device_id(&self) -> u32;

    /// The generation of the device's context: objects minted under an older one fail with
    /// [`Error::DeviceLost`].
    fn generation(&self) -> u64;
}

/// An in-order stream of one backend: the native operations the stream-queue skeleton
/// ([`crate::StreamQueue`]) is built on. Called with the queue's lock held, from
/// the submitting thread or the queue's helper thread, one at a time.
///
/// # Errors
/// Every method returns the driver's failure as [`Error::Driver`] (marked fatal when the
/// device context is lost); [`AccelStream::check_kernel`] returns [`Error::Launch`] as it says.
/// An enqueue error fails the queue as the [`crate::queue`] contract says.
pub trait AccelStream: Send + 'static {
    /// The backend this stream belongs to; its events are the only ones it can wait on.
    type Backend: AccelBackend<Stream = Self>;

    /// The device the stream runs on; the queue reports it and checks buffers against it.
    fn device(&self) -> &DeviceSpec;

    /// Refuses, at record time, a launch this stream cannot make (another backend's program,
    /// a program loaded for another device or context, launch sizes beyond the device's
    /// limits): [`Error::Launch`]. `launch` has passed [`Kernel::check`].
    fn check_kernel(&self, kernel: &Kernel, launch: &LaunchDims) -> Result<()>;

    /// Enqueues one launch over `views` (checked live memory of this device, held until the
    /// launch completes). With a `timer`, reports the launch's device times to it.
    fn enqueue_kernel(
        &mut self,
        kernel: &Kernel,
        views: &[RawView],
        vals: &[i64],
        dims: &LaunchDims,
        timer: Option<&Arc<dyn CommandTimer>>,
    ) -> Result<()>;

    /// Enqueues `dst <- src` (equal sizes, not overlapping, at least one on this device) if
    /// the stream can copy between them natively; `Ok(false)` when it cannot (the skeleton
    /// then stages the copy through the host). With a `timer`, reports the copy's times.
    fn enqueue_copy(&mut self, dst: &Buffer, src: &Buffer, timer: Option<&Arc<dyn CommandTimer>>) -> Result<bool>;

    /// An event that completes when every command enqueued so far has finished.
    fn record_event(&mut self) -> Result<EventOf<Self>>;

    /// Makes later commands wait on the device for `event`; `Ok(false)` when this stream
    /// cannot wait on it natively (an event of another context): the skeleton waits on the
    /// host instead.
    fn wait_event(&mut self, event: &EventOf<Self>) -> Result<bool>;

    /// Orders every later command after every earlier write.
    fn barrier(&mut self) -> Result<()>;

    /// Hands enqueued commands to the device without waiting (`clFlush`; a no-op in CUDA).
    fn flush(&mut self) -> Result<()>;

    /// Blocks until every enqueued command finished (used when the queue is dropped).
    fn synchronize(&mut self) -> Result<()>;
}

/// The event type of stream `S`'s backend.
pub type EventOf<S> = <<S as AccelStream>::Backend as AccelBackend>::Event;

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
