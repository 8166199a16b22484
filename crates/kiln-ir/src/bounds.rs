//! Bounds proof: every LOAD and STORE of a kernel stays inside its buffer.
//!
//! An interval analysis (each integer node's `[min, max]`, like tinygrad's `vmin`/`vmax`)
//! over the kernel graph, iterative over [`UOp::toposort`] so graph depth never matters.
//! Its inputs are the variables' bounds, the launch sizes (SPECIAL), loop extents (RANGE),
//! constants, and the gate of a gated LOAD or STORE: an access only touches memory when its
//! gate holds, so the gate's conditions (`x < e`, `x <= e`, `x == e`, NOT of these, and
//! conjunctions with AND) narrow the intervals of the nodes they compare, and the narrowing
//! flows into every expression built from those nodes (gate `i < n`, index `i*4 + 2`). An
//! access inside IF blocks (one that depends on an IF and not on its ENDIF) only runs where
//! their conditions hold, so they narrow it like a gate.
//!
//! # Relations
//! Intervals forget how values are related: under the gate `r2 + r1 > 43` the index
//! `20·r2 + 20·r1 + r0 − 880` still starts at −880. Where intervals fail, the index, the
//! gate's comparisons and the loop and launch extents are read as linear forms over the same
//! atoms and the atoms eliminated (Fourier–Motzkin, `bounds/linear.rs`); the bounds found are
//! intersected with the intervals, so the result is never weaker. When the kernel is built
//! the index is also related to the buffer's length expression, whose variables are the
//! kernel's: `idx0 < n` into `n` elements needs no launch check.
//!
//! # What an access touches
//! An access goes through a chain of INDEX (and AFTER) nodes ending at a PARAM. Renderers
//! turn `INDEX(INDEX(p, a), b)` into `p + a + b` in *elements of the buffer's scalar*, and a
//! `w`-wide access (`ptr<f32x8>`) touches `w` consecutive elements from there. So an access
//! touches elements `[a + b, a + b + w - 1]`; it is in bounds when that lies in
//! `[0, len)`, `len` being the slot's declared element count (the size every launch checks
//! the buffer against). A chain may end at a DEFINE_LOCAL instead: work-group local memory,
//! whose `len` is its static element count.
//!
//! # Integer semantics assumed
//! ADD/SUB/MUL/NEG/SHL wrap in the node's dtype; IDIV truncates toward zero and MOD takes the
//! sign of the dividend, with `x / 0 == 0`, `x % 0 == x`, `MIN / -1 == MIN` and
//! `MIN % -1 == 0`; SHL/SHR take the shift count modulo the bit width; CAST between integers
//! wraps, float to integer saturates. Whenever an intermediate may leave its dtype's range
//! its interval becomes the whole range (the analysis never relies on a wrapped value).
//!
//! Host-side sizes (launch sizes and buffer lengths) are evaluated by [`crate::eval_int`],
//! in checked `i64` arithmetic with casts ignored; the analysis models that separately
//! ("host mode"), and a launch index takes the larger of the kernel's and the host's view of
//! its extent (the CPU loops to the kernel's, OpenCL launches the host's).
//!
//! # Two stages
//! [`Bounds::prove`] runs once per kernel, with every variable over its declared bounds: an
//! access proven there is never looked at again. The rest (an access whose safety depends
//! on the launch, such as `idx0 < n` into a buffer of `m`) is kept with the part of the graph
//! it needs, and [`Bounds::check`] decides it at launch from the bound values, where every
//! variable and launch size is a single number: intervals first, elimination only for an
//! access they cannot settle.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::dtype::{DType, Scalar};
use crate::symbolic::variables_sorted;
use crate::uop::{Arg, Op, UOp};

mod linear;

use linear::{Bound, HostView, View};

/// A closed integer interval `[lo, hi]`; empty when `lo > hi` (a value that never exists,
/// such as the index of a loop that runs zero times).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The smallest possible value (inclusive).
    pub lo: i128,
    /// The largest possible value (inclusive).
    pub hi: i128,
}

impl Interval {
    /// Nothing known (floats, pointers, overflow).
    pub const ANY: Interval = Interval { lo: i128::MIN, hi: i128::MAX };
    /// No value at all (the canonical empty interval).
    pub const EMPTY: Interval = Interval { lo: 1, hi: 0 };
    const BOOL: Interval = Interval { lo: 0, hi: 1 };

    /// `[lo, hi]`; empty when `lo > hi`.
    pub const fn new(lo: i128, hi: i128) -> Interval {
        Interval { lo, hi }
    }

    /// Exactly `v` (a constant, or a variable's bound value at launch).
    pub const fn point(v: i128) -> Interval {
        Interval { lo: v, hi: v }
    }

    /// Whether no value lies in it.
    pub const fn is_empty(self) -> bool {
        self.lo > self.hi
    }

    /// Whether `lo <= v <= hi`.
    pub const fn contains(self, v: i128) -> bool {
        self.lo <= v && v <= self.hi
    }

    fn within(self, outer: Interval) -> bool {
        self.lo >= outer.lo && self.hi <= outer.hi
    }

    /// The smallest interval holding both (a value that is one or the other); an empty
    /// side adds nothing.
    pub fn hull(self, o: Interval) -> Interval {
        if self.is_empty() {
            o
        } else if o.is_empty() {
            self
        } else {
            Interval::new(self.lo.min(o.lo), self.hi.max(o.hi))
        }
    }

    /// The values in both (empty when they do not overlap).
    pub fn intersect(self, o: Interval) -> Interval {
        Interval::new(self.lo.max(o.lo), self.hi.min(o.hi))
    }
}

/// An access that could not be proven in bounds, as [`Bounds::check`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfBounds {
    /// The LOAD or STORE: its `%N` number in [`crate::print`] order (`root.toposort()`, the
    /// numbering [`crate::validate`] uses). For a kernel printed by `print`, `%N` is on line
    /// `N + 2` of the text (after the header line).
    pub node: usize,
    /// `LOAD` or `STORE`.
    pub op: &'static str,
    /// The buffer slot, or `None` when the address is not an INDEX chain over a PARAM.
    pub slot: Option<usize>,
    /// The DEFINE_LOCAL (its `%N`) when the address is an INDEX chain over local memory.
    pub local: Option<usize>,
    /// The elements the access may touch, `first..=last` (in the buffer's scalar elements).
    pub first: i128,
    /// The last element the access may touch (inclusive).
    pub last: i128,
    /// The slot's element count for this launch (local memory: its static size).
    pub len: i128,
    /// The access ran under an inline guard ([`crate::guard`]) and tried to touch element
    /// `first` (`== last`), which the guard prevented; otherwise the proof could not show
    /// that it stays inside and the launch was refused.
    pub guarded: bool,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = |v: i128| if v.unsigned_abs() >= 1 << 62 { "unbounded".to_string() } else { v.to_string() };
        let memory = match (self.slot, self.local) {
            (Some(slot), _) => format!("buffer {slot}"),
            (None, Some(node)) => format!("local memory %{node}"),
            (None, None) => {
                return write!(
                    f,
                    "%{} {} accesses memory through a pointer that is not an INDEX of a buffer PARAM, which cannot be proven in bounds",
                    self.node, self.op
                );
            }
        };
        if self.guarded {
            return write!(
                f,
                "%{} {} tried to access element {} of {memory}, which holds {} element(s); its guard skipped the access \
                 (a load read its alternative value); bound the index or declare a larger buffer",
                self.node, self.op, self.first, self.len
            );
        }
        write!(
            f,
            "%{} {} may access elements {}..={} of {memory}, which holds {} element(s); \
             bound the index (a gate such as `idx < len`, a smaller launch) or declare a larger buffer",
            self.node,
            self.op,
            span(self.first),
            span(self.last),
            self.len
        )
    }
}

/// A launch index's source of values: `0..3` global axes, `3..6` local axes.
pub const LAUNCH_SLOTS: usize = 6;

/// The bounds proof of one kernel: what [`Bounds::prove`] could not settle, with the part of
/// the graph needed to settle it at launch. `Default` is a kernel without memory accesses.
#[derive(Clone, Debug, Default)]
pub struct Bounds {
    tape: Vec<Step>,
    /// The distinct (address, gate) pairs of the pending accesses: the accesses of an
    /// elementwise kernel all share one, which a launch then evaluates once.
    offsets: Vec<Offset>,
    /// Sorted by `offset`.
    pending: Vec<Access>,
}

/// One node of the analysed graph, its operands as positions in the tape.
#[derive(Clone, Debug)]
struct Step {
    op: Op,
    dtype: DType,
    /// The kernel's view of `dtype` (host mode derives its own).
    ty: Ty,
    src: Box<[u32]>,
    leaf: Leaf,
}

#[derive(Clone, Copy, Debug)]
enum Leaf {
    None,
    /// A DEFINE_VAR: its position in the sorted variables (the `vals` order).
    Var(usize),
    /// A SPECIAL: which launch size bounds it.
    Launch(usize),
    /// An integer or bool CONST.
    Const(i128),
}

/// `a < b` or `a <= b` (tape positions), known to hold whenever a gate holds.
#[derive(Clone, Copy, Debug)]
enum Fact {
    Lt(u32, u32),
    Le(u32, u32),
}

/// A LOAD or STORE.
#[derive(Clone, Debug)]
struct Access {
    node: usize,
    op: &'static str,
    slot: Option<usize>,
    /// Local memory: the DEFINE_LOCAL's `%N` and its static element count.
    local: Option<(usize, i128)>,
    width: i128,
    /// Its element offset, in [`Bounds::offsets`].
    offset: usize,
}

/// Where an access starts: the sum of the INDEX operands along its address chain, where
/// its gate and the conditions of its IF blocks hold.
#[derive(Clone, Debug)]
struct Offset {
    terms: Vec<u32>,
    gate: Option<Gate>,
}

#[derive(Clone, Debug)]
struct Gate {
    /// The conditions (bool nodes) that all hold when the access runs.
    nodes: Vec<u32>,
    /// A conjunct is the constant false: the access never happens.
    never: bool,
    facts: Vec<Fact>,
    /// The nodes (in tape order) between the facts' nodes and the offsets, re-evaluated
    /// with the narrowed intervals.
    cone: Vec<u32>,
}

/// Variable values: intervals while proving, numbers at launch.
#[derive(Clone, Copy)]
enum Vars<'a> {
    Boxes(&'a [Interval]),
    Points(&'a [i64]),
}

struct Env<'a> {
    vars: Vars<'a>,
    launch: [Interval; LAUNCH_SLOTS],
    /// Host mode: checked i64 arithmetic, casts ignored (what [`crate::eval_int`] computes).
    host: bool,
}

impl Env<'_> {
    fn var(&self, k: usize) -> Interval {
        match self.vars {
            Vars::Boxes(b) => b.get(k).copied().unwrap_or(Interval::ANY),
            Vars::Points(p) => p.get(k).map_or(Interval::ANY, |&v| Interval::point(v as i128)),
        }
    }
}

/// How values of a dtype behave: their range, width and signedness. `opaque` values
/// (floats, pointers) carry no interval.
#[derive(Clone, Copy, Debug)]
struct Ty {
    lim: Interval,
    bits: u32,
    signed: bool,
    is_bool: bool,
    opaque: bool,
}

impl Ty {
    /// How values of `dt` behave in the kernel, or on the host (`host`: every integer is an
    /// i64, as [`crate::eval_int`] computes).
    fn of(dt: DType, host: bool) -> Ty {
        let s = dt.scalar().filter(|_| !dt.is_ptr());
        match s {
            None => Ty { lim: Interval::ANY, bits: 0, signed: false, is_bool: false, opaque: true },
            Some(Scalar::Bool) => Ty { lim: Interval::BOOL, bits: 1, signed: false, is_bool: true, opaque: false },
            Some(s) if s.is_float() => Ty { lim: Interval::ANY, bits: 0, signed: false, is_bool: false, opaque: true },
            Some(_) if host => {
                Ty { lim: scalar_range(Scalar::I64), bits: 64, signed: true, is_bool: false, opaque: false }
            }
            Some(s) => Ty {
                lim: scalar_range(s),
                bits: s.size() as u32 * 8,
                signed: s.is_signed(),
                is_bool: false,
                opaque: false,
            },
        }
    }

    /// `v` if every value fits the type, else the whole range (the value may have wrapped).
    fn fit(self, v: Option<Interval>) -> Interval {
        match v {
            Some(v) if v.is_empty() || v.within(self.lim) => v,
            _ => self.lim,
        }
    }
}

fn scalar_range(s: Scalar) -> Interval {
    match s {
        Scalar::Bool => Interval::BOOL,
        s if s.is_float() => Interval::ANY,
        s if s.is_signed() => {
            let bits = s.size() as u32 * 8;
            Interval::new(-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        }
        s => Interval::new(0, (1i128 << (s.size() as u32 * 8)) - 1),
    }
}

impl Bounds {
    /// Proves what it can about every access of `sink` for all allowed variable values.
    ///
    /// `lens[slot]` is the element count each launch checks slot `slot`'s buffer against;
    /// `launch` the launch sizes (global axes 0..3, then local axes; a constant 1 where
    /// absent) and `launch_slot` which of them a SPECIAL's name reads. `sink` must have
    /// passed [`crate::validate`].
    pub fn prove(
        sink: &Arc<UOp>,
        lens: &[Arc<UOp>],
        launch: &[Arc<UOp>; LAUNCH_SLOTS],
        launch_slot: &dyn Fn(&str) -> Option<usize>,
    ) -> Bounds {
        // One graph over the kernel and the host-side sizes it is checked against. The
        // kernel's nodes come first in the same order, so tape positions below
        // `kernel_nodes` are `print`'s `%N` numbers.
        let mut all = vec![sink.clone()];
        all.extend(lens.iter().cloned());
        all.extend(launch.iter().cloned());
        let root = UOp::new(Op::Sink, DType::Void, Arg::None, all);
        let order = root.toposort();
        // The kernel is the root's first operand, so its nodes come first, ending with it.
        let kernel_nodes = order.iter().position(|n| Arc::ptr_eq(n, sink)).map_or(0, |p| p + 1);
        let pos: HashMap<*const UOp, u32> = order.iter().enumerate().map(|(i, n)| (Arc::as_ptr(n), i as u32)).collect();
        let at = |n: &Arc<UOp>| pos.get(&Arc::as_ptr(n)).copied().unwrap_or(0);
        let vars = variables_sorted(&order[..kernel_nodes]);
        let var_pos = |name: &str| vars.iter().position(|v| v.arg_name() == Some(name));
        let tape: Vec<Step> = order
            .iter()
            .map(|n| Step {
                op: n.op(),
                dtype: n.dtype(),
                ty: Ty::of(n.dtype(), false),
                src: n.src().iter().map(at).collect(),
                leaf: match (n.op(), n.arg()) {
                    (Op::DefineVar, _) => n.arg_name().and_then(var_pos).map_or(Leaf::None, Leaf::Var),
                    (Op::Special, _) => n.arg_name().and_then(launch_slot).map_or(Leaf::None, Leaf::Launch),
                    (Op::Const, Arg::Int(v)) => Leaf::Const(*v as i128),
                    (Op::Const, Arg::Bool(b)) => Leaf::Const(*b as i128),
                    _ => Leaf::None,
                },
            })
            .collect();

        // Host view first: the sizes every launch checks.
        let boxes: Vec<Interval> = vars
            .iter()
            .map(|v| match v.arg() {
                Arg::Var { min, max, .. } => Interval::new(*min as i128, *max as i128),
                _ => Interval::ANY,
            })
            .collect();
        let host_env = Env { vars: Vars::Boxes(&boxes), launch: [Interval::ANY; LAUNCH_SLOTS], host: true };
        let mut host = Vec::new();
        eval_tape(&tape, &host_env, &mut host);
        let launch_iv = std::array::from_fn(|k| host[at(&launch[k]) as usize]);
        let len_iv: Vec<Interval> = lens.iter().map(|l| host[at(l) as usize]).collect();
        let len_pos: Vec<u32> = lens.iter().map(at).collect();
        let env = Env { vars: Vars::Boxes(&boxes), launch: launch_iv, host: false };
        let mut cur = Vec::new();
        eval_tape(&tape, &env, &mut cur);

        let host_view = HostView { iv: &host, vars: &boxes, launch: std::array::from_fn(|k| at(&launch[k])) };
        let mut work = linear::Work::default();
        let mut saved = Vec::new();
        let mut offsets: Vec<Offset> = Vec::new();
        let mut known: HashMap<(Vec<u32>, Vec<u32>), usize> = HashMap::default();
        let mut ranges: Vec<Option<Interval>> = Vec::new();
        // Per offset, once needed: `ranges` narrowed by elimination over linear forms.
        let mut refined: Vec<Option<Option<Interval>>> = Vec::new();
        let mut pending = Vec::new();
        let blocks = if_blocks(&order[..kernel_nodes], &at);
        for (i, node) in order.iter().enumerate().take(kernel_nodes) {
            if !matches!(node.op(), Op::Load | Op::Store) {
                continue;
            }
            let (access, terms, mut conds) = Access::new(i, node, &at);
            conds.extend(blocks[i].iter().map(|&f| order[f as usize].src()[0].clone()));
            let key: Vec<u32> = conds.iter().map(at).collect();
            let offset = *known.entry((terms.clone(), key)).or_insert_with(|| {
                let gate = (!conds.is_empty()).then(|| Gate::new(&conds, &at, &terms, &tape));
                let o = Offset { gate, terms };
                ranges.push(o.eval(&tape, &mut cur, &env, &mut saved));
                refined.push(None);
                offsets.push(o);
                offsets.len() - 1
            });
            let access = Access { offset, ..access };
            let len = access.len(|s| len_iv.get(s).copied());
            if access.judge(ranges[offset], len).is_none() {
                continue;
            }
            // Intervals alone fail: relate the index to the gate, then to the buffer's
            // length expression (the same variables on both sides).
            let o = &offsets[offset];
            let mut at = Analysis {
                tape: &tape,
                cur: &mut cur,
                env: &env,
                saved: &mut saved,
                host: Some(&host_view),
                work: &mut work,
            };
            let range = *refined[offset].get_or_insert_with(|| o.refine(ranges[offset], &mut at));
            if access.judge(range, len).is_none() {
                continue;
            }
            let fits = range.is_some_and(|r| r.lo >= 0)
                && access.slot.and_then(|s| len_pos.get(s)).is_some_and(|&l| match o.linear(Some(l), &mut at) {
                    Some(Bound::Never) => true,
                    Some(Bound::Within(b)) => b.hi <= -access.width,
                    None => false,
                });
            if !fits {
                pending.push(access);
            }
        }
        compact(tape, offsets, pending)
    }

    /// Accesses left for [`Bounds::check`]: 0 when the kernel was proven for every allowed
    /// variable value.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The `%N` numbers ([`crate::print`] order) of the accesses left for [`Bounds::check`],
    /// ascending.
    pub fn pending_nodes(&self) -> Vec<usize> {
        let mut nodes: Vec<usize> = self.pending.iter().map(|a| a.node).collect();
        nodes.sort_unstable();
        nodes
    }

    /// Decides the accesses [`Bounds::prove`] left open, for one launch: `vals` the variable
    /// values (positional, sorted by name, already checked against their bounds), `launch`
    /// the launch sizes as in `prove` (1 where absent) and `lens[slot]` each slot's element
    /// count for these values.
    ///
    /// # Errors
    /// The first access (in [`crate::print`] order) that may leave its buffer for these values,
    /// with the elements it may touch and the buffer's length.
    pub fn check(&self, vals: &[i64], launch: &[i64; LAUNCH_SLOTS], lens: &[usize]) -> Result<(), OutOfBounds> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let env = Env { vars: Vars::Points(vals), launch: launch.map(|v| Interval::point(v as i128)), host: false };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.check_with(&env, lens, &mut scratch),
            Err(_) => self.check_with(&env, lens, &mut Scratch::default()),
        })
    }

    fn check_with(&self, env: &Env, lens: &[usize], scratch: &mut Scratch) -> Result<(), OutOfBounds> {
        let Scratch { cur, saved, work } = scratch;
        eval_tape(&self.tape, env, cur);
        // (offset, its interval, the interval refined by elimination once needed)
        let mut range = (usize::MAX, None, None);
        for access in &self.pending {
            if range.0 != access.offset {
                range = (access.offset, self.offsets[access.offset].eval(&self.tape, cur, env, saved), None);
            }
            let len = access.len(|s| lens.get(s).map(|&l| Interval::point(l as i128)));
            if access.judge(range.1, len).is_none() {
                continue;
            }
            let refined = *range.2.get_or_insert_with(|| {
                let mut at = Analysis { tape: &self.tape, cur, env, saved, host: None, work };
                self.offsets[access.offset].refine(range.1, &mut at)
            });
            if let Some(e) = access.judge(refined, len) {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// For each node, the IFs (tape positions) whose blocks it is in: those it depends on
/// without depending on their ENDIF.
pub(crate) fn if_blocks(kernel: &[Arc<UOp>], at: &dyn Fn(&Arc<UOp>) -> u32) -> Vec<Vec<u32>> {
    let mut blocks: Vec<Vec<u32>> = vec![Vec::new(); kernel.len()];
    if !kernel.iter().any(|n| n.op() == Op::If) {
        return blocks;
    }
    for (i, node) in kernel.iter().enumerate() {
        let mut b: Vec<u32> = node.src().iter().flat_map(|s| blocks[at(s) as usize].iter().copied()).collect();
        match node.op() {
            Op::If => b.push(i as u32),
            Op::EndIf => {
                let f = at(&node.src()[0]);
                b.retain(|&x| x != f);
            }
            _ => {}
        }
        b.sort_unstable();
        b.dedup();
        blocks[i] = b;
    }
    blocks
}

impl Access {
    /// The access `node` (`%i`), its offset terms and its gate (none or one condition).
    fn new(i: usize, node: &Arc<UOp>, at: &dyn Fn(&Arc<UOp>) -> u32) -> (Access, Vec<u32>, Vec<Arc<UOp>>) {
        let src = node.src();
        let mut terms = Vec::new();
        let mut ptr = &src[0];
        let (slot, local) = loop {
            match ptr.op() {
                Op::Index => {
                    terms.push(at(&ptr.src()[1]));
                    ptr = &ptr.src()[0];
                }
                Op::After => ptr = &ptr.src()[0],
                Op::Param => break (ptr.arg_int().and_then(|s| usize::try_from(s).ok()), None),
                Op::DefineLocal => {
                    let len = ptr.src()[0].arg_int().unwrap_or(0) as i128;
                    break (None, Some((at(ptr) as usize, len)));
                }
                _ => break (None, None),
            }
        };
        let gate = match node.op() {
            Op::Load | Op::Store if src.len() == 3 => vec![src[2].clone()],
            _ => Vec::new(),
        };
        let width = src[0].dtype().width().max(1) as i128;
        (Access { node: i, op: node.op().name(), slot, local, width, offset: 0 }, terms, gate)
    }

    /// The element count of the memory it accesses, given each slot's (`None`: unknown).
    fn len(&self, slot_len: impl Fn(usize) -> Option<Interval>) -> Interval {
        match (self.slot, self.local) {
            (Some(s), _) => slot_len(s).unwrap_or(Interval::EMPTY),
            (None, Some((_, len))) => Interval::point(len),
            (None, None) => Interval::EMPTY,
        }
    }

    /// `None` when an access starting in `range` (`None`: it never runs) stays in
    /// `[0, len)`; else what it may touch.
    fn judge(&self, range: Option<Interval>, len: Interval) -> Option<OutOfBounds> {
        let error = |touched: Interval| OutOfBounds {
            node: self.node,
            op: self.op,
            slot: self.slot,
            local: self.local.map(|(node, _)| node),
            first: touched.lo,
            last: touched.hi,
            len: len.lo,
            guarded: false,
        };
        if self.slot.is_none() && self.local.is_none() {
            return Some(error(Interval::ANY));
        }
        let range = range?;
        let touched = Interval::new(range.lo, range.hi.saturating_add(self.width - 1));
        let ok = !len.is_empty() && touched.lo >= 0 && touched.hi < len.lo;
        (!ok).then(|| error(touched))
    }
}

impl Offset {
    /// The offsets the access starts at where its gate holds, `None` if it never runs.
    /// `cur` holds every node's interval and is left as it was.
    fn eval(
        &self,
        tape: &[Step],
        cur: &mut [Interval],
        env: &Env,
        saved: &mut Vec<(u32, Interval)>,
    ) -> Option<Interval> {
        self.with_gate(tape, cur, env, saved, |cur| self.sum(cur)).flatten()
    }

    /// `f` of the intervals narrowed to where the gate holds, `None` when it never does.
    /// `cur` is left as it was.
    fn with_gate<R>(
        &self,
        tape: &[Step],
        cur: &mut [Interval],
        env: &Env,
        saved: &mut Vec<(u32, Interval)>,
        f: impl FnOnce(&[Interval]) -> R,
    ) -> Option<R> {
        saved.clear();
        let r = match &self.gate {
            None => Some(f(cur)),
            Some(g) => g.narrow(tape, cur, env, saved).map(|()| f(cur)),
        };
        for &(p, v) in saved.iter().rev() {
            cur[p as usize] = v;
        }
        r
    }

    /// `range` (its interval result, `None`: it never runs) intersected with the bounds
    /// that elimination over linear forms finds; `range` itself when that gives up.
    fn refine(&self, range: Option<Interval>, at: &mut Analysis) -> Option<Interval> {
        let range = range?;
        match self.linear(None, at) {
            Some(Bound::Never) => None,
            Some(Bound::Within(b)) => Some(range.intersect(b)).filter(|r| !r.is_empty()),
            None => Some(range),
        }
    }

    /// Bounds of the offset, less the host's value of the node `len` if given, where the
    /// gate holds ([`linear::bound`]).
    fn linear(&self, len: Option<u32>, at: &mut Analysis) -> Option<Bound> {
        let Analysis { tape, cur, env, saved, host, work } = at;
        let facts = self.gate.as_ref().map_or(&[][..], |g| &g.facts[..]);
        let bound = |cur: &[Interval]| linear::bound(&View { tape, cur, host: *host }, facts, &self.terms, len, work);
        self.with_gate(tape, cur, env, saved, bound).unwrap_or(Some(Bound::Never))
    }

    fn sum(&self, cur: &[Interval]) -> Option<Interval> {
        let mut sum = Interval::point(0);
        for &t in &self.terms {
            let v = cur[t as usize];
            if v.is_empty() {
                return None;
            }
            sum = add(sum, v).unwrap_or(Interval::ANY);
        }
        Some(sum)
    }
}

impl Gate {
    fn new(conds: &[Arc<UOp>], at: &dyn Fn(&Arc<UOp>) -> u32, terms: &[u32], tape: &[Step]) -> Gate {
        let mut facts = Vec::new();
        let mut never = false;
        let int_like = |n: &Arc<UOp>| n.dtype().is_int() || n.dtype().is_bool();
        let mut stack: Vec<(Arc<UOp>, bool)> = conds.iter().map(|c| (c.clone(), false)).collect();
        while let Some((n, negated)) = stack.pop() {
            let s = n.src();
            match (n.op(), negated) {
                (Op::And, false) | (Op::Or, true) if n.dtype().is_bool() => {
                    stack.extend(s.iter().map(|c| (c.clone(), negated)));
                }
                (Op::Not, _) if n.dtype().is_bool() => stack.push((s[0].clone(), !negated)),
                (Op::Const, _) if *n.arg() == Arg::Bool(negated) => never = true,
                (Op::Lt | Op::Le | Op::Eq | Op::Ne, _) if int_like(&s[0]) && int_like(&s[1]) => {
                    let (a, b) = (at(&s[0]), at(&s[1]));
                    match (n.op(), negated) {
                        (Op::Lt, false) => facts.push(Fact::Lt(a, b)),
                        (Op::Lt, true) => facts.push(Fact::Le(b, a)),
                        (Op::Le, false) => facts.push(Fact::Le(a, b)),
                        (Op::Le, true) => facts.push(Fact::Lt(b, a)),
                        (Op::Eq, false) | (Op::Ne, true) => facts.extend([Fact::Le(a, b), Fact::Le(b, a)]),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        // The offsets' operands, in tape order, that depend on a narrowed node.
        let narrowed: HashSet<u32> = facts.iter().flat_map(|f| f.nodes()).collect();
        let mut cone: HashSet<u32> = HashSet::default();
        let mut stack: Vec<u32> = terms.to_vec();
        while let Some(p) = stack.pop() {
            if cone.insert(p) {
                stack.extend(tape[p as usize].src.iter().copied());
            }
        }
        let mut cone: Vec<u32> = cone.into_iter().collect();
        cone.sort_unstable();
        let mut dirty: HashSet<u32> = HashSet::default();
        cone.retain(|&p| {
            let d = narrowed.contains(&p) || tape[p as usize].src.iter().any(|s| dirty.contains(s));
            if d {
                dirty.insert(p);
            }
            d
        });
        Gate { nodes: conds.iter().map(at).collect(), never, facts, cone }
    }

    /// Narrows `cur` in place to the executions where the gate holds, pushing the old
    /// values to `saved`; `None` when it never holds.
    fn narrow(&self, tape: &[Step], cur: &mut [Interval], env: &Env, saved: &mut Vec<(u32, Interval)>) -> Option<()> {
        if self.never || self.nodes.iter().any(|&n| cur[n as usize].is_empty() || cur[n as usize].hi < 1) {
            return None;
        }
        let set = |cur: &mut [Interval], saved: &mut Vec<(u32, Interval)>, p: u32, v: Interval| {
            if v != cur[p as usize] {
                saved.push((p, cur[p as usize]));
                cur[p as usize] = v;
            }
        };
        // Twice, so that chained facts (`i < j`, `j < n`) inform each other.
        for _ in 0..2 {
            for f in &self.facts {
                let (a, b, strict) = match *f {
                    Fact::Lt(a, b) => (a, b, 1),
                    Fact::Le(a, b) => (a, b, 0),
                };
                let (va, vb) = (cur[a as usize], cur[b as usize]);
                set(cur, saved, a, va.intersect(Interval::new(i128::MIN, vb.hi.saturating_sub(strict))));
                set(cur, saved, b, vb.intersect(Interval::new(va.lo.saturating_add(strict), i128::MAX)));
            }
        }
        if self.facts.iter().flat_map(|f| f.nodes()).any(|p| cur[p as usize].is_empty()) {
            return None;
        }
        // Carry the narrowing into what is built from the narrowed nodes. Both the old and
        // the recomputed interval hold wherever the gate does, so their intersection does.
        for &p in &self.cone {
            let step = &tape[p as usize];
            if step.src.iter().any(|s| saved.iter().any(|(q, _)| q == s)) {
                let v = eval_step(step, cur, env).intersect(cur[p as usize]);
                set(cur, saved, p, v);
            }
        }
        Some(())
    }
}

/// Buffers of one check, reused between launches on a thread.
#[derive(Default)]
struct Scratch {
    /// Every tape node's interval.
    cur: Vec<Interval>,
    /// Intervals overwritten while narrowing, to restore afterwards.
    saved: Vec<(u32, Interval)>,
    /// Forms and rows of an elimination.
    work: linear::Work,
}

/// What an elimination over one offset reads, and the buffers it works in.
struct Analysis<'a, 'e> {
    tape: &'a [Step],
    /// Every node's interval: narrowed in place while a gate holds, then restored.
    cur: &'a mut [Interval],
    env: &'a Env<'e>,
    /// The narrowing's undo list.
    saved: &'a mut Vec<(u32, Interval)>,
    /// The host's view, only while proving.
    host: Option<&'a HostView<'a>>,
    work: &'a mut linear::Work,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

impl Fact {
    fn nodes(&self) -> [u32; 2] {
        match *self {
            Fact::Lt(a, b) | Fact::Le(a, b) => [a, b],
        }
    }
}

/// Keeps only the steps and offsets `pending` reads, renumbered.
fn compact(tape: Vec<Step>, offsets: Vec<Offset>, mut pending: Vec<Access>) -> Bounds {
    if pending.is_empty() {
        return Bounds::default();
    }
    let mut used = vec![None; offsets.len()];
    let mut kept: Vec<Offset> = Vec::new();
    pending.sort_by_key(|a| a.offset);
    for a in &mut pending {
        a.offset = *used[a.offset].get_or_insert_with(|| {
            kept.push(offsets[a.offset].clone());
            kept.len() - 1
        });
    }
    let mut keep = vec![false; tape.len()];
    let mut stack: Vec<u32> = Vec::new();
    for o in &kept {
        stack.extend(&o.terms);
        if let Some(g) = &o.gate {
            stack.extend(&g.nodes);
            stack.extend(g.facts.iter().flat_map(|f| f.nodes()));
        }
    }
    while let Some(p) = stack.pop() {
        if !std::mem::replace(&mut keep[p as usize], true) {
            stack.extend(tape[p as usize].src.iter().copied());
        }
    }
    let mut new_pos = vec![0u32; tape.len()];
    let mut steps = Vec::new();
    for (i, step) in tape.into_iter().enumerate() {
        if keep[i] {
            new_pos[i] = steps.len() as u32;
            let src = step.src.iter().map(|&s| new_pos[s as usize]).collect();
            steps.push(Step { src, ..step });
        }
    }
    let remap = |v: &mut u32| *v = new_pos[*v as usize];
    for o in &mut kept {
        o.terms.iter_mut().for_each(remap);
        if let Some(g) = &mut o.gate {
            g.nodes.iter_mut().for_each(remap);
            g.cone.iter_mut().for_each(remap);
            for f in &mut g.facts {
                let (Fact::Lt(x, y) | Fact::Le(x, y)) = f;
                remap(x);
                remap(y);
            }
        }
    }
    Bounds { tape: steps, offsets: kept, pending }
}

/// Every node's interval, into `cur`.
fn eval_tape(tape: &[Step], env: &Env, cur: &mut Vec<Interval>) {
    cur.clear();
    for step in tape {
        let v = eval_step(step, cur, env);
        cur.push(v);
    }
}

/// The interval of one node from its operands' intervals in `cur`.
fn eval_step(step: &Step, cur: &[Interval], env: &Env) -> Interval {
    let ty = if env.host { Ty::of(step.dtype, true) } else { step.ty };
    let arg = |k: usize| step.src.get(k).map_or(Interval::ANY, |&p| cur[p as usize]);
    match step.op {
        Op::Const => match step.leaf {
            Leaf::Const(v) => ty.fit(Some(Interval::point(v))),
            _ => ty.lim,
        },
        Op::DefineVar => match step.leaf {
            Leaf::Var(k) => ty.fit(Some(env.var(k))),
            _ => ty.lim,
        },
        Op::Special => {
            let Leaf::Launch(slot) = step.leaf else { return ty.lim };
            let extent = arg(0).hull(env.launch[slot]);
            ty.fit(Some(Interval::new(0, extent.hi.saturating_sub(1))))
        }
        Op::Range => {
            let extent = arg(0);
            if extent.is_empty() { extent } else { ty.fit(Some(Interval::new(0, extent.hi.saturating_sub(1)))) }
        }
        Op::After | Op::Gep => arg(0),
        Op::Bind => ty.fit(Some(arg(1))),
        Op::Vectorize => (0..step.src.len()).map(arg).fold(Interval::EMPTY, Interval::hull),
        Op::Cast => {
            let a = arg(0);
            if env.host || a.is_empty() {
                a
            } else if ty.is_bool {
                if a == Interval::point(0) {
                    a
                } else if a.contains(0) {
                    Interval::BOOL
                } else {
                    Interval::point(1)
                }
            } else {
                // Float sources saturate: their ANY becomes the whole range.
                ty.fit(Some(a))
            }
        }
        op if op.is_alu() => {
            let args: [Interval; 3] = [arg(0), arg(1), arg(2)];
            let args = &args[..step.src.len().min(3)];
            if args.iter().any(|a| a.is_empty()) {
                return Interval::EMPTY;
            }
            alu(op, ty, args)
        }
        _ => ty.lim,
    }
}

fn alu(op: Op, t: Ty, v: &[Interval]) -> Interval {
    if op.is_comparison() {
        return compare(op, v[0], v[1]);
    }
    if t.opaque {
        return Interval::ANY;
    }
    let (a, b) = (v[0], v.get(1).copied().unwrap_or(Interval::ANY));
    let r = match op {
        Op::Add => add(a, b),
        Op::Sub => b.lo.checked_neg().zip(b.hi.checked_neg()).and_then(|(l, h)| add(a, Interval::new(h, l))),
        Op::Mul => mul(a, b),
        Op::MulAcc => mul(a, b).and_then(|p| add(p, v[2])),
        Op::Neg | Op::Not if t.is_bool => Some(Interval::new(1 - a.hi, 1 - a.lo)),
        Op::Neg => Some(Interval::new(-a.hi, -a.lo)),
        Op::Not if t.signed => Some(Interval::new(-a.hi - 1, -a.lo - 1)),
        Op::Not => Some(Interval::new(t.lim.hi - a.hi, t.lim.hi - a.lo)),
        Op::Abs if !t.signed || a.lo >= 0 => Some(a),
        Op::Abs if a.hi <= 0 => Some(Interval::new(-a.hi, -a.lo)),
        Op::Abs => Some(Interval::new(0, a.hi.max(-a.lo))),
        Op::Idiv => idiv(a, b),
        Op::Mod => Some(rem(a, b)),
        Op::Max => Some(Interval::new(a.lo.max(b.lo), a.hi.max(b.hi))),
        Op::Min => Some(Interval::new(a.lo.min(b.lo), a.hi.min(b.hi))),
        Op::Shl => mul(a, shift_pow(shift_count(b, t.bits))),
        Op::Shr => {
            let s = shift_count(b, t.bits);
            let (lo, hi) = (s.lo as u32, s.hi as u32);
            Some(Interval::new((a.lo >> lo).min(a.lo >> hi), (a.hi >> lo).max(a.hi >> hi)))
        }
        Op::And | Op::Or | Op::Xor => bitwise(op, t, a, b),
        Op::Where => Some(if v[0].lo >= 1 {
            v[1]
        } else if v[0].hi <= 0 {
            v[2]
        } else {
            v[1].hull(v[2])
        }),
        _ => None,
    };
    t.fit(r)
}

fn add(a: Interval, b: Interval) -> Option<Interval> {
    Some(Interval::new(a.lo.checked_add(b.lo)?, a.hi.checked_add(b.hi)?))
}

fn mul(a: Interval, b: Interval) -> Option<Interval> {
    // Values of up to 64 bits multiply in one widening instruction; i128 is the fallback.
    let m = |x: i128, y: i128| match (i64::try_from(x), i64::try_from(y)) {
        (Ok(x), Ok(y)) => Some(x as i128 * y as i128),
        _ => x.checked_mul(y),
    };
    let c = [m(a.lo, b.lo)?, m(a.lo, b.hi)?, m(a.hi, b.lo)?, m(a.hi, b.hi)?];
    Some(Interval::new(*c.iter().min()?, *c.iter().max()?))
}

/// Truncating division with `x / 0 == 0`. Over each sign of the divisor the quotient is
/// monotone in both operands, so the corners bound it.
fn idiv(a: Interval, b: Interval) -> Option<Interval> {
    let mut out = if b.contains(0) { Interval::point(0) } else { Interval::EMPTY };
    for part in [b.intersect(Interval::new(i128::MIN, -1)), b.intersect(Interval::new(1, i128::MAX))] {
        if part.is_empty() {
            continue;
        }
        // 64-bit division where it cannot overflow (i128 division is a slow library call).
        let d = |x: i128, y: i128| match (i64::try_from(x), i64::try_from(y)) {
            (Ok(x), Ok(y)) if y != -1 => Some((x / y) as i128),
            _ => x.checked_div(y),
        };
        let c = [d(a.lo, part.lo)?, d(a.lo, part.hi)?, d(a.hi, part.lo)?, d(a.hi, part.hi)?];
        out = out.hull(Interval::new(*c.iter().min()?, *c.iter().max()?));
    }
    Some(out)
}

/// Remainder with the dividend's sign and `x % 0 == x`: `|x % y| < |y|` and `|x % y| <= |x|`.
fn rem(a: Interval, b: Interval) -> Interval {
    let mut out = if b.contains(0) { a } else { Interval::EMPTY };
    let nonzero = [b.intersect(Interval::new(i128::MIN, -1)), b.intersect(Interval::new(1, i128::MAX))];
    let mags: Vec<(i128, i128)> = nonzero
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (x, y) = (p.lo.saturating_abs(), p.hi.saturating_abs());
            (x.min(y), x.max(y))
        })
        .collect();
    if let (Some(smallest), Some(largest)) = (mags.iter().map(|m| m.0).min(), mags.iter().map(|m| m.1).max()) {
        let r = if a.lo > -smallest && a.hi < smallest {
            a // |x| < |y| for every pair: x % y == x
        } else {
            Interval::new(
                if a.lo < 0 { a.lo.max(1 - largest) } else { 0 },
                if a.hi > 0 { a.hi.min(largest - 1) } else { 0 },
            )
        };
        out = out.hull(r);
    }
    out
}

/// The shift counts actually used: the count modulo the bit width.
fn shift_count(b: Interval, bits: u32) -> Interval {
    let all = Interval::new(0, bits.saturating_sub(1) as i128);
    if b.within(all) { b } else { all }
}

fn shift_pow(s: Interval) -> Interval {
    Interval::new(1i128 << s.lo.clamp(0, 126), 1i128 << s.hi.clamp(0, 126))
}

fn bitwise(op: Op, t: Ty, a: Interval, b: Interval) -> Option<Interval> {
    // Two known values (at launch, every variable is one): the exact result, which `fit`
    // then checks against the dtype like any other.
    if a.lo == a.hi && b.lo == b.hi {
        let (x, y) = (a.lo, b.lo);
        return Some(Interval::point(match op {
            Op::And => x & y,
            Op::Or => x | y,
            _ => x ^ y,
        }));
    }
    if t.is_bool {
        return Some(match op {
            Op::And => Interval::new(a.lo & b.lo, a.hi & b.hi),
            Op::Or => Interval::new(a.lo | b.lo, a.hi | b.hi),
            _ if a.lo == a.hi && b.lo == b.hi => Interval::point(a.lo ^ b.lo),
            _ => Interval::BOOL,
        });
    }
    // Below the next power of two above both: the bits a result can have.
    let ceiling = |hi: i128| if hi <= 0 { 0 } else { (1i128 << (128 - hi.leading_zeros()).min(126)) - 1 };
    match (op, a.lo >= 0, b.lo >= 0) {
        (Op::And, true, true) => Some(Interval::new(0, a.hi.min(b.hi))),
        (Op::And, true, false) => Some(Interval::new(0, a.hi)),
        (Op::And, false, true) => Some(Interval::new(0, b.hi)),
        (Op::Or, true, true) => Some(Interval::new(a.lo.max(b.lo), ceiling(a.hi.max(b.hi)))),
        (Op::Xor, true, true) => Some(Interval::new(0, ceiling(a.hi.max(b.hi)))),
        _ => None,
    }
}

fn compare(op: Op, a: Interval, b: Interval) -> Interval {
    let point_eq = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
    let disjoint = a.hi < b.lo || b.hi < a.lo;
    let (always, never) = match op {
        Op::Lt => (a.hi < b.lo, a.lo >= b.hi),
        Op::Le => (a.hi <= b.lo, a.lo > b.hi),
        Op::Eq => (point_eq, disjoint),
        _ => (disjoint, point_eq),
    };
    if always {
        Interval::point(1)
    } else if never {
        Interval::point(0)
    } else {
        Interval::BOOL
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{eval_int, parse_kernel};

    /// A kernel with its proof, checked the way a launch checks it.
    pub(crate) struct Case {
        sink: Arc<UOp>,
        lens: Vec<Arc<UOp>>,
        launch: [Arc<UOp>; LAUNCH_SLOTS],
        pub(crate) bounds: Bounds,
    }

    fn launch_slot(name: &str) -> Option<usize> {
        let axis: usize = name.trim_start_matches(|c: char| !c.is_ascii_digit()).parse().ok()?;
        Some(if name.starts_with("lidx") { 3 + axis } else { axis })
    }

    fn case(body: &str) -> Case {
        case_of(parse_kernel(body).unwrap_or_else(|e| panic!("{e}\n{body}")))
    }

    /// `sink` with its proof, its lengths and launch sizes derived as `ProgramSpec::from_sink`
    /// derives them (a slot's length from its first PARAM, launch sizes from SPECIAL extents).
    pub(crate) fn case_of(sink: Arc<UOp>) -> Case {
        let mut lens: Vec<Option<Arc<UOp>>> = Vec::new();
        let mut launch: [Arc<UOp>; LAUNCH_SLOTS] = std::array::from_fn(|_| UOp::index_const(1));
        for n in sink.toposort() {
            match n.op() {
                Op::Param => {
                    let slot = n.arg_int().unwrap() as usize;
                    if lens.len() <= slot {
                        lens.resize(slot + 1, None);
                    }
                    lens[slot].get_or_insert_with(|| n.src()[0].clone());
                }
                Op::Special => launch[launch_slot(n.arg_name().unwrap()).unwrap()] = n.src()[0].clone(),
                _ => {}
            }
        }
        let lens: Vec<Arc<UOp>> = lens.into_iter().map(|l| l.unwrap_or_else(|| UOp::index_const(0))).collect();
        let bounds = Bounds::prove(&sink, &lens, &launch, &launch_slot);
        Case { sink, lens, launch, bounds }
    }

    impl Case {
        /// Checks one launch with `vals` (sorted by variable name), sizes evaluated on the host.
        fn at(&self, vals: &[i64]) -> Result<(), OutOfBounds> {
            let names: Vec<String> =
                crate::symbolic::variables(&self.sink).iter().map(|v| v.arg_name().unwrap().to_string()).collect();
            let lookup = |name: &str| names.iter().position(|n| n == name).map(|i| vals[i]);
            let launch = std::array::from_fn(|k| eval_int(&self.launch[k], &lookup).unwrap());
            let lens: Vec<usize> = self.lens.iter().map(|l| eval_int(l, &lookup).unwrap() as usize).collect();
            self.bounds.check(vals, &launch, &lens)
        }

        /// The `%N` number of the only node with `op`.
        fn node(&self, op: Op) -> usize {
            let order = self.sink.toposort();
            let mut found = order.iter().enumerate().filter(|(_, n)| n.op() == op).map(|(i, _)| i);
            let i = found.next().unwrap();
            assert!(found.next().is_none(), "several {op}");
            i
        }
    }

    const STORE_ONE: &str = "%one = CONST f32 1.0\n%st = STORE void (%p, %one)\nSINK void (%st)\n";

    /// At launch every variable is one value, so a bitwise op of them is one value too: a
    /// length `m & n` of 0 (m = 2, n = 29) closes the gate `i <= (m & n) - 1` (the fuzzer's
    /// mutant whose guarded form was refused while `[0, 2]` stood for `2 & 29`).
    #[test]
    fn bitwise_ops_of_bound_values_are_exact_at_launch() {
        let c = case(
            "%m = DEFINE_VAR i32 \"m\" 1 64\n%n = DEFINE_VAR i32 \"n\" 1 64\n%mn = AND i32 (%m, %n)\n\
             %a = PARAM ptr<f32> 0 (%mn)\n%i = SPECIAL i32 \"idx0\" (%n)\n%p = INDEX ptr<f32> (%a, %i)\n\
             %one = CONST i32 1\n%last = SUB i32 (%mn, %one)\n%g = CMPLE bool (%i, %last)\n\
             %v = CONST f32 1.0\n%st = STORE void (%p, %v, %g)\nSINK void (%st)\n",
        );
        c.at(&[2, 29]).unwrap();
        c.at(&[3, 29]).unwrap();
        c.at(&[64, 64]).unwrap();
    }

    /// Issue 9: a PARAM of 4 elements stored at `idx0 < n`.
    #[test]
    fn a_store_past_a_four_element_param_is_refused_when_n_exceeds_4() {
        let c = case(&format!(
            "%n = DEFINE_VAR i32 \"n\" 1 1024\n%four = CONST i32 4\n%a = PARAM ptr<f32> 0 (%four)\n\
             %i = SPECIAL i32 \"idx0\" (%n)\n%p = INDEX ptr<f32> (%a, %i)\n{STORE_ONE}"
        ));
        assert_eq!(c.bounds.pending(), 1);
        for n in 1..=4 {
            c.at(&[n]).unwrap();
        }
        let e = c.at(&[5]).unwrap_err();
        let store = c.node(Op::Store);
        assert_eq!(
            e,
            OutOfBounds {
                node: store,
                op: "STORE",
                slot: Some(0),
                local: None,
                first: 0,
                last: 4,
                len: 4,
                guarded: false
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("%{store} STORE")) && msg.contains("0..=4 of buffer 0") && msg.contains("holds 4")
        );
    }

    /// Issue 9: an 8-wide copy over `idx0 < n` of n-element buffers reads 7 elements past
    /// the end; stepping by 8 over n / 8 items is fine.
    #[test]
    fn vector_accesses_count_their_width() {
        // `items` work items, each copying 8 elements from `at` on, gated by `at < n`.
        let copy = |items: &str, at: &str| {
            let (grouped, step) = if at == "%i8" {
                ("%eight = CONST i32 8\n%n8 = IDIV i32 (%n, %eight)\n", "%i8 = MUL i32 (%i, %eight)\n")
            } else {
                ("", "")
            };
            case(&format!(
                "%n = DEFINE_VAR i32 \"n\" 8 1024\n{grouped}\
                 %a = PARAM ptr<f32> 0 (%n)\n%b = PARAM ptr<f32> 1 (%n)\n\
                 %i = SPECIAL i32 \"idx0\" ({items})\n{step}%ok = CMPLT bool ({at}, %n)\n\
                 %pa = INDEX ptr<f32x8> (%a, {at})\n%pb = INDEX ptr<f32x8> (%b, {at})\n\
                 %z = CONST f32 0.0\n%zv = VECTORIZE f32x8 (%z)\n%x = LOAD f32x8 (%pa, %zv, %ok)\n\
                 %st = STORE void (%pb, %x, %ok)\nSINK void (%st)\n"
            ))
        };
        let bad = copy("%n", "%i");
        let e = bad.at(&[8]).unwrap_err();
        assert_eq!((e.op, e.slot, e.first, e.last, e.len), ("LOAD", Some(0), 0, 14, 8));
        let good = copy("%n8", "%i8");
        for n in [8, 15, 16, 17, 1000, 1024] {
            good.at(&[n]).unwrap_or_else(|e| panic!("n = {n}: {e}"));
        }
    }

    /// `%n` in [1, 1024], the lines of `pre`, `%i` = idx0 over `extent`, the lines of `body`
    /// (which define `%at` and may define `%gate`), and a store of 1.0 at `%at` of a buffer
    /// of `len` elements.
    fn store_case(pre: &str, extent: &str, body: &str, len: &str) -> Case {
        let gated = body.contains("%gate =");
        let store = if gated { "STORE void (%p, %one, %gate)" } else { "STORE void (%p, %one)" };
        case(&format!(
            "%n = DEFINE_VAR i32 \"n\" 1 1024\n{pre}%i = SPECIAL i32 \"idx0\" ({extent})\n{body}\n\
             %a = PARAM ptr<f32> 0 ({len})\n%p = INDEX ptr<f32> (%a, %at)\n%one = CONST f32 1.0\n\
             %st = {store}\nSINK void (%st)\n"
        ))
    }

    #[test]
    fn a_gate_narrows_every_expression_built_from_the_gated_node() {
        let pre = "%c4 = CONST i32 4\n%n4 = MUL i32 (%n, %c4)\n%ext = ADD i32 (%n, %c4)\n";
        let lines = |plus: i64| {
            format!(
                "%k = CONST i32 {plus}\n%m = MUL i32 (%i, %c4)\n%at = ADD i32 (%m, %k)\n%gate = CMPLT bool (%i, %n)"
            )
        };
        // Four items past n, masked by the gate: i*4 + 3 < 4n.
        let ok = store_case(pre, "%ext", &lines(3), "%n4");
        for n in [1, 2, 1000, 1024] {
            ok.at(&[n]).unwrap_or_else(|e| panic!("n = {n}: {e}"));
        }
        let e = store_case(pre, "%ext", &lines(4), "%n4").at(&[10]).unwrap_err();
        assert_eq!((e.first, e.last, e.len), (4, 40, 40));
    }

    #[test]
    fn conjunctions_and_negations_of_comparisons_narrow_both_sides() {
        // j = i - 1 runs from -1; each gate excludes j = -1 and j >= n in its own way.
        let pre = "%c1 = CONST i32 1\n%c0 = CONST i32 0\n%ext = ADD i32 (%n, %c1)\n";
        let at = "%at = SUB i32 (%i, %c1)\n%hi = CMPLT bool (%at, %n)\n";
        for gate in [
            "%lo = CMPLE bool (%c0, %at)\n%gate = AND bool (%lo, %hi)",
            "%neg = CMPLT bool (%at, %c0)\n%lo = NOT bool (%neg)\n%gate = AND bool (%hi, %lo)",
            "%neg = CMPLT bool (%at, %c0)\n%out = NOT bool (%hi)\n%any = OR bool (%neg, %out)\n%gate = NOT bool (%any)",
        ] {
            let c = store_case(pre, "%ext", &format!("{at}{gate}"), "%n");
            for n in [1, 7, 1024] {
                c.at(&[n]).unwrap_or_else(|e| panic!("{gate}: n = {n}: {e}"));
            }
        }
        // Without the lower bound, j = -1 is a store before the buffer.
        let e = store_case(pre, "%ext", &format!("{at}%lo = CMPLE bool (%c0, %c1)\n%gate = AND bool (%lo, %hi)"), "%n")
            .at(&[5])
            .unwrap_err();
        assert_eq!((e.first, e.last), (-1, 4));
    }

    #[test]
    fn an_index_that_may_overflow_its_dtype_is_unbounded() {
        // i * 1e6 wraps in i32 for i >= 2148 (n >= 716): refused however large the buffer.
        let pre = "%c3 = CONST i32 3\n%ext = MUL i32 (%n, %c3)\n%len = CONST i64 4000000000\n";
        let body =
            |ty: &str| format!("%big = CONST {ty} 1000000\n%wide = CAST {ty} (%i)\n%at = MUL {ty} (%wide, %big)");
        let e = store_case(pre, "%ext", &body("i32"), "%len").at(&[1000]).unwrap_err();
        assert_eq!((e.first, e.last), (i32::MIN as i128, i32::MAX as i128));
        assert!(e.to_string().contains("elements -2147483648..=2147483647"), "{e}");
        // The same product in i64 is exact, and proven for every n when the kernel is built.
        assert_eq!(store_case(pre, "%ext", &body("i64"), "%len").bounds.pending(), 0);
    }

    #[test]
    fn division_and_remainder_follow_the_defined_semantics() {
        let iv = Interval::new;
        assert_eq!(idiv(iv(0, 15), iv(0, 4)), Some(iv(0, 15))); // x / 0 == 0, x / 1 == x
        assert_eq!(idiv(iv(-8, 7), iv(-2, 2)), Some(iv(-8, 8)));
        assert_eq!(idiv(iv(10, 20), iv(3, 5)), Some(iv(2, 6)));
        assert_eq!(rem(iv(0, 15), iv(0, 4)), iv(0, 15)); // x % 0 == x
        assert_eq!(rem(iv(0, 15), iv(1, 4)), iv(0, 3));
        assert_eq!(rem(iv(-9, 9), iv(3, 3)), iv(-2, 2));
        assert_eq!(rem(iv(2, 5), iv(-8, -8)), iv(2, 5));
        // MIN / -1 wraps to MIN in i32: the quotient 2^31 leaves the range, so all of i32.
        let t = Ty::of(DType::I32, false);
        let min = Interval::point(i32::MIN as i128);
        assert_eq!(alu(Op::Idiv, t, &[min, Interval::point(-1)]), t.lim);
        assert_eq!(alu(Op::Mod, t, &[min, Interval::point(-1)]), Interval::point(0));

        // In a kernel: a % d with d possibly 0 is a itself.
        let c = case(
            "%d = DEFINE_VAR i32 \"d\" 0 8\n%c16 = CONST i32 16\n\
             %i = SPECIAL i32 \"idx0\" (%c16)\n%at = MOD i32 (%i, %d)\n%c8 = CONST i32 8\n\
             %a = PARAM ptr<f32> 0 (%c8)\n%p = INDEX ptr<f32> (%a, %at)\n%one = CONST f32 1.0\n\
             %st = STORE void (%p, %one)\nSINK void (%st)\n",
        );
        c.at(&[8]).unwrap();
        c.at(&[3]).unwrap();
        assert_eq!(c.at(&[0]).unwrap_err().last, 15);
    }

    #[test]
    fn accesses_that_never_run_need_no_bound() {
        // A loop of n - 1 iterations writing r + 1 < n; for n = 1 it runs zero times.
        let c = case(
            "%n = DEFINE_VAR i32 \"n\" 1 1024\n%c1 = CONST i32 1\n%m = SUB i32 (%n, %c1)\n\
             %r = RANGE i32 0 (%m)\n%at = ADD i32 (%r, %c1)\n%a = PARAM ptr<f32> 0 (%n)\n\
             %p = INDEX ptr<f32> (%a, %at)\n%one = CONST f32 1.0\n%s = STORE void (%p, %one)\n\
             %st = END void (%r, %s)\nSINK void (%st)\n",
        );
        for n in [1, 2, 1024] {
            c.at(&[n]).unwrap();
        }
        // Gates that never hold: a false constant, and i < 0 for a launch index.
        for gate in ["%gate = CONST bool false", "%c0 = CONST i32 0\n%gate = CMPLT bool (%i, %c0)"] {
            let c = store_case("", "%n", &format!("%c9 = CONST i32 9\n%at = ADD i32 (%i, %c9)\n{gate}"), "%n");
            assert_eq!(c.bounds.pending(), 0, "{gate}");
        }
    }

    #[test]
    fn a_pointer_that_is_not_an_index_chain_is_refused() {
        let c = case(
            "%n = DEFINE_VAR i32 \"n\" 1 1024\n%a = PARAM ptr<f32> 0 (%n)\n%b = PARAM ptr<f32> 1 (%n)\n\
             %i = SPECIAL i32 \"idx0\" (%n)\n%c0 = CONST i32 0\n%odd = CMPLT bool (%c0, %i)\n\
             %ptr = WHERE ptr<f32> (%odd, %a, %b)\n%x = LOAD f32 (%ptr)\n%pb = INDEX ptr<f32> (%b, %i)\n\
             %st = STORE void (%pb, %x)\nSINK void (%st)\n",
        );
        let e = c.at(&[4]).unwrap_err();
        assert_eq!((e.op, e.slot), ("LOAD", None));
        assert!(e.to_string().contains("not an INDEX of a buffer PARAM"), "{e}");
    }

    #[test]
    fn a_launch_size_that_overflows_its_index_dtype_is_refused() {
        // 300 items, whose count the kernel computes as an i8 (it would wrap to 44): the host
        // refuses to evaluate that launch size at all.
        let c = case(
            "%k = CONST i32 300\n%e = CAST i8 (%k)\n%i = SPECIAL i8 \"idx0\" (%e)\n%len = CONST i32 1000\n\
             %a = PARAM ptr<f32> 0 (%len)\n%p = INDEX ptr<f32> (%a, %i)\n%one = CONST f32 1.0\n\
             %st = STORE void (%p, %one)\nSINK void (%st)\n",
        );
        let err = eval_int(&c.launch[0], &|_| None).unwrap_err();
        assert!(matches!(&err, crate::IrError::Eval(m) if m.contains("does not fit i8")), "{err}");
    }

    /// `idx0 < n` through 100,000 additions of 0: into `n` elements it is proven when the
    /// kernel is built (the launch size and the length are the same `n`); into `m` elements
    /// it is a relation between two variables, decided at each launch.
    #[test]
    fn a_deep_index_expression_is_proven_without_recursion() {
        let var =
            |name: &str| UOp::new(Op::DefineVar, DType::I32, Arg::Var { name: name.into(), min: 1, max: 64 }, vec![]);
        let (m, n) = (var("m"), var("n"));
        let i = UOp::new(Op::Special, DType::I32, Arg::Str("idx0".into()), vec![n.clone()]);
        let zero = UOp::const_int(DType::I32, 0);
        let mut at = i;
        for _ in 0..100_000 {
            at = UOp::new(Op::Add, DType::I32, Arg::None, vec![at, zero.clone()]);
        }
        let launch: [Arc<UOp>; LAUNCH_SLOTS] =
            std::array::from_fn(|k| if k == 0 { n.clone() } else { UOp::index_const(1) });
        let prove = |len: &Arc<UOp>| {
            let a = UOp::new(Op::Param, DType::ptr(Scalar::F32), Arg::Int(0), vec![len.clone()]);
            let p = UOp::new(Op::Index, DType::ptr(Scalar::F32), Arg::None, vec![a, at.clone()]);
            let st = UOp::new(Op::Store, DType::Void, Arg::None, vec![p, UOp::const_float(DType::F32, 1.0)]);
            let sink = UOp::new(Op::Sink, DType::Void, Arg::None, vec![st]);
            Bounds::prove(&sink, std::slice::from_ref(len), &launch, &launch_slot)
        };
        assert_eq!(prove(&n).pending(), 0);
        let bounds = prove(&m);
        assert_eq!(bounds.pending(), 1);
        // vals sorted by name: m, n
        bounds.check(&[64, 64], &[64, 1, 1, 1, 1, 1], &[64]).unwrap();
        assert!(bounds.check(&[63, 64], &[64, 1, 1, 1, 1, 1], &[63]).is_err());
    }

    /// `lidx0` over `items` work items stores at `%at` of 64 elements of local memory, under
    /// the lines of `body` (which define `%at`).
    fn local_case(items: i64, body: &str) -> Case {
        case(&format!(
            "%ext = CONST i32 {items}\n%l = SPECIAL i32 \"lidx0\" (%ext)\n%c64 = CONST i32 64\n\
             %tmp = DEFINE_LOCAL lptr<f32> 0 (%c64)\n{body}\n%p = INDEX lptr<f32> (%tmp, %at)\n\
             %one = CONST f32 1.0\n%st = STORE void (%p, %one)\nSINK void (%st)\n"
        ))
    }

    #[test]
    fn local_memory_accesses_are_proven_against_its_static_size() {
        let fits = local_case(64, "%z = CONST i32 0\n%at = ADD i32 (%l, %z)");
        assert_eq!(fits.bounds.pending(), 0, "lidx0 < 64 indexes 64 elements: proven once");
        let over = local_case(65, "%z = CONST i32 0\n%at = ADD i32 (%l, %z)");
        let e = over.at(&[]).unwrap_err();
        let local = over.node(Op::DefineLocal);
        assert_eq!((e.slot, e.local, e.first, e.last, e.len), (None, Some(local), 0, 64, 64));
        assert!(e.to_string().contains(&format!("0..=64 of local memory %{local}, which holds 64")), "{e}");
    }

    /// The tree-reduction step `if (l < s) tmp[l] += tmp[l + s]` stays inside 64 elements:
    /// the IF's condition narrows `l` like a gate; without the IF, `l + s` reaches 95.
    #[test]
    fn accesses_inside_an_if_block_are_narrowed_by_its_condition() {
        let step = |guarded: bool| {
            let (open, close) = if guarded {
                (
                    "%if = IF void (%lt)\n%t2 = AFTER lptr<f32> (%tmp, %if)\n",
                    "%e = ENDIF void (%if, %st)\n%end = END void (%r, %e)",
                )
            } else {
                ("%t2 = AFTER lptr<f32> (%tmp, %lt)\n", "%end = END void (%r, %st)")
            };
            case(&format!(
                "%c64 = CONST i32 64\n%l = SPECIAL i32 \"lidx0\" (%c64)\n%tmp = DEFINE_LOCAL lptr<f32> 0 (%c64)\n\
                 %r = RANGE i32 0 (%c64)\n%c32 = CONST i32 32\n%s = SHR i32 (%c32, %r)\n%lt = CMPLT bool (%l, %s)\n\
                 {open}%ls = ADD i32 (%l, %s)\n%p1 = INDEX lptr<f32> (%t2, %ls)\n%x = LOAD f32 (%p1)\n\
                 %p0 = INDEX lptr<f32> (%t2, %l)\n%st = STORE void (%p0, %x)\n{close}\nSINK void (%end)\n"
            ))
        };
        let guarded = step(true);
        assert_eq!(guarded.bounds.pending(), 0, "proven for every launch");
        let bare = step(false);
        let e = bare.at(&[]).unwrap_err();
        assert_eq!((e.op, e.last, e.len), ("LOAD", 95, 64));
    }

    /// tinygrad's cumsum: the load reads `20·(r2 + r1) + r0 − 880` under the gate
    /// `r2 + r1 > 43`; intervals alone see −880, the gate as a row gives 0.
    fn cumsum(gate: i64, shift: i64) -> Case {
        case(&format!(
            "%0  = CONST i32 900\n%1  = PARAM ptr<i32> 0 (%0)\n%2  = PARAM ptr<i32> 1 (%0)\n\
             %3  = CONST i32 {shift}\n%4  = CONST i32 0\n%5  = CONST i32 20\n%6  = CONST i32 {gate}\n\
             %7  = CONST i32 45\n%8  = RANGE i32 0 (%5)\n%9  = MUL i32 (%8, %7)\n%10 = RANGE i32 1 (%7)\n\
             %11 = MUL i32 (%10, %5)\n%12 = RANGE i32 2 (%7)\n%13 = DEFINE_ACC i32 1 (%4, %12)\n\
             %14 = MUL i32 (%12, %5)\n%15 = ADD i32 (%14, %11)\n%16 = ADD i32 (%15, %8)\n\
             %17 = ADD i32 (%16, %3)\n%18 = INDEX ptr<i32> (%2, %17)\n%19 = ADD i32 (%12, %10)\n\
             %20 = CMPLT bool (%6, %19)\n%21 = LOAD i32 (%18, %4, %20)\n%22 = ADD i32 (%13, %21)\n\
             %23 = ASSIGN i32 (%13, %22)\n%24 = END i32 (%12, %23)\n%25 = ADD i32 (%9, %10)\n\
             %26 = INDEX ptr<i32> (%1, %25)\n%27 = STORE void (%26, %24)\n%28 = END void (%10, %27)\n\
             %29 = END void (%8, %28)\nSINK void (%29)\n"
        ))
    }

    #[test]
    fn a_multiple_of_a_gated_sum_is_proven() {
        assert_eq!(cumsum(43, -880).bounds.pending(), 0);
        // One more row under the gate reads 20 elements before the buffer; one more to the
        // left reads element -1.
        for (gate, shift, first) in [(42, -880, -20), (43, -881, -1)] {
            let c = cumsum(gate, shift);
            assert_eq!(c.bounds.pending_nodes(), vec![c.node(Op::Load)]);
            let e = c.at(&[]).unwrap_err();
            assert_eq!((e.op, e.first, e.last, e.len), ("LOAD", first, (899 + shift + 880) as i128, 900));
        }
    }

    /// `lidx0 + 4·gidx1 − 1` under `0 < gidx1 + lidx0`: `(gidx1 + lidx0) + 3·gidx1 − 1 ≥ 0`
    /// needs the gate and gidx1's interval together. `len` defines `%len`.
    fn shared_atoms(shift: i64, len: &str) -> Case {
        case(&format!(
            "%c8 = CONST i32 8\n%c4 = CONST i32 4\n%c0 = CONST i32 0\n%k = CONST i32 {shift}\n\
             {len}\n%c32 = CONST i32 32\n\
             %g = SPECIAL i32 \"gidx1\" (%c8)\n%l = SPECIAL i32 \"lidx0\" (%c4)\n\
             %a = PARAM ptr<f32> 0 (%len)\n%b = PARAM ptr<f32> 1 (%c32)\n\
             %g4 = MUL i32 (%g, %c4)\n%s = ADD i32 (%l, %g4)\n%at = ADD i32 (%s, %k)\n\
             %sum = ADD i32 (%g, %l)\n%gate = CMPLT bool (%c0, %sum)\n\
             %pa = INDEX ptr<f32> (%a, %at)\n%z = CONST f32 0.0\n%x = LOAD f32 (%pa, %z, %gate)\n\
             %pb = INDEX ptr<f32> (%b, %s)\n%st = STORE void (%pb, %x)\nSINK void (%st)\n"
        ))
    }

    #[test]
    fn an_index_and_a_gate_over_the_same_atoms_are_related() {
        let constant = |len: i64| format!("%len = CONST i32 {len}");
        assert_eq!(shared_atoms(-1, &constant(32)).bounds.pending(), 0);
        for (shift, len, first, last) in [(-2, 32, -1, 29), (-1, 30, 0, 30)] {
            let c = shared_atoms(shift, &constant(len));
            assert_eq!(c.bounds.pending_nodes(), vec![c.node(Op::Load)]);
            let e = c.at(&[]).unwrap_err();
            assert_eq!((e.first, e.last, e.len), (first, last, len as i128));
        }
    }

    /// The same load from a buffer of `m` elements: left for the launch, where elimination
    /// settles it too (intervals alone would see element −1).
    #[test]
    fn a_launch_relates_an_index_and_a_gate_over_the_same_atoms() {
        let c = shared_atoms(-1, "%len = DEFINE_VAR i32 \"m\" 1 64");
        assert_eq!(c.bounds.pending_nodes(), vec![c.node(Op::Load)]);
        c.at(&[31]).unwrap();
        c.at(&[64]).unwrap();
        let e = c.at(&[30]).unwrap_err();
        assert_eq!((e.first, e.last, e.len), (0, 30, 30));
    }

    /// `idx0 < n` into buffers of `n` is settled when the kernel is built; into a buffer of
    /// `m` it depends on the launch and is decided there, as before.
    #[test]
    fn an_index_below_the_length_variable_is_proven_when_built() {
        let add = |len: &str| {
            let m = if len == "%m" { "%m = DEFINE_VAR i32 \"m\" 1 4096\n" } else { "" };
            case(&format!(
                "{m}%n = DEFINE_VAR i32 \"n\" 1 16777216\n\
                 %a = PARAM ptr<f32> 0 (%n)\n%b = PARAM ptr<f32> 1 (%n)\n%c = PARAM ptr<f32> 2 ({len})\n\
                 %i = SPECIAL i32 \"idx0\" (%n)\n%pa = INDEX ptr<f32> (%a, %i)\n%pb = INDEX ptr<f32> (%b, %i)\n\
                 %pc = INDEX ptr<f32> (%c, %i)\n%x = LOAD f32 (%pa)\n%y = LOAD f32 (%pb)\n\
                 %sum = ADD f32 (%x, %y)\n%st = STORE void (%pc, %sum)\nSINK void (%st)\n"
            ))
        };
        assert_eq!(add("%n").bounds.pending(), 0);
        let c = add("%m");
        assert_eq!(c.bounds.pending_nodes(), vec![c.node(Op::Store)]);
        c.at(&[100, 100]).unwrap();
        c.at(&[4096, 17]).unwrap();
        let e = c.at(&[99, 100]).unwrap_err();
        assert_eq!((e.op, e.slot, e.first, e.last, e.len), ("STORE", Some(2), 0, 99, 99));
    }

    /// An 8-wide copy over `idx0 < n / 8`: `8·i ≤ 8·(n / 8) − 8 ≤ n − 8`, through the exact
    /// relation of the quotient `n / 8` and `n`, the same in the kernel and on the host.
    #[test]
    fn a_quotient_relates_a_launch_size_to_the_length() {
        let c = case(
            "%n = DEFINE_VAR i32 \"n\" 8 1024\n%eight = CONST i32 8\n%n8 = IDIV i32 (%n, %eight)\n\
             %a = PARAM ptr<f32> 0 (%n)\n%b = PARAM ptr<f32> 1 (%n)\n%i = SPECIAL i32 \"idx0\" (%n8)\n\
             %i8 = MUL i32 (%i, %eight)\n%pa = INDEX ptr<f32x8> (%a, %i8)\n%pb = INDEX ptr<f32x8> (%b, %i8)\n\
             %x = LOAD f32x8 (%pa)\n%st = STORE void (%pb, %x)\nSINK void (%st)\n",
        );
        assert_eq!(c.bounds.pending(), 0);
    }

    use crate::test_rng::Rng;

    /// `Σ c[i]·x[i] + k` over a kernel's indices.
    #[derive(Clone, Debug)]
    struct Affine {
        c: Vec<i64>,
        k: i64,
    }

    impl Affine {
        fn at(&self, x: &[i64]) -> i64 {
            self.c.iter().zip(x).map(|(c, x)| c * x).sum::<i64>() + self.k
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Rel {
        Lt,
        Le,
        Eq,
        Ne,
        Ge,
        Gt,
    }

    /// `lhs rel rhs`, and whether it is an IF block's condition rather than the store's gate.
    #[derive(Clone, Debug)]
    struct Cmp {
        lhs: Affine,
        rel: Rel,
        rhs: Affine,
        in_if: bool,
    }

    impl Cmp {
        fn holds(&self, x: &[i64]) -> bool {
            let (a, b) = (self.lhs.at(x), self.rhs.at(x));
            match self.rel {
                Rel::Lt => a < b,
                Rel::Le => a <= b,
                Rel::Eq => a == b,
                Rel::Ne => a != b,
                Rel::Ge => a >= b,
                Rel::Gt => a > b,
            }
        }
    }

    /// `q·(x / c) + r·(x % c)`, truncating: IDIV and MOD terms of an index; with `floor`
    /// (`c` a power of two) `q·(x >> s) + r·(x & (c − 1))`, SHR and AND terms.
    #[derive(Clone, Debug)]
    struct Division {
        x: Affine,
        c: i64,
        q: i64,
        r: i64,
        floor: bool,
    }

    impl Division {
        fn at(&self, x: &[i64]) -> i64 {
            let v = self.x.at(x);
            match self.floor {
                true => self.q * v.div_euclid(self.c) + self.r * (v & (self.c - 1)),
                false => self.q * (v / self.c) + self.r * (v % self.c),
            }
        }
    }

    /// A store of 1.0 at `index` (plus `m·sum` when `sum` is set: the gate's sum reused, plus
    /// the division terms `div`) of a
    /// buffer of `len_c·n + len_k` elements, over indices `x[i] < extent[i]` (`None`: the
    /// variable `n`, in `1..=n_max`), where every comparison holds.
    #[derive(Clone, Debug)]
    struct Shape {
        extent: Vec<Option<i64>>,
        launch: Vec<bool>,
        n_max: i64,
        index: Affine,
        sum: Option<(Affine, i64)>,
        div: Option<Division>,
        gate: Vec<Cmp>,
        len_c: i64,
        len_k: i64,
    }

    impl Shape {
        fn uses_n(&self) -> bool {
            self.extent.iter().any(Option::is_none) || self.len_c != 0
        }

        fn offset(&self, x: &[i64]) -> i64 {
            let div = self.div.as_ref().map_or(0, |d| d.at(x));
            self.index.at(x) + self.sum.as_ref().map_or(0, |(s, m)| m * s.at(x)) + div
        }

        /// The offsets the store really touches for `n`: `None` when it never runs.
        fn touched(&self, n: i64) -> Option<(i64, i64)> {
            let ext: Vec<i64> = self.extent.iter().map(|e| e.unwrap_or(n)).collect();
            let mut x = vec![0i64; ext.len()];
            let mut span: Option<(i64, i64)> = None;
            'all: loop {
                if self.gate.iter().all(|g| g.holds(&x)) {
                    let o = self.offset(&x);
                    span = Some(span.map_or((o, o), |(lo, hi)| (lo.min(o), hi.max(o))));
                }
                for i in 0..x.len() {
                    x[i] += 1;
                    if x[i] < ext[i] {
                        continue 'all;
                    }
                    x[i] = 0;
                }
                break;
            }
            span
        }

        fn len(&self, n: i64) -> i64 {
            self.len_c * n + self.len_k
        }

        fn in_bounds(&self, n: i64) -> bool {
            self.touched(n).is_none_or(|(lo, hi)| lo >= 0 && hi < self.len(n))
        }

        fn text(&self, rng: &mut Rng) -> String {
            let mut t = Text { lines: String::new(), consts: Vec::new(), next: 0 };
            if self.uses_n() {
                t.lines += &format!("%n = DEFINE_VAR i32 \"n\" 1 {}\n", self.n_max);
            }
            let (mut specials, mut ranges) = (0, Vec::new());
            let mut x = Vec::new();
            for (i, (e, &launch)) in self.extent.iter().zip(&self.launch).enumerate() {
                let extent = e.map_or("%n".to_string(), |v| t.constant(v));
                let name = format!("%x{i}");
                if launch {
                    let kind = if specials < 3 { "gidx" } else { "lidx" };
                    t.lines += &format!("{name} = SPECIAL i32 \"{kind}{}\" ({extent})\n", specials % 3);
                    specials += 1;
                } else {
                    t.lines += &format!("{name} = RANGE i32 {i} ({extent})\n");
                    ranges.push(name.clone());
                }
                x.push(name);
            }
            let sum = self.sum.as_ref().map(|(s, m)| (t.affine(s, &x, rng), *m));
            let mut conds = [Vec::new(), Vec::new()];
            for g in &self.gate {
                let lhs = match (&self.sum, &sum) {
                    // The substitution shape: the gate compares the very node the index reuses.
                    (Some((s, _)), Some((node, _))) if s.c == g.lhs.c && s.k == g.lhs.k => node.clone(),
                    _ => t.affine(&g.lhs, &x, rng),
                };
                let rhs = t.affine(&g.rhs, &x, rng);
                let (op, a, b, not) = match g.rel {
                    Rel::Lt => ("CMPLT", &lhs, &rhs, false),
                    Rel::Le => ("CMPLE", &lhs, &rhs, false),
                    Rel::Eq => ("CMPEQ", &lhs, &rhs, false),
                    Rel::Ne => ("CMPNE", &lhs, &rhs, false),
                    Rel::Ge => ("CMPLT", &lhs, &rhs, true),
                    Rel::Gt if rng.one_in(2) => ("CMPLT", &rhs, &lhs, false),
                    Rel::Gt => ("CMPLE", &lhs, &rhs, true),
                };
                let mut c = t.node(&format!("{op} bool ({a}, {b})"));
                if not {
                    c = t.node(&format!("NOT bool ({c})"));
                }
                conds[g.in_if as usize].push(c);
            }
            if !conds[1].is_empty() {
                // An IF placed inside every loop: its condition depends on every loop index.
                for r in &ranges {
                    let zero = t.constant(0);
                    let c = t.node(&format!("CMPLE bool ({zero}, {r})"));
                    conds[1].push(c);
                }
            }
            let [gate, block] = conds.map(|c| c.into_iter().reduce(|a, b| t.node(&format!("AND bool ({a}, {b})"))));
            let mut at = t.affine(&self.index, &x, rng);
            if let Some(d) = self.div.as_ref().filter(|d| d.q != 0 || d.r != 0) {
                let dividend = t.affine(&d.x, &x, rng);
                let (ops, operands) = match d.floor {
                    true => (["SHR", "AND"], [d.c.trailing_zeros() as i64, d.c - 1]),
                    false => (["IDIV", "MOD"], [d.c, d.c]),
                };
                for ((op, coeff), operand) in ops.into_iter().zip([d.q, d.r]).zip(operands) {
                    if coeff != 0 {
                        let c = t.constant(operand);
                        let v = t.node(&format!("{op} i32 ({dividend}, {c})"));
                        let k = t.constant(coeff);
                        let term = t.node(&format!("MUL i32 ({v}, {k})"));
                        at = t.node(&format!("ADD i32 ({at}, {term})"));
                    }
                }
            }
            if let Some((node, m)) = &sum {
                let m = t.constant(*m);
                let scaled = t.node(&format!("MUL i32 ({node}, {m})"));
                at = t.node(&format!("ADD i32 ({scaled}, {at})"));
            }
            let len = if self.len_c == 0 {
                t.constant(self.len_k)
            } else {
                let (c, k) = (t.constant(self.len_c), t.constant(self.len_k));
                let m = t.node(&format!("MUL i32 (%n, {c})"));
                t.node(&format!("ADD i32 ({m}, {k})"))
            };
            t.lines += &format!("%a = PARAM ptr<f32> 0 ({len})\n%one = CONST f32 1.0\n");
            let mut buf = "%a".to_string();
            if let Some(b) = &block {
                t.lines += &format!("%if = IF void ({b})\n");
                buf = t.node("AFTER ptr<f32> (%a, %if)");
            }
            let p = t.node(&format!("INDEX ptr<f32> ({buf}, {at})"));
            let mut root = match &gate {
                Some(g) => t.node(&format!("STORE void ({p}, %one, {g})")),
                None => t.node(&format!("STORE void ({p}, %one)")),
            };
            if block.is_some() {
                root = t.node(&format!("ENDIF void (%if, {root})"));
            }
            for r in ranges.iter().rev() {
                root = t.node(&format!("END void ({r}, {root})"));
            }
            t.lines + &format!("SINK void ({root})\n")
        }
    }

    /// Kernel text under construction: constants once each, fresh names for the rest.
    struct Text {
        lines: String,
        consts: Vec<i64>,
        next: usize,
    }

    impl Text {
        fn constant(&mut self, v: i64) -> String {
            let name = if v < 0 { format!("%cm{}", -v) } else { format!("%c{v}") };
            if !self.consts.contains(&v) {
                self.consts.push(v);
                self.lines += &format!("{name} = CONST i32 {v}\n");
            }
            name
        }

        fn node(&mut self, def: &str) -> String {
            self.next += 1;
            let name = format!("%v{}", self.next);
            self.lines += &format!("{name} = {def}\n");
            name
        }

        /// `a` written out, in one of several equivalent ways (MUL, SHL, SUB, MULACC).
        fn affine(&mut self, a: &Affine, x: &[String], rng: &mut Rng) -> String {
            let mut acc: Option<String> = None;
            for (xi, &c) in x.iter().zip(&a.c).filter(|(_, c)| **c != 0) {
                let term = |t: &mut Text, c: i64, rng: &mut Rng| match c {
                    1 => xi.clone(),
                    2 | 4 if rng.one_in(2) => {
                        let s = t.constant(c / 2);
                        t.node(&format!("SHL i32 ({xi}, {s})"))
                    }
                    _ => {
                        let k = t.constant(c);
                        if rng.one_in(2) {
                            t.node(&format!("MUL i32 ({xi}, {k})"))
                        } else {
                            t.node(&format!("MUL i32 ({k}, {xi})"))
                        }
                    }
                };
                acc = Some(match acc {
                    None => term(self, c, rng),
                    Some(acc) if c < 0 && rng.one_in(2) => {
                        let t = term(self, -c, rng);
                        self.node(&format!("SUB i32 ({acc}, {t})"))
                    }
                    Some(acc) if rng.one_in(4) => {
                        let k = self.constant(c);
                        self.node(&format!("MULACC i32 ({xi}, {k}, {acc})"))
                    }
                    Some(acc) => {
                        let t = term(self, c, rng);
                        self.node(&format!("ADD i32 ({acc}, {t})"))
                    }
                });
            }
            match acc {
                None => self.constant(a.k),
                Some(acc) if a.k == 0 => acc,
                Some(acc) if a.k < 0 && rng.one_in(2) => {
                    let k = self.constant(-a.k);
                    self.node(&format!("SUB i32 ({acc}, {k})"))
                }
                Some(acc) => {
                    let k = self.constant(a.k);
                    self.node(&format!("ADD i32 ({acc}, {k})"))
                }
            }
        }
    }

    /// A random shape: 2 to 4 indices with small extents; either the substitution shape
    /// (one comparison of `Σ ±x` with a constant, the index a multiple of that sum plus
    /// small terms) or random comparisons; a buffer often exactly as large as needed.
    fn random_shape(rng: &mut Rng) -> Shape {
        let dims = rng.int(2, 4) as usize;
        let with_n = rng.one_in(3);
        let n_max = rng.int(1, 5);
        let mut extent: Vec<Option<i64>> = (0..dims).map(|_| Some(rng.int(1, 5))).collect();
        if with_n {
            for e in extent.iter_mut() {
                if rng.one_in(2) {
                    *e = None;
                }
            }
            extent[rng.int(0, dims as i64 - 1) as usize] = None;
        }
        let launch: Vec<bool> = (0..dims).map(|_| rng.one_in(2)).collect();
        let coeffs = |rng: &mut Rng, lo: i64, hi: i64| (0..dims).map(|_| rng.int(lo, hi)).collect::<Vec<i64>>();
        let mut index = Affine { c: coeffs(rng, -4, 4), k: rng.int(-10, 10) };
        let (sum, gate) = if rng.one_in(2) {
            let mut s = Affine { c: coeffs(rng, -1, 1), k: 0 };
            if s.c.iter().all(|&c| c == 0) {
                s.c[0] = 1;
            }
            let rel = [Rel::Lt, Rel::Le, Rel::Eq, Rel::Ge, Rel::Gt][rng.int(0, 4) as usize];
            let reach: i64 = s.c.iter().zip(&extent).map(|(c, e)| c.abs() * (e.unwrap_or(n_max) - 1)).sum();
            let bound = Affine { c: vec![0; dims], k: rng.int(-reach - 1, reach + 1) };
            let cmp = Cmp { lhs: s.clone(), rel, rhs: bound, in_if: rng.one_in(3) };
            (Some((s, rng.int(-20, 20))), vec![cmp])
        } else {
            let gate = (0..rng.int(0, 3))
                .map(|_| {
                    let lhs = Affine { c: coeffs(rng, -3, 3), k: rng.int(-5, 5) };
                    let rhs = if rng.one_in(2) {
                        Affine { c: vec![0; dims], k: rng.int(-5, 5) }
                    } else {
                        Affine { c: coeffs(rng, -3, 3), k: rng.int(-5, 5) }
                    };
                    let rel = [Rel::Lt, Rel::Le, Rel::Eq, Rel::Ne, Rel::Ge, Rel::Gt][rng.int(0, 5) as usize];
                    Cmp { lhs, rel, rhs, in_if: rng.one_in(3) }
                })
                .collect();
            (None, gate)
        };
        // Every index must be used (a loop the store does not depend on does not enclose it).
        for i in 0..dims {
            let used = index.c[i] != 0
                || sum.as_ref().is_some_and(|(s, m)| *m != 0 && s.c[i] != 0)
                || gate.iter().any(|g| g.lhs.c[i] != 0 || g.rhs.c[i] != 0);
            if !used {
                index.c[i] = 1;
            }
        }
        // Sometimes a quotient and remainder too (both of one dividend: `c·q + r` is exact).
        let div = (sum.is_none() && rng.one_in(3)).then(|| {
            let x = Affine { c: coeffs(rng, -2, 2), k: rng.int(-3, 3) };
            let floor = rng.one_in(2);
            let c = if floor { 1 << rng.int(0, 2) } else { rng.int(1, 4) };
            let (q, r) = if rng.one_in(2) {
                let m = rng.int(-2, 2);
                (m * c, m)
            } else {
                (rng.int(-3, 3), rng.int(-3, 3))
            };
            Division { x, c, q, r, floor }
        });
        let mut shape = Shape { extent, launch, n_max, index, sum, div, gate, len_c: 0, len_k: 0 };
        // Often start the buffer exactly where the touched range starts, and end it
        // exactly where it ends (or one element before or after).
        let spans: Vec<(i64, i64)> = (1..=n_max).filter_map(|n| shape.touched(n)).collect();
        let jitter = |rng: &mut Rng| if rng.one_in(3) { rng.int(-1, 1) } else { 0 };
        match (spans.iter().map(|s| s.0).min(), spans.iter().map(|s| s.1).max()) {
            (Some(lo), Some(hi)) => {
                let shift = if rng.one_in(4) { 0 } else { lo + jitter(rng) };
                shape.index.k -= shift;
                shape.len_k = (hi - shift + 1 + jitter(rng)).max(0);
            }
            _ => shape.len_k = rng.int(0, 40),
        }
        if shape.uses_n() && rng.one_in(2) {
            shape.len_c = rng.int(1, 4);
            shape.len_k = rng.int(0, 20);
        }
        shape
    }

    /// Random affine stores (see [`random_shape`]) against brute force: the proof never
    /// calls an access in bounds that is not, neither when the kernel is built nor at a
    /// launch, and a refused launch reports at least the elements really touched. The
    /// substitution shape in bounds with constant extents is always proven when built (its
    /// constraint matrix is totally unimodular, so elimination's bounds are exact).
    /// `KILN_FUZZ_CASES` (default 2000) and `KILN_FUZZ_SEED` set the run.
    #[test]
    fn random_affine_kernels_are_never_proven_out_of_bounds() {
        let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        let cases = env("KILN_FUZZ_CASES", 2000);
        let mut rng = Rng(env("KILN_FUZZ_SEED", 0x9e37_79b9_7f4a_7c15) | 1);
        let (mut built, mut built_proven, mut shaped, mut launches, mut launches_ok, mut refused_out) =
            (0, 0, 0, 0, 0, 0);
        for _ in 0..cases {
            let shape = random_shape(&mut rng);
            let text = shape.text(&mut rng);
            let c = case(&text);
            let ns = if shape.uses_n() { 1..=shape.n_max } else { 1..=1 };
            let vals = |n: i64| if shape.uses_n() { vec![n] } else { vec![] };
            let in_bounds = ns.clone().all(|n| shape.in_bounds(n));
            let proven = c.bounds.pending() == 0;
            assert!(in_bounds || !proven, "proven when built, but out of bounds:\n{shape:?}\n{text}");
            if in_bounds {
                built += 1;
                built_proven += proven as usize;
                if shape.sum.is_some() && !shape.uses_n() {
                    shaped += 1;
                    assert!(proven, "the substitution shape in bounds is not proven:\n{shape:?}\n{text}");
                }
            }
            for n in ns {
                let result = c.at(&vals(n));
                if shape.in_bounds(n) {
                    launches += 1;
                    launches_ok += result.is_ok() as usize;
                } else {
                    refused_out += 1;
                    assert!(result.is_err(), "n = {n}: launch accepted, but out of bounds:\n{shape:?}\n{text}");
                }
                if let (Err(e), Some((lo, hi))) = (result, shape.touched(n)) {
                    assert!(
                        e.first <= lo as i128 && e.last >= hi as i128,
                        "n = {n}: refused with {}..={}, but {lo}..={hi} is touched:\n{shape:?}\n{text}",
                        e.first,
                        e.last
                    );
                }
            }
        }
        eprintln!(
            "{cases} random kernels: {built_proven}/{built} in bounds proven when built \
             (all {shaped} of the substitution shape), {launches_ok}/{launches} launches in bounds \
             accepted, {refused_out}/{refused_out} launches out of bounds refused"
        );
    }

    /// A launch index is below its extent only when the launch size is that extent: here the
    /// host launches `n + 1` items over a kernel extent of `n`, and `idx0` reaches `n`.
    #[test]
    fn a_launch_larger_than_the_kernel_extent_is_not_assumed_away() {
        let n = UOp::new(Op::DefineVar, DType::I32, Arg::Var { name: "n".into(), min: 1, max: 64 }, vec![]);
        let i = UOp::new(Op::Special, DType::I32, Arg::Str("idx0".into()), vec![n.clone()]);
        let a = UOp::new(Op::Param, DType::ptr(Scalar::F32), Arg::Int(0), vec![n.clone()]);
        let p = UOp::new(Op::Index, DType::ptr(Scalar::F32), Arg::None, vec![a, i]);
        let st = UOp::new(Op::Store, DType::Void, Arg::None, vec![p, UOp::const_float(DType::F32, 1.0)]);
        let sink = UOp::new(Op::Sink, DType::Void, Arg::None, vec![st]);
        let more = UOp::new(Op::Add, DType::I32, Arg::None, vec![n.clone(), UOp::const_int(DType::I32, 1)]);
        let launch: [Arc<UOp>; LAUNCH_SLOTS] =
            std::array::from_fn(|k| if k == 0 { more.clone() } else { UOp::index_const(1) });
        let bounds = Bounds::prove(&sink, std::slice::from_ref(&n), &launch, &launch_slot);
        assert_eq!(bounds.pending(), 1);
        let e = bounds.check(&[8], &[9, 1, 1, 1, 1, 1], &[8]).unwrap_err();
        assert_eq!((e.first, e.last, e.len), (0, 8, 8));
    }
}
