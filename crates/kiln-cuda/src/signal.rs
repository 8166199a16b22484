//! Timeline signals backed by CUDA events: the generic [`RingSignal`] over [`CudaEvent`].
//!
//! A queue that signals `v` records an event on its stream after the earlier work and
//! records that event in the ring for `v`; the timeline reaches `v` when the event
//! completes. Each event is recorded once; a queue of the same context that waits for `v`
//! finds it with [`RingSignal::event_for`] and waits on the device (`cuStreamWaitEvent`). Host `set`, `fail`, timeouts and parked waiters
//! are the ring's (see [`kiln_device::ring`]).

use std::fmt;
use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use kiln_device::{BackendEvent, Result, RingSignal};

use crate::{CudaDevice, driver};

/// A CUDA timeline signal.
pub type CudaSignal = RingSignal<CudaEvent>;

/// An owned `CUevent` of one device. Created without timing (the cheapest kind) unless a
/// timed command asks for timing. An untimed event goes back to its device's spare events on
/// drop, up to [`SPARE_EVENTS`], for a later signal value to record again (re-recording an
/// event leaves earlier `cuStreamWaitEvent`s on it unaffected: they wait for the record they
/// saw); a timed one, or one beyond that bound, is destroyed.
pub struct CudaEvent {
    event: sys::CUevent,
    cu: Arc<CudaDevice>,
    timed: bool,
}

/// The most untimed events a device keeps for reuse: more than a ring's slots for a few
/// queues in flight, few enough that the idle ones cost nothing worth reclaiming.
pub const SPARE_EVENTS: usize = 1024;

// SAFETY: event handles may be used from any thread (the driver API is thread-safe); every
// use binds the event's context first, and the handle is destroyed exactly once, in Drop.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaEvent({:p} on {})", self.event, self.cu.spec)
    }
}

impl CudaEvent {
    /// Records a new event on `stream` (of `cu`'s context, current on this thread): it
    /// completes when everything enqueued on `stream` before it has finished.
    pub(crate) fn record(cu: &Arc<CudaDevice>, stream: sys::CUstream, timed: bool) -> Result<CudaEvent> {
        let spare = if timed { None } else { cu.spare_events.lock().unwrap_or_else(|p| p.into_inner()).pop() };
        let event = match spare {
            Some(event) => event,
            None => {
                let flags = if timed {
                    sys::CUevent_flags::CU_EVENT_DEFAULT
                } else {
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
                };
                cu::event::create(flags).map_err(|e| driver("cuEventCreate", e))?
            }
        };
        let event = CudaEvent { event, cu: cu.clone(), timed };
        // SAFETY: the event and the stream are live handles of the current context.
        unsafe { cu::event::record(event.event, stream) }.map_err(|e| driver("cuEventRecord", e))?;
        Ok(event)
    }
}

impl CudaEvent {
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.event
    }

    /// The device (context) the event belongs to.
    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.cu
    }

    /// Milliseconds from this completed timed event to the completed timed `later`.
    pub(crate) fn elapsed_ms(&self, later: &CudaEvent) -> Result<f32> {
        self.cu.bind()?;
        // SAFETY: both events are live timed events of this context.
        unsafe { cu::event::elapsed(self.event, later.event) }.map_err(|e| driver("cuEventElapsedTime", e))
    }
}

impl BackendEvent for CudaEvent {
    fn is_complete(&self) -> Result<bool> {
        self.cu.bind()?;
        // SAFETY: the event is live.
        match unsafe { cu::event::query(self.event) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver("the work before a CUDA event (cuEventQuery)", e)),
        }
    }

    fn wait(&self) -> Result<()> {
        self.cu.bind()?;
        // SAFETY: the event is live.
        unsafe { cu::event::synchronize(self.event) }
            .map_err(|e| driver("the work before a CUDA event (cuEventSynchronize)", e))
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if !self.timed {
            let mut spare = self.cu.spare_events.lock().unwrap_or_else(|p| p.into_inner());
            if spare.len() < SPARE_EVENTS {
                return spare.push(self.event);
            }
        }
        if self.cu.bind().is_ok() {
            // SAFETY: the event is destroyed once; the driver defers the release of an event
            // that is still pending.
            let _ = unsafe { cu::event::destroy(self.event) };
        }
    }
}
