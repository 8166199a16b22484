//! A register tile's lanes from a loop: the unroll-and-jam that lets a compiler hand kiln a
//! tile's rows only.
//!
//! A register-blocked contraction keeps `rows × lanes` accumulators. Unrolled by the compiler
//! over both axes (tinygrad's UPCAST), every lane is a scalar chain of ops that the compiler's
//! own passes then rewrite one by one: a ResNet-50 convolution becomes 8,000 nodes, and
//! tinygrad spends seconds on each. Unrolled over the rows only, the lanes stay a loop of
//! `lanes` iterations around the reduction: 32 times fewer nodes upstream. [`unroll_lane_loops`]
//! then unrolls that loop here, and jams its copies into one body: one reduction loop carrying
//! every lane's accumulators, which is exactly the scalar form the two-axis unroll would have
//! given. [`crate::vectorize_outer_products`] takes it from there.
//!
//! Which loop: an output loop (closed by a void END) of a constant extent that two vectors of
//! the tile's dtype hold, around a MULACC whose one operand is read at `lane` (stride 1 in the
//! loop), directly or under lane-wise ops (a ReLU: `MAX(x, 0)`), and whose other operand does
//! not depend on the loop. The copies read and write the same memory as the loop's iterations
//! did, with each lane's own ops in their order, so the result is the same bits. Jamming
//! reorders the iterations' memory accesses, so a kernel that reads a buffer it also writes, or
//! orders accesses explicitly (AFTER, barriers, local memory, IF blocks), is left as it is.

use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::lanes::split_offset;
use crate::{Arg, DType, Op, Scalar, UOp};

/// The most nodes the copies of one loop may add (a tile of 8 rows × 32 lanes adds about
/// 6,000); a bigger loop body stays a loop.
const MAX_COPIED_NODES: usize = 1 << 16;

/// Unrolls and jams every lane loop under `root` (module docs) whose lanes fit in two vectors
/// of `vector_bytes`; None where there is none, or the kernel's memory accesses rule it out.
pub(crate) fn unroll_lane_loops(root: &Arc<UOp>, vector_bytes: usize) -> Option<Arc<UOp>> {
    let mut current = root.clone();
    let mut changed = false;
    // each pass unrolls one loop, which is then gone
    for _ in 0..8 {
        let topo = current.toposort();
        if !may_reorder(&topo) {
            break;
        }
        let Some(jammed) = candidates(&topo).into_iter().find_map(|r| jam(&current, &topo, &r, vector_bytes)) else {
            break;
        };
        current = jammed;
        changed = true;
    }
    changed.then_some(current)
}

/// Whether the kernel's iterations may run in another order: no explicit ordering and no
/// buffer both read and written.
fn may_reorder(topo: &[Arc<UOp>]) -> bool {
    let mut read: HashSet<*const UOp> = HashSet::default();
    let mut written: HashSet<*const UOp> = HashSet::default();
    for n in topo {
        let pointer = || n.src().first().and_then(|i| i.src().first()).map(Arc::as_ptr);
        match n.op() {
            Op::After | Op::Barrier | Op::DefineLocal | Op::If | Op::EndIf | Op::Wmma => return false,
            Op::Load => read.extend(pointer()),
            Op::Store => written.extend(pointer()),
            _ => {}
        }
    }
    read.is_disjoint(&written)
}

/// The loops closed by a void END, innermost (last closed) first.
fn candidates(topo: &[Arc<UOp>]) -> Vec<Arc<UOp>> {
    let mut out: Vec<Arc<UOp>> = Vec::new();
    for n in topo {
        let closed = n.src().first().filter(|r| n.op() == Op::End && n.dtype() == DType::Void && r.op() == Op::Range);
        if let Some(r) = closed.filter(|r| !out.iter().any(|o| Arc::ptr_eq(o, r))) {
            out.push(r.clone());
        }
    }
    out
}

fn const_int(n: &Arc<UOp>) -> Option<i64> {
    (n.op() == Op::Const && n.dtype().is_int()).then(|| n.arg_int()).flatten()
}

/// Which nodes depend on `range`: through their operands, and an accumulator through the
/// values assigned to it. A void END does not count (its effects are jammed, not copied).
/// None if another loop's extent depends on it.
fn varying(topo: &[Arc<UOp>], range: &Arc<UOp>) -> Option<HashSet<*const UOp>> {
    let mut accs: HashSet<*const UOp> = HashSet::default();
    loop {
        let mut vary: HashSet<*const UOp> = HashSet::default();
        vary.insert(Arc::as_ptr(range));
        for n in topo {
            let key = Arc::as_ptr(n);
            if Arc::ptr_eq(n, range) || (n.op() == Op::End && n.dtype() == DType::Void) {
                continue;
            }
            if accs.contains(&key) || n.src().iter().any(|s| vary.contains(&Arc::as_ptr(s))) {
                if n.op() == Op::Range {
                    return None;
                }
                vary.insert(key);
            }
        }
        let before = accs.len();
        for n in topo {
            let assigned = n.src().first().filter(|_| n.op() == Op::Assign && vary.contains(&Arc::as_ptr(n)));
            if let Some(acc) = assigned.filter(|a| a.op() == Op::DefineAcc) {
                accs.insert(Arc::as_ptr(acc));
            }
        }
        if accs.len() == before {
            return Some(vary);
        }
    }
}

/// The additive terms of an integer address: ADD's operands, and an integer MULACC's addend
/// besides its product (the MULACC itself stands for the product: it varies where its factors
/// do). A loop, not a recursion: an address may be a long chain.
fn terms(addr: &Arc<UOp>) -> Vec<&Arc<UOp>> {
    let (mut out, mut stack) = (Vec::new(), vec![addr]);
    while let Some(n) = stack.pop() {
        match n.op() {
            Op::Add => stack.extend(n.src()),
            Op::MulAcc if n.dtype().is_int() && n.src().len() == 3 => {
                out.push(n);
                stack.push(&n.src()[2]);
            }
            _ => out.push(n),
        }
    }
    out
}

/// Whether `v` is a load whose address is `range` plus terms that do not depend on it, or
/// lane-wise ops ([`crate::epilogue::liftable`]: a ReLU, `MAX(x, 0)` or `WHERE(0 < x, x, 0)`)
/// over one such load and values that do not depend on `range`.
fn reads_at_lane(v: &Arc<UOp>, range: &Arc<UOp>, vary: &HashSet<*const UOp>) -> bool {
    let mut read: Option<&Arc<UOp>> = None;
    let (mut stack, mut ops) = (vec![v], 0);
    while let Some(n) = stack.pop() {
        if !vary.contains(&Arc::as_ptr(n)) {
            continue;
        }
        if n.op() == Op::Load {
            if read.is_some_and(|r| !Arc::ptr_eq(r, n)) {
                return false;
            }
            read = Some(n);
        } else if crate::epilogue::liftable(n.op()) && n.dtype().width() == 1 && ops < 16 {
            ops += 1;
            stack.extend(n.src());
        } else {
            return false;
        }
    }
    read.is_some_and(|r| load_at_lane(r, range, vary))
}

/// Whether `v` is a load whose address is `range` plus terms that do not depend on it.
fn load_at_lane(v: &Arc<UOp>, range: &Arc<UOp>, vary: &HashSet<*const UOp>) -> bool {
    let Some(index) = v.src().first().filter(|_| v.op() == Op::Load) else { return false };
    let Some(addr) = index.src().get(1).filter(|_| index.op() == Op::Index) else { return false };
    let mut lanes = 0;
    for t in terms(addr) {
        if Arc::ptr_eq(t, range) {
            lanes += 1;
        } else if t.op() == Op::MulAcc && t.dtype().is_int() {
            if t.src().iter().take(2).any(|f| vary.contains(&Arc::as_ptr(f))) {
                return false;
            }
        } else if vary.contains(&Arc::as_ptr(t)) {
            return false;
        }
    }
    lanes == 1
}

/// `range`'s loop unrolled and jammed, or None where it is not a lane loop.
fn jam(root: &Arc<UOp>, topo: &[Arc<UOp>], range: &Arc<UOp>, vector_bytes: usize) -> Option<Arc<UOp>> {
    let extent = range.src().first().and_then(const_int)?;
    // a reduction's own loop is no output loop
    let reduces = |n: &Arc<UOp>| matches!(n.op(), Op::DefineAcc | Op::End) && n.dtype() != DType::Void;
    if topo.iter().any(|n| reduces(n) && n.src().iter().any(|s| Arc::ptr_eq(s, range))) {
        return None;
    }
    let vary = varying(topo, range)?;
    let is_lane_tile = |n: &Arc<UOp>| {
        let [x, y] = match n.src() {
            [x, y, _] if n.op() == Op::MulAcc && matches!(n.dtype(), DType::Scalar(s) if s != Scalar::Bool) => [x, y],
            _ => return false,
        };
        let fits = n.dtype().scalar().is_some_and(|s| extent as usize * s.size() <= 2 * vector_bytes);
        let (xv, yv) = (vary.contains(&Arc::as_ptr(x)), vary.contains(&Arc::as_ptr(y)));
        fits && xv != yv && reads_at_lane(if xv { x } else { y }, range, &vary)
    };
    if extent < 2 || !topo.iter().any(is_lane_tile) || vary.len().saturating_mul(extent as usize) > MAX_COPIED_NODES {
        return None;
    }
    let lanes = extent as usize;
    let mut next_acc =
        topo.iter().filter(|n| n.op() == Op::DefineAcc).filter_map(|n| n.arg_int()).max().unwrap_or(-1) + 1;
    // a node that does not vary, rebuilt over jammed loops; a varying one, once per lane; the
    // loop's own END, as the effects that take its place in the enclosing END or SINK
    let mut same: HashMap<*const UOp, Arc<UOp>> = HashMap::default();
    let mut per_lane: HashMap<*const UOp, Vec<Arc<UOp>>> = HashMap::default();
    let mut unrolled: Option<(*const UOp, Vec<Arc<UOp>>)> = None;
    for n in topo {
        let key = Arc::as_ptr(n);
        if vary.contains(&key) {
            let copies = (0..lanes)
                .map(|lane| {
                    if Arc::ptr_eq(n, range) {
                        return Some(UOp::const_int(range.dtype(), lane as i64));
                    }
                    let src: Vec<Arc<UOp>> = n
                        .src()
                        .iter()
                        .map(|s| match per_lane.get(&Arc::as_ptr(s)) {
                            Some(c) => c.get(lane).cloned(),
                            None => same.get(&Arc::as_ptr(s)).cloned(),
                        })
                        .collect::<Option<_>>()?;
                    Some(match n.op() {
                        Op::DefineAcc => {
                            next_acc += 1;
                            UOp::new(Op::DefineAcc, n.dtype(), Arg::Int(next_acc - 1), src)
                        }
                        _ => fold_offsets(n, &src).unwrap_or_else(|| n.with_src(src)),
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            per_lane.insert(key, copies);
            continue;
        }
        // the effects that stand for `e` where it is one: every lane's in turn, the unrolled
        // loop's in its place
        let mut effects: Vec<Arc<UOp>> = Vec::new();
        let mut push = |e: Arc<UOp>| {
            if !effects.iter().any(|s| Arc::ptr_eq(s, &e)) {
                effects.push(e);
            }
        };
        let is_end = n.op() == Op::End && n.dtype() == DType::Void && !n.src().is_empty();
        let first = usize::from(is_end);
        if is_end || n.op() == Op::Sink {
            // effect by effect, each one's lanes together: a tile's rows in turn, so that the
            // vector FMAs of one row come together and its broadcast dies before the next row's
            // (lane by lane, every row's broadcast stayed live across all vectors of lanes, and
            // a 13-row tile spilled)
            for e in &n.src()[first..] {
                let k = Arc::as_ptr(e);
                for lane in 0..lanes {
                    match (per_lane.get(&k), &unrolled) {
                        (Some(c), _) => push(c.get(lane).cloned()?),
                        (None, Some((u, es))) if *u == k => es.iter().for_each(|e| push(e.clone())),
                        (None, _) => push(same.get(&k).cloned()?),
                    }
                }
            }
        }
        let src: Vec<Arc<UOp>> = if is_end && Arc::ptr_eq(&n.src()[0], range) {
            unrolled = Some((key, effects));
            continue;
        } else if is_end {
            [same.get(&Arc::as_ptr(&n.src()[0])).cloned()?].into_iter().chain(effects).collect()
        } else if n.op() == Op::Sink {
            effects
        } else {
            // no operand varies, and the unrolled END sits only in an END or the SINK
            n.src().iter().map(|s| same.get(&Arc::as_ptr(s)).cloned()).collect::<Option<_>>()?
        };
        let unchanged = src.len() == n.src().len() && src.iter().zip(n.src()).all(|(a, b)| Arc::ptr_eq(a, b));
        same.insert(key, if unchanged { n.clone() } else { n.with_src(src) });
    }
    same.get(&Arc::as_ptr(root)).cloned()
}

/// An integer ADD, MUL or MULACC over `src` (a lane's operands, where the lane's constant is
/// an addend) with the constant carried outward: `(b + 3) + c` as `(b + c) + 3`, `(b + 3) * 4`
/// as `b * 4 + 12`, so that every lane's address reads `base + lane` over one shared `base`.
/// None for any other node, or where a constant would overflow. Integers wrap, so the value
/// is the same.
fn fold_offsets(n: &Arc<UOp>, src: &[Arc<UOp>]) -> Option<Arc<UOp>> {
    let dt = n.dtype();
    if !matches!(dt, DType::Scalar(_)) || !dt.is_int() {
        return None;
    }
    let add = |a: Option<Arc<UOp>>, b: Option<Arc<UOp>>| match (a, b) {
        (Some(a), Some(b)) => Some(UOp::new(Op::Add, dt, Arg::None, vec![a, b])),
        (a, b) => a.or(b),
    };
    // (base, constant) of `x * y` where one factor is a constant
    let scaled = |x: &Arc<UOp>, y: &Arc<UOp>| -> Option<(Option<Arc<UOp>>, i64)> {
        let (c, other) = match (const_int(x), const_int(y)) {
            (_, Some(c)) => (c, x),
            (Some(c), None) => (c, y),
            (None, None) => return None,
        };
        let (base, off) = split_offset(other);
        let base = base.map(|b| UOp::new(Op::Mul, dt, Arg::None, vec![b, UOp::const_int(dt, c)]));
        Some((base, off.checked_mul(c)?))
    };
    let (base, off) = match (n.op(), src) {
        (Op::Add, [a, b]) => {
            let ((ba, ca), (bb, cb)) = (split_offset(a), split_offset(b));
            (add(ba, bb), ca.checked_add(cb)?)
        }
        (Op::Mul, [a, b]) => scaled(a, b)?,
        (Op::MulAcc, [a, b, c]) => {
            let (bc, cc) = split_offset(c);
            let (bp, cp) = match scaled(a, b) {
                Some(p) => p,
                None => (Some(UOp::new(Op::Mul, dt, Arg::None, vec![a.clone(), b.clone()])), 0),
            };
            (add(bp, bc), cp.checked_add(cc)?)
        }
        _ => return None,
    };
    Some(match (base, off) {
        (None, c) => UOp::const_int(dt, c),
        (Some(b), 0) => b,
        (Some(b), c) => UOp::new(Op::Add, dt, Arg::None, vec![b, UOp::const_int(dt, c)]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KernelBuilder, Val, validate, vectorize_outer_products};

    /// `rows` accumulators of A[i]·B[j] over k, the lanes j a loop of `lanes` iterations
    /// (`lanes` of a block of `blocks`); with `in_place`, the results go back into B; with
    /// `relu`, B is read through tinygrad's ReLU (`WHERE(0 < b, b, 0)`).
    fn rolled(rows: i64, lanes: i64, blocks: i64, in_place: bool, relu: bool) -> Arc<UOp> {
        let n = lanes * blocks;
        let mut k = KernelBuilder::new();
        let (a, b) = (k.param(0, Scalar::F32, rows * 16), k.param(1, Scalar::F32, 16 * n));
        let c = if in_place { b.clone() } else { k.param(2, Scalar::F32, rows * n) };
        let (block, lane) = (k.range(blocks), k.range(lanes));
        let r = k.range(16);
        let col = &block * lanes + &lane;
        let mut stores = Vec::new();
        for i in 0..rows {
            let acc = k.acc(&Val::f32(0.0), &[&r]);
            let x = a.at(&(&r + i * 16)).load();
            let read = b.at(&(&r * n + &col)).load();
            let lane = if relu { Val::f32(0.0).lt(&read).select(&read, 0.0f32) } else { read };
            let sum = acc.update(&x.mul_acc(&lane, &acc.get()));
            stores.push(k.store(&c.at(&(&col + i * n)), &sum));
        }
        let refs: Vec<&Val> = stores.iter().collect();
        let inner = k.end(&lane, &refs);
        k.end(&block, &[&inner]);
        k.finish().unwrap()
    }

    fn count(root: &Arc<UOp>, op: Op) -> usize {
        root.toposort().iter().filter(|n| n.op() == op).count()
    }

    #[test]
    fn a_lane_loop_becomes_the_scalar_tile_then_vector_accumulators() {
        // lanes read plainly, or through a ReLU
        for relu in [false, true] {
            let k = rolled(4, 32, 3, false, relu);
            let jammed = unroll_lane_loops(&k, 64).unwrap();
            validate(&jammed).unwrap();
            crate::linearize(&jammed).unwrap();
            // one reduction loop with every lane's accumulators, the lane loop gone
            assert_eq!(count(&jammed, Op::DefineAcc), 4 * 32);
            assert_eq!(count(&jammed, Op::Range), 2);
            let tiled = vectorize_outer_products(&k, 64);
            validate(&tiled).unwrap();
            let accs: Vec<DType> =
                tiled.toposort().iter().filter(|n| n.op() == Op::DefineAcc).map(|n| n.dtype()).collect();
            assert_eq!(accs, vec![DType::vec(Scalar::F32, 16); 8]);
            assert_eq!(count(&tiled, Op::Where), if relu { 2 } else { 0 });
        }
    }

    /// The unrolled lanes' effects come row by row, so a row's vector FMAs are linearized
    /// together and its broadcast dies before the next row's (lane by lane, all 13 broadcasts of
    /// a 13-row tile stayed live across both vectors of lanes, and LLVM spilled 8 accumulators).
    #[test]
    fn a_rows_vector_fmas_are_linearized_together() {
        let tiled = vectorize_outer_products(&rolled(13, 32, 1, false, false), 64);
        let linear = crate::linearize(&tiled).unwrap();
        let broadcasts: Vec<*const UOp> = linear
            .iter()
            .filter(|n| n.op() == Op::MulAcc && n.dtype().width() == 16)
            .map(|n| Arc::as_ptr(&n.src()[0]))
            .collect();
        assert_eq!(broadcasts.len(), 26);
        // each row's two FMAs are adjacent: its broadcast is used, then dead
        for pair in broadcasts.chunks(2) {
            assert_eq!(pair[0], pair[1], "{broadcasts:?}");
        }
    }

    #[test]
    fn loops_it_must_not_reorder_or_cannot_hold_stay_loops() {
        // results written into an operand: the iterations' order matters
        assert!(unroll_lane_loops(&rolled(2, 16, 2, true, false), 64).is_none());
        // 32 lanes are more than two 32-byte vectors hold
        assert!(unroll_lane_loops(&rolled(2, 32, 2, false, false), 32).is_none());
        assert!(unroll_lane_loops(&rolled(2, 16, 2, false, false), 32).is_some());
        // no contraction: a copy loop
        let mut k = KernelBuilder::new();
        let (a, c) = (k.param(0, Scalar::F32, 32), k.param(1, Scalar::F32, 32));
        let j = k.range(32);
        let st = k.store(&c.at(&j), &a.at(&j).load());
        k.end(&j, &[&st]);
        assert!(unroll_lane_loops(&k.finish().unwrap(), 64).is_none());
    }

    #[test]
    fn a_lanes_constant_is_carried_out_of_its_address() {
        let i32s = DType::I32;
        let x = UOp::new(Op::DefineVar, i32s, Arg::Var { name: "x".into(), min: 0, max: 9 }, vec![]);
        let c = |v| UOp::const_int(i32s, v);
        let add = |a: Arc<UOp>, b: Arc<UOp>| UOp::new(Op::Add, i32s, Arg::None, vec![a, b]);
        let base = add(x.clone(), c(3));
        // (x + 3) * 4 + 5 as x * 4 + 17
        let n = UOp::new(Op::MulAcc, i32s, Arg::None, vec![base.clone(), c(4), c(5)]);
        let folded = fold_offsets(&n, n.src()).unwrap();
        assert_eq!(split_offset(&folded).1, 17);
        // ((x + 3) + x) as (x + x) + 3
        let n = add(base.clone(), x.clone());
        assert_eq!(split_offset(&fold_offsets(&n, n.src()).unwrap()).1, 3);
        // a constant that overflows is left where it is
        let n = UOp::new(Op::Mul, i32s, Arg::None, vec![add(x, c(i64::MAX)), c(2)]);
        assert!(fold_offsets(&n, n.src()).is_none());
    }
}
