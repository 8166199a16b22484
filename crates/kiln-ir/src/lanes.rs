//! Where the lanes of a vector are read from, and the order a rewrite that builds vectors from
//! scalars visits a graph in: what the register tiles ([`crate::outer`]) and their epilogues
//! ([`crate::epilogue`]) share.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::{DType, Op, UOp};

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
