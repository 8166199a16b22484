//! Timeline signals over wgpu submission indices: the generic [`RingSignal`] over
//! [`WgpuEvent`].
//!
//! wgpu has one ordered queue per device. A queue that signals `v` submits (an empty
//! submission if need be) and records that submission's index for `v`; the timeline reaches
//! `v` when `queue.on_submitted_work_done` reports the submission done, which `Device::poll`
//! drives. A queue of the same device that waits for `v` needs nothing on the device: every
//! later submission runs after it, as WebGPU orders one queue's work.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kiln_device::{BackendEvent, Result, RingSignal};

use crate::{WgpuDevice, driver};

/// One submission on a wgpu device, and whether (and when) it finished.
pub struct WgpuEvent {
    gpu: Arc<WgpuDevice>,
    index: wgpu::SubmissionIndex,
    done: Arc<AtomicBool>,
    finished: Arc<Mutex<Option<Instant>>>,
}

impl fmt::Debug for WgpuEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WgpuEvent({:?}, done = {})", self.index, self.done.load(Ordering::Acquire))
    }
}

impl WgpuEvent {
    /// An event for everything submitted to `gpu` so far (submits an empty batch).
    pub fn now(gpu: &Arc<WgpuDevice>) -> Result<WgpuEvent> {
        let index = gpu.submit(None)?;
        Ok(WgpuEvent::after(gpu, index))
    }

    /// An event for submission `index`, the latest on `gpu`.
    pub fn after(gpu: &Arc<WgpuDevice>, index: wgpu::SubmissionIndex) -> WgpuEvent {
        let done = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(Mutex::new(None));
        let (d, t) = (done.clone(), finished.clone());
        gpu.queue.on_submitted_work_done(move || {
            *t.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            d.store(true, Ordering::Release);
        });
        WgpuEvent { gpu: gpu.clone(), index, done, finished }
    }

    /// The device the submission was made on.
    pub fn device(&self) -> &Arc<WgpuDevice> {
        &self.gpu
    }

    /// Waits for the submission and returns when the host saw it finish.
    pub fn finished_at(&self) -> Result<Instant> {
        BackendEvent::wait(self)?;
        Ok(self.finished.lock().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(Instant::now))
    }
}

impl BackendEvent for WgpuEvent {
    fn is_complete(&self) -> Result<bool> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        self.gpu.device.poll(wgpu::PollType::Poll).map_err(|e| driver("Device::poll", e, false))?;
        self.gpu.check_lost()?;
        Ok(self.done.load(Ordering::Acquire))
    }

    fn wait(&self) -> Result<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        self.gpu.wait(Some(self.index.clone()))
    }
}

/// A timeline signal whose values are reached by wgpu submissions (or host `set`s).
pub type WgpuSignal = RingSignal<WgpuEvent>;
