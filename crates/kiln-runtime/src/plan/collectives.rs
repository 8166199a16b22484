//! The collectives of one run of a plan: the deadline they share, when each may start, who is
//! told when the run fails before one, and which error a missing peer gives.
//!
//! Every collective node of a run holds one [`RunCollectives`]:
//! - Its deadline is the run's (submission plus the plan's timeout), so a collective gives up
//!   when the plan does, and a missing peer is [`Error::Channel`] whichever wait notices it
//!   first: a run whose wait timed out while a collective was waiting for a peer reports the
//!   collective's channel error, not [`Error::Timeout`].
//! - A failed run is closed before its wait returns: a collective that has not started does
//!   not start, and the wait returns only after every collective that started has returned
//!   (each is bounded by the deadline), so the next run never finds its predecessor's
//!   collective still waiting on the channel.
//! - Per channel it counts the collectives started. When the run fails before one of them
//!   (its host step dropped by a failed queue, refused because the run was closed, or the
//!   run refused before anything was queued), the plan leaves the channel
//!   ([`Channel::leave`]) once, naming the first collective not started, so the peers fail at
//!   once instead of at their timeout.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_device::collective::{Channel, Collective, Deadline};
use kiln_device::queue::{CommandTimer, HostCall};
use kiln_device::{Buffer, Error};

/// What the collective nodes of one run share (see the module docs).
pub(super) struct RunCollectives {
    deadline: Deadline,
    state: Mutex<State>,
    /// Signalled when a collective returns.
    idle: Condvar,
}

struct State {
    /// Why the run ended early; collectives not started by then never start.
    closed: Option<Error>,
    /// Collectives that started and have not returned.
    active: usize,
    /// The first [`Error::Channel`] a collective of the run returned.
    channel_error: Option<Error>,
    channels: Vec<Progress>,
}

/// One channel's collectives in a run.
struct Progress {
    channel: Arc<dyn Channel>,
    /// In recorded order, which is the order they run in.
    ops: Vec<Collective>,
    /// How many have started.
    started: usize,
    /// Whether the run left the channel.
    left: bool,
}

/// Where a collective node sits: its channel's index in [`State::channels`] and its position
/// among that channel's collectives.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    channel: usize,
    position: usize,
}

impl RunCollectives {
    /// The shared state of a run whose collectives are `collectives` (in recorded order) and
    /// whose deadline is `timeout` from now; the slot of each collective, in the same order.
    pub(super) fn new<'a>(
        collectives: impl Iterator<Item = (&'a Arc<dyn Channel>, Collective)>,
        timeout: Duration,
    ) -> (Arc<RunCollectives>, Vec<Slot>) {
        let mut channels: Vec<Progress> = Vec::new();
        let mut slots = Vec::new();
        for (channel, op) in collectives {
            let at = match channels.iter().position(|p| Arc::ptr_eq(&p.channel, channel)) {
                Some(at) => at,
                None => {
                    channels.push(Progress { channel: channel.clone(), ops: Vec::new(), started: 0, left: false });
                    channels.len() - 1
                }
            };
            slots.push(Slot { channel: at, position: channels[at].ops.len() });
            channels[at].ops.push(op);
        }
        let state = State { closed: None, active: 0, channel_error: None, channels };
        let run = RunCollectives { deadline: Deadline::after(timeout), state: Mutex::new(state), idle: Condvar::new() };
        (Arc::new(run), slots)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Only plain assignments run under the lock: a poisoned lock still holds valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host step of the collective at `slot`: runs it on its channel until the run's
    /// deadline (timed for `timer`). Refused when the run was closed first; dropped without
    /// being called (its queue failed before it), it leaves the channel.
    pub(super) fn host_step(
        self: &Arc<Self>,
        slot: Slot,
        send: &Buffer,
        recv: &Buffer,
        timer: Option<Arc<dyn CommandTimer>>,
    ) -> HostCall {
        /// Leaves the channel when the step is dropped uncalled.
        struct Pending {
            run: Arc<RunCollectives>,
            slot: Slot,
            called: bool,
        }
        impl Drop for Pending {
            fn drop(&mut self) {
                if !self.called {
                    let why = Error::Invalid("its plan failed before the collective".into());
                    self.run.leave(self.slot.channel, &why);
                }
            }
        }
        let mut pending = Pending { run: self.clone(), slot, called: false };
        let (send, recv) = (send.clone(), recv.clone());
        Box::new(move || {
            pending.called = true;
            let run = &pending.run;
            let (channel, op) = {
                let mut st = run.lock();
                if let Some(why) = st.closed.clone() {
                    drop(st);
                    run.leave(slot.channel, &why);
                    return Err(why);
                }
                let progress = &mut st.channels[slot.channel];
                progress.started = progress.started.max(slot.position + 1);
                let step = (progress.channel.clone(), progress.ops[slot.position]);
                st.active += 1;
                step
            };
            let start = Instant::now();
            let result = channel.run(op, &send, &recv, run.deadline.left().unwrap_or(Duration::ZERO));
            if let Some(t) = timer {
                let end = Instant::now();
                t.measured(Box::new(move || Ok((start, end))));
            }
            let mut st = run.lock();
            st.active -= 1;
            if let Err(e @ Error::Channel { .. }) = &result {
                st.channel_error.get_or_insert_with(|| e.clone());
            }
            run.idle.notify_all();
            result
        })
    }

    /// Leaves channel `at` (once per run), naming its first collective not started.
    fn leave(&self, at: usize, why: &Error) {
        let (channel, next) = {
            let mut st = self.lock();
            let progress = &mut st.channels[at];
            if progress.left || progress.started >= progress.ops.len() {
                return;
            }
            progress.left = true;
            (progress.channel.clone(), progress.ops[progress.started])
        };
        // Outside the lock: a provider may wait for its peers to hear it.
        channel.leave(next, why);
    }

    /// Ends a run that failed with `why`: collectives not started never start, those that
    /// started are waited for, and every channel with a collective not started is left.
    /// Returns the first channel error a collective of the run gave.
    pub(super) fn close(&self, why: &Error) -> Option<Error> {
        let mut st = self.lock();
        st.closed.get_or_insert_with(|| why.clone());
        // Each active collective returns by the run's deadline (or, in its last step, after a
        // bounded amount of memory work): this wait ends.
        while st.active > 0 {
            st = self.idle.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let channel_error = st.channel_error.clone();
        let channels = st.channels.len();
        drop(st);
        for at in 0..channels {
            self.leave(at, why);
        }
        channel_error
    }
}
