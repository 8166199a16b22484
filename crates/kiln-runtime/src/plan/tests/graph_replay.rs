//! Graph replay ([`super::super::graph`]) with mock graph backends: what the plan asks of
//! the backend hook and when it falls back to its queues. The CUDA graph itself is tested in
//! kiln-cuda (on a GPU).

use std::sync::atomic::AtomicUsize;

use kiln_device::{GraphLaunch, LaunchGraph};

use super::*;

/// How the mock backend answers.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Captures, and updates in place.
    Graphs,
    /// Captures, but refuses every update (the plan must capture again).
    NoUpdates,
    /// Capture fails with a driver error (the plan must fall back to its queues).
    CaptureFails,
}

#[derive(Default)]
struct Counts {
    captures: AtomicUsize,
    updates: AtomicUsize,
    launches: AtomicUsize,
}

impl Counts {
    fn get(&self) -> (usize, usize, usize) {
        let n = |c: &AtomicUsize| c.load(Ordering::SeqCst);
        (n(&self.captures), n(&self.updates), n(&self.launches))
    }
}

/// `AffineProgram` on a backend with (mock) graphs.
struct GraphProgram {
    inner: AffineProgram,
    mode: Mode,
    counts: Arc<Counts>,
}

impl Program for GraphProgram {
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.execute(bufs, vals, launch) }
    }

    fn name(&self) -> &str {
        "graph_affine"
    }

    fn capture_graph(&self, launches: &[GraphLaunch]) -> Result<Option<Box<dyn LaunchGraph>>> {
        self.counts.captures.fetch_add(1, Ordering::SeqCst);
        if self.mode == Mode::CaptureFails {
            return Err(Error::driver("mock", "stream capture is not supported here"));
        }
        Ok(Some(Box::new(MockGraph { launches: launches.to_vec(), mode: self.mode, counts: self.counts.clone() })))
    }
}

/// Runs its launches in order, like a device graph would.
struct MockGraph {
    launches: Vec<GraphLaunch>,
    mode: Mode,
    counts: Arc<Counts>,
}

impl LaunchGraph for MockGraph {
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool> {
        if self.mode == Mode::NoUpdates {
            return Ok(false);
        }
        self.counts.updates.fetch_add(1, Ordering::SeqCst);
        self.launches = launches.to_vec();
        Ok(true)
    }

    unsafe fn launch(&mut self) -> Result<()> {
        self.counts.launches.fetch_add(1, Ordering::SeqCst);
        for l in &self.launches {
            // SAFETY: forwarded from this function's contract.
            unsafe { l.program.execute(&l.views, &l.vals, &l.dims) }?;
        }
        Ok(())
    }
}

fn graph_kernel(mode: Mode, counts: &Arc<Counts>, mul: f32, add: f32) -> Kernel {
    let program = GraphProgram { inner: AffineProgram { mul, add }, mode, counts: counts.clone() };
    Kernel::new(affine_spec(None), Arc::new(program))
}

/// A plan `b = 2a + 1; c = b - 3` over the first `n` elements, and its buffers.
fn two_step_plan(mode: Mode, counts: &Arc<Counts>, graph: bool) -> (ExecutionPlan, [Buffer; 3]) {
    let alloc = HostAllocator::shared();
    let bufs = [filled(&alloc, 16, 1.0), filled(&alloc, 16, 0.0), filled(&alloc, 16, 0.0)];
    let options = PlanOptions { compute_queues: 2, graph, ..PlanOptions::default() };
    let mut p = ExecutionPlan::on_queues(queue_factory(), options);
    p.exec(&graph_kernel(mode, counts, 2.0, 1.0), &[&bufs[0], &bufs[1]], &[("n", 16)]).expect("record");
    p.exec(&graph_kernel(mode, counts, 1.0, -3.0), &[&bufs[1], &bufs[2]], &[("n", 16)]).expect("record");
    (p, bufs)
}

/// `c` after runs with `n` up to `n`: `2a + 1 - 3` where written, as `filled` left it elsewhere.
fn expected(a: &[f32], n: usize) -> Vec<f32> {
    a.iter().enumerate().map(|(i, x)| if i < n { 2.0 * x - 2.0 } else { i as f32 * 0.25 }).collect()
}

#[test]
fn a_plan_is_captured_once_then_replayed_and_updated_with_new_values() {
    let counts = Arc::new(Counts::default());
    let (mut p, [a, _, c]) = two_step_plan(Mode::Graphs, &counts, true);
    let input = a.to_vec::<f32>().expect("read");
    p.run(&[("n", 4)]).expect("run");
    assert_eq!(counts.get(), (1, 0, 1), "first run: one capture, one graph launch");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 4));
    p.run(&[("n", 4)]).expect("run");
    assert_eq!(counts.get(), (1, 0, 2), "same values: the graph is launched as it is");
    p.run_vals(&[16]).expect("run");
    assert_eq!(counts.get(), (1, 1, 3), "new values: updated in place, not captured again");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 16));
    p.exec(&graph_kernel(Mode::Graphs, &counts, 1.0, 0.0), &[&c, &a], &[("n", 16)]).expect("record");
    p.run(&[]).expect("run");
    assert_eq!(counts.get(), (2, 1, 4), "a new node: captured again");
    assert_eq!(a.to_vec::<f32>().expect("read"), expected(&input, 16), "a = c");
}

#[test]
fn a_refused_update_captures_again() {
    let counts = Arc::new(Counts::default());
    let (mut p, [a, _, c]) = two_step_plan(Mode::NoUpdates, &counts, true);
    let input = a.to_vec::<f32>().expect("read");
    p.run(&[("n", 4)]).expect("run");
    p.run(&[("n", 8)]).expect("run");
    assert_eq!(counts.get(), (2, 0, 2));
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 8));
}

#[test]
fn a_failing_capture_falls_back_to_the_queues_for_good() {
    let counts = Arc::new(Counts::default());
    let (mut p, [a, _, c]) = two_step_plan(Mode::CaptureFails, &counts, true);
    let input = a.to_vec::<f32>().expect("read");
    p.run(&[("n", 8)]).expect("run through the queues");
    p.run(&[("n", 8)]).expect("run through the queues");
    assert_eq!(counts.get(), (1, 0, 0), "capture is tried once per recording");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 8));
    assert!(!p.timeline().is_empty(), "the queues ran the plan");
}

#[test]
fn graphs_off_copies_and_bad_values_use_the_queues_or_fail_before_running() {
    let counts = Arc::new(Counts::default());
    let (mut p, [a, _, c]) = two_step_plan(Mode::Graphs, &counts, false);
    let input = a.to_vec::<f32>().expect("read");
    p.run(&[]).expect("run");
    assert_eq!(counts.get(), (0, 0, 0), "PlanOptions::graph = false");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 16));

    let (mut p, [a, b, _]) = two_step_plan(Mode::Graphs, &counts, true);
    p.copy(&a, &b).expect("record a copy");
    p.run(&[]).expect("run");
    assert_eq!(counts.get(), (0, 0, 0), "a plan with a copy is not captured");

    let (mut p, _) = two_step_plan(Mode::Graphs, &counts, true);
    assert!(matches!(p.run(&[("n", 5000)]), Err(Error::Ir(_))), "n above its bound");
    assert!(matches!(p.run(&[("n", 17)]), Err(Error::Launch(_))), "n past the buffers");
    assert!(matches!(p.run_vals(&[]), Err(Error::Launch(_))), "one value per variable");
    assert_eq!(counts.get(), (0, 0, 0), "nothing captured or launched for refused values");
}
