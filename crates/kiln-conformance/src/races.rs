//! Whether a kernel's result is deterministic: [`races`] enumerates on the host the addresses
//! every work item touches and says whether two items may touch one element with at least one
//! of them writing it. Where they may, the result depends on the order the items run in, and
//! two backends (or two compiler pairs of one) may legitimately differ; the differential tests
//! compare only where they may not.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kiln_device::kiln_ir::{Arg, DType, Op, UOp};

use crate::host::{Value, normalize};
use crate::reference;

/// Most points (launch items × the loop trips an address depends on) enumerated per access.
const MAX_POINTS: i128 = 1 << 18;

/// The items seen at one element: at most two distinct ones, which is all a race needs (two
/// writers, or a reader that is not the only writer: of two distinct readers one is not it).
#[derive(Default)]
struct Items(Vec<i128>);

impl Items {
    fn add(&mut self, item: i128) {
        if self.0.len() < 2 && !self.0.contains(&item) {
            self.0.push(item);
        }
    }
}

/// Whether two work items of `sink`, launched with variable values `vals` (in the order of the
/// variables' names, as [`kiln_device::ProgramSpec::vars`]), may touch one element with at
/// least one of them writing it.
///
/// Buffers of different slots are taken not to overlap (the caller launches it so), and loads
/// from a buffer that no store writes are left out: they cannot race, wherever they read.
///
/// `None` when the other addresses can't be enumerated on the host: they depend on loaded data
/// or on a float, an access is not to a parameter, a loop extent depends on another loop, or
/// there are more than 2^18 points to one access. A caller treats `None` as "may race".
///
/// Every launch index (`gidxN`, `lidxN`, `idxN`, `core_id`) is enumerated as an axis of its
/// own and a work item is the tuple of them all; two indices of one hardware axis (`core_id`
/// and `gidx0`) then enumerate points that never run, which can only add conflicts, never hide
/// one, so the answer errs towards "may race".
pub fn races(sink: &Arc<UOp>, vals: &[i64]) -> Option<bool> {
    let nodes = sink.toposort();
    let mut vars: Vec<&Arc<UOp>> = nodes.iter().filter(|n| n.op() == Op::DefineVar).collect();
    vars.sort_by_key(|v| v.arg_name().map(str::to_string));
    let mut env: HashMap<*const UOp, i128> = HashMap::new();
    for (v, &x) in vars.iter().zip(vals) {
        env.insert(Arc::as_ptr(v), x as i128);
    }
    // Every work item runs every access, whether or not its address uses the item's index (a
    // store to a constant address from many items races), so every launch axis is enumerated.
    let specials: Vec<Arc<UOp>> = nodes.iter().filter(|n| n.op() == Op::Special).cloned().collect();
    let accesses: Vec<(&Arc<UOp>, i64)> = nodes
        .iter()
        .filter(|n| matches!(n.op(), Op::Load | Op::Store))
        .map(|access| {
            let index = &access.src()[0];
            let param =
                Some(index).filter(|i| i.op() == Op::Index).map(|i| &i.src()[0]).filter(|p| p.op() == Op::Param)?;
            Some((access, param.arg_int()?))
        })
        .collect::<Option<_>>()?;
    // A buffer no item writes is read by any number of items in any order: its loads, at
    // whatever address (one read from memory, a gather's), take no part.
    let written: HashSet<i64> = accesses.iter().filter(|(a, _)| a.op() == Op::Store).map(|&(_, slot)| slot).collect();
    // (slot, element) -> the items writing it, and those reading it.
    let mut writes: HashMap<(i64, i128), Items> = HashMap::new();
    let mut reads: HashMap<(i64, i128), Items> = HashMap::new();
    for (access, slot) in accesses.into_iter().filter(|(_, slot)| written.contains(slot)) {
        let index = &access.src()[0];
        let width = if access.op() == Op::Load { access.dtype() } else { access.src()[1].dtype() }.width() as i128;
        let gate = (access.src().len() == 3).then(|| access.src()[2].clone());
        // The launch axes, with the loops the address or the gate depends on.
        let mut axes = specials.clone();
        for root in std::iter::once(&index.src()[1]).chain(gate.as_ref()) {
            for n in root.toposort() {
                if matches!(n.op(), Op::Special | Op::Range) && !axes.iter().any(|a| Arc::ptr_eq(a, &n)) {
                    axes.push(n);
                }
            }
        }
        let extents: Vec<i128> = axes.iter().map(|a| eval(&a.src()[0], &env)).collect::<Option<_>>()?;
        if extents.contains(&0) {
            continue;
        }
        if extents.iter().try_fold(1i128, |acc, &e| acc.checked_mul(e.max(0))).is_none_or(|n| n > MAX_POINTS) {
            return None;
        }
        let map = if access.op() == Op::Store { &mut writes } else { &mut reads };
        let mut point = vec![0i128; axes.len()];
        'points: loop {
            let mut local = env.clone();
            let mut item = 0i128;
            for ((a, &x), &e) in axes.iter().zip(&point).zip(&extents) {
                local.insert(Arc::as_ptr(a), x);
                if a.op() == Op::Special {
                    item = item.wrapping_mul(e.max(1)).wrapping_add(x);
                }
            }
            let on = match &gate {
                Some(g) => eval(g, &local)? != 0,
                None => true,
            };
            if on {
                let at = eval(&index.src()[1], &local)?;
                for lane in 0..width {
                    map.entry((slot, at + lane)).or_default().add(item);
                }
            }
            // Next point of the odometer.
            for k in (0..point.len()).rev() {
                point[k] += 1;
                if point[k] < extents[k] {
                    continue 'points;
                }
                point[k] = 0;
            }
            break;
        }
    }
    Some(
        writes
            .iter()
            .any(|(at, w)| w.0.len() > 1 || reads.get(at).is_some_and(|r| r.0.iter().any(|i| !w.0.contains(i)))),
    )
}

/// The integer (or bool, as 0/1) value of the scalar `node` at the launch point `env`, with
/// kiln's integer semantics ([`reference::alu`]); `None` for anything that depends on memory or
/// is not an integer or bool scalar.
fn eval(node: &Arc<UOp>, env: &HashMap<*const UOp, i128>) -> Option<i128> {
    if let Some(&v) = env.get(&Arc::as_ptr(node)) {
        return Some(v);
    }
    let DType::Scalar(s) = node.dtype() else { return None };
    if s.is_float() {
        return None;
    }
    let src = node.src();
    match node.op() {
        Op::Const => match node.arg() {
            Arg::Int(v) => Some(*v as i128),
            Arg::Bool(b) => Some(*b as i128),
            _ => None,
        },
        Op::Cast if matches!(src[0].dtype(), DType::Scalar(from) if !from.is_float()) => {
            Some(normalize(Value::I(eval(&src[0], env)?), s).as_i128())
        }
        op if op.is_alu() => {
            // A comparison computes on its operands' type; WHERE's condition is a bool.
            let on = if op.is_comparison() { src[0].dtype().scalar()? } else { s };
            if on.is_float() {
                return None;
            }
            let args: Vec<Value> = src.iter().map(|x| eval(x, env).map(Value::I)).collect::<Option<_>>()?;
            reference::alu(op, on, &args).map(Value::as_i128)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use kiln_device::kiln_ir::parse;

    use super::*;

    /// `out[store_at] = a[(i << 1) >> 1]` over the items `i < n` of launch index `axis`.
    fn copy(axis: &str, store_at: &str) -> Arc<UOp> {
        let text = format!(
            "%n = DEFINE_VAR i32 \"n\" 1 64\n%a = PARAM ptr<f32> 0 (%n)\n%o = PARAM ptr<f32> 1 (%n)\n\
             %i = SPECIAL i32 \"{axis}\" (%n)\n%one = CONST i32 1\n%sh = SHL i32 (%i, %one)\n\
             %half = SHR i32 (%sh, %one)\n%pa = INDEX ptr<f32> (%a, %half)\n%x = LOAD f32 (%pa)\n\
             %po = INDEX ptr<f32> (%o, {store_at})\n%st = STORE void (%po, %x)\nSINK void (%st)"
        );
        parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn one_writer_per_element_is_deterministic_on_every_launch_index() {
        for axis in ["gidx0", "idx0", "core_id"] {
            assert_eq!(races(&copy(axis, "%i"), &[9]), Some(false), "{axis}");
        }
    }

    #[test]
    fn many_items_storing_to_one_element_race() {
        assert_eq!(races(&copy("gidx0", "%one"), &[9]), Some(true));
        // With one item there is no one to race with.
        assert_eq!(races(&copy("gidx0", "%one"), &[1]), Some(false));
    }

    #[test]
    fn an_item_reading_what_another_writes_races() {
        // a[i] = a[(i + 1) % n]: item i reads what item i + 1 writes, unless there is one item.
        let text = "%n = DEFINE_VAR i32 \"n\" 1 64\n%a = PARAM ptr<f32> 0 (%n)\n\
                    %i = SPECIAL i32 \"gidx0\" (%n)\n%one = CONST i32 1\n%j = ADD i32 (%i, %one)\n\
                    %m = MOD i32 (%j, %n)\n%pa = INDEX ptr<f32> (%a, %m)\n%x = LOAD f32 (%pa)\n\
                    %po = INDEX ptr<f32> (%a, %i)\n%st = STORE void (%po, %x)\nSINK void (%st)";
        let sink = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(races(&sink, &[4]), Some(true));
        assert_eq!(races(&sink, &[1]), Some(false));
    }

    #[test]
    fn reads_of_a_buffer_no_item_writes_never_race() {
        // out[i] = a[idx[i]]: a gather, whatever the indices hold.
        let text = "%a = CONST i32 8\n%t = PARAM ptr<f32> 0 (%a)\n%p = PARAM ptr<i32> 1 (%a)\n\
                    %o = PARAM ptr<f32> 2 (%a)\n%i = SPECIAL i32 \"gidx0\" (%a)\n%pi = INDEX ptr<i32> (%p, %i)\n\
                    %x = LOAD i32 (%pi)\n%pt = INDEX ptr<f32> (%t, %x)\n%v = LOAD f32 (%pt)\n\
                    %po = INDEX ptr<f32> (%o, %i)\n%st = STORE void (%po, %v)\nSINK void (%st)";
        assert_eq!(races(&parse(text).unwrap_or_else(|e| panic!("{e}")), &[]), Some(false));
    }

    #[test]
    fn addresses_from_memory_cannot_be_enumerated() {
        let text = "%a = CONST i32 8\n%p = PARAM ptr<i32> 0 (%a)\n%i = SPECIAL i32 \"gidx0\" (%a)\n\
                    %pi = INDEX ptr<i32> (%p, %i)\n%x = LOAD i32 (%pi)\n%po = INDEX ptr<i32> (%p, %x)\n\
                    %st = STORE void (%po, %i)\nSINK void (%st)";
        assert_eq!(races(&parse(text).unwrap_or_else(|e| panic!("{e}")), &[]), None);
    }
}
