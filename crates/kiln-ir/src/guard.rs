//! Inline bounds guards: the fallback for accesses no proof reaches.
//!
//! [`guard`] rewrites chosen LOADs and STOREs of a kernel so that each checks its own
//! element range at run time: a load outside its buffer yields its alternative value (0 when
//! it had none) and a store outside is skipped. Every guarded access also records that it
//! fired in a *fault buffer*, a new `i64` PARAM one slot past the kernel's last: access `k`
//! sets element `2k` to 1 and writes one offending element index to `2k + 1`. The launcher
//! zeroes the buffer before the run and reads it after, so an incorrect kernel still never
//! touches memory outside its buffers and is still reported.
//!
//! The rewrite is plain kernel IR (gates, comparisons, a STORE ordered before the access
//! with AFTER), so every backend runs it unchanged, and the guarded kernel is proven in
//! bounds by [`crate::bounds`] like any other: each access's own gate now bounds its offset.
//! Accesses not named are left exactly as they were.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::IrError;
use crate::bounds::if_blocks;
use crate::dtype::{DType, Scalar};
use crate::uop::{Arg, Op, UOp};

/// A kernel whose unproven accesses check themselves, and what its fault buffer means.
#[derive(Debug, Clone)]
pub struct Guarded {
    /// The rewritten kernel: the original's slots, plus the fault buffer at `fault_slot`.
    pub sink: Arc<UOp>,
    /// The slot of the `i64` fault buffer (`2 * accesses.len()` elements, zeroed per launch).
    pub fault_slot: usize,
    /// The guarded accesses; the `k`-th owns fault elements `2k` and `2k + 1`.
    pub accesses: Vec<GuardedAccess>,
}

/// One guarded LOAD or STORE, named as in the original kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedAccess {
    /// Its `%N` number in the *original* kernel's [`crate::print`] order.
    pub node: usize,
    /// `LOAD` or `STORE`.
    pub op: &'static str,
    /// The buffer slot it addresses, or `None` for local memory.
    pub slot: Option<usize>,
    /// For local memory: the DEFINE_LOCAL's `%N` (original order) and its element count.
    pub local: Option<(usize, i64)>,
}

/// Rewrites the accesses `nodes` (`%N` numbers in `sink`'s [`crate::print`] order) of a
/// validated kernel into self-checking ones (see the module docs). Unknown or repeated
/// numbers are ignored; an empty list returns the kernel as it is, with no fault buffer.
///
/// # Errors
/// [`IrError::Structure`] when a named node is not a LOAD or STORE whose address is an INDEX
/// chain over a PARAM or a DEFINE_LOCAL of constant size (nothing to check it against).
pub fn guard(sink: &Arc<UOp>, nodes: &[usize]) -> Result<Guarded, IrError> {
    let order = sink.toposort();
    let pos: HashMap<*const UOp, u32> = order.iter().enumerate().map(|(i, n)| (Arc::as_ptr(n), i as u32)).collect();
    let at = |n: &Arc<UOp>| pos.get(&Arc::as_ptr(n)).copied().unwrap_or(0);
    let fault_slot =
        order.iter().filter(|n| n.op() == Op::Param).filter_map(|n| n.arg_int()).max().map_or(0, |s| s as usize + 1);
    let mut wanted: Vec<usize> = nodes.iter().copied().filter(|&i| i < order.len()).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let blocks = if wanted.is_empty() { Vec::new() } else { if_blocks(&order, &at) };
    // A slot's length is its first PARAM's (in this order), as every launch checks it.
    let mut slot_len: HashMap<i64, Arc<UOp>> = HashMap::default();
    for n in order.iter().filter(|n| n.op() == Op::Param) {
        slot_len.entry(n.arg_int().unwrap_or(0)).or_insert_with(|| n.src()[0].clone());
    }

    let fault_len = UOp::index_const(2 * wanted.len() as i64);
    let faults = UOp::new(Op::Param, DType::ptr(Scalar::I64), Arg::Int(fault_slot as i64), vec![fault_len]);
    let mut accesses = Vec::with_capacity(wanted.len());
    // One pass in topological order: each node is rebuilt from its rebuilt operands, so a
    // guard built over an address, gate or IF condition sees the guarded graph below it.
    let mut new: Vec<Arc<UOp>> = Vec::with_capacity(order.len());
    for (i, n) in order.iter().enumerate() {
        let src: Vec<Arc<UOp>> = n.src().iter().map(|s| new[at(s) as usize].clone()).collect();
        let node = if src.iter().zip(n.src()).all(|(a, b)| Arc::ptr_eq(a, b)) { n.clone() } else { n.with_src(src) };
        let node = if wanted.binary_search(&i).is_ok() {
            let conds: Vec<Arc<UOp>> =
                blocks[i].iter().map(|&f| new[at(&order[f as usize].src()[0]) as usize].clone()).collect();
            let (rewritten, access) = guard_one(i, &node, accesses.len(), &faults, &conds, &slot_len, &at)?;
            accesses.push(access);
            rewritten
        } else {
            node
        };
        new.push(node);
    }
    let sink = new.pop().unwrap_or_else(|| sink.clone());
    Ok(Guarded { sink, fault_slot, accesses })
}

/// The self-checking form of access `node` (`%i`), the `k`-th guarded one; `conds` are the
/// conditions of the IF blocks it is in.
fn guard_one(
    i: usize,
    node: &Arc<UOp>,
    k: usize,
    faults: &Arc<UOp>,
    conds: &[Arc<UOp>],
    slot_len: &HashMap<i64, Arc<UOp>>,
    at: &dyn Fn(&Arc<UOp>) -> u32,
) -> Result<(Arc<UOp>, GuardedAccess), IrError> {
    let refuse = |why: &str| IrError::Structure(format!("%{i} {} cannot be guarded: {why}", node.op()));
    if !matches!(node.op(), Op::Load | Op::Store) {
        return Err(refuse("only LOAD and STORE are"));
    }
    let src = node.src();
    let mut terms = Vec::new();
    let mut ptr = &src[0];
    let (len, slot, local) = loop {
        match ptr.op() {
            Op::Index => {
                terms.push(ptr.src()[1].clone());
                ptr = &ptr.src()[0];
            }
            Op::After => ptr = &ptr.src()[0],
            Op::Param => {
                let slot = ptr.arg_int().and_then(|s| usize::try_from(s).ok());
                let len = ptr.arg_int().and_then(|s| slot_len.get(&s)).unwrap_or(&ptr.src()[0]);
                break (len.clone(), slot, None);
            }
            Op::DefineLocal => {
                let n = ptr.src()[0].arg_int().ok_or_else(|| refuse("its local memory has no constant size"))?;
                let ty = match terms.first().map(|t| t.dtype()) {
                    Some(t @ (DType::I32 | DType::I64)) => t,
                    _ => DType::I64,
                };
                break (UOp::const_int(ty, n), None, Some((at(ptr) as usize, n)));
            }
            _ => return Err(refuse("its address is not an INDEX of a buffer PARAM or DEFINE_LOCAL")),
        }
    };
    // The element offset as the renderer computes it (each INDEX adds its operand). One
    // index compares in its own dtype when the length has it (so the check bounds that very
    // node); a sum compares in i64, where it cannot wrap.
    let ty = match terms.as_slice() {
        [t] if t.dtype() == len.dtype() => t.dtype(),
        _ => DType::I64,
    };
    let offset = terms.iter().map(|t| cast(t, ty)).reduce(|a, b| bin(Op::Add, ty, &a, &b));
    let offset = offset.unwrap_or_else(|| UOp::const_int(ty, 0)); // no INDEX: the first element
    let width = src[0].dtype().width().max(1) as i64;
    let last_start = bin(Op::Sub, ty, &cast(&len, ty), &UOp::const_int(ty, width));
    let inside = bin(
        Op::And,
        DType::BOOL,
        &bin(Op::Le, DType::BOOL, &UOp::const_int(ty, 0), &offset),
        &bin(Op::Le, DType::BOOL, &offset, &last_start),
    );
    let gate = (src.len() == 3).then(|| src[2].clone());
    // The fault records fire where the access would have run: its IF blocks and gate hold.
    let outside = UOp::new(Op::Not, DType::BOOL, Arg::None, vec![inside.clone()]);
    let fires = conds.iter().chain(gate.iter()).fold(outside, |acc, c| bin(Op::And, DType::BOOL, c, &acc));
    let record = |element: i64, value: Arc<UOp>| {
        let at = UOp::new(Op::Index, faults.dtype(), Arg::None, vec![faults.clone(), UOp::index_const(element)]);
        UOp::new(Op::Store, DType::Void, Arg::None, vec![at, value, fires.clone()])
    };
    let flag = record(2 * k as i64, UOp::const_int(DType::I64, 1));
    let index = record(2 * k as i64 + 1, cast(&offset, DType::I64));
    let address = UOp::new(Op::After, src[0].dtype(), Arg::None, vec![src[0].clone(), flag, index]);
    let runs = match &gate {
        Some(g) => bin(Op::And, DType::BOOL, g, &inside),
        None => inside,
    };
    let rewritten = match node.op() {
        Op::Load => {
            let alt = if src.len() == 3 { src[1].clone() } else { zero(node.dtype()) };
            node.with_src(vec![address, alt, runs])
        }
        _ => node.with_src(vec![address, src[1].clone(), runs]),
    };
    let access = GuardedAccess { node: i, op: node.op().name(), slot, local };
    Ok((rewritten, access))
}

fn bin(op: Op, dtype: DType, a: &Arc<UOp>, b: &Arc<UOp>) -> Arc<UOp> {
    UOp::new(op, dtype, Arg::None, vec![a.clone(), b.clone()])
}

/// `x` as a `ty`: an integer widened to i64 (a u64 beyond `i64::MAX` reads negative, so
/// outside), or `x` itself.
fn cast(x: &Arc<UOp>, ty: DType) -> Arc<UOp> {
    if x.dtype() == ty { x.clone() } else { UOp::new(Op::Cast, ty, Arg::None, vec![x.clone()]) }
}

/// The zero of a loaded dtype (the alternative of a load that had none).
fn zero(dtype: DType) -> Arc<UOp> {
    let lane = dtype.lane();
    let scalar = match lane.scalar() {
        Some(Scalar::Bool) => UOp::const_bool(false),
        Some(s) if s.is_float() => UOp::const_float(lane, 0.0),
        _ => UOp::const_int(lane, 0),
    };
    match dtype {
        DType::Vector(_, w) => UOp::new(Op::Vectorize, dtype, Arg::None, vec![scalar; w as usize]),
        _ => scalar,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::Bounds;
    use crate::{linearize, parse_kernel, validate};

    /// `out[i] = table[ids[i]]`: the table load's index is data, which no proof sees.
    const GATHER: &str = include_str!("../../../examples/kernels/gather.kiln");

    fn prove(sink: &Arc<UOp>) -> Bounds {
        crate::bounds::tests::case_of(sink.clone()).bounds
    }

    #[test]
    fn a_guarded_kernel_validates_and_is_proven_in_bounds() {
        let sink = parse_kernel(GATHER).unwrap();
        let pending = prove(&sink).pending_nodes();
        let load = sink.toposort().iter().rposition(|n| n.op() == Op::Load).unwrap();
        assert_eq!(pending, [load], "the table load is the one access no proof reaches");
        let g = guard(&sink, &pending).unwrap();
        assert_eq!(g.fault_slot, 3);
        assert_eq!(g.accesses, [GuardedAccess { node: load, op: "LOAD", slot: Some(0), local: None }]);
        validate(&g.sink).unwrap();
        linearize(&g.sink).unwrap();
        assert_eq!(prove(&g.sink).pending(), 0, "each guarded access is bounded by its own gate");
        let text = crate::print(&g.sink);
        assert!(text.contains("PARAM ptr<i64> 3"), "{text}");
    }

    #[test]
    fn stores_in_if_blocks_and_local_memory_are_guarded_too() {
        let text = "\
%c8 = CONST i32 8
%c4 = CONST i32 4
%a = PARAM ptr<f32> 0 (%c8)
%l = DEFINE_LOCAL lptr<f32> 0 (%c4)
%i = SPECIAL i32 \"lidx0\" (%c8)
%one = CONST i32 1
%m = AND i32 (%i, %one)
%h = SHR i32 (%i, %one)
%j = ADD i32 (%h, %m)
%lp = INDEX lptr<f32> (%l, %j)
%v = CONST f32 2.0
%ls = STORE void (%lp, %v)
%bar = BARRIER void (%ls)
%la = AFTER lptr<f32> (%l, %bar)
%lq = INDEX lptr<f32> (%la, %h)
%x = LOAD f32 (%lq)
%c3 = CONST i32 3
%cond = CMPLT bool (%i, %c3)
%if = IF void (%cond)
%pa = INDEX ptr<f32> (%a, %i)
%pad = AFTER ptr<f32> (%pa, %if)
%st = STORE void (%pad, %x)
%end = ENDIF void (%if, %st)
SINK void (%end)
";
        let sink = parse_kernel(text).unwrap();
        let order = sink.toposort();
        let accesses: Vec<usize> =
            order.iter().enumerate().filter(|(_, n)| matches!(n.op(), Op::Load | Op::Store)).map(|(i, _)| i).collect();
        let g = guard(&sink, &accesses).unwrap();
        assert_eq!(g.accesses.len(), 3);
        assert!(g.accesses.iter().any(|a| a.local.is_some_and(|(_, n)| n == 4)));
        validate(&g.sink).unwrap();
        linearize(&g.sink).unwrap();
        assert_eq!(prove(&g.sink).pending(), 0);
    }

    /// A slot declared twice with different lengths (a fuzzer's mutant): the guard bounds the
    /// access by the length every launch checks (the slot's first PARAM), not its own PARAM's.
    #[test]
    fn a_slot_declared_twice_is_guarded_by_the_length_launches_check() {
        let text = "\
%c1 = CONST i32 1
%a = PARAM ptr<f32> 0 (%c1)
%c0 = CONST i32 0
%p0 = INDEX ptr<f32> (%a, %c0)
%c64 = CONST i32 64
%r = RANGE i32 0 (%c64)
%a64 = PARAM ptr<f32> 0 (%c64)
%pr = INDEX ptr<f32> (%a64, %r)
%x = LOAD f32 (%pr)
%st = STORE void (%pr, %x)
%end = END void (%r, %st)
%y = CONST f32 1.0
%s0 = STORE void (%p0, %y)
SINK void (%s0, %end)
";
        let sink = parse_kernel(text).unwrap();
        let pending = prove(&sink).pending_nodes();
        assert_eq!(pending.len(), 2, "the load and store of 64 into a slot of 1");
        let g = guard(&sink, &pending).unwrap();
        validate(&g.sink).unwrap();
        assert_eq!(prove(&g.sink).pending(), 0);
    }

    #[test]
    fn what_cannot_be_checked_is_refused_and_nothing_named_changes_nothing() {
        let sink = parse_kernel(GATHER).unwrap();
        let special = sink.toposort().iter().position(|n| n.op() == Op::Special).unwrap();
        let e = guard(&sink, &[special]).unwrap_err().to_string();
        assert!(e.contains("only LOAD and STORE"), "{e}");
        let same = guard(&sink, &[999]).unwrap();
        assert!(Arc::ptr_eq(&same.sink, &sink) && same.accesses.is_empty());
    }
}
