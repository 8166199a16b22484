//! Segment fusion: the cheap path for runs of kernels on host memory.
//!
//! On one queue, a run of kernel nodes with no wait inside it and no signal before its last
//! node is only ordered by the queue itself. When every buffer of those nodes is host
//! memory, the plan hands the queue one command for the whole run: a [`FusedProgram`] that
//! calls each node's program in order with arguments checked and resolved when the
//! variable values were bound. A replay then costs the queue one command per segment
//! instead of one argument check and recording per kernel.
//!
//! Failure: the first failing node's error is the fused command's error, so the queue
//! fails its signal exactly as if that node had been a command of its own; the nodes after
//! it in the segment do not run (as on a queue that stops at a failure).
//!
//! Device generations: when every node's kernel was loaded under one device generation
//! (the usual case), the fused command checks that generation once per run and then runs
//! each kernel without its own check ([`Kernel::execute_current`]: the launch gate still
//! admits every launch), instead of paying one check per kernel; a fatal error still marks
//! the device lost ([`Stamp::observe`]).
//!
//! Profiling: a launch with a timer reports the host times around its own run, so a profiled
//! segment still times every node. A reset or loss during a run cannot make a
//! stale kernel touch freed state (an old generation's memory stays alive while its buffers
//! do) and fails the run's signals, so nothing computed after it is reported as valid.

use std::sync::Arc;

use kiln_device::kiln_ir::{Arg, DType, DeviceSpec, Op, UOp};
use kiln_device::queue::CommandTimer;
use kiln_device::{Buffer, FaultWatch, Kernel, LaunchDims, Program, ProgramSpec, RawView, Result, Stamp};

use crate::schedule::Schedule;

/// A fusable run of nodes on one queue, in queue order.
#[derive(Debug)]
pub(crate) struct Segment {
    pub nodes: Vec<usize>,
    /// The fused command, built when variable values are bound.
    pub kernel: Option<Kernel>,
}

/// Finds the segments of `schedule` (runs of at least two fusable nodes). Returns them and,
/// per node, the segment it belongs to.
pub(crate) fn find_segments(schedule: &Schedule, fusable: &[bool]) -> (Vec<Segment>, Vec<Option<usize>>) {
    let mut segments = Vec::new();
    let mut segment_of = vec![None; fusable.len()];
    for order in &schedule.order {
        let mut run: Vec<usize> = Vec::new();
        let mut flush = |run: &mut Vec<usize>| {
            if run.len() >= 2 {
                for &n in run.iter() {
                    segment_of[n] = Some(segments.len());
                }
                segments.push(Segment { nodes: std::mem::take(run), kernel: None });
            }
            run.clear();
        };
        for &n in order {
            let joins = fusable[n]
                && run.last().is_some_and(|&prev| !schedule.signal_after[prev])
                && schedule.waits[n].is_empty();
            if !joins {
                flush(&mut run);
            }
            if fusable[n] {
                run.push(n);
            }
        }
        flush(&mut run);
    }
    (segments, segment_of)
}

/// One checked launch: everything `Kernel::execute` needs, resolved.
pub(crate) struct Launch {
    pub kernel: Kernel,
    pub views: Vec<RawView>,
    pub vals: Vec<i64>,
    pub dims: LaunchDims,
    /// A guarded form's fault record: cleared before each run, checked after it.
    pub faults: Option<FaultWatch>,
    /// Receives the host times around the launch's run (a profiled run).
    pub timer: Option<Arc<dyn CommandTimer>>,
}

/// Runs a segment's launches in order on the calling (queue) thread.
pub(crate) struct FusedProgram {
    /// The one device generation of every launch, checked once per run; `None` when they
    /// share none (each kernel checks its own).
    stamp: Option<Stamp>,
    launches: Vec<Launch>,
    /// Keeps every allocation the views point into alive for as long as a queue holds
    /// this program, independent of the plan's lifetime.
    _keep: Vec<Buffer>,
}

impl Program for FusedProgram {
    unsafe fn execute(&self, _bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        if let Some(s) = &self.stamp {
            s.check("a kernel")?;
        }
        for l in &self.launches {
            let run = || {
                // SAFETY: each launch was built from `Kernel::prepare` over buffers that `_keep`
                // holds alive (views of host memory, counts, dtypes, sizes, variable bounds,
                // launch sizes and every access's bounds verified; a guarded form's fault
                // record is one of the views, held by `faults`); the plan orders this segment
                // after every node that conflicts with it (hazard analysis + timeline waits)
                // and never starts a run before the previous one finished, so no other thread
                // writes these bytes now. With `stamp`, the generation of every launch's
                // kernel was checked above.
                unsafe {
                    match self.stamp {
                        Some(_) => l.kernel.execute_current(&l.views, &l.vals, &l.dims),
                        None => l.kernel.execute(&l.views, &l.vals, &l.dims),
                    }
                }
            };
            // Only a profiled launch reads the clock: an unprofiled replay pays nothing for it.
            let start = l.timer.as_ref().map(|_| std::time::Instant::now());
            let r = match &l.faults {
                None => run(),
                Some(f) => f.arm().and_then(|()| run()).and_then(|()| f.check()),
            };
            if let (Some(t), Some(start)) = (&l.timer, start) {
                let end = std::time::Instant::now();
                t.measured(Box::new(move || Ok((start, end))));
            }
            r?;
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "plan_segment"
    }
}

/// A kernel (no buffers, no variables, one work item) whose program runs `launches`.
pub(crate) fn fused_kernel(device: &DeviceSpec, launches: Vec<Launch>, keep: Vec<Buffer>) -> Kernel {
    let stamp = one_generation(&launches);
    Kernel::new(Arc::new(bare_spec("plan_segment", device)), Arc::new(FusedProgram { stamp, launches, _keep: keep }))
}

/// The stamp of the one device generation every launch's kernel was loaded under, or
/// `None` when they share none.
fn one_generation(launches: &[Launch]) -> Option<Stamp> {
    let mut shared: Option<&Stamp> = None;
    for l in launches {
        let s = l.kernel.origin()?.stamp();
        if shared.is_some_and(|f| !Arc::ptr_eq(f.context(), s.context()) || f.minted() != s.minted()) {
            return None;
        }
        shared = Some(s);
    }
    shared.cloned()
}

/// The metadata of a program with no buffers and no variables that runs once on `device`.
pub(crate) fn bare_spec(name: &str, device: &DeviceSpec) -> ProgramSpec {
    let one = || UOp::index_const(1);
    ProgramSpec {
        name: name.into(),
        src: String::new(),
        device: device.clone(),
        ast: UOp::new(Op::Sink, DType::Void, Arg::None, vec![]),
        global_size: [one(), one(), one()],
        local_size: None,
        vars: vec![],
        var_names: vec![],
        globals: vec![],
        outs: vec![],
        ins: vec![],
        params: vec![],
        bounds: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Lane, QueueLayout, schedule};

    /// A fused replay checks the device generation once, not once per kernel (the per-kernel
    /// check made `plan_replay_per_kernel` ~50% slower), and still refuses a stale run and
    /// runs only while the device is current.
    #[test]
    fn a_fused_segment_checks_its_generation_once() {
        use kiln_device::kiln_ir::{KernelBuilder, Scalar};
        use kiln_device::{Error, Kernel};
        let dev = match kiln_cpu::open(&DeviceSpec::new("CPU", 0)) {
            Ok(d) => d,
            Err(Error::CompilerMissing(m)) => return eprintln!("skipping: no C compiler ({m})"),
            Err(e) => panic!("the CPU device does not open: {e}"),
        };
        let mut k = KernelBuilder::new();
        let x = k.param(0, Scalar::F32, 4);
        let i = k.global(0, 4);
        k.store(&x.at(&i), &(x.at(&i).load() + 1.0));
        let inc = dev.compile(&k.finish().unwrap(), Some("inc")).unwrap();
        let buf = dev.buffer(Scalar::F32, 4).unwrap();
        buf.copy_from_slice(&[0.0f32; 4]).unwrap();
        let launch = |k: &Kernel| {
            let (views, dims) = k.check(&[&buf], &[]).unwrap();
            Launch { kernel: k.clone(), views, vals: vec![], dims, faults: None, timer: None }
        };
        let stamp = one_generation(&[launch(&inc), launch(&inc)]);
        assert_eq!(stamp.map(|s| s.minted()), Some(0), "the launches share generation 0");

        let fused = fused_kernel(dev.spec(), vec![launch(&inc), launch(&inc), launch(&inc)], vec![buf.clone()]);
        fused.launch(&[], &[]).unwrap();
        assert_eq!(buf.to_vec::<f32>().unwrap(), [3.0; 4]);
        // A kernel of no device generation: every launch keeps its own check.
        let foreign =
            Kernel::new(inc.spec.clone(), Arc::new(FusedProgram { stamp: None, launches: vec![], _keep: vec![] }));
        assert!(one_generation(&[launch(&inc), launch(&foreign)]).is_none());

        dev.reset().unwrap();
        // SAFETY: the fused program refuses before touching any buffer (stale generation).
        let stale = unsafe { fused.program().execute(&[], &[], &LaunchDims { global: [1; 3], local: None }) };
        assert!(matches!(stale, Err(Error::DeviceLost { minted: 0, current: 1, .. })), "{stale:?}");
    }

    #[test]
    fn segments_break_at_waits_signals_and_unfusable_nodes() {
        // A chain 0..6, an independent expensive node 6 (another queue) and node 7 joining
        // 5 and 6 (a wait).
        let deps: Vec<Vec<usize>> = vec![vec![], vec![0], vec![1], vec![2], vec![3], vec![4], vec![], vec![5, 6]];
        let n = deps.len();
        let s = schedule(
            &deps,
            &vec![Lane::Compute; n],
            &[1, 1, 1, 1, 1, 1, 10, 1],
            QueueLayout { compute: 2, copy: false },
        );
        let mut fusable = vec![true; n];
        fusable[3] = false;
        let (segments, of) = find_segments(&s, &fusable);
        let runs: Vec<Vec<usize>> = segments.iter().map(|g| g.nodes.clone()).collect();
        // The chain 0..6 stays on one queue; the unfusable node 3 splits it. Every segment
        // lies on one queue, with waits only at its head and a signal only after its tail.
        assert!(runs.contains(&vec![0, 1, 2]), "{runs:?}");
        assert!(runs.contains(&vec![4, 5]), "{runs:?}");
        assert_eq!(of[3], None);
        for g in &segments {
            let q = s.queue[g.nodes[0]];
            for (i, &node) in g.nodes.iter().enumerate() {
                assert_eq!(s.queue[node], q);
                assert!(i == 0 || s.waits[node].is_empty());
                assert!(i + 1 == g.nodes.len() || !s.signal_after[node]);
            }
        }
    }
}
