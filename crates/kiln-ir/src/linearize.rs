//! Turns a kernel DAG into the block-structured order renderers print.
//!
//! Each node lives in the innermost scope whose opener it (transitively) uses. A scope is a
//! loop (RANGE, closed by END) or a guarded block (IF, closed by ENDIF). Scopes nest by
//! co-occurrence: if one node uses two loops, the one with the smaller axis id is outer; IF
//! blocks nest inside every loop they co-occur with (an IF block holds straight-line code,
//! so a RANGE that depends on an IF is an error). A DEFINE_ACC lives just outside its
//! outermost reduce range. END(r, ...) closes `r`, ENDIF(f, ...) closes `f`.
//!
//! Output contract: a list where RANGE (IF) opens a scope, the first END (ENDIF) naming it
//! closes it, and every closer follows that scope's body directly. Constants, parameters,
//! variables, SPECIALs and DEFINE_LOCALs come first (they are in no scope). Within a block,
//! nodes keep the order of `toposort()` as far as dependencies allow, so the output is
//! deterministic. Every operand is visible where it is used (its scope encloses the user),
//! and a BARRIER is in no IF block and in no loop whose trip count may differ between the
//! work items of a group; anything else is an [`IrError::Structure`].

use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::IrError;
use crate::uop::{Op, UOp};

type Chain = Vec<usize>; // scope ranks, outermost first

/// The most scopes (RANGEs and IFs) a kernel may have. Laying out loops costs time that
/// grows with the cube of their number when they nest, and C compilers refuse deeper
/// nesting than this (clang's default bracket depth is 256): more are a typed error up
/// front, never a stall or a compiler error.
pub const MAX_LOOPS: usize = 256;

/// The longest chain of dependent nodes a kernel may have when it is compiled. Backend
/// compilers recurse along such chains: a 10,000-deep chain overflows the stack of clang
/// (its own process on the CPU, a `CompileError`) and of PoCL's in-process clang (which kills
/// the process), and clang needs about 11 s for a 4,096-deep one. Deeper kernels are refused
/// before any backend sees them, the same on every backend ([`check_chain_depth`]).
pub const MAX_CHAIN_DEPTH: usize = 4096;

/// The number of nodes on the longest dependency chain below `sink` (a leaf counts 1), in
/// time linear in the graph and without recursion. A PARAM's size expression is left out:
/// kiln evaluates it on the host (without recursion), no backend compiles it.
pub fn chain_depth(sink: &Arc<UOp>) -> usize {
    let mut depth: HashMap<*const UOp, usize> = HashMap::default();
    for node in sink.toposort() {
        let srcs = if node.op() == Op::Param { &[][..] } else { node.src() };
        let d = 1 + srcs.iter().map(|s| depth.get(&Arc::as_ptr(s)).copied().unwrap_or(0)).max().unwrap_or(0);
        depth.insert(Arc::as_ptr(&node), d);
    }
    depth.get(&Arc::as_ptr(sink)).copied().unwrap_or(0)
}

/// Refuses a kernel whose [`chain_depth`] exceeds [`MAX_CHAIN_DEPTH`].
///
/// # Errors
/// [`IrError::Structure`] naming the depth and the limit.
pub fn check_chain_depth(sink: &Arc<UOp>) -> Result<(), IrError> {
    let depth = chain_depth(sink);
    if depth > MAX_CHAIN_DEPTH {
        return Err(IrError::Structure(format!(
            "the kernel's longest chain of dependent operations is {depth} nodes; kiln compiles kernels up to \
             {MAX_CHAIN_DEPTH} deep (backend compilers recurse along such chains): split the kernel or sum in a loop"
        )));
    }
    Ok(())
}

fn opens_scope(op: Op) -> bool {
    matches!(op, Op::Range | Op::If)
}

fn closes_scope(op: Op) -> bool {
    matches!(op, Op::End | Op::EndIf)
}

/// Linearizes the kernel rooted at `sink` (see the module docs for the order's contract).
///
/// # Errors
/// [`IrError::Structure`] when the loops cannot be laid out: more than [`MAX_LOOPS`] RANGEs and IFs,
/// or a value computed inside a loop that is used inside that same loop through its END.
pub fn linearize(sink: &Arc<UOp>) -> Result<Vec<Arc<UOp>>, IrError> {
    let topo = sink.toposort();
    let index: HashMap<*const UOp, usize> = topo.iter().enumerate().map(|(i, n)| (Arc::as_ptr(n), i)).collect();
    let at = |n: &Arc<UOp>| index[&Arc::as_ptr(n)];

    // Scopes ordered by (IF after every RANGE, axis, topo position): that order is the
    // nesting order.
    let mut ranges: Vec<usize> = (0..topo.len()).filter(|&i| opens_scope(topo[i].op())).collect();
    if ranges.len() > MAX_LOOPS {
        return Err(IrError::Structure(format!(
            "the kernel has {} loops and IF blocks; at most {MAX_LOOPS} are supported: fuse or unroll loops",
            ranges.len()
        )));
    }
    ranges.sort_by_key(|&i| (topo[i].op() == Op::If, topo[i].arg_int().unwrap_or(0), i));
    let rank: HashMap<usize, usize> = ranges.iter().enumerate().map(|(r, &i)| (i, r)).collect();
    let is_if = |r: usize| topo[ranges[r]].op() == Op::If;
    let structural = |msg: String| IrError::Structure(msg);

    // Pass 1: the set of scopes each node uses (by rank), and the set of scopes whose closer
    // it comes after.
    let mut raw: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); topo.len()];
    let mut closed: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); topo.len()];
    for (i, node) in topo.iter().enumerate() {
        let mut after: BTreeSet<usize> = node.src().iter().flat_map(|src| closed[at(src)].iter().copied()).collect();
        if closes_scope(node.op()) {
            after.insert(rank[&at(&node.src()[0])]);
        }
        let mut s = BTreeSet::new();
        match node.op() {
            // Readers of an accumulator run inside its reduce loops, so it carries them;
            // the accumulator itself is placed outside them in pass 2.
            Op::DefineAcc => {
                s.extend(raw[at(&node.src()[0])].iter().copied());
                s.extend(node.src()[1..].iter().map(|r| rank[&at(r)]));
            }
            op if closes_scope(op) => {
                let r = rank[&at(&node.src()[0])];
                for src in node.src() {
                    s.extend(raw[at(src)].iter().copied());
                }
                s.remove(&r);
                if let Some(inner) = s.iter().find(|&&x| x > r) {
                    return Err(structural(format!(
                        "{op} of %{} leaves the inner {} %{} open: close inner scopes first",
                        ranges[r],
                        topo[ranges[*inner]].op(),
                        ranges[*inner]
                    )));
                }
            }
            op => {
                for src in node.src() {
                    s.extend(raw[at(src)].iter().copied());
                }
                if op == Op::Range
                    && let Some(&f) = s.iter().find(|&&x| is_if(x))
                {
                    return Err(structural(format!(
                        "loop %{i} depends on IF %{}: an IF block holds straight-line code, so open the loop \
                         outside the IF and guard its body instead",
                        ranges[f]
                    )));
                }
                if opens_scope(op) {
                    s.insert(rank[&i]);
                }
            }
        }
        // Equal nodes are one node: two loops written with the same RANGE (axis and extent)
        // are one loop, so a second "loop" that reads what the first one's END finished
        // would run inside the first.
        if let Some(&r) = s.intersection(&after).next() {
            return Err(structural(if is_if(r) {
                format!("%{i} uses a value of IF block %{} after its ENDIF: use it inside the block", ranges[r])
            } else {
                format!(
                    "%{i} uses the index of range %{} after that loop's END: two loops written with the same \
                     axis and extent are the same RANGE node; give each loop its own axis",
                    ranges[r]
                )
            }));
        }
        raw[i] = s;
        closed[i] = after;
    }

    // Nesting: ranges used together are nested, the smaller rank outside.
    let mut outer: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); ranges.len()];
    for s in &raw {
        for &a in s {
            for &b in s.range(a + 1..) {
                outer[b].insert(a);
            }
        }
    }
    // Transitive closure, innermost last: outer ranks are smaller, so one pass in rank order works.
    for r in 0..ranges.len() {
        let extra: Vec<usize> = outer[r].iter().flat_map(|&o| outer[o].iter().copied()).collect();
        outer[r].extend(extra);
    }
    let close = |s: &BTreeSet<usize>| -> BTreeSet<usize> {
        let mut c = s.clone();
        for &r in s {
            c.extend(outer[r].iter().copied());
        }
        c
    };

    // Pass 2: the full chain of open loops of every node.
    let mut chain: Vec<Chain> = Vec::with_capacity(topo.len());
    for (i, node) in topo.iter().enumerate() {
        let mut c = close(&raw[i]);
        match node.op() {
            Op::DefineAcc => {
                for red in &node.src()[1..] {
                    let r = rank[&at(red)];
                    c.extend(outer[r].iter().copied());
                }
                for red in &node.src()[1..] {
                    c.remove(&rank[&at(red)]);
                }
            }
            op if closes_scope(op) => {
                let r = rank[&at(&node.src()[0])];
                c.extend(outer[r].iter().copied());
                c.remove(&r);
            }
            _ => {}
        }
        chain.push(c.into_iter().collect());
    }
    if !chain[topo.len() - 1].is_empty() {
        let open = ranges[chain[topo.len() - 1][0]];
        let closer = if topo[open].op() == Op::If { "an ENDIF" } else { "an END" };
        return Err(structural(format!("{} %{open} is never closed by {closer}", topo[open].op())));
    }
    check_scopes(&topo, &at, &ranges, &rank, &chain)?;

    // Group nodes into blocks keyed by chain; a RANGE heads the block of its own chain, an END
    // belongs to the block of the range it closes (emitted right after that loop's body).
    let mut ends_of: HashMap<usize, Vec<usize>> = HashMap::default();
    let mut members: HashMap<Chain, Vec<usize>> = HashMap::default();
    for (i, node) in topo.iter().enumerate() {
        match node.op() {
            Op::Range | Op::If => {}
            Op::End | Op::EndIf => ends_of.entry(rank[&at(&node.src()[0])]).or_default().push(i),
            _ => members.entry(chain[i].clone()).or_default().push(i),
        }
    }
    // Every node's item within the block `parent`: itself if its chain is `parent`, or the
    // child loop of `parent` that contains it. None if it lives outside `parent`.
    let item_in = |node: usize, parent: &[usize]| -> Option<Item> {
        let c: &[usize] = match topo[node].op() {
            Op::End | Op::EndIf => {
                // A closer sits in the scope it closes, for ordering purposes.
                let r = rank[&at(&topo[node].src()[0])];
                return item_for_chain(&chain_of_range(&chain, &ranges, r), parent);
            }
            _ => &chain[node],
        };
        if opens_scope(topo[node].op()) {
            return item_for_chain(c, parent);
        }
        if c == parent { Some(Item::Node(node)) } else { item_for_chain(c, parent) }
    };

    let mut out = Vec::with_capacity(topo.len());
    emit_block(&[], &topo, &at, &members, &ranges, &chain, &ends_of, &item_in, &mut out)?;
    Ok(out)
}

/// Refuses what would not render as valid block-structured code: an operand used outside
/// the scope it lives in, and a BARRIER that some work items of a group could skip (inside
/// an IF block, or in a loop whose extent depends on a work item's own index or on loaded
/// data).
fn check_scopes(
    topo: &[Arc<UOp>],
    at: &dyn Fn(&Arc<UOp>) -> usize,
    ranges: &[usize],
    rank: &HashMap<usize, usize>,
    chain: &[Chain],
) -> Result<(), IrError> {
    let mut varying = vec![false; topo.len()];
    for (i, node) in topo.iter().enumerate() {
        varying[i] = match node.op() {
            Op::Special => node.arg_name().is_some_and(|n| n.starts_with("lidx") || n.starts_with("idx")),
            Op::Load => true,
            _ => node.src().iter().any(|s| varying[at(s)]),
        };
        // A closer's operands live inside the scope it closes.
        let inside = if closes_scope(node.op()) { &chain[ranges[rank[&at(&node.src()[0])]]] } else { &chain[i] };
        let srcs = if node.op() == Op::DefineAcc { &node.src()[..1] } else { node.src() };
        for src in srcs {
            let have = &chain[at(src)];
            if !inside.starts_with(have) {
                let scope = ranges[have.iter().find(|r| !inside.contains(r)).copied().unwrap_or(have[have.len() - 1])];
                return Err(IrError::Structure(format!(
                    "%{i} uses %{}, which lives inside {} %{scope} that does not enclose %{i}: compute the value \
                     outside that scope, or use it inside",
                    at(src),
                    topo[scope].op()
                )));
            }
        }
        if node.op() != Op::Barrier {
            continue;
        }
        for &r in &chain[i] {
            let scope = &topo[ranges[r]];
            if scope.op() == Op::If {
                return Err(IrError::Structure(format!(
                    "BARRIER %{i} is inside IF block %{}: every work item of a group must reach a barrier, so \
                     put it after the ENDIF",
                    ranges[r]
                )));
            }
            if varying[at(&scope.src()[0])] {
                return Err(IrError::Structure(format!(
                    "BARRIER %{i} is inside loop %{} whose extent may differ between the work items of a group \
                     (it depends on a local index or on loaded data): every work item must reach a barrier equally often",
                    ranges[r]
                )));
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Item {
    Node(usize),
    /// The loop of this range rank (header, body, ENDs).
    Loop(usize),
}

fn item_for_chain(c: &[usize], parent: &[usize]) -> Option<Item> {
    if c.len() > parent.len() && c.starts_with(parent) { Some(Item::Loop(c[parent.len()])) } else { None }
}

fn chain_of_range(chain: &[Chain], ranges: &[usize], r: usize) -> Chain {
    chain[ranges[r]].clone()
}

#[allow(clippy::too_many_arguments)]
fn emit_block(
    block: &[usize],
    topo: &[Arc<UOp>],
    at: &dyn Fn(&Arc<UOp>) -> usize,
    members: &HashMap<Chain, Vec<usize>>,
    ranges: &[usize],
    chain: &[Chain],
    ends_of: &HashMap<usize, Vec<usize>>,
    item_in: &dyn Fn(usize, &[usize]) -> Option<Item>,
    out: &mut Vec<Arc<UOp>>,
) -> Result<(), IrError> {
    // Items of this block: its own nodes and its direct child loops.
    let mut items: Vec<Item> =
        members.get(block).map(|m| m.iter().map(|&i| Item::Node(i)).collect()).unwrap_or_default();
    for (r, &ri) in ranges.iter().enumerate() {
        let c = &chain[ri];
        if c.len() == block.len() + 1 && c.starts_with(block) && c[block.len()] == r {
            items.push(Item::Loop(r));
        }
    }
    // Nodes inside each loop item (transitively), to collect that item's external deps.
    let nodes_of = |item: Item| -> Vec<usize> {
        match item {
            Item::Node(i) => vec![i],
            Item::Loop(r) => {
                let mut v = vec![ranges[r]];
                for (c, m) in members {
                    if c.len() > block.len() && c.starts_with(block) && c[block.len()] == r {
                        v.extend(m.iter().copied());
                    }
                }
                for (&er, e) in ends_of {
                    let c = &chain[ranges[er]];
                    if c.len() > block.len() && c.starts_with(block) && c[block.len()] == r {
                        v.extend(e.iter().copied());
                        v.push(ranges[er]);
                    }
                }
                v
            }
        }
    };
    let pos: HashMap<Item, usize> = items.iter().enumerate().map(|(k, it)| (*it, k)).collect();
    let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); items.len()];
    let mut key: Vec<usize> = vec![usize::MAX; items.len()];
    for (k, item) in items.iter().enumerate() {
        for n in nodes_of(*item) {
            key[k] = key[k].min(n);
            // A DEFINE_ACC names its reduce ranges but is defined before them.
            let srcs = if topo[n].op() == Op::DefineAcc { &topo[n].src()[..1] } else { topo[n].src() };
            for s in srcs {
                if let Some(d) = item_in(at(s), block)
                    && let Some(&dk) = pos.get(&d)
                    && dk != k
                {
                    deps[k].insert(dk);
                }
            }
        }
    }
    // Kahn's algorithm, smallest topo position first.
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    let mut missing: Vec<usize> = deps.iter().map(BTreeSet::len).collect();
    for (k, d) in deps.iter().enumerate() {
        for &dk in d {
            users[dk].push(k);
        }
    }
    let mut ready: BTreeSet<(usize, usize)> =
        (0..items.len()).filter(|&k| missing[k] == 0).map(|k| (key[k], k)).collect();
    let mut done = 0;
    while let Some((_, k)) = ready.pop_first() {
        done += 1;
        match items[k] {
            Item::Node(i) => out.push(topo[i].clone()),
            Item::Loop(r) => {
                out.push(topo[ranges[r]].clone());
                let mut inner = block.to_vec();
                inner.push(r);
                emit_block(&inner, topo, at, members, ranges, chain, ends_of, item_in, out)?;
                for &e in ends_of.get(&r).map(Vec::as_slice).unwrap_or(&[]) {
                    out.push(topo[e].clone());
                }
            }
        }
        for &u in &users[k] {
            missing[u] -= 1;
            if missing[u] == 0 {
                ready.insert((key[u], u));
            }
        }
    }
    if done != items.len() {
        return Err(IrError::Structure(
            "a value computed inside a loop is used inside that same loop through its END (cycle)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, KernelBuilder, Scalar, Val};

    fn names(order: &[Arc<UOp>]) -> Vec<&'static str> {
        order.iter().map(|n| n.op().name()).collect()
    }

    #[test]
    fn matmul_nests_loops_and_hoists_the_accumulator() {
        // C[i,j] = sum_k A[i,k] * B[k,j], with i, j, k all loops.
        let mut k = KernelBuilder::new();
        let (a, b, c) = (k.param(0, Scalar::F32, 16), k.param(1, Scalar::F32, 16), k.param(2, Scalar::F32, 16));
        let i = k.range(4);
        let j = k.range(4);
        let r = k.range(4);
        let acc = k.acc(&Val::constant(DType::F32, 0.0), &[&r]);
        let prod = a.at(&(&i * 4 + &r)).load() * b.at(&(&r * 4 + &j)).load();
        let total = acc.update(&(acc.get() + prod));
        let st = k.store(&c.at(&(&i * 4 + &j)), &total);
        let ej = k.end(&j, &[&st]);
        k.end(&i, &[&ej]);
        let sink = k.finish().unwrap();
        let order = linearize(&sink).unwrap();
        let ops = names(&order);
        let pos = |n: &Arc<UOp>| order.iter().position(|x| Arc::ptr_eq(x, n)).unwrap();
        // i opens before j before k; the accumulator sits between j and k.
        assert!(pos(&i.0) < pos(&j.0) && pos(&j.0) < pos(&r.0));
        let acc_pos = order.iter().position(|n| n.op() == Op::DefineAcc).unwrap();
        assert!(pos(&j.0) < acc_pos && acc_pos < pos(&r.0));
        // The store is after k's END and before j's END.
        let store_pos = order.iter().position(|n| n.op() == Op::Store).unwrap();
        let ends: Vec<usize> = order.iter().enumerate().filter(|(_, n)| n.op() == Op::End).map(|(p, _)| p).collect();
        assert_eq!(ends.len(), 3);
        assert!(ends[0] < store_pos && store_pos < ends[1]);
        assert_eq!(ops.last(), Some(&"SINK"));
    }

    #[test]
    fn accumulator_update_with_loop_invariant_operand_stays_in_the_loop() {
        // acc = acc * 2 over r: nothing but the accumulator ties the update to the loop.
        let mut k = KernelBuilder::new();
        let out = k.param(0, Scalar::F32, 1);
        let r = k.range(5);
        let acc = k.acc(&Val::f32(1.0), &[&r]);
        let total = acc.update(&(acc.get() * 2.0));
        k.store(&out.at(&Val::int(0)), &total);
        let order = linearize(&k.finish().unwrap()).unwrap();
        let pos = |op: Op| order.iter().position(|n| n.op() == op).unwrap();
        assert!(pos(Op::DefineAcc) < pos(Op::Range));
        assert!(pos(Op::Range) < pos(Op::Mul) && pos(Op::Mul) < pos(Op::Assign) && pos(Op::Assign) < pos(Op::End));
    }

    /// `a[r] = 1` in one loop, then `b[r] = a[r]` in a second loop after it, both written
    /// with axis 0 and the same extent: hash-consing makes them one RANGE.
    #[test]
    fn two_loops_with_the_same_axis_are_a_structure_error_at_their_lines() {
        let text = "%n = CONST i32 4\n%a = PARAM ptr<f32> 0 (%n)\n%b = PARAM ptr<f32> 1 (%n)\n\
                    %r = RANGE i32 0 (%n)\n%pa = INDEX ptr<f32> (%a, %r)\n%one = CONST f32 1.0\n\
                    %st = STORE (%pa, %one)\n%e = END void (%r, %st)\n%a2 = AFTER ptr<f32> (%a, %e)\n\
                    %r2 = RANGE i32 0 (%n)\n%pa2 = INDEX ptr<f32> (%a2, %r2)\n%x = LOAD f32 (%pa2)\n\
                    %pb = INDEX ptr<f32> (%b, %r2)\n%st2 = STORE (%pb, %x)\n%e2 = END void (%r2, %st2)\nSINK (%e2)";
        match crate::parse_kernel(text) {
            Err(IrError::Structure(m)) => {
                assert!(m.contains("%pa2 (line 11) uses the index of range %r (line 4)"), "{m}");
                assert!(m.contains("give each loop its own axis"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // With distinct axes the two loops run one after the other.
        let fixed = text.replace("%r2 = RANGE i32 0", "%r2 = RANGE i32 1");
        let order = linearize(&crate::parse_kernel(&fixed).unwrap()).unwrap();
        let ops = names(&order);
        let (first_end, second_range) =
            (ops.iter().position(|o| *o == "END").unwrap(), ops.iter().rposition(|o| *o == "RANGE").unwrap());
        assert!(first_end < second_range, "{ops:?}");
    }

    #[test]
    fn unclosed_range_is_an_error() {
        let mut k = KernelBuilder::new();
        let a = k.param(0, Scalar::F32, 4);
        let i = k.range(4);
        k.store(&a.at(&i), &Val::f32(1.0));
        assert!(matches!(k.finish(), Err(IrError::Structure(_))));
    }
}
