//! Where the lanes of a vector are read from, and the order a rewrite that builds vectors from
//! scalars visits a graph in: what the register tiles ([`crate::outer`]) and their epilogues
//! ([`crate::epilogue`]) share.

use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::{Arg, DType, Op, UOp};

/// Where a lane operand is read from: element `offset` past `base` (None: address 0)
/// through `pointer` (the INDEX's buffer), with `index` the dtype of the address arithmetic.
/// `plain`: an ungated load, which a run of consecutive lanes can share as one vector load;
/// gated lanes (a padded convolution's input) are gathered into the vector one by one.
#[derive(Clone)]
pub(crate) struct Lane {
    pub(crate) value: Arc<UOp>,
    pub(crate) pointer: Arc<UOp>,
    pub(crate) base: Option<Arc<UOp>>,
    pub(crate) offset: i64,
    pub(crate) index: DType,
    pub(crate) plain: bool,
}

/// A post-order of the graph under `root` in which a node also comes after its `extra`
/// predecessors; None if those make a cycle.
pub(crate) fn order_with(root: &Arc<UOp>, extra: &HashMap<*const UOp, Vec<Arc<UOp>>>) -> Option<Vec<Arc<UOp>>> {
    let mut out = Vec::new();
    let mut state: HashMap<*const UOp, bool> = HashMap::default(); // false: on the stack, true: done
    let mut stack: Vec<(Arc<UOp>, bool)> = vec![(root.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        let key = Arc::as_ptr(&node);
        if expanded {
            state.insert(key, true);
            out.push(node);
            continue;
        }
        match state.get(&key) {
            Some(true) => continue,
            Some(false) => return None,
            None => {}
        }
        state.insert(key, false);
        stack.push((node.clone(), true));
        let preds = node.src().iter().chain(extra.get(&key).into_iter().flatten());
        for p in preds {
            match state.get(&Arc::as_ptr(p)) {
                Some(true) => {}
                Some(false) => return None,
                None => stack.push((p.clone(), false)),
            }
        }
    }
    Some(out)
}

/// The address of a scalar read: a plain LOAD through a one-lane INDEX, or lane `l` of a
/// plain vector LOAD (element `l` past its INDEX).
pub(crate) fn lane_of(v: &Arc<UOp>) -> Option<Lane> {
    let (load, lane) = match v.op() {
        Op::Gep => (&v.src()[0], v.arg_int()?),
        Op::Load => (v, 0),
        _ => return None,
    };
    let plain = load.src().len() == 1;
    if load.op() != Op::Load || !(plain || (load.src().len() == 3 && v.op() == Op::Load)) {
        return None;
    }
    let index = &load.src()[0];
    if index.op() != Op::Index || index.src().len() != 2 || !matches!(index.dtype(), DType::Ptr { .. }) {
        return None;
    }
    let addr = &index.src()[1];
    let (base, offset) = split_offset(addr);
    Some(Lane {
        value: v.clone(),
        pointer: index.src()[0].clone(),
        base,
        offset: offset.checked_add(lane)?,
        index: addr.dtype(),
        plain,
    })
}

/// The most lane-wise ops [`mapped_lane_of`] looks through above a read.
const MAX_OPS: usize = 16;

/// A lane operand: a read ([`lane_of`]), or lane-wise ops over one read and values the lanes
/// share (a ReLU of the image a convolution reads: `MAX(x, 0)`, `WHERE(0 < x, x, 0)`); `value`
/// is the operand itself, `ops` its lane-wise ops (none for a read).
#[derive(Clone)]
pub(crate) struct Mapped {
    pub(crate) value: Arc<UOp>,
    pub(crate) lane: Lane,
    ops: HashSet<*const UOp>,
}

/// One node of a lane operand's [`Mapped::signature`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Term {
    Read,
    Op(Op, DType, usize),
    Shared(*const UOp),
}

impl Mapped {
    /// What lanes must have in common to be one vector besides where their reads are: the
    /// expression over the read, in pre-order, with the values it shares by identity.
    pub(crate) fn signature(&self) -> Vec<Term> {
        let mut out = Vec::new();
        let mut stack = vec![&self.value];
        while let Some(n) = stack.pop() {
            if Arc::ptr_eq(n, &self.lane.value) {
                out.push(Term::Read);
            } else if self.ops.contains(&Arc::as_ptr(n)) {
                out.push(Term::Op(n.op(), n.dtype(), n.src().len()));
                stack.extend(n.src().iter().rev());
            } else {
                out.push(Term::Shared(Arc::as_ptr(n)));
            }
        }
        out
    }

    /// The operand as a `w`-lane vector: its ops rebuilt over `read` (the lanes' reads as one
    /// vector), each shared value (through `get`) broadcast; None if `get` misses one.
    pub(crate) fn over(
        &self,
        read: &Arc<UOp>,
        w: u8,
        get: &impl Fn(&Arc<UOp>) -> Option<Arc<UOp>>,
    ) -> Option<Arc<UOp>> {
        let mut memo: HashMap<*const UOp, Arc<UOp>> = HashMap::default();
        memo.insert(Arc::as_ptr(&self.lane.value), read.clone());
        // post-order over the ops (operands first)
        let mut stack = vec![(self.value.clone(), false)];
        while let Some((n, expanded)) = stack.pop() {
            let key = Arc::as_ptr(&n);
            if memo.contains_key(&key) {
                continue;
            }
            if !self.ops.contains(&key) {
                let shared = get(&n)?;
                let vt = DType::vec(shared.dtype().scalar()?, w);
                memo.insert(key, UOp::new(Op::Vectorize, vt, Arg::None, vec![shared]));
            } else if expanded {
                let src = n.src().iter().map(|s| memo.get(&Arc::as_ptr(s)).cloned()).collect::<Option<_>>()?;
                memo.insert(key, UOp::new(n.op(), DType::vec(n.dtype().scalar()?, w), Arg::None, src));
            } else {
                stack.push((n.clone(), true));
                stack.extend(n.src().iter().map(|s| (s.clone(), false)));
            }
        }
        memo.get(&Arc::as_ptr(&self.value)).cloned()
    }
}

/// `v` as a lane operand: a read, or up to [`MAX_OPS`] lane-wise ops (`liftable`, scalar,
/// without an arg) over exactly one read (which they may use more than once: a ReLU's `WHERE`)
/// and values without one.
pub(crate) fn mapped_lane_of(v: &Arc<UOp>, liftable: impl Fn(Op) -> bool) -> Option<Mapped> {
    let mut ops: HashSet<*const UOp> = HashSet::default();
    let mut read: Option<Lane> = None;
    let mut stack = vec![v];
    let mut seen: HashSet<*const UOp> = HashSet::default();
    while let Some(n) = stack.pop() {
        if !seen.insert(Arc::as_ptr(n)) {
            continue;
        }
        if n.op() == Op::Load || n.op() == Op::Gep {
            let lane = lane_of(n)?;
            if read.as_ref().is_some_and(|r| !Arc::ptr_eq(&r.value, n)) {
                return None; // a second read
            }
            read = Some(lane);
        } else if liftable(n.op()) && n.dtype().width() == 1 && *n.arg() == Arg::None {
            if ops.len() == MAX_OPS {
                return None;
            }
            ops.insert(Arc::as_ptr(n));
            stack.extend(n.src());
        }
    }
    let lane = read?;
    // an op that does not reach the read is a value the lanes share
    let mut reaches: HashSet<*const UOp> = HashSet::default();
    reaches.insert(Arc::as_ptr(&lane.value));
    let nodes: Vec<&Arc<UOp>> = ops_of(v, &ops);
    while let Some(n) = nodes
        .iter()
        .find(|n| !reaches.contains(&Arc::as_ptr(n)) && n.src().iter().any(|s| reaches.contains(&Arc::as_ptr(s))))
    {
        reaches.insert(Arc::as_ptr(n));
    }
    ops.retain(|o| reaches.contains(o));
    Some(Mapped { value: v.clone(), lane, ops })
}

/// The nodes under `v` that are in `ops` (walking through them only).
fn ops_of<'a>(v: &'a Arc<UOp>, ops: &HashSet<*const UOp>) -> Vec<&'a Arc<UOp>> {
    let (mut out, mut stack) = (Vec::new(), vec![v]);
    let mut seen: HashSet<*const UOp> = HashSet::default();
    while let Some(n) = stack.pop() {
        if ops.contains(&Arc::as_ptr(n)) && seen.insert(Arc::as_ptr(n)) {
            out.push(n);
            stack.extend(n.src());
        }
    }
    out
}

/// `base + c` as (base, c); a constant address as (None, c).
pub(crate) fn split_offset(addr: &Arc<UOp>) -> (Option<Arc<UOp>>, i64) {
    if let Some(c) = const_int(addr) {
        return (None, c);
    }
    if addr.op() == Op::Add {
        let (a, b) = (&addr.src()[0], &addr.src()[1]);
        if let Some(c) = const_int(b) {
            return (Some(a.clone()), c);
        }
        if let Some(c) = const_int(a) {
            return (Some(b.clone()), c);
        }
    }
    (Some(addr.clone()), 0)
}

fn const_int(n: &Arc<UOp>) -> Option<i64> {
    (n.op() == Op::Const && n.dtype().is_int()).then(|| n.arg_int()).flatten()
}
