//! Relational reasoning for the bounds proof: integer expressions as linear forms
//! `Σ cᵢ·atomᵢ + k`, and Fourier–Motzkin elimination to bound one form under the linear
//! facts of a gate.
//!
//! Intervals forget how values are related. Under the gate `r2 + r1 > 43` the node
//! `r2 + r1` is narrowed, but the index `20·r2 + 20·r1 + r0 − 880` is built from `r2` and
//! `r1` separately and its interval still starts at −880. Over shared atoms the gate is the
//! row `r2 + r1 − 44 ≥ 0`, and eliminating the atoms from `t = index` leaves `t ≥ 0`.
//!
//! # Forms
//! ADD, SUB, NEG, MUL or SHL by a constant, MULACC with a constant factor, integer CAST,
//! AFTER and BIND are expanded; every other integer node is an *atom*: an unknown integer
//! bounded by its current interval (its box). A node is expanded only when its value cannot
//! wrap for its operands' intervals, so a form always equals the value the node really has
//! (on the host, checked arithmetic fails the launch instead of wrapping). An atom whose
//! interval is one value is that constant.
//!
//! A form has a view: the kernel's, or the host's ([`crate::eval_int`]: checked `i64`,
//! casts ignored), in which buffer lengths and launch sizes are computed. The two views of
//! one node are different atoms unless they provably take the same value: a DEFINE_VAR
//! whose bounds fit its dtype, and IDIV/MOD by one positive constant of a dividend whose
//! forms are equal in both views.
//!
//! # Relations of atoms
//! Besides its box, an atom brings the exact facts that hold of it in every execution: a
//! RANGE index is below its extent, a launch index below its extent when that extent is the
//! launch size (in both views), `x = c·(x / c) + x % c` for a positive constant `c`, and
//! `x = 2^s·(x >> s) + (x & (2^s − 1))` with the mask in `0..2^s` (floor division by a
//! power of two, as tinygrad writes `// 2` and `% 2`; a gate such as `(x & 1) < 1` then
//! says that `x` is even).
//!
//! # Elimination
//! With `t − objective = 0` among the rows `Σ aᵢ·xᵢ + b ≥ 0`, every atom is eliminated and
//! the rows left bound `t`. All unknowns are integers, so a row is divided by the gcd of its
//! coefficients and its constant rounded down (a cut that no integer point violates). The
//! real projection only loses precision, never soundness: every integer solution of the
//! original rows satisfies every derived row. Arithmetic is checked; on overflow, or beyond
//! [`MAX_ATOMS`] unknowns or [`MAX_ROWS`] rows, the analysis gives up (callers keep the
//! interval result).

use std::collections::HashMap;

use super::{Fact, Interval, LAUNCH_SLOTS, Leaf, Step, Ty, add, idiv, mul, rem};
use crate::dtype::{DType, Scalar};
use crate::uop::Op;

/// Unknowns in one elimination (atoms and implied quotients), beyond which it gives up.
pub(super) const MAX_ATOMS: usize = 16;
/// Rows after one elimination step beyond which it gives up.
pub(super) const MAX_ROWS: usize = 256;

/// An unknown: a tape position in one view, or the quotient a kernel MOD implies.
type Key = u64;
const KERNEL: u64 = 0;
const HOST: u64 = 1;
const QUOTIENT: u64 = 2;
/// The remainder a kernel SHR by a constant implies.
const REMAINDER: u64 = 3;

fn key(pos: u32, view: u64) -> Key {
    (pos as u64) << 2 | view
}

fn pos(k: Key) -> usize {
    (k >> 2) as usize
}

/// `Σ c·atom + k`, terms sorted by key, no zero coefficient.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Form {
    terms: Vec<(Key, i128)>,
    k: i128,
}

impl Form {
    fn constant(k: i128) -> Form {
        Form { terms: Vec::new(), k }
    }

    fn atom(a: Key) -> Form {
        Form { terms: vec![(a, 1)], k: 0 }
    }

    /// `self + c·o`, `None` on overflow.
    fn plus(&self, c: i128, o: &Form) -> Option<Form> {
        let mut terms = Vec::with_capacity(self.terms.len() + o.terms.len());
        let (mut i, mut j) = (0, 0);
        while i < self.terms.len() || j < o.terms.len() {
            let a = self.terms.get(i).copied();
            let b = o.terms.get(j).copied();
            let (k, v) = match (a, b) {
                (Some(a), Some(b)) if a.0 == b.0 => {
                    i += 1;
                    j += 1;
                    (a.0, a.1.checked_add(c.checked_mul(b.1)?)?)
                }
                (Some(a), Some(b)) if a.0 < b.0 => {
                    i += 1;
                    a
                }
                (Some(a), None) => {
                    i += 1;
                    a
                }
                (_, Some(b)) => {
                    j += 1;
                    (b.0, c.checked_mul(b.1)?)
                }
                (None, None) => break,
            };
            if v != 0 {
                terms.push((k, v));
            }
        }
        Some(Form { terms, k: self.k.checked_add(c.checked_mul(o.k)?)? })
    }
}

/// What the host computes, for forms in its view (only while proving, not at launch).
pub(super) struct HostView<'a> {
    /// Every tape node's interval in host mode.
    pub iv: &'a [Interval],
    /// The variables' declared bounds (the `vals` order).
    pub vars: &'a [Interval],
    /// The tape positions of the launch sizes.
    pub launch: [u32; LAUNCH_SLOTS],
}

/// The analysed graph at one moment: the tape, the kernel's intervals (narrowed by a
/// gate), and the host's view when proving.
pub(super) struct View<'a> {
    pub tape: &'a [Step],
    pub cur: &'a [Interval],
    pub host: Option<&'a HostView<'a>>,
}

/// Buffers of one elimination, reused between launches on a thread.
#[derive(Default)]
pub(super) struct Work {
    forms: HashMap<Key, Option<Form>>,
    stack: Vec<(Key, bool)>,
    atoms: Vec<Key>,
    rows: Vec<i128>,
    next: Vec<i128>,
    order: Vec<usize>,
}

/// How one node's form follows from its operands'.
enum Plan {
    Const(i128),
    Atom(Key),
    /// Not an integer scalar: no form.
    Opaque,
    /// `Σ c·operand` over the first `n` pairs.
    Sum([(Key, i128); 2], usize),
    /// A host IDIV or MOD: the kernel's atom when the dividend (kernel, host) has the same
    /// form in both views, else its own.
    Share(Key, Key),
}

impl View<'_> {
    fn iv(&self, k: Key) -> Interval {
        match (k & 3, self.host) {
            (KERNEL, _) => self.cur[pos(k)],
            (HOST, Some(h)) => h.iv[pos(k)],
            _ => Interval::ANY,
        }
    }

    /// A node known to have one value is that constant, unless it expands: a gate may have
    /// narrowed `x + y` to one value, and how it relates `x` and `y` is what matters.
    fn plan(&self, k: Key) -> Plan {
        match self.expansion(k) {
            Plan::Atom(_) | Plan::Share(..) if self.iv(k).lo == self.iv(k).hi => Plan::Const(self.iv(k).lo),
            p => p,
        }
    }

    fn expansion(&self, k: Key) -> Plan {
        let (view, step) = (k & 3, &self.tape[pos(k)]);
        let host = match (view, self.host) {
            (KERNEL, _) => None,
            (HOST, Some(h)) => Some(h),
            _ => return Plan::Opaque,
        };
        let scalar = matches!(step.dtype, DType::Scalar(s) if s.is_int() || s == Scalar::Bool);
        let iv = self.iv(k);
        if !scalar {
            return Plan::Opaque;
        }
        let ty = if host.is_some() { Ty::of(step.dtype, true) } else { step.ty };
        if ty.is_bool || iv.is_empty() {
            return Plan::Atom(k);
        }
        let src = |i: usize| step.src.get(i).map_or(k, |&p| key(p, view));
        let arg = |i: usize| self.iv(src(i));
        // Whether a result equals its mathematical value: the host's checked arithmetic
        // never wraps (an overflow fails the launch), except its SHL, which drops bits.
        let fits = |v: Option<Interval>| v.is_some_and(|v| v.within(ty.lim));
        let exact = |v: Option<Interval>| host.is_some() || fits(v);
        let point = |i: usize| Some(arg(i)).filter(|v| v.lo == v.hi && step.src.len() > i).map(|v| v.lo);
        let scaled = |i: usize, c: i128, exact: &dyn Fn(Option<Interval>) -> bool| {
            if exact(mul(arg(i), Interval::point(c))) { Plan::Sum([(src(i), c), (k, 0)], 1) } else { Plan::Atom(k) }
        };
        let int_source =
            || step.src.first().is_some_and(|&p| matches!(self.tape[p as usize].dtype, DType::Scalar(s) if s.is_int()));
        match step.op {
            Op::Add if exact(add(arg(0), arg(1))) => Plan::Sum([(src(0), 1), (src(1), 1)], 2),
            Op::Sub if exact(add(arg(0), neg(arg(1)))) => Plan::Sum([(src(0), 1), (src(1), -1)], 2),
            Op::Neg if exact(Some(neg(arg(0)))) => Plan::Sum([(src(0), -1), (k, 0)], 1),
            Op::Mul => match (point(0), point(1)) {
                (_, Some(c)) => scaled(0, c, &exact),
                (Some(c), _) => scaled(1, c, &exact),
                _ => Plan::Atom(k),
            },
            Op::Shl => {
                let bits = if host.is_some() { 64 } else { ty.bits as i128 };
                match point(1) {
                    Some(s) if (0..bits).contains(&s) => scaled(0, 1 << s, &fits),
                    _ => Plan::Atom(k),
                }
            }
            // The host cannot evaluate MULACC: a launch that needs one fails.
            Op::MulAcc if host.is_none() => {
                let (c, x) = match (point(0), point(1)) {
                    (_, Some(c)) => (c, 0),
                    (Some(c), _) => (c, 1),
                    _ => return Plan::Atom(k),
                };
                if exact(mul(arg(x), Interval::point(c)).and_then(|p| add(p, arg(2)))) {
                    Plan::Sum([(src(x), c), (src(2), 1)], 2)
                } else {
                    Plan::Atom(k)
                }
            }
            Op::Cast if int_source() && (host.is_some() || exact(Some(arg(0)))) => Plan::Sum([(src(0), 1), (k, 0)], 1),
            Op::After if exact(Some(arg(0))) => Plan::Sum([(src(0), 1), (k, 0)], 1),
            Op::Bind if exact(Some(arg(1))) => Plan::Sum([(src(1), 1), (k, 0)], 1),
            Op::DefineVar => match (step.leaf, host) {
                (Leaf::Var(v), Some(h)) if h.vars.get(v).is_some_and(|b| b.within(step.ty.lim)) => {
                    Plan::Atom(key(pos(k) as u32, KERNEL))
                }
                _ => Plan::Atom(k),
            },
            Op::Idiv | Op::Mod if host.is_some() && step.src.len() == 2 => {
                let kernel_divisor = self.cur[step.src[1] as usize];
                match point(1) {
                    Some(c) if c > 0 && kernel_divisor == Interval::point(c) => {
                        Plan::Share(key(step.src[0], KERNEL), key(step.src[0], HOST))
                    }
                    _ => Plan::Atom(k),
                }
            }
            _ => Plan::Atom(k),
        }
    }

    /// The form of `k`, computed children first without recursion and memoised in `work`;
    /// `None` when it is not an integer.
    fn form(&self, k: Key, work: &mut Work) -> Option<Form> {
        let Work { forms, stack, .. } = work;
        stack.clear();
        stack.push((k, false));
        while let Some((n, ready)) = stack.pop() {
            if forms.contains_key(&n) {
                continue;
            }
            let form = match (self.plan(n), ready) {
                (Plan::Const(c), _) => Some(Form::constant(c)),
                (Plan::Atom(a), _) => Some(Form::atom(a)),
                (Plan::Opaque, _) => None,
                (Plan::Sum(ops, len), false) => {
                    stack.push((n, true));
                    stack.extend(ops[..len].iter().map(|&(o, _)| (o, false)));
                    continue;
                }
                (Plan::Share(a, b), false) => {
                    stack.extend([(n, true), (a, false), (b, false)]);
                    continue;
                }
                (Plan::Sum(ops, len), true) => {
                    let mut f = Some(Form::constant(0));
                    for &(o, c) in &ops[..len] {
                        f = match (f, forms.get(&o)) {
                            (Some(f), Some(Some(g))) => f.plus(c, g),
                            _ => None,
                        };
                    }
                    // An operand without a form makes this node opaque; an overflowing or
                    // too long sum is still the node's value: an atom.
                    if ops[..len].iter().any(|(o, _)| !matches!(forms.get(o), Some(Some(_)))) {
                        None
                    } else {
                        Some(f.filter(|f| f.terms.len() <= MAX_ATOMS).unwrap_or_else(|| Form::atom(n)))
                    }
                }
                (Plan::Share(a, b), true) => {
                    let same = matches!((forms.get(&a), forms.get(&b)), (Some(Some(x)), Some(Some(y))) if x == y);
                    Some(Form::atom(if same { key(pos(n) as u32, KERNEL) } else { n }))
                }
            };
            forms.insert(n, form);
        }
        forms.get(&k).cloned().flatten()
    }
}

/// Adds the atoms of `f` that `atoms` lacks.
fn note(f: &Form, atoms: &mut Vec<Key>) {
    for &(a, _) in &f.terms {
        if !atoms.contains(&a) {
            atoms.push(a);
        }
    }
}

fn neg(v: Interval) -> Interval {
    match (v.hi.checked_neg(), v.lo.checked_neg()) {
        (Some(lo), Some(hi)) => Interval::new(lo, hi),
        _ => Interval::ANY,
    }
}

/// What elimination says about the objective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bound {
    /// The facts contradict each other: the access never runs.
    Never,
    /// `lo ≤ objective ≤ hi` (`i128::MIN`/`MAX` for a side without bound).
    Within(Interval),
}

/// Bounds `Σ terms − len` (`terms` in the kernel's view, `len` a node in the host's) over
/// the executions where `facts` hold and every atom lies in its box; `None` when the
/// analysis gives up (a node that is not an integer, overflow, too many unknowns or rows).
pub(super) fn bound(view: &View, facts: &[Fact], terms: &[u32], len: Option<u32>, work: &mut Work) -> Option<Bound> {
    work.forms.clear();
    let mut objective = Form::constant(0);
    for &t in terms {
        objective = objective.plus(1, &view.form(key(t, KERNEL), work)?)?;
    }
    if let Some(l) = len {
        view.host?;
        objective = objective.plus(-1, &view.form(key(l, HOST), work)?)?;
    }
    // Every row is a form known to be ≥ 0.
    let mut rows: Vec<Form> = Vec::new();
    for f in facts {
        let (a, b, strict) = match *f {
            Fact::Lt(a, b) => (a, b, 1),
            Fact::Le(a, b) => (a, b, 0),
        };
        // A fact over values that are not integer scalars (vector lanes) is left out.
        if let (Some(fa), Some(fb)) = (view.form(key(a, KERNEL), work), view.form(key(b, KERNEL), work)) {
            let mut row = fb.plus(-1, &fa)?;
            row.k = row.k.checked_sub(strict)?;
            rows.push(row);
        }
    }
    // The atoms, closed under the relations their nodes bring.
    work.atoms.clear();
    note(&objective, &mut work.atoms);
    for r in &rows {
        note(r, &mut work.atoms);
    }
    // (quotient or remainder atom, form of the dividend, divisor)
    let mut divisions: Vec<(Key, Form, i128)> = Vec::new();
    // (floor quotient `x >> s` or remainder `x & (2^s − 1)` atom, form of x, 2^s, is quotient)
    let mut floors: Vec<(Key, Form, i128, bool)> = Vec::new();
    let mut i = 0;
    while i < work.atoms.len() {
        if work.atoms.len() > MAX_ATOMS {
            return None;
        }
        let a = work.atoms[i];
        i += 1;
        if a & 3 != KERNEL {
            continue;
        }
        let step = &view.tape[pos(a)];
        let Some(&first) = step.src.first() else { continue };
        let fact = match (step.op, step.leaf, view.host) {
            (Op::Range, ..) => view.form(key(first, KERNEL), work),
            // A launch index is below the larger of the kernel's and the host's extent:
            // below the extent itself when both views provably agree on it.
            (Op::Special, Leaf::Launch(slot), Some(h)) if h.launch[slot] == first => {
                let kernel = view.form(key(first, KERNEL), work);
                let host = view.form(key(first, HOST), work);
                kernel.filter(|k| host.as_ref() == Some(k))
            }
            // x >> s is floor(x / 2^s) and x & (2^s − 1) is x − 2^s·floor(x / 2^s), in
            // two's complement for either sign (arithmetic shift) and for unsigned values.
            (Op::Shr | Op::And, ..) if step.src.len() == 2 && !step.ty.is_bool && !step.ty.opaque => {
                let at = |i: usize| view.cur[step.src[i] as usize];
                let power = |s: i128| (0..step.ty.bits.min(62) as i128).contains(&s).then(|| 1i128 << s);
                let split = match step.op {
                    Op::Shr => (at(1).lo == at(1).hi).then(|| power(at(1).lo)).flatten().map(|p| (first, p, true)),
                    _ => [(0, 1), (1, 0)].into_iter().find_map(|(m, x)| {
                        let m = at(m);
                        (m.lo == m.hi && m.lo > 0 && (m.lo + 1).count_ones() == 1)
                            .then(|| (step.src[x], m.lo + 1, false))
                    }),
                };
                if let Some((x, p, quotient)) = split
                    && let Some(x) = view.form(key(x, KERNEL), work)
                {
                    note(&x, &mut work.atoms);
                    floors.push((a, x, p, quotient));
                }
                None
            }
            (Op::Idiv | Op::Mod, ..) if step.src.len() == 2 => {
                let d = view.cur[step.src[1] as usize];
                if d.lo == d.hi
                    && d.lo > 0
                    && let Some(x) = view.form(key(first, KERNEL), work)
                {
                    note(&x, &mut work.atoms);
                    divisions.push((a, x, d.lo));
                }
                None
            }
            _ => None,
        };
        // atom ≤ extent − 1
        if let Some(extent) = fact {
            let mut r = extent.plus(-1, &Form::atom(a))?;
            r.k = r.k.checked_sub(1)?;
            note(&r, &mut work.atoms);
            rows.push(r);
        }
    }
    // x = c·q + r: exact when both the quotient and the remainder of x are atoms; a lone
    // quotient bounds the remainder by its interval, a lone remainder gets its quotient as a
    // new unknown.
    let dividend = |a: Key| view.tape[pos(a)].src[0];
    let mut quotients: Vec<(Key, Interval)> = Vec::new();
    for (a, x, c) in &divisions {
        let (a, c) = (*a, *c);
        let quotient = view.tape[pos(a)].op == Op::Idiv;
        let partner = divisions
            .iter()
            .find(|(b, _, d)| *d == c && dividend(*b) == dividend(a) && (view.tape[pos(*b)].op == Op::Idiv) != quotient)
            .map(|(b, ..)| *b);
        let xiv = view.cur[dividend(a) as usize];
        let (q, r) = match (quotient, partner) {
            (true, Some(b)) => (Form::atom(a), Form::atom(b)),
            (false, Some(_)) => continue, // written once, from the quotient's side
            (true, None) => {
                // lo ≤ x − c·q ≤ hi, the remainder's interval
                let rv = rem(xiv, Interval::point(c));
                let diff = x.plus(-c, &Form::atom(a))?;
                rows.push(diff.plus(-1, &Form::constant(rv.lo))?);
                rows.push(Form::constant(rv.hi).plus(-1, &diff)?);
                continue;
            }
            (false, None) => {
                let q = key(pos(a) as u32, QUOTIENT);
                quotients.push((q, idiv(xiv, Interval::point(c)).unwrap_or(Interval::ANY)));
                work.atoms.push(q);
                (Form::atom(q), Form::atom(a))
            }
        };
        let diff = x.plus(-c, &q)?.plus(-1, &r)?;
        rows.push(Form::constant(0).plus(-1, &diff)?);
        rows.push(diff);
    }
    // x = 2^s·q + r with 0 ≤ r < 2^s: a shift and a mask of one x share q and r. A lone shift
    // takes the mask of its x from the tape when there is one (a gate such as `(x & 1) < 1`
    // narrows it to a constant, which is then no atom), else a new unknown; a lone mask gets
    // its quotient as a new unknown.
    for (a, x, p, quotient) in &floors {
        let partner = floors.iter().find(|(_, y, d, q)| d == p && y == x && q != quotient).map(|f| f.0);
        let (q, r) = match (quotient, partner) {
            (true, Some(b)) => (Form::atom(*a), Form::atom(b)),
            (false, Some(_)) => continue, // written once, from the quotient's side
            (true, None) => {
                let dividend = view.tape[pos(*a)].src[0];
                let is_mask = |m: u32| view.cur[m as usize] == Interval::point(p - 1);
                let mask = view.tape.iter().position(|st| {
                    st.op == Op::And
                        && !st.ty.is_bool
                        && matches!(*st.src, [y, m] | [m, y] if y == dividend && is_mask(m))
                });
                let r = match mask {
                    Some(m) => view.form(key(m as u32, KERNEL), work)?,
                    None => {
                        let r = key(pos(*a) as u32, REMAINDER);
                        quotients.push((r, Interval::new(0, p - 1)));
                        Form::atom(r)
                    }
                };
                (Form::atom(*a), r)
            }
            (false, None) => {
                let q = key(pos(*a) as u32, QUOTIENT);
                let xiv = x.terms.iter().try_fold(Interval::point(x.k), |acc, &(t, c)| {
                    let v = match t & 3 {
                        QUOTIENT | REMAINDER => quotients.iter().find(|f| f.0 == t).map_or(Interval::ANY, |f| f.1),
                        _ => view.iv(t),
                    };
                    add(acc, mul(v, Interval::point(c))?)
                });
                quotients
                    .push((q, xiv.map_or(Interval::ANY, |v| Interval::new(v.lo.div_euclid(*p), v.hi.div_euclid(*p)))));
                (Form::atom(q), Form::atom(*a))
            }
        };
        note(&q, &mut work.atoms);
        note(&r, &mut work.atoms);
        let diff = x.plus(-p, &q)?.plus(-1, &r)?;
        rows.push(Form::constant(0).plus(-1, &diff)?);
        rows.push(diff);
    }
    if work.atoms.len() > MAX_ATOMS {
        return None;
    }

    // Dense rows over the unknowns, then `t` (the objective), then the constant.
    let n = work.atoms.len();
    let w = n + 2;
    let Work { atoms, rows: flat, next, order, .. } = work;
    flat.clear();
    let index = |a: Key| atoms.iter().position(|&b| b == a);
    let push = |f: &Form, t: i128, flat: &mut Vec<i128>| -> Option<()> {
        let at = flat.len();
        flat.resize(at + w, 0);
        for &(a, c) in &f.terms {
            flat[at + index(a)?] = c;
        }
        flat[at + n] = t;
        flat[at + n + 1] = f.k;
        Some(())
    };
    for r in &rows {
        push(r, 0, flat)?;
    }
    push(&Form::constant(0).plus(-1, &objective)?, 1, flat)?;
    push(&objective, -1, flat)?;
    for (i, &a) in atoms.iter().enumerate() {
        let b = match a & 3 {
            QUOTIENT | REMAINDER => quotients.iter().find(|q| q.0 == a).map_or(Interval::ANY, |q| q.1),
            _ => view.iv(a),
        };
        if b.is_empty() {
            return Some(Bound::Never);
        }
        let unit = |c: i128, k: i128| {
            let mut f = Form::constant(k);
            f.terms.push((atoms[i], c));
            f
        };
        if b.lo != i128::MIN {
            push(&unit(1, b.lo.checked_neg()?), 0, flat)?;
        }
        if b.hi != i128::MAX {
            push(&unit(-1, b.hi), 0, flat)?;
        }
    }
    project(flat, next, order, w, n)
}

/// Eliminates every unknown but `keep` from the rows `Σ aᵢ·xᵢ + b ≥ 0` (`w` numbers each,
/// the constant last) and reads `keep`'s bounds; `None` when it gives up.
fn project(rows: &mut Vec<i128>, next: &mut Vec<i128>, order: &mut Vec<usize>, w: usize, keep: usize) -> Option<Bound> {
    let vars = w - 1;
    next.clear();
    next.extend_from_slice(rows);
    if !tidy(next, rows, order, w)? {
        return Some(Bound::Never);
    }
    loop {
        // The unknown whose elimination adds the fewest rows.
        let mut best: Option<(usize, usize)> = None;
        for v in (0..vars).filter(|&v| v != keep) {
            let pos = rows.chunks(w).filter(|r| r[v] > 0).count();
            let neg = rows.chunks(w).filter(|r| r[v] < 0).count();
            if pos + neg == 0 {
                continue;
            }
            let cost = (pos * neg).saturating_sub(pos + neg);
            if best.is_none_or(|(_, c)| cost < c) {
                best = Some((v, cost));
            }
        }
        let Some((v, _)) = best else { break };
        next.clear();
        for r in rows.chunks(w).filter(|r| r[v] == 0) {
            next.extend_from_slice(r);
        }
        for p in rows.chunks(w).filter(|r| r[v] > 0) {
            for q in rows.chunks(w).filter(|r| r[v] < 0) {
                let (a, b) = (q[v].checked_neg()?, p[v]);
                for j in 0..w {
                    next.push(p[j].checked_mul(a)?.checked_add(q[j].checked_mul(b)?)?);
                }
            }
        }
        if !tidy(next, rows, order, w)? {
            return Some(Bound::Never);
        }
        if rows.len() / w > MAX_ROWS {
            return None;
        }
    }
    let (mut lo, mut hi) = (i128::MIN, i128::MAX);
    for r in rows.chunks(w) {
        // Normalised: the coefficient of `keep` is ±1.
        match r[keep] {
            1 => lo = lo.max(r[w - 1].checked_neg()?),
            -1 => hi = hi.min(r[w - 1]),
            _ => {}
        }
    }
    Some(if lo > hi { Bound::Never } else { Bound::Within(Interval::new(lo, hi)) })
}

/// Normalises the rows of `from` into `to`: each divided by the gcd of its coefficients
/// (constant rounded down), rows without unknowns dropped, duplicates reduced to the
/// tightest. `Some(false)` when a row reads `0 ≥ b` with `b < 0`; `None` on overflow.
fn tidy(from: &mut [i128], to: &mut Vec<i128>, order: &mut Vec<usize>, w: usize) -> Option<bool> {
    order.clear();
    for (i, r) in from.chunks_mut(w).enumerate() {
        let g = r[..w - 1].iter().fold(0u128, |g, &a| gcd(g, a.unsigned_abs()));
        if g == 0 {
            if r[w - 1] < 0 {
                return Some(false);
            }
            continue;
        }
        let g = i128::try_from(g).ok()?;
        for a in r.iter_mut().take(w - 1) {
            *a /= g;
        }
        r[w - 1] = r[w - 1].div_euclid(g);
        order.push(i);
    }
    let row = |i: usize| &from[i * w..(i + 1) * w];
    order.sort_unstable_by(|&a, &b| row(a).cmp(row(b)));
    to.clear();
    let mut last: Option<usize> = None;
    for &i in order.iter() {
        // Sorted by coefficients, then constant: the first of equal coefficients is tightest.
        if last.is_some_and(|l| row(l)[..w - 1] == row(i)[..w - 1]) {
            continue;
        }
        to.extend_from_slice(row(i));
        last = Some(i);
    }
    Some(true)
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds of `t` (the last unknown) under `rows` (`[a₀, …, a_{n-1}, a_t, b]` each).
    fn solve(rows: &[&[i128]]) -> Option<Bound> {
        let w = rows[0].len() - 1;
        let mut flat: Vec<i128> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        project(&mut flat, &mut Vec::new(), &mut Vec::new(), w + 1, w - 1)
    }

    fn within(lo: i128, hi: i128) -> Option<Bound> {
        Some(Bound::Within(Interval::new(lo, hi)))
    }

    #[test]
    fn a_sum_bounded_below_lifts_a_multiple_of_it() {
        // x, y ∈ [0, 44], x + y ≥ 44, t = 20x + 20y − 880.
        let rows: [&[i128]; 7] = [
            &[1, 0, 0, 0],
            &[-1, 0, 0, 44],
            &[0, 1, 0, 0],
            &[0, -1, 0, 44],
            &[1, 1, 0, -44],
            &[-20, -20, 1, 880],
            &[20, 20, -1, -880],
        ];
        assert_eq!(solve(&rows), within(0, 880));
    }

    #[test]
    fn contradicting_rows_mean_never() {
        // x ≥ 3, x ≤ 2
        assert_eq!(solve(&[&[1, 0, -3], &[-1, 0, 2], &[0, 1, 0]]), Some(Bound::Never));
        // 2x = 1 has no integer solution: 2x − 1 ≥ 0 and 1 − 2x ≥ 0 tighten to x ≥ 1, x ≤ 0.
        assert_eq!(solve(&[&[2, 0, -1], &[-2, 0, 1], &[0, 1, 0]]), Some(Bound::Never));
    }

    #[test]
    fn integer_rounding_tightens_bounds() {
        // 3t ≤ 10 and 2t ≥ 1: t ∈ [1, 3].
        assert_eq!(solve(&[&[-3, 10], &[2, -1]]), within(1, 3));
        // Only an upper bound: the lower side stays open.
        assert_eq!(solve(&[&[-1, 7]]), within(i128::MIN, 7));
    }

    #[test]
    fn equalities_pin_a_remainder_and_quotient() {
        // x ∈ [0, 99], q ∈ [0, 24], r ∈ [0, 3], x = 4q + r, t = 4q + r − x: exactly 0.
        let rows: [&[i128]; 10] = [
            &[1, 0, 0, 0, 0],
            &[-1, 0, 0, 0, 99],
            &[0, 1, 0, 0, 0],
            &[0, -1, 0, 0, 24],
            &[0, 0, 1, 0, 0],
            &[0, 0, -1, 0, 3],
            &[1, -4, -1, 0, 0],
            &[-1, 4, 1, 0, 0],
            &[1, -4, -1, 1, 0],
            &[-1, 4, 1, -1, 0],
        ];
        assert_eq!(solve(&rows), within(0, 0));
    }

    #[test]
    fn overflow_gives_up() {
        let big = i128::MAX / 2;
        assert_eq!(solve(&[&[3, -5, 0, big], &[-7, 3, 0, big], &[0, 5, 1, 0], &[0, -3, -1, big]]), None);
    }

    #[test]
    fn forms_merge_and_cancel() {
        let (x, y) = (key(1, KERNEL), key(2, KERNEL));
        let f = Form::atom(x).plus(3, &Form::atom(y)).unwrap();
        let g = f.plus(-1, &Form::atom(x)).unwrap();
        assert_eq!(g, Form { terms: vec![(y, 3)], k: 0 });
        assert_eq!(Form::constant(i128::MAX).plus(1, &Form::constant(1)), None);
    }
}
