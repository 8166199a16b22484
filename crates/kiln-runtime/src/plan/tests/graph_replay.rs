//! Graph replay ([`super::super::graph`]) on a device with mock graphs: what the plan asks of
//! the device's graph factory and when it falls back to its queues, and that a profiled plan
//! and a fault-injected device still replay as a graph. The CUDA graph itself is tested in
//! kiln-cuda (on a GPU).

use std::sync::atomic::AtomicUsize;

use kiln_device::kiln_ir::UOp;
use kiln_device::{
    CacheConfig, CompiledSpec, Compiler, CompilerPair, Device, DeviceParts, GraphFactory, GraphLaunch, KernelCache,
    LaunchGraph, Renderer,
};

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
    /// Updates and launches made while an earlier launch had not been waited for.
    overlaps: AtomicUsize,
}

impl Counts {
    fn get(&self) -> (usize, usize, usize) {
        let n = |c: &AtomicUsize| c.load(Ordering::SeqCst);
        (n(&self.captures), n(&self.updates), n(&self.launches))
    }
}

/// A device whose graphs are mock graphs: its kernels are `AffineProgram`s named
/// `affine <mul> <add>`, compiled by a renderer and compiler that only carry the spec.
struct MockGraphs {
    mode: Mode,
    counts: Arc<Counts>,
}

impl GraphFactory for MockGraphs {
    fn capture(&self, launches: &[GraphLaunch]) -> Result<Option<Box<dyn LaunchGraph>>> {
        self.counts.captures.fetch_add(1, Ordering::SeqCst);
        if self.mode == Mode::CaptureFails {
            return Err(Error::driver("mock", "stream capture is not supported here"));
        }
        let (mode, counts) = (self.mode, self.counts.clone());
        Ok(Some(Box::new(MockGraph { launches: launches.to_vec(), running: Vec::new(), mode, counts })))
    }
}

struct SpecOnly;

impl Renderer for SpecOnly {
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        ProgramSpec::from_sink(name.unwrap_or("affine 1 0"), String::new(), DeviceSpec::new("CPU", 0), ast)
    }

    fn device(&self) -> &DeviceSpec {
        static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
        &SPEC
    }
}

impl Compiler for SpecOnly {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        Ok(CompiledSpec { name: spec.name.clone(), bytes: Vec::new(), spec: Arc::new(spec.clone()) })
    }

    fn cache_key(&self) -> &'static str {
        "spec-only"
    }

    fn fingerprint(&self) -> String {
        String::new()
    }
}

/// `AffineProgram { mul, add }` for a kernel named `affine <mul> <add>`.
fn load_affine(compiled: &CompiledSpec) -> Result<Arc<dyn Program>> {
    let mut words = compiled.name.split(' ').skip(1).map(str::parse::<f32>);
    match (words.next(), words.next()) {
        (Some(Ok(mul)), Some(Ok(add))) => Ok(Arc::new(AffineProgram { mul, add })),
        _ => Err(Error::Load(format!("`{}` is not `affine <mul> <add>`", compiled.name))),
    }
}

/// A CPU-family device of `AffineProgram`s with mock graphs answering as `mode` says.
fn graph_device(mode: Mode, counts: &Arc<Counts>) -> Device {
    let counts = counts.clone();
    Device::new(DeviceSpec::new("CPU", 0), "mock graphs".into(), move |_| {
        let pair = CompilerPair::new("spec-only", Arc::new(SpecOnly), Arc::new(SpecOnly));
        Ok(DeviceParts::new(HostAllocator::shared(), vec![pair], Arc::new(load_affine))
            .with_queues(queue_factory())
            .with_graphs(Arc::new(MockGraphs { mode, counts: counts.clone() })))
    })
    .expect("the mock device opens")
    .with_cache(Arc::new(KernelCache::new(CacheConfig::memory_only())))
}

/// Runs its launches in order, like a device graph would: a launch takes the arguments as
/// they are, and the work is done when it is waited for.
struct MockGraph {
    launches: Vec<GraphLaunch>,
    /// Launched sequences not waited for yet.
    running: Vec<Vec<GraphLaunch>>,
    mode: Mode,
    counts: Arc<Counts>,
}

impl MockGraph {
    fn note_overlap(&self) {
        if !self.running.is_empty() {
            self.counts.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl LaunchGraph for MockGraph {
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool> {
        self.note_overlap();
        if self.mode == Mode::NoUpdates {
            return Ok(false);
        }
        self.counts.updates.fetch_add(1, Ordering::SeqCst);
        self.launches = launches.to_vec();
        Ok(true)
    }

    unsafe fn launch(&mut self) -> Result<()> {
        self.note_overlap();
        self.counts.launches.fetch_add(1, Ordering::SeqCst);
        self.running.push(self.launches.clone());
        Ok(())
    }

    fn wait(&mut self, _timeout: Duration) -> Result<()> {
        for run in std::mem::take(&mut self.running) {
            for l in run {
                // SAFETY: `launch`'s contract holds until this wait returns.
                unsafe { l.program.execute(&l.views, &l.vals, &l.dims) }?;
            }
        }
        Ok(())
    }
}

/// The kernel `y = mul * x + add` of `device`.
fn graph_kernel(device: &Device, mul: f32, add: f32) -> Kernel {
    device.compile(&affine_spec(None).ast, Some(&format!("affine {mul} {add}"))).expect("compile")
}

/// A plan `b = 2a + 1; c = b - 3` over the first `n` elements of kernels of `device`, and
/// its buffers.
fn plan_on(device: &Device, graph: bool) -> (ExecutionPlan, [Buffer; 3]) {
    let alloc = HostAllocator::shared();
    let bufs = [filled(&alloc, 16, 1.0), filled(&alloc, 16, 0.0), filled(&alloc, 16, 0.0)];
    let options = PlanOptions { compute_queues: 2, graph, ..PlanOptions::default() };
    let mut p = ExecutionPlan::on_queues(queue_factory(), options);
    p.exec(&graph_kernel(device, 2.0, 1.0), &[&bufs[0], &bufs[1]], &[("n", 16)]).expect("record");
    p.exec(&graph_kernel(device, 1.0, -3.0), &[&bufs[1], &bufs[2]], &[("n", 16)]).expect("record");
    (p, bufs)
}

/// [`plan_on`] a mock graph device answering as `mode` says.
fn two_step_plan(mode: Mode, counts: &Arc<Counts>, graph: bool) -> (ExecutionPlan, [Buffer; 3]) {
    plan_on(&graph_device(mode, counts), graph)
}

/// `c` after runs with `n` up to `n`: `2a + 1 - 3` where written, as `filled` left it elsewhere.
fn expected(a: &[f32], n: usize) -> Vec<f32> {
    a.iter().enumerate().map(|(i, x)| if i < n { 2.0 * x - 2.0 } else { i as f32 * 0.25 }).collect()
}

#[test]
fn a_plan_is_captured_once_then_replayed_and_updated_with_new_values() {
    let counts = Arc::new(Counts::default());
    let device = graph_device(Mode::Graphs, &counts);
    let (mut p, [a, _, c]) = plan_on(&device, true);
    let input = a.to_vec::<f32>().expect("read");
    p.run(&[("n", 4)]).expect("run");
    assert_eq!(counts.get(), (1, 0, 1), "first run: one capture, one graph launch");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 4));
    p.run(&[("n", 4)]).expect("run");
    assert_eq!(counts.get(), (1, 0, 2), "same values: the graph is launched as it is");
    p.run_vals(&[16]).expect("run");
    assert_eq!(counts.get(), (1, 1, 3), "new values: updated in place, not captured again");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 16));
    p.exec(&graph_kernel(&device, 1.0, 0.0), &[&c, &a], &[("n", 16)]).expect("record");
    p.run(&[]).expect("run");
    assert_eq!(counts.get(), (2, 1, 4), "a new node: captured again");
    assert_eq!(a.to_vec::<f32>().expect("read"), expected(&input, 16), "a = c");
}

#[test]
fn new_buffers_update_the_captured_graph() {
    let counts = Arc::new(Counts::default());
    let (mut p, [_, _, c]) = two_step_plan(Mode::Graphs, &counts, true);
    p.run(&[("n", 16)]).expect("run");
    let a2 = filled(&HostAllocator::shared(), 16, 3.0);
    p.rebind(&[(0, 0, &a2)]).expect("rebind the input");
    p.run(&[("n", 16)]).expect("run");
    assert_eq!(counts.get(), (1, 1, 2), "same values, a new buffer: updated in place");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&a2.to_vec::<f32>().expect("read"), 16));
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

/// A plan with a kernel built by hand (no device, so no graphs) runs through its queues.
#[test]
fn kernels_without_one_graph_factory_use_the_queues() {
    let counts = Arc::new(Counts::default());
    let (mut p, [a, _, c]) = two_step_plan(Mode::Graphs, &counts, true);
    let input = a.to_vec::<f32>().expect("read");
    p.exec(&affine(None, 1.0, 0.0), &[&c, &a], &[("n", 16)]).expect("record a hand-built kernel");
    p.run(&[]).expect("run");
    assert_eq!(counts.get(), (0, 0, 0), "a kernel of no device: not captured");
    assert_eq!(a.to_vec::<f32>().expect("read"), expected(&input, 16), "a = c");
}

/// Profiling times every node through the queues' timers and never wraps a kernel, so a
/// profiled plan still replays as a graph afterwards (and is profiled again after that).
#[test]
fn a_profiled_plan_still_replays_as_a_graph() {
    let counts = Arc::new(Counts::default());
    let (mut p, [a, _, c]) = two_step_plan(Mode::Graphs, &counts, true);
    let input = a.to_vec::<f32>().expect("read");
    let profile = p.run_profiled(&[("n", 8)]).expect("profiled run");
    assert_eq!(profile.events.len(), 2, "both nodes timed: {profile:?}");
    assert!(profile.events.iter().all(|e| e.start <= e.end));
    assert_eq!(counts.get(), (0, 0, 0), "a profiled run goes through the queues");
    p.run(&[("n", 8)]).expect("run");
    assert_eq!(counts.get(), (1, 0, 1), "after profiling, the plan is captured and replayed");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 8));
    let again = p.run_profiled(&[("n", 16)]).expect("profiled run");
    assert_eq!(again.events.len(), 2);
    p.run(&[("n", 16)]).expect("run");
    assert_eq!(counts.get(), (1, 1, 2), "the graph is updated, not captured again");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 16));
}

/// A plan on a fault-injected mock graph device whose first graph run (n = 4) timed out
/// (an injected timeout), with its device, buffers, input and counts.
fn timed_out_plan() -> (ExecutionPlan, Device, [Buffer; 3], Vec<f32>, Arc<Counts>) {
    use kiln_device::faults::{FaultKind, FaultPlan};
    let counts = Arc::new(Counts::default());
    let faults = FaultPlan::new();
    let device = graph_device(Mode::Graphs, &counts).with_faults(faults.clone()).expect("fault-injected device");
    let (mut p, bufs) = plan_on(&device, true);
    let input = bufs[0].to_vec::<f32>().expect("read");
    faults.after(FaultKind::Timeout, 1);
    let e = p.run(&[("n", 4)]).expect_err("the injected timeout");
    assert_eq!(e.class(), kiln_device::ErrorClass::Timeout, "{e}");
    (p, device, bufs, input, counts)
}

#[test]
fn a_graph_run_that_times_out_is_waited_for_before_the_next() {
    let (mut p, device, [_, _, c], input, counts) = timed_out_plan();
    assert!(!device.is_lost(), "a timeout does not lose the device");
    p.run(&[("n", 8)]).expect("the run after a timed-out one");
    assert_eq!(counts.get(), (1, 1, 2), "one capture, updated in place");
    assert_eq!(counts.overlaps.load(Ordering::SeqCst), 0, "the timed-out run was waited for first");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 8));
}

#[test]
fn dropping_a_plan_waits_for_its_timed_out_graph_run() {
    let (p, _device, [_, _, c], input, _) = timed_out_plan();
    drop(p);
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 4), "the run finished before the plan went");
}

/// A fault-injected device keeps its graphs: the plan captures and replays them, every
/// replayed launch passes the injection's launch gate, and an injected kernel fault in a
/// replay fails the run and loses the device, as on the queues.
#[test]
fn a_fault_injected_device_still_replays_as_a_graph() {
    use kiln_device::faults::{FaultKind, FaultPlan, KERNEL_FAULT};
    let counts = Arc::new(Counts::default());
    let faults = FaultPlan::new();
    let device = graph_device(Mode::Graphs, &counts).with_faults(faults.clone()).expect("fault-injected device");
    let (mut p, [a, _, c]) = plan_on(&device, true);
    let input = a.to_vec::<f32>().expect("read");
    p.run(&[("n", 4)]).expect("run");
    assert_eq!(counts.get(), (1, 0, 1), "captured and launched as a graph");
    assert_eq!(c.to_vec::<f32>().expect("read"), expected(&input, 4));
    assert_eq!(faults.seen(FaultKind::Kernel), 2, "the gate saw both launches of the replay");
    faults.after(FaultKind::Kernel, 2);
    let e = p.run(&[("n", 4)]).expect_err("the injected kernel fault");
    assert!(matches!(e.root_cause(), Error::Driver { code: Some(KERNEL_FAULT), .. }), "{e}");
    assert_eq!(counts.get(), (1, 0, 1), "the faulted replay never reached the graph");
    assert!(device.is_lost(), "a fatal fault in a replay loses the device");
}
