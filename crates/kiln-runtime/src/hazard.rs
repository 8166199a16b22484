//! Hazard analysis over byte ranges.
//!
//! Every node of a plan reads and writes byte ranges of allocations (a [`kiln_device::Buffer`]
//! view names its allocation and range through `Buffer::byte_range`). Two nodes conflict when
//! they touch overlapping bytes of one allocation and at least one of them writes.
//!
//! The tracker keeps, per allocation, a sorted list of disjoint segments; each segment
//! remembers its last writer and the readers since that write. A new access only looks at
//! the segments it overlaps, so recording `n` nodes of `k` accesses costs O(n·k·s) with `s`
//! the segments an access overlaps (small for real plans: a few views per buffer).
//!
//! The edges returned are enough to order every conflicting pair, not every conflicting
//! pair itself: a write after reads depends on those readers, which themselves depend on the
//! earlier writer, so the write-after-write edge to that writer is implied and left out.

use std::collections::HashMap;
use std::ops::Range;

/// One access of a node to a byte range of an allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Allocation identity, as returned by `Buffer::byte_range`.
    pub alloc: usize,
    /// The bytes touched, relative to the allocation's start.
    pub range: Range<usize>,
    /// Whether the node writes them (a node that reads and writes records two accesses).
    pub write: bool,
}

/// Why a node must run after an earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hazard {
    /// The node reads bytes the earlier node writes.
    ReadAfterWrite,
    /// The node writes bytes the earlier node reads.
    WriteAfterRead,
    /// The node writes bytes the earlier node writes.
    WriteAfterWrite,
}

/// A dependency edge: this node must run after `node` (an earlier node) because of `hazard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dependency {
    /// The earlier node, by recording index.
    pub node: usize,
    /// Why the order matters (the first conflict found, when there are several).
    pub hazard: Hazard,
}

#[derive(Clone, Debug)]
struct Segment {
    start: usize,
    end: usize,
    writer: Option<usize>,
    /// Nodes that read this segment since `writer` wrote it (ascending, no duplicates).
    readers: Vec<usize>,
}

/// Accumulates accesses in recording order and derives each new node's dependencies.
#[derive(Default, Debug)]
pub struct HazardTracker {
    allocs: HashMap<usize, Vec<Segment>>,
}

impl HazardTracker {
    /// A tracker that has seen no accesses.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `node`'s accesses and returns its dependencies on earlier nodes, sorted by
    /// node index with one edge per earlier node. Accesses of one node never conflict with
    /// each other (a kernel may read and write the same bytes). `node` must be larger than
    /// every node recorded before.
    pub fn record(&mut self, node: usize, accesses: &[Access]) -> Vec<Dependency> {
        let mut deps = Vec::new();
        for a in accesses.iter().filter(|a| !a.range.is_empty()) {
            let Some(segs) = self.allocs.get(&a.alloc) else { continue };
            let first = segs.partition_point(|s| s.end <= a.range.start);
            for s in segs[first..].iter().take_while(|s| s.start < a.range.end) {
                if a.write {
                    if s.readers.is_empty() {
                        deps.extend(s.writer.map(|w| Dependency { node: w, hazard: Hazard::WriteAfterWrite }));
                    }
                    deps.extend(s.readers.iter().map(|&r| Dependency { node: r, hazard: Hazard::WriteAfterRead }));
                } else {
                    deps.extend(s.writer.map(|w| Dependency { node: w, hazard: Hazard::ReadAfterWrite }));
                }
            }
        }
        // Reads first, then writes: a node that reads and writes the same bytes ends up as
        // their writer with no readers, which orders every later access after it.
        for write in [false, true] {
            for a in accesses.iter().filter(|a| a.write == write && !a.range.is_empty()) {
                let segs = self.allocs.entry(a.alloc).or_default();
                let run = cover(segs, a.range.clone());
                for s in &mut segs[run] {
                    if write {
                        s.writer = Some(node);
                        s.readers.clear();
                    } else if s.readers.last() != Some(&node) {
                        s.readers.push(node);
                    }
                }
            }
        }
        deps.sort_by_key(|d| (d.node, d.hazard as u8));
        deps.dedup_by_key(|d| d.node);
        deps
    }
}

/// Splits and fills `segs` so that `range` is covered exactly by a run of segments; returns
/// the index range of that run.
fn cover(segs: &mut Vec<Segment>, range: Range<usize>) -> Range<usize> {
    split(segs, range.start);
    split(segs, range.end);
    let first = segs.partition_point(|s| s.end <= range.start);
    let (mut i, mut pos) = (first, range.start);
    while pos < range.end {
        if i < segs.len() && segs[i].start == pos {
            pos = segs[i].end;
        } else {
            let next = segs.get(i).map_or(range.end, |s| s.start.min(range.end));
            segs.insert(i, Segment { start: pos, end: next, writer: None, readers: Vec::new() });
            pos = next;
        }
        i += 1;
    }
    first..i
}

/// Splits the segment that strictly contains `at` (if any) into two at `at`.
fn split(segs: &mut Vec<Segment>, at: usize) {
    let i = segs.partition_point(|s| s.end <= at);
    if i < segs.len() && segs[i].start < at {
        let mut tail = segs[i].clone();
        tail.start = at;
        segs[i].end = at;
        segs.insert(i + 1, tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(alloc: usize, r: Range<usize>) -> Access {
        Access { alloc, range: r, write: false }
    }
    fn write(alloc: usize, r: Range<usize>) -> Access {
        Access { alloc, range: r, write: true }
    }
    fn nodes(deps: &[Dependency]) -> Vec<usize> {
        deps.iter().map(|d| d.node).collect()
    }

    #[test]
    fn read_after_write() {
        let mut t = HazardTracker::new();
        assert!(t.record(0, &[write(1, 0..64)]).is_empty());
        let d = t.record(1, &[read(1, 32..40)]);
        assert_eq!(d, vec![Dependency { node: 0, hazard: Hazard::ReadAfterWrite }]);
    }

    #[test]
    fn write_after_read() {
        let mut t = HazardTracker::new();
        t.record(0, &[read(1, 0..64), write(2, 0..64)]);
        let d = t.record(1, &[write(1, 60..70)]);
        assert_eq!(d, vec![Dependency { node: 0, hazard: Hazard::WriteAfterRead }]);
    }

    #[test]
    fn write_after_write() {
        let mut t = HazardTracker::new();
        t.record(0, &[write(1, 0..64)]);
        let d = t.record(1, &[write(1, 0..8)]);
        assert_eq!(d, vec![Dependency { node: 0, hazard: Hazard::WriteAfterWrite }]);
    }

    #[test]
    fn disjoint_views_and_allocations_do_not_conflict() {
        let mut t = HazardTracker::new();
        t.record(0, &[write(1, 0..64)]);
        assert!(t.record(1, &[write(1, 64..128)]).is_empty(), "adjacent views share no byte");
        assert!(t.record(2, &[write(2, 0..64)]).is_empty(), "another allocation");
        assert!(t.record(3, &[read(1, 128..256)]).is_empty());
        assert!(t.record(4, &[read(1, 200..300), read(1, 0..0)]).is_empty(), "reads never conflict");
        assert!(t.record(5, &[write(1, 10..10)]).is_empty(), "empty ranges touch nothing");
    }

    #[test]
    fn reads_and_writes_of_one_node_do_not_conflict_with_themselves() {
        let mut t = HazardTracker::new();
        assert!(t.record(0, &[read(1, 0..64), write(1, 0..64)]).is_empty());
        // The in-place node is the writer now: a later read depends on it alone.
        assert_eq!(nodes(&t.record(1, &[read(1, 0..64)])), vec![0]);
    }

    #[test]
    fn a_write_depends_on_every_reader_since_the_last_write() {
        let mut t = HazardTracker::new();
        t.record(0, &[write(1, 0..100)]);
        t.record(1, &[read(1, 0..10)]);
        t.record(2, &[read(1, 50..60)]);
        t.record(3, &[read(1, 90..100)]);
        // Overlaps the readers 1 and 2; the writer 0 is ordered through them, and through
        // the still-unread part 10..50 directly.
        assert_eq!(nodes(&t.record(4, &[write(1, 5..55)])), vec![0, 1, 2]);
        // 55..60 was read by 2 and 90..100 by 3; 60..90 was never read after 0 wrote it.
        assert_eq!(nodes(&t.record(5, &[write(1, 55..100)])), vec![0, 2, 3]);
        assert_eq!(nodes(&t.record(6, &[read(1, 0..100)])), vec![0, 4, 5]);
    }

    #[test]
    fn partial_overlaps_split_segments() {
        let mut t = HazardTracker::new();
        t.record(0, &[write(7, 0..10)]);
        t.record(1, &[write(7, 5..15)]);
        assert_eq!(nodes(&t.record(2, &[read(7, 0..5)])), vec![0]);
        assert_eq!(nodes(&t.record(3, &[read(7, 9..11)])), vec![1]);
        assert_eq!(nodes(&t.record(4, &[read(7, 12..20)])), vec![1]);
        assert!(t.record(5, &[read(7, 15..20)]).is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Every conflicting pair of nodes (shared bytes, at least one write) is ordered:
        /// the later node reaches the earlier one through dependency edges.
        #[test]
        fn every_conflict_is_ordered(ops in proptest::collection::vec((0usize..3, 0usize..48, 1usize..16, proptest::bool::ANY), 1..40)) {
            let mut t = HazardTracker::new();
            let mut deps: Vec<Vec<usize>> = Vec::new();
            for (i, &(alloc, start, len, w)) in ops.iter().enumerate() {
                let d = t.record(i, &[Access { alloc, range: start..start + len, write: w }]);
                proptest::prop_assert!(d.iter().all(|d| d.node < i));
                deps.push(d.iter().map(|d| d.node).collect());
            }
            for j in 0..ops.len() {
                // Nodes j reaches (transitively).
                let mut reach = vec![false; j + 1];
                let mut stack = vec![j];
                while let Some(n) = stack.pop() {
                    for &d in &deps[n] {
                        if !reach[d] { reach[d] = true; stack.push(d); }
                    }
                }
                let (aj, sj, lj, wj) = ops[j];
                for i in 0..j {
                    let (ai, si, li, wi) = ops[i];
                    let overlap = ai == aj && si < sj + lj && sj < si + li;
                    if overlap && (wi || wj) {
                        proptest::prop_assert!(reach[i], "node {} does not reach conflicting node {}", j, i);
                    }
                }
            }
        }
    }
}
