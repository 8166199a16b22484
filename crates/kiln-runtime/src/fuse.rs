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

use std::sync::Arc;

use kiln_device::kiln_ir::{Arg, DType, DeviceSpec, Op, UOp};
use kiln_device::{Buffer, Kernel, LaunchDims, Program, ProgramSpec, RawView, Result};

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

/// One checked launch: everything `Program::execute` needs, resolved.
pub(crate) struct Launch {
    pub program: Arc<dyn Program>,
    pub views: Vec<RawView>,
    pub vals: Vec<i64>,
    pub dims: LaunchDims,
}

/// Runs a segment's launches in order on the calling (queue) thread.
pub(crate) struct FusedProgram {
    launches: Vec<Launch>,
    /// Keeps every allocation the views point into alive for as long as a queue holds
    /// this program, independent of the plan's lifetime.
    _keep: Vec<Buffer>,
}

impl Program for FusedProgram {
    unsafe fn execute(&self, _bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        for l in &self.launches {
            // SAFETY: each launch was built from `Kernel::check` over buffers that `_keep`
            // holds alive (views of host memory, counts, dtypes, sizes, variable bounds and
            // launch sizes verified); the plan orders this segment after every node that
            // conflicts with it (hazard analysis + timeline waits) and never starts a run
            // before the previous one finished, so no other thread writes these bytes now.
            unsafe { l.program.execute(&l.views, &l.vals, &l.dims)? };
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "plan_segment"
    }
}

/// A kernel (no buffers, no variables, one work item) whose program runs `launches`.
pub(crate) fn fused_kernel(device: &DeviceSpec, launches: Vec<Launch>, keep: Vec<Buffer>) -> Kernel {
    Kernel {
        spec: Arc::new(bare_spec("plan_segment", device)),
        program: Arc::new(FusedProgram { launches, _keep: keep }),
    }
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
