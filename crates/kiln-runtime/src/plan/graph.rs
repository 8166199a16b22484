//! Replay as one device-side graph ([`kiln_device::graph`]), where the backend offers one.
//!
//! A synchronous run ([`ExecutionPlan::run`], [`ExecutionPlan::run_vals`]) of a plan whose
//! nodes are all kernel launches of one device generation first tries the graph: the first
//! such run asks that device's [`GraphFactory`] ([`kiln_device::Kernel::graphs`]) to capture
//! every launch in record order (a valid order: dependencies only point backwards), and
//! later runs launch the captured graph, updating its launches' arguments when the variable
//! values changed. A device without graphs (or whose capture fails) marks the plan
//! "unsupported" and every run replays through the queues, as before.
//! Recording a node drops the graph. Graph runs do not advance the queues' timelines.
//! A run waits for its graph with the plan's timeout; after a timeout the graph may still
//! run, and the next run, recording or [`ExecutionPlan::drain`] waits for it first.

use std::sync::Arc;

use kiln_device::{Error, GraphFactory, GraphLaunch, LaunchGraph, Result};

use super::{ExecutionPlan, NodeKind};

/// Where a plan stands with graph replay.
#[derive(Default)]
pub(super) enum GraphState {
    /// Not tried since the last recording.
    #[default]
    Untried,
    /// The backend has no graph for this plan: runs go through the queues.
    Unsupported,
    /// A captured graph and the plan values its launches were last bound to (`None` after
    /// a rebinding changed their buffers).
    Ready(Box<dyn LaunchGraph>, Option<Vec<i64>>),
}

impl ExecutionPlan {
    /// Runs the plan as a graph with `vals` and returns `Ok(true)`, or `Ok(false)` when the
    /// plan does not replay as a graph (the caller runs it through the queues).
    ///
    /// # Errors
    /// The launch checks' errors for these values (as a queued run reports them), and the
    /// graph's own failure while it runs; the graph is then captured again on the next run.
    pub(super) fn graph_run(&mut self, vals: &[i64]) -> Result<bool> {
        if !self.options.graph || matches!(self.graph, GraphState::Unsupported) {
            return Ok(false);
        }
        let Some(graphs) = self.graph_factory() else {
            self.graph = GraphState::Unsupported;
            return Ok(false);
        };
        // A leaked handle's queued run must finish before the graph touches the buffers.
        let _ = self.drain();
        let Some(launches) = self.graph_launches(vals)? else { return Ok(false) };
        // An update error (like `Ok(false)`) is answered by capturing again.
        let reused = match std::mem::take(&mut self.graph) {
            GraphState::Ready(g, Some(old)) if old == vals => Some(g),
            GraphState::Ready(mut g, _) => g.update(&launches).unwrap_or(false).then_some(g),
            _ => None,
        };
        let mut graph = match reused {
            Some(g) => g,
            None => match graphs.capture(&launches) {
                Ok(Some(g)) => g,
                Ok(None) | Err(_) => {
                    self.graph = GraphState::Unsupported;
                    return Ok(false);
                }
            },
        };
        // SAFETY: every launch was checked for these values by `Kernel::check` (slots,
        // sizes, launch dims, bounds of every access); the plan holds every buffer it
        // recorded, and no queued run of this plan is in flight (drained above).
        unsafe { graph.launch() }?;
        match graph.wait(self.options.timeout) {
            Ok(()) => {
                self.graph = GraphState::Ready(graph, Some(vals.to_vec()));
                Ok(true)
            }
            Err(e @ Error::Timeout { .. }) => {
                self.graph = GraphState::Ready(graph, Some(vals.to_vec()));
                self.graph_running = true;
                Err(e)
            }
            // A failed run: the next run captures again.
            Err(e) => Err(e),
        }
    }

    /// Waits (with the plan's timeout) for a graph launch whose run's wait timed out.
    pub(super) fn wait_graph(&mut self) -> Result<()> {
        match &mut self.graph {
            GraphState::Ready(graph, _) if std::mem::take(&mut self.graph_running) => graph.wait(self.options.timeout),
            _ => Ok(()),
        }
    }

    /// The graph factory of the one device generation every node's kernel was loaded under;
    /// `None` when a node is not a kernel launch, or the kernels' devices have no graphs or
    /// not the same ones.
    fn graph_factory(&self) -> Option<Arc<dyn GraphFactory>> {
        let mut shared: Option<&Arc<dyn GraphFactory>> = None;
        for node in &self.nodes {
            let NodeKind::Exec { kernel, .. } = &node.kind else { return None };
            let graphs = kernel.graphs()?;
            if shared.is_some_and(|s| !Arc::ptr_eq(s, graphs)) {
                return None;
            }
            shared = Some(graphs);
        }
        shared.cloned()
    }

    /// Every node's launch with its arguments checked for the plan values `vals`; `None` when
    /// a launch needs its kernel's guarded form, whose faults only a queued run checks.
    fn graph_launches(&mut self, vals: &[i64]) -> Result<Option<Vec<GraphLaunch>>> {
        self.check_vals_len(vals)?;
        let mut launches = Vec::with_capacity(self.nodes.len());
        let mut scratch = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let NodeKind::Exec { kernel, bufs, var_index, .. } = &node.kind {
                let node_vals: Vec<i64> = var_index.iter().map(|&v| vals[v]).collect();
                scratch.clear();
                scratch.extend(bufs.iter());
                let (views, dims) = match kernel.check(&scratch, &node_vals) {
                    Ok(checked) => checked,
                    Err(Error::OutOfBounds { .. }) if kernel.has_fallback() => return Ok(None),
                    Err(e) => return Err(super::with_node(e, i, &kernel.spec.name)),
                };
                launches.push(GraphLaunch { program: kernel.program().clone(), views, vals: node_vals, dims });
            }
        }
        Ok(Some(launches))
    }
}

impl Drop for ExecutionPlan {
    /// A graph run whose wait timed out may still use the plan's buffers, which the graph
    /// does not hold: wait for it (without limit; a failing device ends the wait with its
    /// error) before they are released.
    fn drop(&mut self) {
        if let GraphState::Ready(graph, _) = &mut self.graph
            && self.graph_running
        {
            let _ = graph.wait(std::time::Duration::MAX);
        }
    }
}
