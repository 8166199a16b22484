//! Queue assignment and cross-queue synchronization.
//!
//! Nodes are placed in recording order (a topological order: every dependency points to an
//! earlier node) by list scheduling with estimated costs: a node goes to the queue where it
//! could start earliest, preferring a queue that already holds its dependencies, so chains
//! stay on one queue and independent branches spread out. Copies go to the copy queue when
//! the device has one.
//!
//! Order within a queue is implicit. A dependency that crosses queues becomes a timeline
//! wait: queue `q` has one signal, and the node at 1-based position `p` of `q` sets it to
//! `base + p` when the node is a dependency of another queue (or the queue's last node).
//! Vector clocks drop waits that are already implied by an earlier wait.

/// Which kind of queue a node needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// A kernel launch: any compute queue.
    Compute,
    /// A copy: the copy queue when the layout has one, else a compute queue.
    Copy,
}

/// The queues a plan runs on: `compute` compute queues (indices `0..compute`) and, when
/// `copy` is set, one copy queue at index `compute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    /// Compute queues (indices `0..compute`).
    pub compute: usize,
    /// Whether there is a copy queue (index `compute`).
    pub copy: bool,
}

impl QueueLayout {
    /// Total number of queues, the copy queue included.
    pub fn len(&self) -> usize {
        self.compute + usize::from(self.copy)
    }

    /// Whether there are no queues at all (not a usable layout).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A wait before a node: the node starts once queue `queue`'s signal reaches the plan's base
/// for that queue plus `position`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    /// The queue whose signal is waited on.
    pub queue: usize,
    /// The 1-based position, in that queue, of the node waited for.
    pub position: u64,
}

/// Where every node runs and what synchronizes it.
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    /// Queue of each node.
    pub queue: Vec<usize>,
    /// 1-based position of each node in its queue.
    pub position: Vec<u64>,
    /// Waits to record before each node.
    pub waits: Vec<Vec<Wait>>,
    /// Whether the node's queue signals `base + position` after the node.
    pub signal_after: Vec<bool>,
    /// Nodes of each queue, in submission order.
    pub order: Vec<Vec<usize>>,
}

impl Schedule {
    /// Number of nodes on queue `q` (the value its signal reaches, above its base, at the end).
    pub fn queue_len(&self, q: usize) -> u64 {
        self.order.get(q).map_or(0, |o| o.len() as u64)
    }

    /// Number of cross-queue waits in the whole schedule.
    pub fn wait_count(&self) -> usize {
        self.waits.iter().map(Vec::len).sum()
    }
}

/// Assigns `deps.len()` nodes to the queues of `layout` (which must have at least one compute
/// queue). `deps[n]` lists earlier nodes `n` must run after; `lanes[n]` and `costs[n]` (an
/// estimate in any consistent unit) describe node `n`.
pub fn schedule(deps: &[Vec<usize>], lanes: &[Lane], costs: &[u64], layout: QueueLayout) -> Schedule {
    let n = deps.len();
    let nq = layout.len().max(1);
    let compute = layout.compute.max(1);
    let mut s = Schedule {
        queue: Vec::with_capacity(n),
        position: Vec::with_capacity(n),
        waits: Vec::with_capacity(n),
        signal_after: vec![false; n],
        order: vec![Vec::new(); nq],
    };
    let mut finish = vec![0u64; n];
    let mut queue_free = vec![0u64; nq];
    // known[q][r]: the highest position of queue r known complete at the end of queue q.
    let mut known = vec![vec![0u64; nq]; nq];
    // clock[node]: `known` of the node's queue right after the node.
    let mut clock: Vec<Vec<u64>> = Vec::with_capacity(n);

    for node in 0..n {
        let ready = deps[node].iter().map(|&d| finish[d]).max().unwrap_or(0);
        let candidates = match lanes[node] {
            Lane::Copy if layout.copy => compute..compute + 1,
            _ => 0..compute,
        };
        let q = candidates
            .min_by_key(|&q| {
                let start = queue_free[q].max(ready);
                let foreign = deps[node].iter().filter(|&&d| s.queue[d] != q).count();
                (start, foreign, q)
            })
            .unwrap_or(0);
        let start = queue_free[q].max(ready);
        finish[node] = start.saturating_add(costs[node].max(1));
        queue_free[q] = finish[node];

        let mut waits = Vec::new();
        // Latest dependencies first: waiting on them often implies the earlier ones.
        let mut sorted: Vec<usize> = deps[node].clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for d in sorted {
            let (dq, dp) = (s.queue[d], s.position[d]);
            if dq == q || known[q][dq] >= dp {
                continue;
            }
            s.signal_after[d] = true;
            waits.push(Wait { queue: dq, position: dp });
            for (k, c) in known[q].iter_mut().zip(&clock[d]) {
                *k = (*k).max(*c);
            }
        }
        waits.sort_unstable_by_key(|w| (w.queue, w.position));
        s.order[q].push(node);
        let pos = s.order[q].len() as u64;
        known[q][q] = pos;
        clock.push(known[q].clone());
        s.queue.push(q);
        s.position.push(pos);
        s.waits.push(waits);
    }
    for order in &s.order {
        if let Some(&last) = order.last() {
            s.signal_after[last] = true;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: QueueLayout = QueueLayout { compute: 2, copy: false };

    fn run(deps: &[&[usize]], layout: QueueLayout) -> Schedule {
        let deps: Vec<Vec<usize>> = deps.iter().map(|d| d.to_vec()).collect();
        let n = deps.len();
        schedule(&deps, &vec![Lane::Compute; n], &vec![1; n], layout)
    }

    #[test]
    fn a_chain_stays_on_one_queue_without_waits() {
        let s = run(&[&[], &[0], &[1], &[2]], TWO);
        assert!(s.queue.iter().all(|&q| q == s.queue[0]));
        assert_eq!(s.wait_count(), 0);
        assert_eq!(s.signal_after, vec![false, false, false, true]);
    }

    #[test]
    fn independent_branches_go_to_different_queues() {
        // 0 → 2, 1 → 3, then 4 joins both branches.
        let s = run(&[&[], &[], &[0], &[1], &[2, 3]], TWO);
        assert_ne!(s.queue[0], s.queue[1]);
        assert_eq!(s.queue[2], s.queue[0]);
        assert_eq!(s.queue[3], s.queue[1]);
        // The join waits for the other branch's tail exactly once.
        assert_eq!(s.wait_count(), 1);
        let w = s.waits[4][0];
        let other = if s.queue[4] == s.queue[2] { 3 } else { 2 };
        assert_eq!((w.queue, w.position), (s.queue[other], s.position[other]));
        assert!(s.signal_after[other]);
    }

    #[test]
    fn implied_waits_are_dropped() {
        // 0 on one queue, 1 on the other; 2 depends on 0 and 1 (one wait); 3 on the same
        // queue as 2 depends on 1 again: already known complete.
        let s = run(&[&[], &[], &[0, 1], &[1, 2]], TWO);
        assert_eq!(s.wait_count(), 1);
        assert!(s.waits[3].is_empty());
    }

    #[test]
    fn copies_go_to_the_copy_queue() {
        let deps: Vec<Vec<usize>> = vec![vec![], vec![0], vec![1]];
        let lanes = [Lane::Compute, Lane::Copy, Lane::Compute];
        let s = schedule(&deps, &lanes, &[1, 1, 1], QueueLayout { compute: 2, copy: true });
        assert_eq!(s.queue[1], 2);
        assert_eq!(s.waits[1], vec![Wait { queue: s.queue[0], position: 1 }]);
        assert_eq!(s.waits[2], vec![Wait { queue: 2, position: 1 }]);
        // Without a copy queue a copy runs on a compute queue.
        let s = schedule(&deps, &lanes, &[1, 1, 1], TWO);
        assert!(s.queue[1] < 2);
        assert_eq!(s.wait_count(), 0);
    }

    #[test]
    fn every_dependency_is_ordered() {
        // A dense random-ish DAG: each cross-queue dependency is covered by a wait on its
        // queue at or after its position (directly or through clocks), checked by replaying
        // the vector clocks independently.
        let n = 40;
        let deps: Vec<Vec<usize>> = (0..n).map(|i| (0..i).filter(|j| (i * 7 + j * 13) % 5 == 0).collect()).collect();
        let costs: Vec<u64> = (0..n as u64).map(|i| 1 + i % 3).collect();
        let s = schedule(&deps, &vec![Lane::Compute; n], &costs, QueueLayout { compute: 3, copy: false });
        let nq = 3;
        let mut known = vec![vec![0u64; nq]; nq];
        let mut clock = vec![vec![0u64; nq]; n];
        for q in 0..nq {
            assert!(s.order[q].windows(2).all(|w| w[0] < w[1]));
        }
        for node in 0..n {
            let q = s.queue[node];
            for w in &s.waits[node] {
                let src = s.order[w.queue][w.position as usize - 1];
                assert!(s.signal_after[src]);
                let c = clock[src].clone();
                for (k, c) in known[q].iter_mut().zip(c) {
                    *k = (*k).max(c);
                }
            }
            for &d in &deps[node] {
                assert!(known[q][s.queue[d]] >= s.position[d] || s.queue[d] == q, "node {node} dep {d}");
            }
            known[q][q] = s.position[node];
            clock[node] = known[q].clone();
        }
    }
}
