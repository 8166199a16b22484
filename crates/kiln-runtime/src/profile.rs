//! Profiling: per-node start/end times taken on the executing side, written as a Chrome
//! trace (the JSON that `chrome://tracing` and Perfetto open).
//!
//! Every profiled command is recorded with `exec_timed`/`copy_timed`, and each node's
//! [`Stamps`] is its [`CommandTimer`]: the queue reports when the kernel ran (the host times
//! around it on a CPU queue, the device's own on an OpenCL queue), and a fused segment
//! reports each of its nodes. Kernels are never wrapped, so a profiled kernel is the same
//! kernel (its device's graphs and native queues still take it). Copy nodes on host memory
//! are bracketed by two marker kernels (no buffers, one work item) that stamp the time on the
//! copy's queue.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::{CommandTimer, TimeProbe};
use kiln_device::{Error, Kernel, LaunchDims, Program, RawView, Result};
use serde::Serialize;

/// Time stamps of one node, in nanoseconds since the plan's epoch plus one (0 = not taken),
/// or the probe of a queue that measured the node itself.
#[derive(Default)]
pub(crate) struct Stamps {
    start: AtomicU64,
    end: AtomicU64,
    probe: Mutex<Option<TimeProbe>>,
}

impl std::fmt::Debug for Stamps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stamps").field("start", &self.start).field("end", &self.end).finish_non_exhaustive()
    }
}

/// Nanoseconds from `epoch` to `t`, plus one (0 means "not taken").
fn since(epoch: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX - 1) + 1
}

impl Stamps {
    fn stamp(slot: &AtomicU64, epoch: Instant) {
        slot.store(since(epoch, Instant::now()), Ordering::Release);
    }

    fn probe(&self) -> std::sync::MutexGuard<'_, Option<TimeProbe>> {
        self.probe.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn clear(&self) {
        self.start.store(0, Ordering::Relaxed);
        self.end.store(0, Ordering::Relaxed);
        self.probe().take();
    }

    /// (start, end) since `epoch`, when both were taken. A queue's probe (read here, after
    /// the run completed) takes precedence over host stamps; a probe that fails leaves the
    /// node untimed.
    pub(crate) fn read(&self, epoch: Instant) -> Option<(Duration, Duration)> {
        let probe = self.probe().take();
        if let Some(Ok((s, e))) = probe.map(|p| p()) {
            self.start.store(since(epoch, s), Ordering::Release);
            self.end.store(since(epoch, e), Ordering::Release);
        }
        let (s, e) = (self.start.load(Ordering::Acquire), self.end.load(Ordering::Acquire));
        (s > 0 && e > 0).then(|| (Duration::from_nanos(s - 1), Duration::from_nanos(e - 1)))
    }
}

impl CommandTimer for Stamps {
    fn measured(&self, probe: TimeProbe) {
        *self.probe() = Some(probe);
    }
}

/// A program with no buffers that stamps the start or the end slot.
struct MarkerProgram {
    stamps: Arc<Stamps>,
    end: bool,
    epoch: Instant,
}

impl Program for MarkerProgram {
    unsafe fn execute(&self, _bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        Stamps::stamp(if self.end { &self.stamps.end } else { &self.stamps.start }, self.epoch);
        Ok(())
    }

    fn name(&self) -> &str {
        if self.end { "copy_end" } else { "copy_start" }
    }
}

/// Two kernels (start, end) that stamp `stamps` when they run on a queue of `device`.
pub(crate) fn marker_kernels(device: &DeviceSpec, stamps: Arc<Stamps>, epoch: Instant) -> (Kernel, Kernel) {
    let spec = Arc::new(crate::fuse::bare_spec("copy_marker", device));
    let mark = |end| {
        Kernel::new(spec.clone(), Arc::new(MarkerProgram { stamps: stamps.clone(), end, epoch }) as Arc<dyn Program>)
    };
    (mark(false), mark(true))
}

/// One node's execution in a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileEvent {
    /// Node index in recording order.
    pub node: usize,
    /// Kernel name, or `copy` for copies.
    pub name: String,
    /// Queue index the node ran on (compute queues first, then the copy queue).
    pub queue: usize,
    /// Since the start of the run.
    pub start: Duration,
    /// Since the start of the run (never before `start`).
    pub end: Duration,
}

/// The timeline of one profiled run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// One event per node, sorted by start time.
    pub events: Vec<ProfileEvent>,
    /// Display name of each queue (`compute 0`, `copy`, ...), indexed by queue.
    pub queue_names: Vec<String>,
    /// Wall time of the run on the host, from the first submit to the last completion.
    pub wall: Duration,
}

impl Profile {
    /// The trace as Chrome-trace JSON: one complete event (`"ph": "X"`) per node with
    /// `tid` = queue index and `ts`/`dur` in microseconds, plus thread-name metadata.
    pub fn to_chrome_trace(&self) -> String {
        let threads = self.queue_names.iter().enumerate().map(|(tid, name)| TraceEvent::Thread {
            name: "thread_name",
            ph: "M",
            pid: 0,
            tid,
            args: ThreadArgs { name },
        });
        let slices = self.events.iter().map(|e| TraceEvent::Slice {
            name: &e.name,
            cat: "kernel",
            ph: "X",
            pid: 0,
            tid: e.queue,
            ts: e.start.as_secs_f64() * 1e6,
            dur: e.end.saturating_sub(e.start).as_secs_f64() * 1e6,
            args: SliceArgs { node: e.node },
        });
        let trace = ChromeTrace { trace_events: threads.chain(slices).collect(), display_time_unit: "ns" };
        // serde_json fails only on non-string map keys and failing `Serialize` impls, neither
        // of which these structs have; the fallback is still JSON, and says what happened.
        let mut json =
            serde_json::to_string(&trace).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string());
        json.push('\n');
        json
    }

    /// Writes [`Profile::to_chrome_trace`] to `path`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the path when the file cannot be written.
    pub fn write_chrome_trace(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_chrome_trace())
            .map_err(|e| Error::Io(format!("cannot write the trace to {}: {e}", path.display())))
    }
}

/// The Chrome trace file (the "JSON object format"), serialized with the fields in this order.
#[derive(Serialize)]
struct ChromeTrace<'a> {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<TraceEvent<'a>>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
}

/// A queue's name (metadata event `M`) or one node's execution (complete event `X`).
#[derive(Serialize)]
#[serde(untagged)]
enum TraceEvent<'a> {
    Thread {
        name: &'static str,
        ph: &'static str,
        pid: u32,
        tid: usize,
        args: ThreadArgs<'a>,
    },
    Slice {
        name: &'a str,
        cat: &'static str,
        ph: &'static str,
        pid: u32,
        tid: usize,
        ts: f64,
        dur: f64,
        args: SliceArgs,
    },
}

#[derive(Serialize)]
struct ThreadArgs<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct SliceArgs {
    node: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_trace_has_complete_events_per_queue() {
        let ms = Duration::from_millis;
        let odd = "a\"b\\c\n\u{1}";
        let p = Profile {
            events: vec![
                ProfileEvent { node: 0, name: odd.into(), queue: 0, start: ms(0), end: ms(2) },
                ProfileEvent { node: 1, name: "c".into(), queue: 1, start: ms(1), end: ms(3) },
            ],
            queue_names: vec!["compute 0".into(), "compute \"1\"".into()],
            wall: ms(3),
        };
        let json = p.to_chrome_trace();
        assert!(json.starts_with("{\"traceEvents\":["));
        assert!(
            json.contains("\"cat\":\"kernel\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":0.0,\"dur\":2000.0"),
            "{json}"
        );
        assert!(json.contains("\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1000.0,\"dur\":2000.0"), "{json}");
        // Names with quotes, backslashes and control characters round-trip.
        let parsed: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        let events = parsed["traceEvents"].as_array().expect("an event list");
        assert_eq!(events.len(), 4);
        assert_eq!(events[1]["args"]["name"], "compute \"1\"");
        assert_eq!(events[2]["name"], odd);
        assert_eq!(events[3]["args"]["node"], 1);
        assert_eq!(parsed["displayTimeUnit"], "ns");
    }

    #[test]
    fn a_queue_probe_is_read_on_the_epoch_and_wins_over_host_stamps() {
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        let stamps = Stamps::default();
        Stamps::stamp(&stamps.start, epoch);
        Stamps::stamp(&stamps.end, epoch);
        stamps.measured(Box::new(move || Ok((epoch + ms(5), epoch + ms(7)))));
        assert_eq!(stamps.read(epoch), Some((ms(5), ms(7))));
        assert_eq!(stamps.read(epoch), Some((ms(5), ms(7))), "a second read gives the same times");
        // A failing probe (no device times) leaves the node untimed.
        stamps.clear();
        stamps.measured(Box::new(|| Err(Error::Invalid("no profiling".into()))));
        assert_eq!(stamps.read(epoch), None);
        // A probe measured before the epoch clamps to it instead of wrapping.
        let late = Instant::now();
        stamps.measured(Box::new(move || Ok((epoch, epoch + ms(1)))));
        assert_eq!(stamps.read(late).map(|(s, _)| s), Some(Duration::ZERO));
    }
}
