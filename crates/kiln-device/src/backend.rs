//! The kit a stream backend (a GPU API with in-order queues and events) is built from.
//!
//! - Identity: a backend is a zero-sized marker type implementing [`AccelBackend`], which
//!   names its stream and event types. The stream-queue skeleton ([`crate::StreamQueue`], and
//!   its factory [`crate::StreamQueueFactory`]) is generic over it, so its queues, signals and
//!   events are typed by it and two backends' types cannot be mixed.
//! - Its stream ([`AccelStream`]) enqueues kernels and copies and records and waits on events,
//!   the primitives every GPU-like ordering is built from.
//! - Its driver contexts, one per device ordinal and shared by every kiln device of that
//!   ordinal in the process, live in a [`ContextMap`], which replaces one on a device reset.
//! - The typed program a queue launches is [`crate::Kernel::program_as`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kiln_ir::DeviceSpec;

use crate::buffer::{Buffer, RawView};
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::program::LaunchDims;
use crate::queue::CommandTimer;
use crate::ring::BackendEvent;

/// One stream backend: its name and native types.
pub trait AccelBackend: Send + Sync + 'static {
    /// The device family, as in device names (`"OPENCL"`, `"CUDA"`).
    const NAME: &'static str;
    /// An in-order stream of commands (a queue); its `Backend` is this backend, so stream and
    /// event types of two backends cannot be mixed.
    type Stream: AccelStream<Backend = Self>;
    /// A marker a stream records after some work; other streams wait on it.
    type Event: BackendEvent;
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

/// The process-wide driver contexts of one backend's devices, by ordinal: every kiln device
/// of an ordinal shares one, and a device reset may replace it. A `static` of the backend.
pub struct ContextMap<C> {
    backend: &'static str,
    opened: Mutex<BTreeMap<u32, Arc<C>>>,
}

impl<C> ContextMap<C> {
    /// An empty map for the devices of `backend` (its device family name, `"OPENCL"`).
    pub const fn new(backend: &'static str) -> ContextMap<C> {
        ContextMap { backend, opened: Mutex::new(BTreeMap::new()) }
    }

    /// The context of `spec`: the shared one, unless `stale` says it must be replaced (it is
    /// called with the map locked, so it may retire the old context first); otherwise, and on
    /// first use, a new one from `open`, which then becomes the shared one.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `spec` is not a device of this backend; the errors of `stale`
    /// and `open` (such as [`Error::Unavailable`] for an ordinal the machine lacks).
    pub fn get(
        &self,
        spec: &DeviceSpec,
        stale: impl FnOnce(&Arc<C>) -> Result<bool>,
        open: impl FnOnce(&DeviceSpec) -> Result<C>,
    ) -> Result<Arc<C>> {
        if spec.base_type() != self.backend {
            return Err(Error::Invalid(format!("{spec} is not a {0} device (expected {0}:n)", self.backend)));
        }
        let mut map = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&spec.ordinal())
            && !stale(c)?
        {
            return Ok(c.clone());
        }
        let fresh = Arc::new(open(spec)?);
        map.insert(spec.ordinal(), fresh.clone());
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static CONTEXTS: ContextMap<(u32, usize)> = ContextMap::new("TOY");

    /// Contexts are shared per ordinal, replaced when stale, and refused for another backend;
    /// an `open` that fails leaves the shared one in place.
    #[test]
    fn contexts_are_shared_per_ordinal_and_replaced_when_stale() {
        let (toy0, toy1) = (DeviceSpec::new("TOY", 0), DeviceSpec::new("TOY", 1));
        let opens = std::cell::Cell::new(0);
        let open = |s: &DeviceSpec| {
            opens.set(opens.get() + 1);
            Ok((s.ordinal(), opens.get()))
        };
        let first = CONTEXTS.get(&toy0, |_| Ok(false), open).unwrap();
        assert!(Arc::ptr_eq(&first, &CONTEXTS.get(&toy0, |_| Ok(false), open).unwrap()));
        assert_eq!(*CONTEXTS.get(&toy1, |_| Ok(false), open).unwrap(), (1, 2));
        let failed = CONTEXTS.get(&toy0, |_| Ok(true), |_| Err(Error::Unavailable("gone".into())));
        assert!(matches!(failed, Err(Error::Unavailable(_))));
        assert!(Arc::ptr_eq(&first, &CONTEXTS.get(&toy0, |_| Ok(false), open).unwrap()));
        let fresh = CONTEXTS.get(&toy0, |old| Ok(Arc::ptr_eq(old, &first)), open).unwrap();
        assert_eq!((*first, *fresh), ((0, 1), (0, 3)));
        let other = CONTEXTS.get(&DeviceSpec::new("CPU", 0), |_| Ok(false), open);
        assert!(matches!(&other, Err(Error::Invalid(m)) if m.contains("not a TOY device")), "{other:?}");
    }
}
