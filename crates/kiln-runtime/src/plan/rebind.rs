//! Binding new buffers to recorded launches between runs, as a JIT does when it replays a
//! captured graph on new inputs ([`ExecutionPlan::rebind`]).
//!
//! The plan's order (each node's dependencies, its queue, the fused segments) was derived
//! from the bytes the recorded buffers share. A rebinding keeps that order valid when it
//! only renames memory:
//! - a new buffer shares no allocation with any argument the rebinding leaves alone;
//! - arguments given new buffers of one allocation had one recorded window before (the
//!   same input in several launches) and all get the same new window.
//!
//! Two new windows then overlap only where their old windows did, and the plan already
//! orders those nodes. Anything else could need an order the plan does not have, so it is
//! refused; recording the plan again orders it.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use kiln_device::{Buffer, Error, Result};

use super::{ExecutionPlan, GraphState, NodeKind};

/// A buffer window's identity: its allocation and byte range.
type Window = (usize, Range<usize>);

impl ExecutionPlan {
    /// Binds new buffers to recorded launches for the runs that follow: each `(node, slot,
    /// buffer)` replaces the buffer of parameter `slot` of launch `node` (an index
    /// [`ExecutionPlan::exec`] returned). Either every binding is applied or none is.
    /// The next run checks each launch with its new buffers (dtype, device, size, bounds)
    /// as a recorded launch is checked.
    ///
    /// # Errors
    /// [`Error::Launch`] when a node is not a recorded launch or has no such slot, when one
    /// argument is given two different buffers, or when the new buffers would share memory
    /// in a way the recorded ones did not (see the module docs): record the plan again with
    /// those buffers instead.
    pub fn rebind(&mut self, bindings: &[(usize, usize, &Buffer)]) -> Result<()> {
        // The arguments that change, with their old and new windows.
        let mut changed: HashMap<(usize, usize), (Window, &Buffer)> = HashMap::with_capacity(bindings.len());
        for &(node, slot, buf) in bindings {
            let old = self.argument(node, slot)?;
            if old.byte_range() == buf.byte_range() {
                continue;
            }
            let entry = changed.entry((node, slot)).or_insert((old.byte_range(), buf));
            if entry.1.byte_range() != buf.byte_range() {
                return Err(Error::Launch(format!("slot {slot} of node {node} is bound to two different buffers")));
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        let kept: HashSet<usize> = self
            .arguments()
            .filter(|(at, _)| at.is_none_or(|at| !changed.contains_key(&at)))
            .map(|(_, b)| b.byte_range().0)
            .collect();
        let mut renames: HashMap<usize, (&Window, Range<usize>)> = HashMap::with_capacity(changed.len());
        for ((node, slot), (old, buf)) in &changed {
            let (alloc, range) = buf.byte_range();
            let refuse = |why: &str| {
                Err(Error::Launch(format!(
                    "slot {slot} of node {node}: the new buffer {why}, so the plan's order may not hold for it; \
                     record the plan again with this buffer"
                )))
            };
            if kept.contains(&alloc) {
                return refuse("shares memory with a buffer the plan keeps");
            }
            match renames.get(&alloc) {
                Some((first_old, first_range)) if *first_old != old || *first_range != range => {
                    return refuse("shares memory with another new buffer whose recorded buffer was different");
                }
                Some(_) => {}
                None => {
                    renames.insert(alloc, (old, range));
                }
            }
        }
        for ((node, slot), (_, buf)) in changed {
            if let NodeKind::Exec { bufs, .. } = &mut self.nodes[node].kind {
                if bufs[slot].allocator().is_host() != buf.allocator().is_host() {
                    self.schedule = None; // fusing depends on host memory
                }
                bufs[slot] = buf.clone();
            }
        }
        self.checked = None;
        self.tracker_stale = true;
        if let GraphState::Ready(_, vals) = &mut self.graph {
            *vals = None;
        }
        Ok(())
    }

    /// The buffer of `slot` of launch `node`.
    fn argument(&self, node: usize, slot: usize) -> Result<&Buffer> {
        match self.nodes.get(node).map(|n| &n.kind) {
            Some(NodeKind::Exec { bufs, kernel, .. }) => bufs.get(slot).ok_or_else(|| {
                Error::Launch(format!(
                    "node {node} (`{}`) has {} buffer slot(s), no slot {slot}",
                    kernel.spec.name,
                    bufs.len()
                ))
            }),
            Some(NodeKind::Copy { .. } | NodeKind::Collective { .. }) => {
                Err(Error::Launch(format!("node {node} is not a launch; only launches are rebound")))
            }
            None => Err(Error::Launch(format!("the plan has {} node(s), no node {node}", self.nodes.len()))),
        }
    }

    /// Every buffer the plan's nodes use, with `(node, slot)` for a launch's arguments.
    fn arguments(&self) -> impl Iterator<Item = (Option<(usize, usize)>, &Buffer)> {
        self.nodes.iter().enumerate().flat_map(|(n, node)| -> Box<dyn Iterator<Item = _>> {
            match &node.kind {
                NodeKind::Exec { bufs, .. } => Box::new(bufs.iter().enumerate().map(move |(s, b)| (Some((n, s)), b))),
                NodeKind::Copy { dst, src, .. } | NodeKind::Collective { recv: dst, send: src, .. } => {
                    Box::new([(None, dst), (None, src)].into_iter())
                }
            }
        })
    }
}
