//! Timeline signals backed by `cl_event`s: the generic [`RingSignal`] over [`ClEvent`].
//!
//! A queue that signals `v` enqueues a marker and records its event for `v`; the timeline
//! reaches `v` when the marker completes. A queue of the same context that waits for `v`
//! puts the marker's event in a barrier's wait list (the device orders the work, the host
//! never blocks); anything else (another context, a value no event covers yet, a host
//! signal) is waited for on the host by the queue's helper thread (see [`crate::queue`]).
//!
//! A queue finds the event to wait on with [`RingSignal::event_for`]: each event is
//! recorded once.

use std::fmt;
use std::time::{Duration, Instant};

use kiln_device::{BackendEvent, Error, Result, RingSignal};
use opencl3::event::{
    CL_COMPLETE, CL_EVENT_COMMAND_EXECUTION_STATUS, CL_PROFILING_COMMAND_END, CL_PROFILING_COMMAND_QUEUED,
    CL_PROFILING_COMMAND_START, get_event_info, get_event_profiling_info, release_event, wait_for_events,
};
use opencl3::types::{cl_context, cl_event, cl_int, cl_profiling_info, cl_ulong};

use crate::driver;

/// An owned reference to a `cl_event`, released on drop. Shared as `Arc<ClEvent>`.
pub struct ClEvent {
    event: cl_event,
    context: cl_context,
}

// SAFETY: OpenCL event handles may be used from any thread (the API is thread-safe); the
// reference this value owns is released exactly once, in Drop.
unsafe impl Send for ClEvent {}
// SAFETY: as above; every method only passes the handle to thread-safe API calls.
unsafe impl Sync for ClEvent {}

impl fmt::Debug for ClEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClEvent({:p})", self.event)
    }
}

impl Drop for ClEvent {
    fn drop(&mut self) {
        // SAFETY: we own one reference to the event (from its creation or a retain).
        let _ = unsafe { release_event(self.event) };
    }
}

impl ClEvent {
    /// Takes ownership of the reference an enqueue call returned.
    pub(crate) fn from_raw(event: cl_event, context: cl_context) -> ClEvent {
        ClEvent { event, context }
    }

    /// A user event of `context`, completed by the host with [`ClEvent::complete`].
    #[cfg(test)]
    pub(crate) fn user(context: cl_context) -> Result<ClEvent> {
        let e = opencl3::event::create_user_event(context).map_err(|e| driver("clCreateUserEvent", e))?;
        Ok(ClEvent { event: e, context })
    }

    pub fn raw(&self) -> cl_event {
        self.event
    }

    pub fn context(&self) -> cl_context {
        self.context
    }

    /// Completes a user event: successfully, or with a failure status.
    #[cfg(test)]
    pub(crate) fn complete(&self, ok: bool) -> Result<()> {
        let status = if ok { CL_COMPLETE } else { -1 };
        opencl3::event::set_user_event_status(self.event, status).map_err(|e| driver("clSetUserEventStatus", e))
    }

    /// `Ok(true)` when the command completed, `Ok(false)` while it is queued or running, an
    /// error when it (or a command it depended on) failed.
    pub fn status(&self) -> Result<bool> {
        let status: cl_int = get_event_info(self.event, CL_EVENT_COMMAND_EXECUTION_STATUS)
            .map_err(|e| driver("clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)", e))?
            .into();
        match status {
            CL_COMPLETE => Ok(true),
            s if s < 0 => Err(Error::Driver {
                backend: "OpenCL",
                code: Some(s.into()),
                fatal: crate::is_fatal(s),
                message: format!(
                    "a command before this event failed with status {s} ({})",
                    opencl3::error_codes::ClError(s)
                ),
            }),
            _ => Ok(false),
        }
    }
}

impl ClEvent {
    /// Blocks until the command finished; its failure (or the driver's) is an error.
    pub fn wait(&self) -> Result<()> {
        match wait_for_events(&[self.event]) {
            Ok(()) => self.status().map(drop),
            Err(code) => match self.status() {
                Err(e) => Err(e),
                Ok(_) => Err(driver("clWaitForEvents", code)),
            },
        }
    }
}

impl ClEvent {
    /// Waits for the command, then returns when it started and ended on the device, placed on
    /// the host clock: `queued` is a host instant taken right before the command was enqueued,
    /// the reference for the event's `CL_PROFILING_COMMAND_QUEUED` (which the driver stamps
    /// during the enqueue call, so the result errs late by at most that call's duration).
    /// Fails when the command failed or its queue was created without profiling.
    pub fn host_span(&self, queued: Instant) -> Result<(Instant, Instant)> {
        self.wait()?;
        let read = |what: &str, param: cl_profiling_info| -> Result<cl_ulong> {
            Ok(get_event_profiling_info(self.event, param).map_err(|e| driver(what, e))?.into())
        };
        let q = read("clGetEventProfilingInfo(CL_PROFILING_COMMAND_QUEUED)", CL_PROFILING_COMMAND_QUEUED)?;
        let s = read("clGetEventProfilingInfo(CL_PROFILING_COMMAND_START)", CL_PROFILING_COMMAND_START)?;
        let e = read("clGetEventProfilingInfo(CL_PROFILING_COMMAND_END)", CL_PROFILING_COMMAND_END)?;
        let at = |t: cl_ulong| queued + Duration::from_nanos(t.saturating_sub(q));
        Ok((at(s), at(e.max(s))))
    }
}

impl BackendEvent for ClEvent {
    fn is_complete(&self) -> Result<bool> {
        self.status()
    }

    fn wait(&self) -> Result<()> {
        ClEvent::wait(self)
    }
}

/// A timeline signal whose values are reached by OpenCL events (or host `set`s).
pub type OpenClSignal = RingSignal<ClEvent>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_device;
    use kiln_device::TimelineSignal;
    use std::sync::Arc;

    #[test]
    fn user_events_drive_the_timeline() {
        let Some(dev) = test_device() else { return };
        let cl = crate::cl_device(dev.spec()).unwrap();
        let s = Arc::new(OpenClSignal::default());
        let user = || Arc::new(ClEvent::user(cl.context().get()).unwrap());
        let (a, b) = (user(), user());
        s.record_shared(1, a.clone()).unwrap();
        s.record_shared(2, b.clone()).unwrap();
        assert_eq!(s.value(), 0);
        assert!(s.wait(1, Duration::from_millis(5)).is_err());
        a.complete(true).unwrap();
        s.wait(1, Duration::from_secs(10)).unwrap();
        assert_eq!(s.value(), 1);
        assert!(matches!(s.record_shared(0, a.clone()), Err(Error::Invalid(_))), "values never decrease");
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || s.wait(2, Duration::MAX))
        };
        b.complete(false).unwrap();
        assert!(matches!(waiter.join().unwrap(), Err(Error::SignalFailed(_))));
        assert!(s.failure().is_some());
    }
}
