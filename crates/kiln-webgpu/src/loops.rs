//! Loop iteration budgets: Mesa's lavapipe (llvmpipe) runs at most 65,535 loop iterations
//! per work item.
//!
//! llvmpipe compiles a shader's loops with a *loop limiter* (`LP_MAX_TGSI_LOOP_ITERATIONS`
//! in gallivm, a guard against infinite loops kept from its TGSI days): one counter per
//! invocation (per SIMD vector of invocations), set to 65,535 where the shader starts and
//! decremented at the end of every pass of *every* loop. When it reaches zero the loop
//! that is running exits as if its condition had failed, and each loop entered after that
//! runs one pass. Nothing reports it: the shader goes on with the loop cut short. So on
//! lavapipe a loop of 70,000 iterations runs 65,535 (`sum` of 70,000 ones is 65,535), two
//! loops of 40,000 run 40,000 and 25,534, and a 300 × 300 nest runs 65,101 inner passes.
//!
//! kiln keeps its results right within that budget:
//! - [`LoopPlan`] counts the passes a kernel's loops may make in one work item (every
//!   loop's passes times the passes of the loops around it, plus one exit pass per entry),
//!   from the loop extents' intervals.
//! - Where the variables' declared bounds allow more than the budget, the renderer unrolls
//!   innermost loops (each pass runs `unroll` iterations, each guarded), with the smallest
//!   factor that fits the budget at those bounds, as far as [`MAX_UNROLL`] and
//!   [`MAX_UNROLLED_NODES`] allow.
//! - A launch whose variables still need more passes than the budget is refused with
//!   [`Error::Launch`] before anything runs, instead of computing a wrong result.
//!
//! Other adapters have no budget (`None`): nothing is unrolled and nothing is refused.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_device::{Error, Result};
use kiln_ir::{Arg, ContentHash, DType, Op, Scalar, UOp};

/// llvmpipe's loop passes per work item (`LP_MAX_TGSI_LOOP_ITERATIONS`).
pub const LLVMPIPE_LOOP_BUDGET: u64 = 65_535;
/// The largest unroll factor the renderer uses.
pub const MAX_UNROLL: u32 = 512;
/// The most kernel nodes an unrolled loop body may hold in all (its nodes, vectors once per
/// lane, times the factor), which bounds the WGSL text and the driver's compile time.
pub const MAX_UNROLLED_NODES: usize = 4096;

/// The loop passes a WebGPU adapter runs per work item before it cuts loops short, or `None`
/// for an adapter that runs loops to the end. Mesa's llvmpipe (lavapipe) has a budget.
pub fn loop_budget(info: &wgpu::AdapterInfo) -> Option<u64> {
    let llvmpipe = |s: &str| s.to_ascii_lowercase().contains("llvmpipe");
    (llvmpipe(&info.driver) || llvmpipe(&info.name)).then_some(LLVMPIPE_LOOP_BUDGET)
}

/// One loop (a RANGE) of a kernel.
#[derive(Debug, Clone)]
struct Loop {
    range: ContentHash,
    extent: Arc<UOp>,
    /// The enclosing loop (an index into [`LoopPlan::loops`]).
    parent: Option<usize>,
    /// Whether no loop opens inside it.
    innermost: bool,
    /// The size of its body: the kernel nodes between its RANGE and its END, a vector node
    /// counting once per lane (WGSL computes vectors lane by lane).
    body: usize,
    /// Iterations per pass (1: not unrolled).
    unroll: u32,
}

/// A kernel's loops, how the renderer unrolls them, and how many passes a launch makes.
#[derive(Debug, Clone, Default)]
pub struct LoopPlan {
    loops: Vec<Loop>,
    budget: Option<u64>,
}

/// An integer interval `[lo, hi]` of a node's possible values.
type Span = (i128, i128);

const ANY: Span = (i128::MIN, i128::MAX);

impl LoopPlan {
    /// The loops of `linear` (a kernel's linear order), with unroll factors that keep the
    /// passes within `budget` for every value the variables are declared to take where that
    /// is possible; without a budget nothing is unrolled.
    pub fn new(linear: &[Arc<UOp>], budget: Option<u64>) -> LoopPlan {
        let mut loops: Vec<Loop> = Vec::new();
        let mut open: Vec<(usize, usize)> = Vec::new();
        for (at, n) in linear.iter().enumerate() {
            match n.op() {
                Op::Range if !n.src().is_empty() => {
                    let parent = open.last().map(|(l, _)| *l);
                    if let Some(p) = parent {
                        loops[p].innermost = false;
                    }
                    open.push((loops.len(), at));
                    loops.push(Loop {
                        range: n.content_hash(),
                        extent: n.src()[0].clone(),
                        parent,
                        innermost: true,
                        body: 0,
                        unroll: 1,
                    });
                }
                Op::End if n.src().first().map(|r| r.content_hash()) == open.last().map(|(l, _)| loops[*l].range) => {
                    if let Some((l, start)) = open.pop() {
                        loops[l].body = linear[start + 1..at].iter().map(|n| n.dtype().width().max(1) as usize).sum();
                    }
                }
                _ => {}
            }
        }
        let mut plan = LoopPlan { loops, budget };
        let Some(budget) = budget else { return plan };
        let trips = plan.trips(&|_, min, max| (min as i128, max as i128));
        if plan.passes(&trips, 1) <= budget as u128 {
            return plan;
        }
        // The smallest factor that fits (the passes only fall as the factor grows).
        let (mut lo, mut hi) = (2u32, MAX_UNROLL);
        if plan.passes(&trips, hi) <= budget as u128 {
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if plan.passes(&trips, mid) <= budget as u128 { hi = mid } else { lo = mid + 1 }
            }
        }
        for (l, t) in plan.loops.iter_mut().zip(&trips) {
            l.unroll = Self::factor(l, *t, hi);
        }
        plan
    }

    /// The unroll factor of loop `l` (with `trips` iterations at most) when innermost loops
    /// are unrolled `want` times: never past the iterations, nor [`MAX_UNROLLED_NODES`].
    fn factor(l: &Loop, trips: u128, want: u32) -> u32 {
        if !l.innermost {
            return 1;
        }
        let by_size = (MAX_UNROLLED_NODES / l.body.max(1)).max(1);
        let by_trips = trips.clamp(1, u32::MAX as u128) as u32;
        want.min(by_trips).min(by_size.min(u32::MAX as usize) as u32).max(1)
    }

    /// The unroll factor of the loop opened by the RANGE `range` (1 when it is not unrolled).
    pub fn unroll(&self, range: ContentHash) -> u32 {
        self.loops.iter().find(|l| l.range == range).map_or(1, |l| l.unroll)
    }

    /// The budget the plan was made for.
    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    /// Each loop's largest iteration count, with variables spanning `var(name, min, max)`.
    fn trips(&self, var: &dyn Fn(&str, i64, i64) -> Span) -> Vec<u128> {
        let mut memo = HashMap::new();
        self.loops
            .iter()
            .map(|l| {
                let (_, hi) = span(&l.extent, var, &mut memo);
                hi.max(0) as u128
            })
            .collect()
    }

    /// The loop passes of one work item (an upper bound), with loop `i` running at most
    /// `trips[i]` iterations, `unroll(i)` of them per pass.
    fn count(&self, trips: &[u128], unroll: &dyn Fn(usize) -> u32) -> u128 {
        let mut entries = vec![0u128; self.loops.len()];
        let mut total = 0u128;
        for (i, l) in self.loops.iter().enumerate() {
            // Loops are listed outer before inner: the parent's entries are known. Every
            // entry makes one more pass than it runs iterations (the pass that exits).
            entries[i] = l.parent.map_or(1, |p| entries[p].saturating_mul(trips[p]));
            let per_entry = trips[i].div_ceil(unroll(i).max(1) as u128) + 1;
            total = total.saturating_add(entries[i].saturating_mul(per_entry));
        }
        total
    }

    /// [`Self::count`] with innermost loops unrolled `want` times (see [`Self::factor`]).
    fn passes(&self, trips: &[u128], want: u32) -> u128 {
        self.count(trips, &|i| Self::factor(&self.loops[i], trips[i], want))
    }

    /// The loop passes one work item of a launch with variable values `vals` (in the order of
    /// `names`) may make, with this plan's unroll factors (an upper bound).
    pub fn launch_passes(&self, names: &[String], vals: &[i64]) -> u128 {
        let trips = self.trips(&|name, min, max| match names.iter().position(|n| n == name) {
            Some(i) if i < vals.len() => (vals[i] as i128, vals[i] as i128),
            _ => (min as i128, max as i128),
        });
        self.count(&trips, &|i| self.loops[i].unroll)
    }

    /// [`Error::Launch`] when a launch of kernel `name` with `vals` may make more loop passes
    /// per work item than the adapter runs.
    pub fn check_launch(&self, name: &str, device: &str, names: &[String], vals: &[i64]) -> Result<()> {
        let Some(budget) = self.budget else { return Ok(()) };
        if self.loops.is_empty() {
            return Ok(());
        }
        let passes = self.launch_passes(names, vals);
        if passes <= budget as u128 {
            return Ok(());
        }
        let bound: Vec<String> = names.iter().zip(vals).map(|(n, v)| format!("{n}={v}")).collect();
        Err(Error::Launch(format!(
            "kernel `{name}` with {} may make {passes} loop passes in one work item; {device} is Mesa's \
             llvmpipe (lavapipe), which ends a work item's loops after {budget} passes in all and would \
             return a wrong result: split the loop across work items or use smaller sizes",
            if bound.is_empty() { "no variables".to_string() } else { bound.join(", ") }
        )))
    }
}

/// The interval of integer node `n`, with variables spanning `var(name, min, max)`;
/// anything it cannot follow takes its dtype's whole range.
fn span(n: &Arc<UOp>, var: &dyn Fn(&str, i64, i64) -> Span, memo: &mut HashMap<ContentHash, Span>) -> Span {
    if let Some(s) = memo.get(&n.content_hash()) {
        return *s;
    }
    for node in n.toposort() {
        if memo.contains_key(&node.content_hash()) {
            continue;
        }
        let src: Vec<Span> = node.src().iter().map(|s| memo.get(&s.content_hash()).copied().unwrap_or(ANY)).collect();
        let s = step(&node, &src, var);
        memo.insert(node.content_hash(), s);
    }
    memo.get(&n.content_hash()).copied().unwrap_or(ANY)
}

/// The whole range of `dt`'s values (bools: 0 and 1; floats and pointers: anything).
fn whole(dt: DType) -> Span {
    match dt.scalar() {
        Some(Scalar::Bool) => (0, 1),
        Some(s) => s.int_range().unwrap_or(ANY),
        None => ANY,
    }
}

/// One node's interval from its operands' (`src`).
fn step(n: &UOp, src: &[Span], var: &dyn Fn(&str, i64, i64) -> Span) -> Span {
    let full = whole(n.dtype());
    let a = src.first().copied().unwrap_or(ANY);
    let b = src.get(1).copied().unwrap_or(ANY);
    let add = |x: i128, y: i128| x.checked_add(y);
    let r: Option<Span> =
        match n.op() {
            Op::Const => match n.arg() {
                Arg::Int(v) => Some((*v as i128, *v as i128)),
                Arg::Bool(v) => Some((*v as i128, *v as i128)),
                _ => None,
            },
            Op::DefineVar => match n.arg() {
                Arg::Var { name, min, max } => Some(var(name, *min, *max)),
                _ => None,
            },
            Op::Bind => Some(b),
            Op::After | Op::Cast => Some(a),
            // A loop or launch index runs over 0..extent.
            Op::Range | Op::Special => Some((0, a.1.saturating_sub(1).max(0))),
            Op::Add => add(a.0, b.0).zip(add(a.1, b.1)),
            Op::Sub => a.0.checked_sub(b.1).zip(a.1.checked_sub(b.0)),
            Op::Neg => a.1.checked_neg().zip(a.0.checked_neg()),
            Op::Mul => {
                let c = [a.0.checked_mul(b.0), a.0.checked_mul(b.1), a.1.checked_mul(b.0), a.1.checked_mul(b.1)];
                c.iter().copied().collect::<Option<Vec<i128>>>().map(|c| {
                    (c.iter().copied().min().unwrap_or(i128::MIN), c.iter().copied().max().unwrap_or(i128::MAX))
                })
            }
            Op::Max => Some((a.0.max(b.0), a.1.max(b.1))),
            Op::Min => Some((a.0.min(b.0), a.1.min(b.1))),
            Op::Where => src.get(2).map(|c| (b.0.min(c.0), b.1.max(c.1))),
            // Truncating division by a divisor of one sign is monotone in each operand.
            Op::Idiv if b.0 > 0 || b.1 < 0 => {
                let c = [a.0.checked_div(b.0), a.0.checked_div(b.1), a.1.checked_div(b.0), a.1.checked_div(b.1)];
                c.iter().copied().collect::<Option<Vec<i128>>>().map(|c| {
                    (c.iter().copied().min().unwrap_or(i128::MIN), c.iter().copied().max().unwrap_or(i128::MAX))
                })
            }
            // |x / y| <= |x| (kiln's x / 0 is 0), and x % y keeps x's sign with |x % y| <= |x|.
            Op::Idiv | Op::Mod => {
                let m = a.0.unsigned_abs().max(a.1.unsigned_abs()).min(i128::MAX as u128) as i128;
                let m = if n.op() == Op::Mod && (b.0 > 0 || b.1 < 0) {
                    m.min(b.0.unsigned_abs().max(b.1.unsigned_abs()).min(i128::MAX as u128) as i128 - 1)
                } else {
                    m
                };
                Some((if a.0 >= 0 { 0 } else { -m }, if a.1 <= 0 { 0 } else { m }))
            }
            Op::Shr if a.0 >= 0 && b.0 == b.1 && (0..127).contains(&b.0) => Some((a.0 >> b.0, a.1 >> b.0)),
            Op::Shl if a.0 >= 0 && b.0 == b.1 && (0..64).contains(&b.0) => {
                a.1.checked_mul(1i128 << b.0).map(|hi| (a.0 << b.0, hi))
            }
            Op::And if a.0 >= 0 || b.0 >= 0 => {
                let hi = match (a.0 >= 0, b.0 >= 0) {
                    (true, true) => a.1.min(b.1),
                    (true, false) => a.1,
                    _ => b.1,
                };
                Some((0, hi))
            }
            _ => None,
        };
    match r {
        // A value that may leave its dtype wraps: it could be anything in it.
        Some((lo, hi)) if lo <= hi && lo >= full.0 && hi <= full.1 => (lo, hi),
        // An empty interval (a loop that never runs): its index takes no value.
        Some((lo, hi)) if lo > hi => (lo, hi),
        _ => full,
    }
}

#[cfg(test)]
mod tests {
    use kiln_device::kiln_ir::{linearize, parse_kernel};

    use super::*;

    fn plan(text: &str, budget: Option<u64>) -> LoopPlan {
        LoopPlan::new(&linearize(&parse_kernel(text).unwrap()).unwrap(), budget)
    }

    const SUM: &str = include_str!("../../../examples/kernels/sum.kiln");

    /// `sum` loops up to 2^24 times: on llvmpipe it is unrolled just enough for that
    /// (ceil(2^24 / 257) + 1 passes fit 65,535; 256 would not), and every allowed launch fits.
    #[test]
    fn a_long_loop_is_unrolled_just_enough_for_its_declared_bound() {
        let p = plan(SUM, Some(LLVMPIPE_LOOP_BUDGET));
        assert_eq!(p.loops.len(), 1);
        assert_eq!(p.loops[0].unroll, 257);
        let names = ["n".to_string()];
        for n in [1, 65_535, 65_536, 1 << 20, 1 << 24] {
            assert!(p.launch_passes(&names, &[n]) <= LLVMPIPE_LOOP_BUDGET as u128, "n = {n}");
            p.check_launch("sum", "WEBGPU:0", &names, &[n]).unwrap();
        }
        // Without a budget nothing changes.
        let p = plan(SUM, None);
        assert_eq!(p.loops[0].unroll, 1);
        p.check_launch("sum", "WEBGPU:0", &names, &[1 << 24]).unwrap();
    }

    /// Loops whose declared bounds fit the budget are left alone.
    #[test]
    fn loops_within_the_budget_are_not_unrolled() {
        let cumsum = include_str!("../../../examples/kernels/cumsum.kiln");
        let matmul = include_str!("../../../examples/kernels/matmul.kiln");
        for text in [cumsum, matmul] {
            let p = plan(text, Some(LLVMPIPE_LOOP_BUDGET));
            assert!(!p.loops.is_empty());
            assert!(p.loops.iter().all(|l| l.unroll == 1), "{:?}", p.loops);
        }
    }

    /// Nested and consecutive loops share one budget: passes multiply down a nest and add
    /// up across loops, and a launch past it is refused with a launch error.
    #[test]
    fn nested_and_consecutive_loops_count_against_one_budget() {
        let text = "%a = DEFINE_VAR i32 \"a\" 1 100000\n%b = DEFINE_VAR i32 \"b\" 1 100000\n\
                    %one = CONST i32 1\n%z = CONST i32 0\n%out = PARAM ptr<i32> 0 (%one)\n\
                    %i = RANGE i32 0 (%a)\n%j = RANGE i32 1 (%b)\n%acc = DEFINE_ACC i32 0 (%z, %i, %j)\n\
                    %nx = ADD i32 (%acc, %one)\n%up = ASSIGN i32 (%acc, %nx)\n%ej = END i32 (%j, %up)\n\
                    %ei = END i32 (%i, %ej)\n%p = INDEX ptr<i32> (%out, %z)\n%st = STORE void (%p, %ei)\nSINK void (%st)";
        let p = plan(text, Some(LLVMPIPE_LOOP_BUDGET));
        assert_eq!(p.loops.len(), 2);
        assert_eq!(p.loops[0].unroll, 1, "outer loops are never unrolled");
        assert_eq!(p.loops[1].unroll, MAX_UNROLL, "no factor fits a^b = 10^10: the largest is used");
        let names = ["a".to_string(), "b".to_string()];
        // 300 x 300: 301 outer passes and 300 * (ceil(300 / 512) + 1) inner ones.
        assert_eq!(p.launch_passes(&names, &[300, 300]), 301 + 300 * 2);
        p.check_launch("nest", "WEBGPU:0", &names, &[300, 300]).unwrap();
        let e = p.check_launch("nest", "WEBGPU:0", &names, &[100_000, 2]).unwrap_err();
        assert!(matches!(&e, Error::Launch(m) if m.contains("a=100000, b=2") && m.contains("65535")), "{e}");
    }

    #[test]
    fn extents_are_bounded_through_arithmetic() {
        let var = |_: &str, min: i64, max: i64| (min as i128, max as i128);
        let k = parse_kernel(
            "%n = DEFINE_VAR i32 \"n\" 1 1000\n%c = CONST i32 3\n%m = MUL i32 (%n, %c)\n%d = IDIV i32 (%m, %c)\n\
             %s = SUB i32 (%d, %c)\n%x = MAX i32 (%s, %c)\n%out = PARAM ptr<i32> 0 (%x)\n\
             %r = RANGE i32 0 (%x)\n%p = INDEX ptr<i32> (%out, %r)\n%st = STORE void (%p, %r)\n%e = END void (%r, %st)\nSINK void (%e)",
        )
        .unwrap();
        let range = k.toposort().into_iter().find(|n| n.op() == Op::Range).unwrap();
        let mut memo = HashMap::new();
        assert_eq!(span(&range.src()[0], &var, &mut memo), (3, 997));
        assert_eq!(span(&range, &var, &mut memo), (0, 996));
    }
}
