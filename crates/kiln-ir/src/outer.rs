//! Outer products into vector registers: the register tile of a matrix multiply, recovered
//! from scalar accumulators.
//!
//! A compiler that unrolls a contraction over two output axes (tinygrad's UPCAST) hands kiln
//! a loop with one scalar accumulator per output element, each updated as
//! `acc[i][j] = MULACC(a[i], b[j], acc[i][j])`, where the `b[j]` are lanes of loads at
//! consecutive addresses, or the same lane-wise ops of such loads (a ReLU of the image read). [`vectorize_outer_products`] turns every run of such accumulators
//! that share the loop, the initial value and the `a` operand into one vector accumulator
//! updated with one vector MULACC of the broadcast `a` and one vector load of the `b`s: the
//! register-blocked micro-kernel of a hand-written matrix multiply (a row of the tile per
//! `a`, one FMA per vector), which a C compiler does not recover from the scalar form.
//!
//! The result is the same bits: a vector MULACC rounds each lane once, as each scalar MULACC
//! did, and the product's operand order does not change a fused multiply-add. Loads are only
//! merged when they are plain (ungated) loads through the same pointer node, so memory
//! ordering (`AFTER`) is unchanged. Anything else is left as it was.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::lanes::{Mapped, Term, mapped_lane_of, order_with};
use crate::{Arg, DType, Op, Scalar, UOp};

/// One scalar accumulator of the pattern `END(range, ASSIGN(acc, MULACC(x, y, acc)))` with
/// `acc = DEFINE_ACC(CONST, range)` used nowhere else, or its nest over several reduce loops
/// (a convolution's channels and window): `END(r1, ASSIGN(acc1, END(r2, ASSIGN(acc2, ...))))`
/// where each inner accumulator starts from the outer one, `DEFINE_ACC(acc1, r2)`.
struct Chain {
    end: Arc<UOp>,
    /// The reduce loops, outermost first.
    ranges: Vec<Arc<UOp>>,
    init: Arc<UOp>,
    operands: [Arc<UOp>; 2],
}

/// One accumulator of a vector: its chain, the broadcast operand and its lane operand (where
/// it is read, and the lane-wise ops above the read).
#[derive(Clone)]
struct Member {
    chain: usize,
    shared: Arc<UOp>,
    lane: Mapped,
}

/// Rewrites the outer-product accumulators under `root` into vector accumulators of at most
/// `vector_bytes` bytes (the target's widest vector register; runs shorter than two lanes
/// stay scalar). Returns `root` itself when nothing matches.
///
/// A tile whose lanes are still a loop (a compiler that unrolled the rows only) is first
/// unrolled into that scalar form ([`crate::jam`]). Then the tile's epilogue, each lane's
/// chain of scalar ops after its accumulator, is lifted into vectors where every lane does the
/// same ([`crate::epilogue`]). The caller's renderer must compute a vector MAX or MIN lane for
/// lane as its scalar one (which of two equal zeros, which of a NaN and a number), as kiln's CPU
/// pairs do.
pub fn vectorize_outer_products(root: &Arc<UOp>, vector_bytes: usize) -> Arc<UOp> {
    let jammed = crate::jam::unroll_lane_loops(root, vector_bytes);
    let root = jammed.as_ref().unwrap_or(root);
    match vectorize(root, vector_bytes) {
        Some(tiled) => crate::epilogue::lift(&tiled).unwrap_or(tiled),
        None => root.clone(),
    }
}

/// The rewritten graph, or None where nothing changes (or a lookup the plan relies on fails,
/// which would be a bug here: the graph is then left as it is rather than panicking).
fn vectorize(root: &Arc<UOp>, vector_bytes: usize) -> Option<Arc<UOp>> {
    let topo = root.toposort();
    let mut users: HashMap<*const UOp, usize> = HashMap::default();
    for n in &topo {
        for s in n.src() {
            *users.entry(Arc::as_ptr(s)).or_default() += 1;
        }
    }
    let used = |n: &Arc<UOp>| users.get(&Arc::as_ptr(n)).copied().unwrap_or(0);
    let chains: Vec<Chain> = topo.iter().filter_map(|n| chain(n, &used)).collect();
    if chains.len() < 2 {
        return None;
    }

    // The operand shared by more accumulators is the broadcast one (a row of A), the other the
    // lane (a column of B).
    let mut sharers: HashMap<*const UOp, usize> = HashMap::default();
    for c in &chains {
        for o in &c.operands {
            *sharers.entry(Arc::as_ptr(o)).or_default() += 1;
        }
    }
    type Key = (Vec<*const UOp>, *const UOp, *const UOp, *const UOp, *const UOp, Vec<Term>);
    let mut groups: HashMap<Key, Vec<Member>> = HashMap::default();
    let mut order: Vec<Key> = Vec::new();
    for (ci, c) in chains.iter().enumerate() {
        let [x, y] = &c.operands;
        let shares = |o: &Arc<UOp>| sharers.get(&Arc::as_ptr(o)).copied().unwrap_or(0);
        let (shared, lane_op) = if shares(y) > shares(x) { (y, x) } else { (x, y) };
        let Some(lane) = mapped_lane_of(lane_op, crate::epilogue::liftable) else { continue };
        let read = &lane.lane;
        let base = read.base.as_ref().map_or(std::ptr::null(), Arc::as_ptr);
        let ranges = c.ranges.iter().map(Arc::as_ptr).collect();
        let key =
            (ranges, Arc::as_ptr(&c.init), Arc::as_ptr(shared), Arc::as_ptr(&read.pointer), base, lane.signature());
        let group = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        group.push(Member { chain: ci, shared: shared.clone(), lane });
    }

    // Runs of consecutive offsets, cut into vectors of a power-of-two width.
    let mut next_acc =
        topo.iter().filter(|n| n.op() == Op::DefineAcc).filter_map(|n| n.arg_int()).max().unwrap_or(-1) + 1;
    let mut plans: Vec<Vec<Member>> = Vec::new();
    for key in &order {
        let Some(group) = groups.get_mut(key) else { continue };
        let mut members = std::mem::take(group);
        members.sort_by_key(|m| m.lane.lane.offset);
        members.dedup_by_key(|m| m.lane.lane.offset);
        let Some(scalar) = chains[members[0].chain].end.dtype().scalar() else { continue };
        let max_lanes = (vector_bytes / scalar.size()).clamp(1, 16);
        let mut run: Vec<Member> = Vec::new();
        let mut flush = |run: &mut Vec<Member>| {
            let mut rest = run.as_slice();
            while rest.len() >= 2 {
                let w = prev_power_of_two(rest.len().min(max_lanes));
                if w < 2 {
                    break;
                }
                plans.push(rest[..w].to_vec());
                rest = &rest[w..];
            }
            run.clear();
        };
        let mut last: Option<i64> = None;
        for m in members {
            if last.is_some_and(|l| l + 1 != m.lane.lane.offset) {
                flush(&mut run);
            }
            last = Some(m.lane.lane.offset);
            run.push(m);
        }
        flush(&mut run);
    }
    if plans.is_empty() {
        return None;
    }

    // Rebuild bottom-up, in an order where every member of a plan comes after the inputs of all
    // its members (the first member met builds the whole vector); a plan whose inputs depend on
    // one of its own members would be a cycle, and then nothing changes.
    let mut member_of: HashMap<*const UOp, (usize, usize)> = HashMap::default();
    let mut inputs: HashMap<*const UOp, Vec<Arc<UOp>>> = HashMap::default();
    for (pi, plan) in plans.iter().enumerate() {
        let all: Vec<Arc<UOp>> = plan.iter().map(|m| m.lane.value.clone()).collect();
        for (lane, m) in plan.iter().enumerate() {
            member_of.insert(Arc::as_ptr(&chains[m.chain].end), (pi, lane));
            inputs.insert(Arc::as_ptr(&chains[m.chain].end), all.clone());
        }
    }
    let order = order_with(root, &inputs)?;
    let mut built: Vec<Option<Arc<UOp>>> = vec![None; plans.len()];
    let mut memo: HashMap<*const UOp, Arc<UOp>> = HashMap::default();
    for node in &order {
        let new = if let Some(&(pi, lane)) = member_of.get(&Arc::as_ptr(node)) {
            let vend = match &built[pi] {
                Some(v) => v.clone(),
                None => {
                    let v = build_vector(&plans[pi], &chains, &memo, next_acc)?;
                    next_acc += chains[plans[pi][0].chain].ranges.len() as i64;
                    built[pi] = Some(v.clone());
                    v
                }
            };
            UOp::new(Op::Gep, node.dtype(), Arg::Int(lane as i64), vec![vend])
        } else {
            let src: Vec<Arc<UOp>> =
                node.src().iter().map(|s| memo.get(&Arc::as_ptr(s)).cloned()).collect::<Option<_>>()?;
            let changed = src.iter().zip(node.src()).any(|(a, b)| !Arc::ptr_eq(a, b));
            let rebuilt = if changed { node.with_src(src) } else { node.clone() };
            whole_vector(&rebuilt).unwrap_or(rebuilt)
        };
        memo.insert(Arc::as_ptr(node), new);
    }
    memo.get(&Arc::as_ptr(root)).cloned()
}

fn chain(end: &Arc<UOp>, used: &impl Fn(&Arc<UOp>) -> usize) -> Option<Chain> {
    let dt = end.dtype();
    // f16 and bf16 stay scalar: their MULACC rounds through f32, and kiln promises that only
    // per scalar op; bool has no MULACC
    if !matches!(dt, DType::Scalar(s) if !matches!(s, Scalar::Bool | Scalar::F16 | Scalar::BF16)) {
        return None;
    }
    let mut ranges = Vec::new();
    let mut outer: Option<Arc<UOp>> = None; // the accumulator the current level starts from
    let mut node = end.clone();
    loop {
        if node.op() != Op::End || node.dtype() != dt || node.src().len() != 2 || (outer.is_some() && used(&node) != 1)
        {
            return None;
        }
        let (range, assign) = (&node.src()[0], &node.src()[1]);
        if assign.op() != Op::Assign || used(assign) != 1 {
            return None;
        }
        let (acc, value) = (&assign.src()[0], &assign.src()[1]);
        let starts_right = match &outer {
            Some(o) => Arc::ptr_eq(&acc.src()[0], o),
            None => acc.src().first().is_some_and(|i| i.op() == Op::Const),
        };
        let acc_ok = acc.op() == Op::DefineAcc
            && acc.dtype() == dt
            && acc.src().len() == 2
            && Arc::ptr_eq(&acc.src()[1], range)
            && used(acc) == 2;
        if !acc_ok || !starts_right {
            return None;
        }
        ranges.push(range.clone());
        if value.op() == Op::MulAcc {
            if value.dtype() != dt || used(value) != 1 || !Arc::ptr_eq(&value.src()[2], acc) {
                return None;
            }
            let mut init = acc.clone();
            while init.op() == Op::DefineAcc {
                init = init.src()[0].clone();
            }
            return Some(Chain {
                end: end.clone(),
                ranges,
                init,
                operands: [value.src()[0].clone(), value.src()[1].clone()],
            });
        }
        outer = Some(acc.clone());
        node = value.clone();
    }
}

fn prev_power_of_two(n: usize) -> usize {
    if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) }
}

/// The vector accumulator of one plan: `END(range, ASSIGN(vacc, MULACC(broadcast a, LOAD
/// b[0..w], vacc)))` (nested as the scalar ones were), every input taken from `memo` (already
/// rebuilt), the accumulators numbered from `id`; None if an input is missing from `memo`.
fn build_vector(plan: &[Member], chains: &[Chain], memo: &HashMap<*const UOp, Arc<UOp>>, id: i64) -> Option<Arc<UOp>> {
    let get = |n: &Arc<UOp>| memo.get(&Arc::as_ptr(n)).cloned();
    let first = &chains[plan.first()?.chain];
    let (shared, mapped) = (&plan[0].shared, &plan[0].lane);
    let lane = &mapped.lane;
    let scalar = first.end.dtype().scalar()?;
    let w = plan.len() as u8;
    let vt = DType::vec(scalar, w);
    let ranges: Vec<Arc<UOp>> = first.ranges.iter().map(get).collect::<Option<_>>()?;
    let mut accs = Vec::with_capacity(ranges.len());
    let mut start = UOp::new(Op::Vectorize, vt, Arg::None, vec![get(&first.init)?]);
    for (i, r) in (0..).zip(&ranges) {
        start = UOp::new(Op::DefineAcc, vt, Arg::Int(id + i), vec![start, r.clone()]);
        accs.push(start.clone());
    }
    let lanes = if plan.iter().all(|m| m.lane.lane.plain) {
        let addr = match (&lane.base, lane.offset) {
            (Some(b), 0) => get(b)?,
            (Some(b), c) => UOp::new(Op::Add, lane.index, Arg::None, vec![get(b)?, UOp::const_int(lane.index, c)]),
            (None, c) => UOp::const_int(lane.index, c),
        };
        let pointer = get(&lane.pointer)?;
        let ptr_dt = match pointer.dtype() {
            DType::Ptr { scalar, space, .. } => DType::Ptr { scalar, width: w, space },
            other => other,
        };
        let index = UOp::new(Op::Index, ptr_dt, Arg::None, vec![pointer, addr]);
        let read = UOp::new(Op::Load, DType::vec(lane.value.dtype().scalar()?, w), Arg::None, vec![index]);
        mapped.over(&read, w, &get)?
    } else {
        UOp::new(Op::Vectorize, vt, Arg::None, plan.iter().map(|m| get(&m.lane.value)).collect::<Option<_>>()?)
    };
    let broadcast = UOp::new(Op::Vectorize, vt, Arg::None, vec![get(shared)?]);
    let mut value = UOp::new(Op::MulAcc, vt, Arg::None, vec![broadcast, lanes, start]);
    for (acc, r) in accs.into_iter().zip(ranges).rev() {
        let assign = UOp::new(Op::Assign, vt, Arg::None, vec![acc, value]);
        value = UOp::new(Op::End, vt, Arg::None, vec![r, assign]);
    }
    Some(value)
}

/// `VECTORIZE(GEP(v, 0), ..., GEP(v, w-1))` of a `w`-lane `v` is `v`.
fn whole_vector(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    if n.op() != Op::Vectorize || n.src().len() < 2 {
        return None;
    }
    let v = n.src()[0].src().first()?;
    let whole = v.dtype() == n.dtype()
        && n.src()
            .iter()
            .enumerate()
            .all(|(i, g)| g.op() == Op::Gep && g.arg_int() == Some(i as i64) && Arc::ptr_eq(&g.src()[0], v));
    whole.then(|| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KernelBuilder, Val, validate};

    /// `rows` accumulators of A[i]·B[j] over k for `lanes` consecutive j (B read as one scalar
    /// load per lane); with `leak`, row 0's first product is also stored on its own.
    fn tile(rows: i64, lanes: i64, leak: bool) -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let (a, b, c) = (k.param(0, Scalar::F32, 64), k.param(1, Scalar::F32, 1024), k.param(2, Scalar::F32, 1024));
        let r = k.range(16);
        for i in 0..rows {
            let x = a.at(&(&r + i * 16)).load();
            for j in 0..lanes {
                let acc = k.acc(&Val::f32(0.0), &[&r]);
                let prod = x.mul_acc(&b.at(&(&r * 64 + j)).load(), &acc.get());
                if leak && i == 0 && j == 0 {
                    let inside = k.store(&c.at(&Val::int(1000)), &prod);
                    k.end(&r, &[&inside]);
                }
                k.store(&c.at(&Val::int(i * 64 + j)), &acc.update(&prod));
            }
        }
        k.finish().unwrap()
    }

    fn accs(root: &Arc<UOp>) -> Vec<DType> {
        root.toposort().iter().filter(|n| n.op() == Op::DefineAcc).map(|n| n.dtype()).collect()
    }

    #[test]
    fn rows_of_lanes_become_vector_accumulators_no_wider_than_the_registers() {
        let k = tile(4, 16, false);
        let wide = vectorize_outer_products(&k, 64);
        validate(&wide).unwrap();
        assert_eq!(accs(&wide), vec![DType::vec(Scalar::F32, 16); 4]);
        let avx2 = vectorize_outer_products(&k, 32);
        validate(&avx2).unwrap();
        assert_eq!(accs(&avx2), vec![DType::vec(Scalar::F32, 8); 8]);
        // 6 lanes: a vector of 4 and one of 2
        let six = vectorize_outer_products(&tile(1, 6, false), 64);
        let mut widths: Vec<u8> = accs(&six).iter().map(|d| d.width()).collect();
        widths.sort();
        assert_eq!(widths, vec![2, 4]);
    }

    /// A tile whose lanes are a ReLU of the reads (a convolution of the previous layer's output,
    /// its ReLU fused into the read: `MAX(b, 0)` or tinygrad's `WHERE(0 < b, b, 0)`) takes the
    /// ReLU in vectors too; two reads under one op (`b[j] + b[j+1]`) are no lane and stay scalar.
    #[test]
    fn lanes_under_lane_wise_ops_are_read_and_mapped_as_vectors() {
        for form in ["max", "where", "two reads"] {
            let mut k = KernelBuilder::new();
            let (a, b, c) = (k.param(0, Scalar::F32, 64), k.param(1, Scalar::F32, 1024), k.param(2, Scalar::F32, 64));
            let r = k.range(16);
            for i in 0..2 {
                let x = a.at(&(&r + i * 16)).load();
                for j in 0..16 {
                    let read = b.at(&(&r * 32 + j)).load();
                    let lane = match form {
                        "max" => read.max(0.0f32),
                        "where" => Val::f32(0.0).lt(&read).select(&read, 0.0f32),
                        _ => &read + &b.at(&(&r * 32 + j + 1)).load(),
                    };
                    let acc = k.acc(&Val::f32(0.0), &[&r]);
                    k.store(&c.at(&Val::int(i * 16 + j)), &acc.update(&x.mul_acc(&lane, &acc.get())));
                }
            }
            let out = vectorize_outer_products(&k.finish().unwrap(), 64);
            validate(&out).unwrap();
            let vectors = |op: Op| out.toposort().iter().filter(|n| n.op() == op && n.dtype().width() == 16).count();
            if form == "two reads" {
                assert_eq!(accs(&out), vec![DType::F32; 32]);
                continue;
            }
            assert_eq!(accs(&out), vec![DType::vec(Scalar::F32, 16); 2], "{form}");
            // one read and one ReLU of 16 lanes, shared by both rows
            let relu = if form == "max" { vectors(Op::Max) } else { vectors(Op::Where) };
            assert_eq!((vectors(Op::Load), relu), (1, 1), "{form}");
        }
    }

    #[test]
    fn kernels_without_the_pattern_are_returned_as_they_are() {
        let single = tile(1, 1, false);
        assert!(Arc::ptr_eq(&vectorize_outer_products(&single, 64), &single));
        // 16 bytes of f64: one lane, nothing to gain
        let mut k = KernelBuilder::new();
        let (a, c) = (k.param(0, Scalar::F64, 64), k.param(1, Scalar::F64, 64));
        let r = k.range(8);
        let x = a.at(&r).load();
        for j in 0..2 {
            let acc = k.acc(&Val::constant(DType::F64, 0.0), &[&r]);
            let v = acc.update(&x.mul_acc(&a.at(&(&r + 8 + j)).load(), &acc.get()));
            k.store(&c.at(&Val::int(j)), &v);
        }
        let f64s = k.finish().unwrap();
        assert!(Arc::ptr_eq(&vectorize_outer_products(&f64s, 8), &f64s));
    }

    #[test]
    fn an_accumulator_whose_update_is_read_elsewhere_stays_scalar() {
        let k = tile(1, 4, true);
        let out = vectorize_outer_products(&k, 64);
        validate(&out).unwrap();
        let widths: Vec<u8> = accs(&out).iter().map(|d| d.width()).collect();
        // lane 0 is read outside its accumulator; lanes 1..3 make a vector of 2 and a scalar
        assert_eq!(widths.iter().filter(|&&w| w == 1).count(), 2, "{widths:?}");
        assert!(widths.contains(&2), "{widths:?}");
    }
}
