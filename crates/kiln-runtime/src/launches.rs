//! Asynchronous launches on devices whose memory the host does not address (OpenCL, CUDA, WebGPU):
//! [`LaunchStream::launch`] records a launch on the device's in-order queue and returns at
//! once, and a caller about to touch that device's memory from the host (reading a buffer,
//! copying into it, a plan run) first calls [`LaunchStream::wait`]. Host devices (the CPU)
//! have no stream: launch on the calling thread, and a launch has completed when it returns.
//! The Python package launches this way (its `Device.synchronize()` is a wait).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kiln_device::{Buffer, Device, DynQueue, Error as KilnError, Kernel, Result as KilnResult, TimelineSignal};

/// One device's queue of asynchronous launches, shared by every user of the device.
pub struct LaunchStream {
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

/// Every device's stream, by the device's identity (its context: two devices of one spec,
/// such as one opened with another default compiler pair, have streams of their own). A
/// stream holds its device open.
fn streams() -> &'static Mutex<HashMap<usize, Arc<LaunchStream>>> {
    static STREAMS: OnceLock<Mutex<HashMap<usize, Arc<LaunchStream>>>> = OnceLock::new();
    STREAMS.get_or_init(Default::default)
}

impl LaunchStream {
    /// The stream of `device`; `None` for a host device or one without queues (its launches
    /// run on the calling thread).
    pub fn of(device: &Arc<Device>) -> Option<Arc<LaunchStream>> {
        if device.allocator().is_host() || device.queues().is_none() {
            return None;
        }
        let mut streams = streams().lock().unwrap_or_else(|p| p.into_inner());
        let stream = streams
            .entry(Arc::as_ptr(device.context()) as usize)
            .or_insert_with(|| Arc::new(LaunchStream { device: device.clone(), state: Mutex::new(None) }));
        Some(stream.clone())
    }

    /// Waits for every launch on every device's stream (at a process's exit: a driver's
    /// worker thread must not run while its library unloads). Failures are left for no one.
    pub fn drain_all() {
        let all: Vec<Arc<LaunchStream>> =
            streams().lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for stream in all {
            let _ = stream.wait();
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar};

    /// `x[i] += 1` over 64 f32.
    fn increment(dev: &Device) -> Kernel {
        let mut k = KernelBuilder::new();
        let x = k.param(0, Scalar::F32, 64);
        let i = k.global(0, 64);
        k.store(&x.at(&i), &(x.at(&i).load() + 1.0));
        dev.compile(&k.finish().expect("kernel"), Some("inc")).expect("compile")
    }

    #[test]
    fn a_host_device_has_no_stream() {
        let cpu = kiln_cpu::open(&DeviceSpec::new("CPU", 0)).expect("the CPU device");
        assert!(LaunchStream::of(&cpu).is_none());
    }

    /// Skipped (with a note) where no OpenCL device is present.
    #[test]
    fn launches_run_in_order_and_a_wait_sees_them_all_on_each_devices_own_stream() {
        let dev = match kiln_opencl::open(&DeviceSpec::new("OPENCL", 0)) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipping: no OpenCL device ({e})");
                return;
            }
        };
        let stream = LaunchStream::of(&dev).expect("OpenCL launches asynchronously");
        assert!(Arc::ptr_eq(&stream, &LaunchStream::of(&dev).expect("the same stream")));
        let other = Arc::new(dev.with_default_compiler("opencl-c").expect("another device of the spec"));
        assert!(!Arc::ptr_eq(&stream, &LaunchStream::of(&other).expect("its stream")), "one stream per device");
        let inc = increment(&dev);
        let x = Buffer::from_slice(dev.allocator(), &[0f32; 64]).expect("buffer");
        for _ in 0..5 {
            stream.launch(&inc, &[&x], &[]).expect("launch");
        }
        stream.wait().expect("wait");
        assert_eq!(x.to_vec::<f32>().expect("read"), [5f32; 64]);
        // An argument error is returned at the launch, and the stream stays usable.
        assert!(stream.launch(&inc, &[], &[]).is_err());
        stream.launch(&inc, &[&x], &[]).expect("launch");
        stream.wait().expect("wait");
        assert_eq!(x.to_vec::<f32>().expect("read"), [6f32; 64]);
    }
}
