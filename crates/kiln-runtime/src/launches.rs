//! Asynchronous launches on devices whose memory the host does not address (OpenCL, CUDA):
//! a launch there is recorded on the device's in-order queue and returns at once, and every
//! host access to that device's memory (`numpy()`, `copy_from`, DLPack, a plan run) and
//! `Device.synchronize()` first waits for what was launched. Host devices (the CPU) launch
//! on the calling thread instead: their launches have completed when the call returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kiln_device::{Buffer, Device, DynQueue, Error as KilnError, Kernel, Result as KilnResult, TimelineSignal};
use kiln_ir::DeviceSpec;

/// One device's queue for launches from Python, shared by every handle of the device.
pub struct Stream {
    device: Arc<Device>,
    state: Mutex<Option<State>>,
}

/// The queue of one device generation and how far its signal will go.
struct State {
    queue: DynQueue,
    signal: Arc<dyn TimelineSignal>,
    submitted: u64,
    generation: u64,
}

/// Every device's stream, by device.
fn streams() -> &'static Mutex<HashMap<DeviceSpec, Arc<Stream>>> {
    static STREAMS: OnceLock<Mutex<HashMap<DeviceSpec, Arc<Stream>>>> = OnceLock::new();
    STREAMS.get_or_init(Default::default)
}

/// Waits for every launch made from Python on every device (at interpreter exit: a driver's
/// worker thread must not run while its library unloads). Failures are left for no one.
pub fn drain_all() {
    let all: Vec<Arc<Stream>> = streams().lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
    for stream in all {
        let _ = stream.wait();
    }
}

/// The stream of `device`; `None` for a host device or one without queues (its launches
/// run on the calling thread).
pub fn of(device: &Arc<Device>) -> Option<Arc<Stream>> {
    if device.allocator().is_host() || device.queues().is_none() {
        return None;
    }
    let mut streams = streams().lock().unwrap_or_else(|p| p.into_inner());
    let stream = streams
        .entry(device.spec().clone())
        .or_insert_with(|| Arc::new(Stream { device: device.clone(), state: Mutex::new(None) }));
    Some(stream.clone())
}

impl Stream {
    fn lock(&self) -> MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a launch and submits it without waiting. Argument errors (count, dtype,
    /// length, bounds) are returned now; failures while running come from [`Stream::wait`].
    pub fn launch(&self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> KilnResult<()> {
        let mut state = self.lock();
        // Checked here as well as by the queue, under the lock: a stale kernel or buffer (of
        // a generation a reset ended) found by the queue fails the queue, which other threads
        // share. (A reset after this check ends the queue's generation as well.)
        kernel.check_current()?;
        for b in bufs {
            b.raw()?;
        }
        let generation = self.device.generation();
        // A new generation, or a queue that failed (its error was reported by a wait),
        // gets a fresh queue.
        if state.as_ref().is_none_or(|s| s.generation != generation || s.queue.failure().is_some()) {
            *state = None;
            let factory = self
                .device
                .queues()
                .ok_or_else(|| KilnError::Unavailable(format!("{} has no queues", self.device.spec())))?;
            let queue = factory.create_dyn_compute_queue()?;
            let signal = factory.create_dyn_signal()?;
            let submitted = signal.value();
            *state = Some(State { queue, signal, submitted, generation });
        }
        let Some(s) = state.as_mut() else {
            return Err(KilnError::Invalid("the launch queue was not created".into()));
        };
        let next = s.submitted + 1;
        s.queue.exec(kernel, bufs, vals).signal(&s.signal, next);
        match s.queue.submit() {
            Ok(()) => {
                s.submitted = next;
                Ok(())
            }
            Err(e) => {
                // Nothing of the batch runs; a failed queue is replaced at the next launch.
                if s.queue.failure().is_some() {
                    *state = None;
                }
                Err(e)
            }
        }
    }

    /// Waits for every launch submitted so far and returns the first failure among them
    /// (then the next launch starts a fresh queue). Launches of an earlier device generation
    /// are not waited for: their buffers report the reset themselves.
    pub fn wait(&self) -> KilnResult<()> {
        let (signal, value) = {
            let mut state = self.lock();
            match state.as_ref() {
                None => return Ok(()),
                Some(s) if s.generation != self.device.generation() => {
                    *state = None;
                    return Ok(());
                }
                Some(s) => (s.signal.clone(), s.submitted),
            }
        };
        let result = signal.wait(value, Duration::MAX);
        if result.is_err() {
            let mut state = self.lock();
            if state.as_ref().is_some_and(|s| Arc::ptr_eq(&s.signal, &signal)) {
                *state = None;
            }
        }
        result
    }
}
