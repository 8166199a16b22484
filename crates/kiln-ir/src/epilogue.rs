//! A register tile's epilogue in vectors: the per-lane arithmetic after the outer products.
//!
//! [`crate::vectorize_outer_products`] leaves a tile's accumulators in vector registers, but what
//! the kernel does with each result (a convolution's bias, batch norm, residual add and ReLU)
//! stays scalar: lane `i` of the accumulator is taken out (`GEP`) and goes through its own chain
//! of scalar ops to its own STORE. For a 16-lane, 14-row tile that is 448 chains, most of a
//! kernel's instructions, which LLVM then spends most of its compile time on. [`lift`] turns
//! every set of such chains that do the same thing lane by lane into one chain of vector ops:
//!
//! - A **group** is one scalar node per lane `0..w` of a vector `v` (the accumulator, or a group
//!   built before), the same op and dtype, each taking lane `i` of `v` at the same operands.
//!   It becomes one vector op whose other operands are the lanes' own, made a vector: one
//!   value broadcast where the lanes share it, one vector LOAD where they are plain loads of
//!   consecutive elements through one pointer, else the lanes gathered (`VECTORIZE`).
//! - The lanes' STOREs become one vector STORE where they write consecutive elements through
//!   one pointer, with one hint, and are the effects of one `END` or `SINK` and nothing else.
//!   Otherwise each stores its lane of the vector (`GEP`).
//!
//! Only ops whose vector form computes each lane exactly as the scalar op does are lifted
//! (IEEE add, subtract, multiply, divide, square root and fused multiply-add, comparisons,
//! `WHERE`, the bitwise ops, integer add/subtract/multiply, which wrap alike, and `MAX`/`MIN`,
//! which the renderers that call this pick by one rule for scalars and vector lanes alike:
//! kiln's CPU), and no f16 or bf16 values (kiln rounds their scalar ops through f32). So the
//! result is the same bits.

use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::lanes::{lane_of, order_with, split_offset};
use crate::{Arg, DType, Op, Scalar, UOp};

/// A vector a lifted node is a lane of: a vector of the graph, or a group's result.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Vector {
    Node(*const UOp),
    Group(usize),
}

/// One scalar node per lane, lifted together.
struct Group {
    members: Vec<Arc<UOp>>,
    /// The operand positions that are the lanes of a vector, and that vector.
    lifted: Vec<(usize, Vector)>,
    /// STOREs, merged into one (the first member's place; the others dropped from their user).
    store: bool,
}

/// Ops whose vector form computes each lane as the scalar op does.
pub(crate) fn liftable(op: Op) -> bool {
    matches!(
        op,
        Op::Add
            | Op::Sub
            | Op::Mul
            | Op::Div
            | Op::Neg
            | Op::Sqrt
            | Op::MulAcc
            | Op::Lt
            | Op::Le
            | Op::Eq
            | Op::Ne
            | Op::Where
            | Op::Max
            | Op::Min
            | Op::And
            | Op::Or
            | Op::Xor
    )
}

/// The lanes of vector `v` (0 for one never seen, which no group is made of).
fn lanes_of(width: &HashMap<Vector, u8>, v: &Vector) -> u8 {
    width.get(v).copied().unwrap_or(0)
}

fn lane_dtype(dt: DType) -> bool {
    matches!(dt, DType::Scalar(s) if !matches!(s, Scalar::F16 | Scalar::BF16))
}

/// The group key of a node: its op, dtype and the operand positions that are lanes of a vector;
/// for a STORE, also the buffer it writes (a value may be stored to several).
type Key = (Op, DType, Vec<(usize, Vector)>, *const UOp);

/// `root` with its lane-wise scalar chains lifted into vectors, or None where nothing changes.
pub(crate) fn lift(root: &Arc<UOp>) -> Option<Arc<UOp>> {
    let topo = root.toposort();
    let mut users: HashMap<*const UOp, Vec<Arc<UOp>>> = HashMap::default();
    for n in &topo {
        for s in n.src() {
            users.entry(Arc::as_ptr(s)).or_default().push(n.clone());
        }
    }
    let users_of = |n: &Arc<UOp>| users.get(&Arc::as_ptr(n)).map_or(&[][..], Vec::as_slice);
    let mut width: HashMap<Vector, u8> = HashMap::default();
    let mut lane: HashMap<*const UOp, (Vector, usize)> = HashMap::default();
    for n in &topo {
        let Some(v) = n.src().first() else { continue };
        if n.op() == Op::Gep && n.dtype().width() == 1 && v.dtype().width() >= 2 && lane_dtype(n.dtype()) {
            let Some(i) = n.arg_int().and_then(|i| usize::try_from(i).ok()) else { continue };
            width.insert(Vector::Node(Arc::as_ptr(v)), v.dtype().width());
            lane.insert(Arc::as_ptr(n), (Vector::Node(Arc::as_ptr(v)), i));
        }
    }

    // Rounds: each finds the groups whose operands the rounds before lifted.
    let mut groups: Vec<Group> = Vec::new();
    let mut grouped: HashSet<*const UOp> = HashSet::default();
    loop {
        let mut candidates: HashMap<Key, Vec<Vec<Arc<UOp>>>> = HashMap::default();
        let mut keys: Vec<Key> = Vec::new();
        for n in &topo {
            if grouped.contains(&Arc::as_ptr(n)) {
                continue;
            }
            let store = n.op() == Op::Store && n.src().len() == 2;
            if !(store || (liftable(n.op()) && lane_dtype(n.dtype()) && *n.arg() == Arg::None)) {
                continue;
            }
            // The lane is that of the widest vector among the operands (a group's first): an
            // accumulator's lane next to a lane of a short vector of parameters is the
            // accumulator's, and the parameter one of the lanes' own operands.
            let lanes: Vec<(usize, Vector, usize)> = n
                .src()
                .iter()
                .enumerate()
                .filter_map(|(q, s)| lane.get(&Arc::as_ptr(s)).map(|&(v, i)| (q, v, i)))
                .collect();
            let Some(&(_, main, i)) =
                lanes.iter().max_by_key(|(_, v, _)| (matches!(v, Vector::Group(_)), lanes_of(&width, v)))
            else {
                continue;
            };
            let w = usize::from(lanes_of(&width, &main));
            let lifted: Vec<(usize, Vector)> = lanes
                .iter()
                .filter(|&&(_, v, j)| j == i && lanes_of(&width, &v) == lanes_of(&width, &main))
                .map(|&(q, v, _)| (q, v))
                .collect();
            let others_fit = n.src().iter().enumerate().all(|(q, s)| {
                lifted.iter().any(|&(l, _)| l == q) || if store { q == 0 } else { lane_dtype(s.dtype()) }
            });
            if !others_fit || i >= w {
                continue; // a lane used as an address, or an f16 operand
            }
            let buffer = match n.src().first() {
                Some(index) if store => index.src().first().map_or(std::ptr::null(), Arc::as_ptr),
                _ => std::ptr::null(),
            };
            let key = (n.op(), n.dtype(), lifted, buffer);
            let slots = candidates.entry(key.clone()).or_insert_with(|| {
                keys.push(key);
                vec![Vec::new(); w]
            });
            slots[i].push(n.clone());
        }
        let before = groups.len();
        for key in keys {
            let Some(slots) = candidates.get(&key) else { continue };
            if slots.iter().any(|s| s.len() != 1) {
                continue;
            }
            let members: Vec<Arc<UOp>> = slots.iter().map(|s| s[0].clone()).collect();
            let store = key.0 == Op::Store;
            if store && !mergeable_stores(&members, &users_of) {
                continue;
            }
            let g = groups.len();
            for (i, m) in members.iter().enumerate() {
                grouped.insert(Arc::as_ptr(m));
                if !store {
                    lane.insert(Arc::as_ptr(m), (Vector::Group(g), i));
                }
            }
            width.insert(Vector::Group(g), members.len() as u8);
            groups.push(Group { members, lifted: key.2, store });
        }
        if groups.len() == before {
            break;
        }
    }
    if groups.is_empty() {
        return None;
    }

    // Rebuild bottom-up; a group is built at its first member met, after every member's inputs.
    let mut member_of: HashMap<*const UOp, (usize, usize)> = HashMap::default();
    let mut inputs: HashMap<*const UOp, Vec<Arc<UOp>>> = HashMap::default();
    for (g, group) in groups.iter().enumerate() {
        let all: Vec<Arc<UOp>> = group.members.iter().flat_map(|m| m.src().iter().cloned()).collect();
        for (i, m) in group.members.iter().enumerate() {
            member_of.insert(Arc::as_ptr(m), (g, i));
            inputs.insert(Arc::as_ptr(m), all.clone());
        }
    }
    let order = order_with(root, &inputs)?;
    let mut built: Vec<Option<Arc<UOp>>> = vec![None; groups.len()];
    let mut memo: HashMap<*const UOp, Arc<UOp>> = HashMap::default();
    let mut dropped: HashSet<*const UOp> = HashSet::default();
    for node in &order {
        let new = if let Some(&(g, i)) = member_of.get(&Arc::as_ptr(node)) {
            let v = match &built[g] {
                Some(v) => v.clone(),
                None => {
                    let v = build(&groups[g], &built, &memo)?;
                    built[g] = Some(v.clone());
                    v
                }
            };
            if groups[g].store {
                if i > 0 {
                    dropped.insert(Arc::as_ptr(node));
                }
                v
            } else {
                UOp::new(Op::Gep, node.dtype(), Arg::Int(i as i64), vec![v])
            }
        } else {
            let src: Vec<Arc<UOp>> = node
                .src()
                .iter()
                .filter(|s| !dropped.contains(&Arc::as_ptr(s)))
                .map(|s| memo.get(&Arc::as_ptr(s)).cloned())
                .collect::<Option<_>>()?;
            let changed = src.len() != node.src().len() || src.iter().zip(node.src()).any(|(a, b)| !Arc::ptr_eq(a, b));
            if changed { node.with_src(src) } else { node.clone() }
        };
        memo.insert(Arc::as_ptr(node), new);
    }
    memo.get(&Arc::as_ptr(root)).cloned()
}

/// Whether the lanes' STOREs can be one vector STORE: plain stores with one hint, of
/// consecutive elements through one pointer from lane 0's address, each an effect of the same
/// `END` or `SINK` (once) and of nothing else.
fn mergeable_stores<'a>(members: &[Arc<UOp>], users_of: &impl Fn(&Arc<UOp>) -> &'a [Arc<UOp>]) -> bool {
    let Some(first) = members.first() else { return false };
    let [user] = users_of(first) else { return false };
    if !matches!(user.op(), Op::End | Op::Sink) {
        return false;
    }
    let Some(base) = lane_of_store(first) else { return false };
    members.iter().enumerate().all(|(i, m)| {
        let only_user = matches!(users_of(m), [u] if Arc::ptr_eq(u, user));
        let once = user.src().iter().filter(|s| Arc::ptr_eq(s, m)).count() == 1;
        let at = lane_of_store(m);
        let consecutive = at.is_some_and(|(p, b, o)| {
            Arc::ptr_eq(&p, &base.0) && same_base(&b, &base.1) && Some(o) == base.2.checked_add(i as i64)
        });
        only_user && once && consecutive && m.arg() == first.arg()
    }) && apart_from_the_others(members, user, &base)
}

/// Whether the user's other STOREs through the group's pointer write none of its elements (so
/// that writing them at once, in the first member's place, cannot reorder two writes of one
/// element): each from the same base, outside the group's offsets.
fn apart_from_the_others(members: &[Arc<UOp>], user: &Arc<UOp>, base: &(Arc<UOp>, Option<Arc<UOp>>, i64)) -> bool {
    let span = base.2..base.2.saturating_add(members.len() as i64);
    user.src().iter().filter(|s| s.op() == Op::Store && !members.iter().any(|m| Arc::ptr_eq(m, s))).all(|s| {
        match lane_of_store(s) {
            Some((p, _, _)) if !Arc::ptr_eq(&p, &base.0) => true,
            Some((_, b, o)) => same_base(&b, &base.1) && !span.contains(&o),
            None => s.src().first().and_then(|i| i.src().first()).is_some_and(|p| !Arc::ptr_eq(p, &base.0)),
        }
    })
}

fn same_base(a: &Option<Arc<UOp>>, b: &Option<Arc<UOp>>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        (None, None) => true,
        _ => false,
    }
}

/// A scalar STORE's pointer, base address and element offset.
fn lane_of_store(store: &Arc<UOp>) -> Option<(Arc<UOp>, Option<Arc<UOp>>, i64)> {
    let index = store.src().first()?;
    if index.op() != Op::Index || index.src().len() != 2 || index.dtype().width() != 1 {
        return None;
    }
    let (base, offset) = split_offset(&index.src()[1]);
    Some((index.src()[0].clone(), base, offset))
}

/// The vector node of `group`, its inputs taken from `memo` and `built`.
fn build(group: &Group, built: &[Option<Arc<UOp>>], memo: &HashMap<*const UOp, Arc<UOp>>) -> Option<Arc<UOp>> {
    let get = |n: &Arc<UOp>| memo.get(&Arc::as_ptr(n)).cloned();
    let first = group.members.first()?;
    let w = group.members.len() as u8;
    let operand = |q: usize| -> Option<Arc<UOp>> {
        if let Some(&(_, v)) = group.lifted.iter().find(|(l, _)| *l == q) {
            return match v {
                // lane 0 of a vector of the graph is a GEP of it
                Vector::Node(_) => get(first.src()[q].src().first()?),
                Vector::Group(h) => built.get(h)?.clone(),
            };
        }
        let lanes: Vec<Arc<UOp>> = group.members.iter().map(|m| get(&m.src()[q])).collect::<Option<_>>()?;
        let vt = DType::vec(lanes[0].dtype().scalar()?, w);
        if lanes.iter().all(|l| Arc::ptr_eq(l, &lanes[0])) {
            return Some(UOp::new(Op::Vectorize, vt, Arg::None, vec![lanes[0].clone()]));
        }
        Some(consecutive_load(&lanes, vt).unwrap_or_else(|| UOp::new(Op::Vectorize, vt, Arg::None, lanes)))
    };
    if group.store {
        let index = get(first.src().first()?)?;
        let [pointer, addr] = index.src() else { return None };
        let ptr_dt = match pointer.dtype() {
            DType::Ptr { scalar, space, .. } => DType::Ptr { scalar, width: w, space },
            _ => return None,
        };
        let at = UOp::new(Op::Index, ptr_dt, Arg::None, vec![pointer.clone(), addr.clone()]);
        return Some(UOp::new(Op::Store, DType::Void, first.arg().clone(), vec![at, operand(1)?]));
    }
    let src: Vec<Arc<UOp>> = (0..first.src().len()).map(operand).collect::<Option<_>>()?;
    Some(UOp::new(first.op(), DType::vec(first.dtype().scalar()?, w), Arg::None, src))
}

/// One vector LOAD for lanes that are plain loads of consecutive elements through one pointer
/// (scalar loads, or lanes of vector ones) from lane 0's address.
fn consecutive_load(lanes: &[Arc<UOp>], vt: DType) -> Option<Arc<UOp>> {
    let at: Vec<_> = lanes.iter().map(|l| lane_of(l).filter(|a| a.plain)).collect::<Option<_>>()?;
    let first = &at[0];
    let consecutive = at.iter().enumerate().all(|(i, a)| {
        Arc::ptr_eq(&a.pointer, &first.pointer)
            && same_base(&a.base, &first.base)
            && Some(a.offset) == first.offset.checked_add(i as i64)
    });
    if !consecutive {
        return None;
    }
    let addr = match (&first.base, first.offset) {
        (Some(b), 0) => b.clone(),
        (Some(b), c) => UOp::new(Op::Add, first.index, Arg::None, vec![b.clone(), UOp::const_int(first.index, c)]),
        (None, c) => UOp::const_int(first.index, c),
    };
    let ptr_dt = match first.pointer.dtype() {
        DType::Ptr { scalar, space, .. } => DType::Ptr { scalar, width: vt.width(), space },
        _ => return None,
    };
    let at = UOp::new(Op::Index, ptr_dt, Arg::None, vec![first.pointer.clone(), addr]);
    Some(UOp::new(Op::Load, vt, Arg::None, vec![at]))
}

#[cfg(test)]
mod tests {
    use crate::{DType, KernelBuilder, Op, Scalar, UOp, Val, validate, vectorize_outer_products};
    use std::sync::Arc;

    /// A 2×16 tile of `A·B` over 16 steps, then per element `(acc - mean[j]) * scale[j] + bias`,
    /// a ReLU (`WHERE(0 < v, v, 0)`) or `MAX(v, 0)`, stored to `C[i][j]` (consecutive lanes)
    /// and, with `transposed`, also to `D[j][i]` (lanes 8 apart).
    fn tile_with_epilogue(relu_by_max: bool, transposed: bool) -> Arc<UOp> {
        let (rows, lanes) = (2i64, 16i64);
        let mut k = KernelBuilder::new();
        let a = k.param(0, Scalar::F32, 64);
        let b = k.param(1, Scalar::F32, 1024);
        let (mean, scale) = (k.param(2, Scalar::F32, 16), k.param(3, Scalar::F32, 16));
        let c = k.param(4, Scalar::F32, 1024);
        let d = k.param(5, Scalar::F32, 1024);
        let r = k.range(16);
        for i in 0..rows {
            let x = a.at(&(&r + i * 16)).load();
            for j in 0..lanes {
                let acc = k.acc(&Val::f32(0.0), &[&r]);
                let sum = acc.update(&x.mul_acc(&b.at(&(&r * 64 + j)).load(), &acc.get()));
                let v = (sum - mean.at(&Val::int(j)).load()) * scale.at(&Val::int(j)).load() + 0.5f32;
                let out = if relu_by_max { v.max(0.0f32) } else { Val::f32(0.0).lt(&v).select(&v, 0.0f32) };
                k.store(&c.at(&Val::int(i * 64 + j)), &out);
                if transposed {
                    k.store(&d.at(&Val::int(j * 8 + i)), &out);
                }
            }
        }
        k.finish().unwrap()
    }

    /// The float (or bool) nodes of `op` with `width` lanes: the epilogue's, not the addresses'.
    fn count(root: &Arc<UOp>, op: Op, width: u8) -> usize {
        let value = |d: DType| matches!(d.scalar(), Some(Scalar::F32 | Scalar::Bool));
        root.toposort().iter().filter(|n| n.op() == op && n.dtype().width() == width && value(n.dtype())).count()
    }

    fn stores(root: &Arc<UOp>, width: u8) -> usize {
        root.toposort().iter().filter(|n| n.op() == Op::Store && n.src()[0].dtype().width() == width).count()
    }

    #[test]
    fn a_tiles_epilogue_is_computed_and_stored_in_vectors() {
        let out = vectorize_outer_products(&tile_with_epilogue(false, false), 64);
        validate(&out).unwrap();
        // per row: one vector of each op, the parameters loaded as vectors, one vector store
        for op in [Op::Sub, Op::Mul, Op::Add, Op::Where] {
            assert_eq!((count(&out, op, 16), count(&out, op, 1)), (2, 0), "{op:?}");
        }
        assert_eq!(count(&out, Op::Lt, 16), 2);
        assert_eq!((stores(&out, 16), stores(&out, 1)), (2, 0));
        let vector_loads =
            out.toposort().iter().filter(|n| n.op() == Op::Load && n.dtype() == DType::vec(Scalar::F32, 16)).count();
        assert!(vector_loads >= 3, "B, mean and scale as vectors: {vector_loads}");
    }

    #[test]
    fn lanes_stored_apart_are_stored_lane_by_lane_from_the_vectors() {
        let out = vectorize_outer_products(&tile_with_epilogue(false, true), 64);
        validate(&out).unwrap();
        assert_eq!(count(&out, Op::Where, 16), 2);
        // C's lanes are consecutive, D's are 8 apart: each of D's 32 stores takes its lane
        assert_eq!((stores(&out, 16), stores(&out, 1)), (2, 32));
    }

    #[test]
    fn a_relu_by_max_is_lifted_and_stored_in_vectors_too() {
        let out = vectorize_outer_products(&tile_with_epilogue(true, false), 64);
        validate(&out).unwrap();
        assert_eq!((count(&out, Op::Add, 16), count(&out, Op::Max, 1), count(&out, Op::Max, 16)), (2, 0, 2));
        assert_eq!((stores(&out, 16), stores(&out, 1)), (2, 0));
    }
}
