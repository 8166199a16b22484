//! Kernels rendered to LLVM 16 IR text, the CPU device's second language beside C.
//!
//! [`LlvmRenderer`] takes the first half of rendering from kiln-cstyle ([`kiln_cstyle::lower`]:
//! validation, the [`ProgramSpec`] from [`ProgramSpec::from_sink`], the CPU dialect's
//! optimization [`vectorize_outer_products`], the linear order) and writes the second half
//! itself: one SSA function per kernel, with the C pair's meaning op for op, so that an object
//! built from it loads and launches through [`crate::CpuProgram`] unchanged, and computes the
//! same bits as the C pair built for the same instruction set.
//!
//! # Entry ABI
//! Exactly the C pair's (see [`crate::renderer`]): one exported function named as the C entry,
//! ```llvm
//! define void @NAME(ptr %bufs, ptr %vals, i64 %core, i64 %ncores)
//! ```
//! with one buffer pointer per parameter slot in `bufs` (slot order; a guarded kernel's fault
//! buffer is the slot after the last), the variable values in `ProgramSpec::var_names` order in
//! `vals` followed by the launch's streaming mask ([`crate::program::stream_mask`]: which
//! write-only buffers to store non-temporally), and chunk `core` of `ncores` of global axis 0
//! run by this call: the launch indices are
//! loops, global axis 0 outermost and split into `ncores` contiguous chunks as the C pair splits
//! it, then global axes 1 and 2, then the local axes. A kernel without global axis 0 runs whole
//! in chunk 0. The module has no target triple or data layout: the compiler sets them.
//!
//! # Values
//! bool is `i1` in registers and a byte in memory; f16 and bf16 are their bits (`i16`) with
//! arithmetic in f32 rounded once per op, f16 through `half` (`fpext`/`fptrunc`, F16C's
//! conversions on x86), bf16 by the C pair's bit arithmetic (round to nearest even, NaN kept
//! quiet). Vectors are LLVM vector types of any lane count; memory is accessed at the element's
//! alignment. Accumulators and values carried out of loops are `alloca` slots (promoted by
//! SROA/mem2reg): an accumulator's updates are stored at the end of their block, so every read
//! inside one iteration sees the value from its start, as in the C emitter. Loops count with a
//! phi.
//!
//! # Semantics
//! Those of kiln-cstyle's emitter: wrapping integer arithmetic, division defined for every
//! operand (`x / 0 == 0`, `x % 0 == x`, `MIN / -1 == MIN` by a select of the divisor, no
//! branch), shift counts modulo the bit width, saturating float → integer casts with NaN → 0
//! (`llvm.fptosi.sat`/`llvm.fptoui.sat`), f64 → f16/bf16 rounded once (round-to-odd to f32
//! first), MULACC of floats fused (`llvm.fma`) and no other contraction (no fast-math flag
//! anywhere). Where the C pair calls libm (`expf`, `sinf`, `powf`, ... on scalars, and lane by
//! lane on vectors of f16/bf16 and for SIN/COS/POW) the same function is called; f32/f64 vector
//! EXP, EXP2, LOG and LOG2 are the C pair's vector math (`super::vmath`) with `llvm.fma`
//! exactly where its `kiln_madd` fuses; MAX/MIN of f32/f64, scalar or vector, are the C pair's
//! rule: the first operand where it is greater (less) or the second is NaN, else the second
//! (the second on equal zeros, as `maxps`/`minps`).
//!
//! # Streaming stores
//! A STORE hinted non-temporal, and every store to a buffer the kernel writes and never reads
//! when the launch's streaming mask says that buffer is large, is non-temporal where its address
//! is aligned to the register it takes (else plain, as the C pair's `kiln_stnt_T`), with a store
//! fence before the kernel returns. A buffer the kernel also reads is never streamed.
//!
//! # Large kernels
//! LLVM 16 takes time quadratic in the length of one straight-line stretch of code in two places
//! (issue 44: a kernel summing 10,000 products took 15 s to the C pair's 3): the SLP vectorizer's
//! search for horizontal reductions, which tries every operand tree of an ordered float sum
//! and reschedules the whole block for each, and the instruction selector's clustering of loads
//! that hang on one memory chain (`ScheduleDAGSDNodes::ClusterNeighboringLoads` compares every
//! load of a block with every other one from the same base pointer). So:
//! - every [`CHAIN_LOADS`] buffer loads between two loop boundaries, a volatile store of a byte to
//!   a stack slot starts a new memory chain (a store instruction per 256 loads; it aliases no
//!   buffer, so nothing is kept from moving around it but the instruction selector's chains);
//! - a kernel with a stretch of more than [`NO_SLP_INSTRUCTIONS`] instructions between loop
//!   boundaries is marked ([`NO_SLP`]), and the compiler runs LLVM's O3 pipeline on it less the
//!   SLP vectorizer (the loop vectorizer still runs; see [`super::compile`]). Such code is
//!   straight-line already; measured on it, the vectorizer cost seconds and the kernel ran once.
//! - a kernel with more than [`NO_INDVARS_STORES`] stores to buffers is marked ([`NO_INDVARS`])
//!   and compiled without IndVarSimplify, whose time grows with every store's address: a
//!   register tile whose lanes are stored apart (a convolution's output channels) stores each
//!   lane on its own. Measured on ResNet-50's plan (`kiln run-plan --runs 60`): its empty-cache
//!   load went from 3.7 to 3.0 s, its run time stayed the same (42.3–42.5 ms both).
//!
//! # Refused
//! Work-group constructs (DEFINE_LOCAL, BARRIER), as the C pair refuses them, and WMMA forms
//! other than the one-thread one: [`Error::Render`] naming the op. The C pair's AVX512-BF16
//! and AVX512-FP16 WMMA bodies are not rendered: every WMMA form takes the portable body, which
//! is bit for bit the reference.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use kiln_cstyle::{lower, unsupported_wmma};
use kiln_device::kiln_ir::{
    AddrSpace, Arg, ContentHash, DType, DeviceSpec, Op, Scalar, StoreHint, UOp, bf16_bits, f16_bits,
    vectorize_outer_products,
};
use kiln_device::{Error, ProgramSpec, Renderer, Result, special_axis};

use super::code::{Code, Ty, float_lit, from_f32, int_lit, to_f32};
use crate::isa::Isa;

/// Renders kernels to LLVM IR text for the CPU (see the module docs). Holds no state between
/// kernels: one renderer serves every thread.
#[derive(Debug, Clone)]
pub struct LlvmRenderer {
    device: DeviceSpec,
    /// The target's widest vector register in bytes: the register tiles of
    /// [`vectorize_outer_products`].
    vector_bytes: usize,
    /// Whether the target has vector FMA, so that the vector math fuses where the C pair's
    /// `kiln_madd` does (16- and 32-byte vectors with FMA, 64-byte ones with AVX-512).
    fma: bool,
}

impl LlvmRenderer {
    /// A renderer for a target whose widest vector register is `vector_bytes` bytes and which
    /// has vector FMA (`fma`) or not.
    pub fn new(vector_bytes: usize, fma: bool) -> LlvmRenderer {
        LlvmRenderer { device: crate::CPU.clone(), vector_bytes, fma }
    }

    /// The renderer for instruction set `isa`: its vector width, and FMA from AVX2 up.
    pub fn for_isa(isa: Isa) -> LlvmRenderer {
        LlvmRenderer::new(isa.vector_bytes().unwrap_or(16), matches!(isa, Isa::Avx512 | Isa::Avx2))
    }

    /// Whether the C pair's `kiln_madd` on a register of `bytes` bytes is one fused
    /// multiply-add (else a multiply and an add).
    pub(super) fn fused_madd(&self, bytes: usize) -> bool {
        match bytes {
            16 | 32 => self.fma,
            64 => self.fma && self.vector_bytes >= 64,
            _ => false,
        }
    }
}

impl Renderer for LlvmRenderer {
    /// Renders `ast` (a SINK) as an LLVM IR module with one exported function, the kernel's
    /// entry (the C pair's name for it). A kernel the CPU cannot run is an [`Error::Render`]
    /// naming the node; a malformed one the validator's [`Error::Ir`].
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        let (mut spec, linear) = lower(ast, name, &self.device, |a| vectorize_outer_products(a, self.vector_bytes))?;
        spec.src = Emitter::new(self).run(&spec, &linear)?;
        Ok(spec)
    }

    fn describe(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        kiln_cstyle::describe(ast, name, &self.device)
    }

    fn identity(&self) -> Option<String> {
        Some(format!("llvm vector_bytes={} fma={}", self.vector_bytes, self.fma))
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }
}

/// Buffer loads after which a straight-line stretch of code starts a new memory chain (see
/// the module docs' "Large kernels").
pub(super) const CHAIN_LOADS: usize = 256;

/// The most instructions a straight-line stretch (between loop boundaries) may have for the
/// kernel to be compiled with the SLP vectorizer (see the module docs' "Large kernels").
pub(super) const NO_SLP_INSTRUCTIONS: usize = 4096;

/// How the second line of a module the compiler optimizes without the SLP vectorizer begins
/// (the first names the module as kiln's).
pub(super) const NO_SLP: &str = "; kiln: no SLP vectorizer";

/// The most stores to buffers a kernel may have for it to be compiled with IndVarSimplify
/// (see the module docs' "Large kernels").
pub(super) const NO_INDVARS_STORES: usize = 128;

/// How a line after the first of a module the compiler optimizes without IndVarSimplify begins.
pub(super) const NO_INDVARS: &str = "; kiln: no IndVarSimplify";

/// Whether the module `ir` carries the mark `mark` ([`NO_SLP`], [`NO_INDVARS`]) in its header.
pub(super) fn marked(ir: &str, mark: &str) -> bool {
    ir.lines().take(4).any(|l| l.starts_with(mark))
}

#[cfg(test)]
fn without_slp(ir: &str) -> bool {
    marked(ir, NO_SLP)
}

/// The straight-line stretch of code being written: the code line it starts at and the buffer
/// loads written in it since its start.
#[derive(Default)]
struct Stretch {
    start: usize,
    loads: usize,
}

/// The value of a node as later nodes use it.
#[derive(Clone, Debug)]
enum Value {
    /// An SSA register or a constant.
    Reg(String),
    /// A mutable slot (`alloca`): loaded at every use.
    Slot(String),
}

/// An open loop: its index phi (patched when the loop closes) and its labels.
struct Loop {
    phi_line: usize,
    index: String,
    ty: String,
    /// The no-wrap flag of the increment: `nsw` for a signed compare, `nuw` for an unsigned one.
    wrap: &'static str,
    start: String,
    pre: String,
    head: String,
    exit: String,
    /// Vector FMAs written directly in its body (not in an inner loop): a register tile's.
    fmas: usize,
}

enum BlockKind {
    Body,
    Loop(Loop),
    If { end: String },
}

/// An open block: the kernel body, a loop or an IF block.
struct Block {
    range: Option<ContentHash>,
    /// Accumulator updates `(slot, value, dtype)`, stored at the end of the block.
    commits: Vec<(String, Value, DType)>,
    kind: BlockKind,
}

/// A valued END that is not an accumulator: a zeroed slot before the loop, set to `value` at
/// the end of every iteration.
#[derive(Clone)]
struct Carry {
    slot: String,
    value: ContentHash,
    dtype: DType,
}

struct Emitter<'a> {
    r: &'a LlvmRenderer,
    c: Code,
    allocas: Vec<String>,
    values: HashMap<ContentHash, Value>,
    blocks: Vec<Block>,
    carries: HashMap<ContentHash, Vec<Carry>>,
    nontemporal: bool,
    /// Loops marked not to be unrolled (`close_loop`); each has metadata node `!(1 + k)`.
    unrolled_never: usize,
    /// Per buffer slot the kernel writes and never reads: the `i1` register that says whether
    /// this launch streams it (see [`crate::program::stream_mask`]).
    streamed: HashMap<usize, String>,
    /// The straight-line stretch being written, and the most lines one had (see the module
    /// docs' "Large kernels").
    stretch: Stretch,
    longest_stretch: usize,
    /// The stores to buffers written (a register tile's epilogue scattered lane by lane makes
    /// hundreds: see the module docs' "Large kernels").
    buffer_stores: usize,
    /// The stack byte that chain breaks store to, made by the first one.
    chain_slot: Option<String>,
}

fn render_err(node: &UOp, msg: impl std::fmt::Display) -> Error {
    Error::Render(format!("{} {}: {msg}", node.op(), node.dtype()))
}

/// The scalar and lane count of a value dtype.
fn lanes(n: &UOp, dt: DType) -> Result<(Scalar, u8)> {
    match dt {
        DType::Scalar(s) => Ok((s, 1)),
        DType::Vector(s, w) => Ok((s, w)),
        other => Err(render_err(n, format!("has no value type for {other}"))),
    }
}

/// Whether a store may bypass the caches: never, always where aligned (a STORE hinted
/// non-temporal), or where aligned and the launch streams its buffer (the `i1` register).
enum NonTemporal {
    Never,
    Always,
    When(String),
}

/// The buffer slot an address indexes (through INDEX, CAST and AFTER), when it is a PARAM's.
fn param_slot(addr: &Arc<UOp>) -> Option<usize> {
    let mut node = addr;
    while matches!(node.op(), Op::Index | Op::Cast | Op::After) {
        node = node.src().first()?;
    }
    match (node.op(), node.arg()) {
        (Op::Param, Arg::Int(slot)) => usize::try_from(*slot).ok(),
        _ => None,
    }
}

fn is_half(s: Scalar) -> bool {
    matches!(s, Scalar::F16 | Scalar::BF16)
}

impl<'a> Emitter<'a> {
    fn new(r: &'a LlvmRenderer) -> Self {
        Emitter {
            r,
            c: Code::new(),
            allocas: Vec::new(),
            values: HashMap::new(),
            blocks: vec![Block { range: None, commits: Vec::new(), kind: BlockKind::Body }],
            carries: HashMap::new(),
            nontemporal: false,
            unrolled_never: 0,
            streamed: HashMap::new(),
            stretch: Stretch::default(),
            longest_stretch: 0,
            buffer_stores: 0,
            chain_slot: None,
        }
    }

    fn run(mut self, spec: &ProgramSpec, linear: &[Arc<UOp>]) -> Result<String> {
        if let Some(n) =
            linear.iter().find(|n| matches!(n.op(), Op::Program | Op::Device | Op::Linear | Op::Source | Op::Binary))
        {
            return Err(render_err(n, "compiled-program stages cannot appear inside a kernel"));
        }
        if let Some(n) = linear.iter().find(|n| matches!(n.op(), Op::DefineLocal | Op::Barrier)) {
            let what = if n.op() == Op::Barrier {
                "a work-group barrier (BARRIER)"
            } else {
                "work-group local memory (DEFINE_LOCAL)"
            };
            return Err(crate::renderer::no_work_groups(what));
        }
        // Buffers and variables, unpacked in the entry block.
        for (i, p) in spec.params.iter().enumerate() {
            let slot = p.slot;
            self.c.stmt(format!("%data{slot}.p = getelementptr inbounds ptr, ptr %bufs, i64 {i}"));
            self.c.stmt(format!("%data{slot} = load ptr, ptr %data{slot}.p, align 8"));
        }
        // The launch's streaming mask follows the variables in `vals`: bit `slot` is set for a
        // write-only buffer large enough that its stores should bypass the caches.
        let write_only: Vec<usize> = spec.outs.iter().copied().filter(|s| !spec.ins.contains(s)).collect();
        if !write_only.is_empty() {
            let at = self.c.ins(format!("getelementptr inbounds i64, ptr %vals, i64 {}", spec.var_names.len()));
            let mask = self.c.ins(format!("load i64, ptr {at}, align 8"));
            for slot in write_only.into_iter().filter(|&s| s < 64) {
                let bit = self.c.ins(format!("and i64 {mask}, {}", 1u64 << slot));
                let on = self.c.ins(format!("icmp ne i64 {bit}, 0"));
                self.streamed.insert(slot, on);
            }
        }
        for n in linear {
            match (n.op(), n.arg()) {
                (Op::Param, Arg::Int(slot)) => {
                    self.values.insert(n.content_hash(), Value::Reg(format!("%data{slot}")));
                }
                (Op::DefineVar, Arg::Var { name, .. }) => {
                    let position = spec.var_names.iter().position(|v| v == name).unwrap_or(0);
                    let (s, _) = lanes(n, n.dtype())?;
                    let raw = self.c.ins(format!("getelementptr inbounds i64, ptr %vals, i64 {position}"));
                    let v64 = self.c.ins(format!("load i64, ptr {raw}, align 8"));
                    let v = self.int_resize(&v64, Scalar::I64, s, 1);
                    self.values.insert(n.content_hash(), Value::Reg(v));
                }
                _ => {}
            }
        }

        let specials = self.check_specials(linear)?;
        let hoisted = extent_closure(&specials)?;
        for n in linear {
            if n.op() == Op::End && n.dtype() != DType::Void && acc_of(n).is_none() {
                let (s, w) = lanes(n, n.dtype())?;
                let slot = self.alloca(Ty::reg(s, w));
                self.carries.entry(n.src()[0].content_hash()).or_default().push(Carry {
                    slot: slot.clone(),
                    value: n.src()[1].content_hash(),
                    dtype: n.dtype(),
                });
                self.values.insert(n.content_hash(), Value::Slot(slot));
            }
        }
        for n in linear.iter().filter(|n| hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        let launch = self.open_launch(&specials)?;
        for n in linear.iter().filter(|n| !hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        if self.blocks.len() != 1 {
            return Err(Error::Render("a loop is still open at the end of the kernel".into()));
        }
        let commits = self.blocks.first_mut().map(|b| std::mem::take(&mut b.commits)).unwrap_or_default();
        self.commit(commits)?;
        for l in launch.into_iter().rev() {
            self.close_loop(l);
        }
        self.c.stmt("br label %exit");
        self.c.start("exit");
        if self.nontemporal {
            // Non-temporal stores are weakly ordered: publish them before the call returns.
            self.c.call("void", "llvm.x86.sse.sfence", &[]);
        }
        self.c.stmt("ret void");

        self.end_stretch();
        let mut out = String::from("; kiln kernel (LLVM 16 IR)\n");
        if self.longest_stretch > NO_SLP_INSTRUCTIONS {
            let _ = writeln!(
                out,
                "{NO_SLP}: a straight-line stretch of {} instructions (more than {NO_SLP_INSTRUCTIONS})",
                self.longest_stretch
            );
        }
        if self.buffer_stores > NO_INDVARS_STORES {
            let _ =
                writeln!(out, "{NO_INDVARS}: {} stores to buffers (more than {NO_INDVARS_STORES})", self.buffer_stores);
        }
        out.push('\n');
        for d in self.c.decls.values() {
            out.push_str(d);
            out.push_str(if d.ends_with('\n') { "\n" } else { "\n\n" });
        }
        let header = format!("define void @{}(ptr %bufs, ptr %vals, i64 %core, i64 %ncores) nounwind", spec.name);
        out.push_str(&self.c.function(&header, &self.allocas));
        if self.nontemporal {
            out.push_str("\n!0 = !{i32 1}\n");
        }
        if self.unrolled_never > 0 {
            out.push_str("\n!1 = !{!\"llvm.loop.unroll.disable\"}\n");
            for id in 2..2 + self.unrolled_never {
                let _ = writeln!(out, "!{id} = distinct !{{!{id}, !1}}");
            }
        }
        Ok(out)
    }

    /// The SPECIAL nodes, checked as the C emitter checks them: known names, one extent per
    /// name, one name per axis, no direct indices beside local ones.
    fn check_specials(&mut self, linear: &[Arc<UOp>]) -> Result<Vec<Arc<UOp>>> {
        let specials: Vec<Arc<UOp>> = linear.iter().filter(|n| n.op() == Op::Special).cloned().collect();
        let mut names: HashMap<String, ContentHash> = HashMap::new();
        let mut axes: HashMap<(char, usize), String> = HashMap::new();
        for s in &specials {
            let name = s.arg_name().unwrap_or_default().to_string();
            let (kind, axis) =
                special_axis(&name).ok_or_else(|| render_err(s, format!("unknown launch index `{name}`")))?;
            if names.insert(name.clone(), s.content_hash()).is_some_and(|h| h != s.content_hash()) {
                return Err(render_err(s, format!("launch index `{name}` appears with two different extents")));
            }
            let key = (if kind == 'l' { 'l' } else { 'g' }, axis);
            if let Some(other) = axes.insert(key, name.clone())
                && other != name
            {
                return Err(render_err(s, format!("`{other}` and `{name}` both claim launch axis {axis}")));
            }
        }
        let direct = specials.iter().any(|s| s.arg_name().is_some_and(|n| n.starts_with("idx")));
        if direct && axes.keys().any(|(k, _)| *k == 'l') {
            return Err(Error::Render("direct launch indices (idxN) cannot be mixed with local ones (lidxN)".into()));
        }
        Ok(specials)
    }

    /// Opens the launch loops (see the module docs) and returns them, outermost first.
    fn open_launch(&mut self, specials: &[Arc<UOp>]) -> Result<Vec<Loop>> {
        let mut order: Vec<(char, usize, &Arc<UOp>)> = Vec::new();
        for s in specials {
            let name = s.arg_name().unwrap_or_default();
            let (kind, axis) = special_axis(name).unwrap_or(('g', 0));
            if !order.iter().any(|(_, _, o)| o.content_hash() == s.content_hash()) {
                order.push((kind, axis, s));
            }
        }
        order.sort_by_key(|(kind, axis, _)| (*kind == 'l', *axis));
        let chunked = order.first().is_some_and(|(kind, axis, _)| *kind != 'l' && *axis == 0);
        if !chunked {
            // No global axis 0: chunk 0 does everything.
            let other = self.c.ins("icmp ne i64 %core, 0");
            let go = self.c.label();
            self.c.stmt(format!("br i1 {other}, label %exit, label %{go}"));
            self.c.start(&go);
        }
        let mut loops = Vec::new();
        for (i, (_, _, s)) in order.iter().enumerate() {
            let (t, _) = lanes(s, s.dtype())?;
            if !t.is_int() {
                return Err(render_err(s, "a launch index is an integer"));
            }
            let ty = Ty::reg(t, 1).name();
            let extent = self.operand(&s.src()[0])?;
            let (l, index) = if i == 0 && chunked {
                // This call runs chunk `core` of `ncores` of 0..extent, as the C pair splits it.
                let n = self.int_resize(&extent, t, Scalar::I64, 1);
                let q = self.c.ins(format!("sdiv i64 {n}, %ncores"));
                let r = self.c.ins(format!("srem i64 {n}, %ncores"));
                let below = self.c.ins(format!("icmp slt i64 %core, {r}"));
                let extra = self.c.ins(format!("select i1 {below}, i64 %core, i64 {r}"));
                let base = self.c.ins(format!("mul i64 %core, {q}"));
                let lo = self.c.ins(format!("add i64 {base}, {extra}"));
                let one = self.c.ins(format!("zext i1 {below} to i64"));
                let len = self.c.ins(format!("add i64 {q}, {one}"));
                let hi = self.c.ins(format!("add i64 {lo}, {len}"));
                // Both bounds lie between 0 and the extent, so they fit its type: the loop
                // counts in it, as the C pair's does, and LLVM sees a plain induction variable.
                let (lo, hi) = (self.int_resize(&lo, Scalar::I64, t, 1), self.int_resize(&hi, Scalar::I64, t, 1));
                let l = self.open_loop(&ty, &lo, &hi, t.is_signed());
                let index = l.index.clone();
                (l, index)
            } else {
                let l = self.open_loop(&ty, "0", &extent, t.is_signed());
                let index = l.index.clone();
                (l, index)
            };
            self.values.insert(s.content_hash(), Value::Reg(index));
            loops.push(l);
        }
        Ok(loops)
    }

    /// Ends the straight-line stretch of code at a loop boundary (see the module docs' "Large
    /// kernels"), keeping the longest's length.
    fn end_stretch(&mut self) {
        let lines = self.c.lines.len();
        self.longest_stretch = self.longest_stretch.max(lines.saturating_sub(self.stretch.start));
        self.stretch = Stretch { start: lines, loads: 0 };
    }

    /// Opens `for (i = start; i < end; i++)` over `ty`, comparing signed or not.
    fn open_loop(&mut self, ty: &str, start: &str, end: &str, signed: bool) -> Loop {
        self.end_stretch();
        let (head, body, exit) = (self.c.label(), self.c.label(), self.c.label());
        let pre = self.c.block.clone();
        self.c.stmt(format!("br label %{head}"));
        self.c.start(&head);
        let index = self.c.ins("phi"); // completed by `close_loop`, which knows the latch
        let phi_line = self.c.lines.len() - 1;
        let (less, wrap) = if signed { ("slt", "nsw") } else { ("ult", "nuw") };
        let more = self.c.ins(format!("icmp {less} {ty} {index}, {end}"));
        self.c.stmt(format!("br i1 {more}, label %{body}, label %{exit}"));
        self.c.start(&body);
        Loop { phi_line, index, ty: ty.to_string(), wrap, start: start.to_string(), pre, head, exit, fmas: 0 }
    }

    fn close_loop(&mut self, l: Loop) {
        self.end_stretch();
        let Loop { phi_line, index, ty, wrap, start, pre, head, exit, fmas } = l;
        // `index < end` held in the body, so `index + 1` cannot wrap.
        let next = self.c.ins(format!("add {wrap} {ty} {index}, 1"));
        let latch = self.c.block.clone();
        if fmas * 4 >= self.registers() * 3 {
            // A tile whose accumulators take three quarters of the vector registers or more
            // (13 rows of 2 vectors): unrolled (a convolution's 3 taps of a row), LLVM keeps
            // each row's pixel broadcast for the next tap, and the tile spills (SqueezeNet's
            // r_4_13_32_2_13_64_3_3: 413 µs unrolled, 224 µs not).
            self.unrolled_never += 1;
            let id = 1 + self.unrolled_never;
            self.c.stmt(format!("br label %{head}, !llvm.loop !{id}"));
        } else {
            self.c.stmt(format!("br label %{head}"));
        }
        if let Some(line) = self.c.lines.get_mut(phi_line) {
            *line = format!("  {index} = phi {ty} [ {start}, %{pre} ], [ {next}, %{latch} ]");
        }
        self.c.start(&exit);
    }

    /// The target's vector registers: 32 with AVX-512's 64-byte vectors, else 16.
    fn registers(&self) -> usize {
        if self.r.vector_bytes >= 64 { 32 } else { 16 }
    }

    /// A new `alloca` slot of `ty` in the entry block.
    fn alloca(&mut self, ty: Ty) -> String {
        let name = format!("%slot{}", self.allocas.len());
        self.allocas.push(format!("{name} = alloca {}", ty.name()));
        name
    }

    fn value(&self, n: &UOp) -> Result<Value> {
        self.values.get(&n.content_hash()).cloned().ok_or_else(|| render_err(n, "used before it is defined"))
    }

    fn value_or_const(&mut self, n: &UOp) -> Result<Value> {
        if n.op() == Op::Const { Ok(Value::Reg(self.constant(n)?)) } else { self.value(n) }
    }

    /// `v` (of dtype `dt`) as an operand: a slot is loaded here.
    fn materialize(&mut self, n: &UOp, v: &Value, dt: DType) -> Result<String> {
        match v {
            Value::Reg(r) => Ok(r.clone()),
            Value::Slot(slot) => {
                let (s, w) = lanes(n, dt)?;
                Ok(self.c.ins(format!("load {}, ptr {slot}", Ty::reg(s, w).name())))
            }
        }
    }

    /// The node as an operand.
    fn operand(&mut self, n: &UOp) -> Result<String> {
        if n.op() == Op::Const {
            return self.constant(n);
        }
        let v = self.value(n)?;
        if n.dtype().is_ptr() {
            return match v {
                Value::Reg(r) => Ok(r),
                Value::Slot(_) => Err(render_err(n, "a pointer cannot be a mutable value")),
            };
        }
        self.materialize(n, &v, n.dtype())
    }

    fn constant(&mut self, n: &UOp) -> Result<String> {
        let DType::Scalar(s) = n.dtype() else {
            return Err(render_err(n, "constants are scalars (broadcast vectors with VECTORIZE)"));
        };
        let v = match n.arg() {
            Arg::Bool(b) => Lit::Int(i64::from(*b)),
            Arg::Int(v) => Lit::Int(*v),
            Arg::Float(v) => Lit::Float(*v),
            other => return Err(render_err(n, format!("unsupported constant {other}"))),
        };
        Ok(literal(v, s))
    }

    fn node(&mut self, n: &Arc<UOp>) -> Result<()> {
        let src = n.src();
        match n.op() {
            Op::Sink | Op::Param | Op::DefineVar | Op::Special | Op::Const => {}
            Op::Bind => {
                let v = self.value_or_const(&src[1])?;
                self.values.insert(n.content_hash(), v);
            }
            Op::After => {
                let v = self.value_or_const(&src[0])?;
                self.values.insert(n.content_hash(), v);
            }
            Op::Range => {
                let (s, _) = lanes(n, n.dtype())?;
                if !s.is_int() {
                    return Err(render_err(n, "a loop counts in an integer type"));
                }
                let extent = self.operand(&src[0])?;
                for carry in self.carries.get(&n.content_hash()).cloned().unwrap_or_default() {
                    let (cs, w) = lanes(n, carry.dtype)?;
                    let ty = Ty::reg(cs, w);
                    let zero = zero(cs);
                    self.c.stmt(format!("store {} {}, ptr {}", ty.name(), ty.splat(&zero), carry.slot));
                }
                let l = self.open_loop(&Ty::reg(s, 1).name(), "0", &extent, s.is_signed());
                self.values.insert(n.content_hash(), Value::Reg(l.index.clone()));
                self.blocks.push(Block {
                    range: Some(n.content_hash()),
                    commits: Vec::new(),
                    kind: BlockKind::Loop(l),
                });
            }
            Op::End | Op::EndIf => self.end(n)?,
            Op::If => {
                let cond = self.operand(&src[0])?;
                let (then, end) = (self.c.label(), self.c.label());
                self.c.stmt(format!("br i1 {cond}, label %{then}, label %{end}"));
                self.c.start(&then);
                self.blocks.push(Block {
                    range: Some(n.content_hash()),
                    commits: Vec::new(),
                    kind: BlockKind::If { end },
                });
            }
            Op::Index => {
                let base = self.operand(&src[0])?;
                let DType::Ptr { scalar, .. } = n.dtype() else {
                    return Err(render_err(n, "INDEX must yield a pointer"));
                };
                let (is, _) = lanes(&src[1], src[1].dtype())?;
                let idx = self.operand(&src[1])?;
                let idx = self.int_resize(&idx, is, Scalar::I64, 1);
                let p = self.c.ins(format!("getelementptr {}, ptr {base}, i64 {idx}", Ty::mem(scalar, 1).name()));
                self.values.insert(n.content_hash(), Value::Reg(p));
            }
            Op::Load => {
                let addr = self.operand(&src[0])?;
                let (s, w) = lanes(n, n.dtype())?;
                if src.len() == 3 {
                    let (alt, gate) = (self.operand(&src[1])?, self.operand(&src[2])?);
                    let (load, done) = (self.c.label(), self.c.label());
                    let before = self.c.block.clone();
                    self.c.stmt(format!("br i1 {gate}, label %{load}, label %{done}"));
                    self.c.start(&load);
                    let v = self.load(&addr, s, w);
                    let from = self.c.block.clone();
                    self.c.stmt(format!("br label %{done}"));
                    self.c.start(&done);
                    let t = Ty::reg(s, w).name();
                    let r = self.c.ins(format!("phi {t} [ {v}, %{from} ], [ {alt}, %{before} ]"));
                    self.values.insert(n.content_hash(), Value::Reg(r));
                } else {
                    let v = self.load(&addr, s, w);
                    self.values.insert(n.content_hash(), Value::Reg(v));
                }
            }
            Op::Store => {
                let addr = self.operand(&src[0])?;
                let value = self.operand(&src[1])?;
                let (s, w) = lanes(&src[1], src[1].dtype())?;
                let global = matches!(src[0].dtype(), DType::Ptr { space: AddrSpace::Global, .. });
                let nt = if !global {
                    NonTemporal::Never
                } else if n.store_hint() == StoreHint::NonTemporal {
                    NonTemporal::Always
                } else {
                    param_slot(&src[0])
                        .and_then(|slot| self.streamed.get(&slot))
                        .map_or(NonTemporal::Never, |on| NonTemporal::When(on.clone()))
                };
                if src.len() == 3 {
                    let gate = self.operand(&src[2])?;
                    let (store, done) = (self.c.label(), self.c.label());
                    self.c.stmt(format!("br i1 {gate}, label %{store}, label %{done}"));
                    self.c.start(&store);
                    self.store(&addr, &value, s, w, &nt);
                    self.c.stmt(format!("br label %{done}"));
                    self.c.start(&done);
                } else {
                    self.store(&addr, &value, s, w, &nt);
                }
            }
            Op::DefineAcc => {
                let (s, w) = lanes(n, n.dtype())?;
                let ty = Ty::reg(s, w);
                let init = self.operand(&src[0])?;
                let slot = self.alloca(ty);
                self.c.stmt(format!("store {} {init}, ptr {slot}", ty.name()));
                self.values.insert(n.content_hash(), Value::Slot(slot));
            }
            Op::Assign => {
                let Value::Slot(slot) = self.value(&src[0])? else {
                    return Err(render_err(n, "assigns to something that is not an accumulator"));
                };
                let value = self.value_or_const(&src[1])?;
                if let Some(block) = self.blocks.last_mut() {
                    block.commits.push((slot, value.clone(), src[1].dtype()));
                }
                self.values.insert(n.content_hash(), value);
            }
            Op::And if let Some((x, s, lo, hi)) = range_test(n) => {
                let r = self.range_check(&x, s, lo, hi)?;
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            op if op.is_alu() => {
                let mut args = Vec::with_capacity(src.len());
                for s in src {
                    args.push((self.operand(s)?, s.dtype()));
                }
                let r = self.alu(n, op, &args)?;
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            Op::Wmma => {
                let Arg::Wmma(w) = n.arg() else { return Err(render_err(n, "needs its shape argument")) };
                if w.threads != 1 {
                    return Err(unsupported_wmma(
                        w,
                        "the CPU renders the one-thread form (threads 1); the 32-thread warp forms are CUDA's",
                    ));
                }
                let args = [self.operand(&src[0])?, self.operand(&src[1])?, self.operand(&src[2])?];
                let r = super::wmma::call(&mut self.c, w, &args);
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            Op::Cast => {
                let v = self.operand(&src[0])?;
                let ((from, w), (to, tw)) = (lanes(&src[0], src[0].dtype())?, lanes(n, n.dtype())?);
                if w != tw {
                    return Err(render_err(n, format!("cannot cast {} to {}", src[0].dtype(), n.dtype())));
                }
                let r = self.cast(&v, from, to, w);
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            Op::Bitcast => {
                let v = self.operand(&src[0])?;
                let r = self.bitcast(n, &v, src[0].dtype(), n.dtype())?;
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            Op::Vectorize => {
                let (s, w) = lanes(n, n.dtype())?;
                let lanes: Vec<String> = if src.len() == 1 {
                    vec![self.operand(&src[0])?; w as usize]
                } else {
                    src.iter().map(|l| self.operand(l)).collect::<Result<_>>()?
                };
                let r = self.c.build(Ty::reg(s, w), &lanes);
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            Op::Gep => {
                let v = self.operand(&src[0])?;
                let (s, w) = lanes(&src[0], src[0].dtype())?;
                let lane = n.arg_int().unwrap_or(0);
                let lane =
                    u8::try_from(lane).ok().filter(|l| *l < w).ok_or_else(|| render_err(n, "lane out of range"))?;
                let r = self.c.lane(&v, Ty::reg(s, w), lane);
                self.values.insert(n.content_hash(), Value::Reg(r));
            }
            op => return Err(render_err(n, format!("{op} cannot be rendered"))),
        }
        Ok(())
    }

    /// Stores the accumulator updates `commits`.
    fn commit(&mut self, commits: Vec<(String, Value, DType)>) -> Result<()> {
        for (slot, value, dt) in commits {
            let (s, w) = match dt {
                DType::Scalar(s) => (s, 1),
                DType::Vector(s, w) => (s, w),
                other => return Err(Error::Render(format!("ASSIGN of a {other}"))),
            };
            let v = match value {
                Value::Reg(r) => r,
                Value::Slot(other) => self.c.ins(format!("load {}, ptr {other}", Ty::reg(s, w).name())),
            };
            self.c.stmt(format!("store {} {v}, ptr {slot}", Ty::reg(s, w).name()));
        }
        Ok(())
    }

    fn end(&mut self, n: &Arc<UOp>) -> Result<()> {
        let range = n.src()[0].content_hash();
        if self.blocks.last().is_some_and(|b| b.range == Some(range)) {
            let Some(block) = self.blocks.pop() else { return Ok(()) };
            self.commit(block.commits)?;
            for carry in self.carries.get(&range).cloned().unwrap_or_default() {
                let Some(v) = self.values.get(&carry.value).cloned() else {
                    return Err(render_err(n, "the value carried out of the loop is not defined in it"));
                };
                let v = self.materialize(n, &v, carry.dtype)?;
                let (s, w) = lanes(n, carry.dtype)?;
                self.c.stmt(format!("store {} {v}, ptr {}", Ty::reg(s, w).name(), carry.slot));
            }
            match block.kind {
                BlockKind::Loop(l) => self.close_loop(l),
                BlockKind::If { end } => {
                    self.c.stmt(format!("br label %{end}"));
                    self.c.start(&end);
                }
                BlockKind::Body => {}
            }
        } else if self.blocks.iter().any(|b| b.range == Some(range)) {
            return Err(render_err(n, "closes a loop while an inner loop is still open"));
        }
        if n.dtype() != DType::Void
            && let Some(acc) = acc_of(n)
        {
            let v = self.value(&acc)?;
            // The END's value is the accumulator after its updates: store any update still
            // pending in an enclosing block (one the linearizer placed outside the loop).
            if let Value::Slot(slot) = &v {
                let mut pending = Vec::new();
                for block in &mut self.blocks {
                    block.commits.retain(|c| {
                        let keep = c.0 != *slot;
                        if !keep {
                            pending.push(c.clone());
                        }
                        keep
                    });
                }
                self.commit(pending)?;
            }
            self.values.insert(n.content_hash(), v);
        }
        Ok(())
    }

    /// A load of a buffer's `w` lanes of `s` at `addr`; every [`CHAIN_LOADS`] of them in one
    /// straight-line stretch, a chain break (see the module docs' "Large kernels").
    fn load(&mut self, addr: &str, s: Scalar, w: u8) -> String {
        let mt = Ty::mem(s, w);
        let v = self.c.ins(format!("load {}, ptr {addr}, align {}", mt.name(), s.size()));
        self.stretch.loads += 1;
        if self.stretch.loads.is_multiple_of(CHAIN_LOADS) {
            let slot = match &self.chain_slot {
                Some(slot) => slot.clone(),
                None => {
                    let slot = self.alloca(Ty::new("i8", 1));
                    self.chain_slot = Some(slot.clone());
                    slot
                }
            };
            self.c.stmt(format!("store volatile i8 0, ptr {slot}, align 1"));
        }
        if s == Scalar::Bool { self.c.ins(format!("icmp ne {} {v}, zeroinitializer", mt.name())) } else { v }
    }

    fn store(&mut self, addr: &str, value: &str, s: Scalar, w: u8, nt: &NonTemporal) {
        self.buffer_stores += 1;
        let mt = Ty::mem(s, w);
        let v = if s == Scalar::Bool {
            self.c.ins(format!("zext {} {value} to {}", Ty::reg(s, w).name(), mt.name()))
        } else {
            value.to_string()
        };
        let bytes = w as usize * s.size();
        let vector = w > 1 && w.is_power_of_two() && matches!(bytes, 16 | 32 | 64);
        let scalar = w == 1 && s != Scalar::Bool && matches!(bytes, 4 | 8);
        let when = match nt {
            NonTemporal::Always => "true".to_string(),
            NonTemporal::When(on) => on.clone(),
            NonTemporal::Never => String::new(),
        };
        if when.is_empty() || !(vector || scalar) {
            self.c.stmt(format!("store {} {v}, ptr {addr}, align {}", mt.name(), s.size()));
            return;
        }
        // As the C pair's `kiln_stnt_T`: non-temporal where the address is aligned to the
        // register the store takes (LLVM splits an unaligned one into 8-byte `movnti`s), else
        // a plain store, so any element-aligned view stays valid.
        self.nontemporal = true;
        let align = bytes.min(self.r.vector_bytes.max(16));
        let name = format!("kiln_stnt_{}", mt.mangle());
        let ty = mt.name();
        self.c.declare(&name, || {
            format!(
                "define internal void @{name}(ptr %p, {ty} %v, i1 %stream) alwaysinline nounwind {{\n\
                 entry:\n  %a = ptrtoint ptr %p to i64\n  %m = and i64 %a, {}\n  %aligned = icmp eq i64 %m, 0\n  \
                 %ok = and i1 %aligned, %stream\n  br i1 %ok, label %nt, label %plain\nnt:\n  \
                 store {ty} %v, ptr %p, align {align}, !nontemporal !0\n  ret void\nplain:\n  \
                 store {ty} %v, ptr %p, align {}\n  ret void\n}}",
                align - 1,
                s.size()
            )
        });
        self.c.stmt(format!("call void @{name}(ptr {addr}, {ty} {v}, i1 {when})"));
    }

    /// `v`, an integer (or bool) of `from`, as `to`: truncated, or extended by `from`'s sign.
    fn int_resize(&mut self, v: &str, from: Scalar, to: Scalar, w: u8) -> String {
        let (ft, tt) = (Ty::reg(from, w), Ty::reg(to, w));
        let (fb, tb) = (bits(from), bits(to));
        if fb == tb {
            v.to_string()
        } else if fb > tb {
            self.c.ins(format!("trunc {} {v} to {}", ft.name(), tt.name()))
        } else {
            let ext = if from.is_signed() { "sext" } else { "zext" };
            self.c.ins(format!("{ext} {} {v} to {}", ft.name(), tt.name()))
        }
    }

    fn alu(&mut self, n: &UOp, op: Op, args: &[(String, DType)]) -> Result<String> {
        let operand = args.get(if op == Op::Where { 1 } else { 0 }).map_or(DType::Void, |a| a.1);
        let (s, w) = lanes(n, operand)?;
        if args.len() != op_arity(op) {
            return Err(render_err(n, format!("{op} takes {} operands", op_arity(op))));
        }
        let a: Vec<String> = args.iter().map(|a| a.0.clone()).collect();
        if op == Op::MulAcc && w > 1 && s.is_float() {
            let innermost = self.blocks.iter_mut().rev().find_map(|b| match &mut b.kind {
                BlockKind::Loop(l) => Some(l),
                _ => None,
            });
            if let Some(l) = innermost {
                l.fmas += 1;
            }
        }
        if op == Op::Where {
            let ty = Ty::reg(s, w);
            let ct = if args[0].1.width() > 1 { ty.with("i1").name() } else { "i1".to_string() };
            let t = ty.name();
            return Ok(self.c.ins(format!("select {ct} {}, {t} {}, {t} {}", a[0], a[1], a[2])));
        }
        if is_half(s) {
            let f: Vec<String> = a.iter().map(|x| to_f32(&mut self.c, x, s, w)).collect();
            let r = self.float_op(n, op, Ty::new("float", w), &f, false)?;
            return Ok(if op.is_comparison() { r } else { from_f32(&mut self.c, &r, s, w) });
        }
        if s.is_float() {
            return self.float_op(n, op, Ty::reg(s, w), &a, w > 1);
        }
        self.int_op(n, op, s, w, &a)
    }

    /// `lo < x && x < hi` ([`range_test`]) as one unsigned compare, `x - (lo + 1) <u hi - (lo + 1)`:
    /// the same truth for every `x`. Written as two compares, LLVM's range analysis turns each
    /// into an inequality (`x != 0`, `x != 57` where `x` counts 0..58) and their conjunction into
    /// a switch, and its loop vectorizer takes no loop with a switch: a padding copy's gated load
    /// stayed scalar.
    fn range_check(&mut self, x: &Arc<UOp>, s: Scalar, lo: i128, hi: i128) -> Result<String> {
        let t = Ty::reg(s, 1).name();
        let v = self.operand(x)?;
        let (from, width) = (lo + 1, hi - lo - 1);
        let d = self.c.ins(format!("sub {t} {v}, {}", int_lit(from as i64, s)));
        Ok(self.c.ins(format!("icmp ult {t} {d}, {}", int_lit(width as i64, s))))
    }

    /// ALU `op` on f32/f64 values of `ty`; `vector`: with the C pair's whole-vector forms (an
    /// f32/f64 vector), else lane by lane as its scalar code computes.
    fn float_op(&mut self, n: &UOp, op: Op, ty: Ty, a: &[String], vector: bool) -> Result<String> {
        let t = ty.name();
        let bin = |c: &mut Code, i: &str| c.ins(format!("{i} {t} {}, {}", a[0], a[1]));
        let libm = |c: &mut Code, f: &str| {
            let name = if ty.elem == "float" { format!("{f}f") } else { f.to_string() };
            let scalar = ty.elem.to_string();
            c.per_lane(ty, ty, a, |c, l| {
                let args: Vec<(String, String)> = l.iter().map(|x| (scalar.clone(), x.clone())).collect();
                c.call(&scalar, &name, &args)
            })
        };
        Ok(match op {
            Op::Add => bin(&mut self.c, "fadd"),
            Op::Sub => bin(&mut self.c, "fsub"),
            Op::Mul => bin(&mut self.c, "fmul"),
            Op::Div => bin(&mut self.c, "fdiv"),
            Op::Neg => self.c.ins(format!("fneg {t} {}", a[0])),
            Op::Recip => self.c.ins(format!("fdiv {t} {}, {}", ty.splat(&float_lit(1.0, ty.elem)), a[0])),
            Op::Sqrt => self.c.intrinsic("sqrt", ty, &[&a[0]]),
            Op::Trunc => self.c.intrinsic("trunc", ty, &[&a[0]]),
            Op::Abs => self.c.intrinsic("fabs", ty, &[&a[0]]),
            Op::Exp | Op::Exp2 | Op::Log | Op::Log2 if vector => {
                let f = match op {
                    Op::Exp => "exp",
                    Op::Exp2 => "exp2",
                    Op::Log => "log",
                    _ => "log2",
                };
                let r = self.r;
                let name = super::vmath::function(&mut self.c, &|bytes| r.fused_madd(bytes), f, ty);
                self.c.ins(format!("call {t} @{name}({t} {})", a[0]))
            }
            Op::Exp => libm(&mut self.c, "exp"),
            Op::Exp2 => libm(&mut self.c, "exp2"),
            Op::Log => libm(&mut self.c, "log"),
            Op::Log2 => libm(&mut self.c, "log2"),
            Op::Sin => libm(&mut self.c, "sin"),
            Op::Cos => libm(&mut self.c, "cos"),
            Op::Pow => libm(&mut self.c, "pow"),
            Op::Max | Op::Min => {
                // The C pair's rule (`max_min`), scalar or vector: a > b ? a : b (MIN: <), then a
                // where b is NaN; on x86 one `maxps`/`minps` and a blend.
                let cmp = if op == Op::Max { "ogt" } else { "olt" };
                let pick = self.c.ins(format!("fcmp {cmp} {t} {}, {}", a[0], a[1]));
                let m = self.c.select(&pick, ty, &a[0], &a[1]);
                let nan = self.c.ins(format!("fcmp uno {t} {}, {}", a[1], a[1]));
                self.c.select(&nan, ty, &a[0], &m)
            }
            Op::MulAcc => self.c.intrinsic("fma", ty, &[&a[0], &a[1], &a[2]]),
            Op::Lt => bin(&mut self.c, "fcmp olt"),
            Op::Le => bin(&mut self.c, "fcmp ole"),
            Op::Eq => bin(&mut self.c, "fcmp oeq"),
            Op::Ne => bin(&mut self.c, "fcmp une"),
            op => return Err(render_err(n, format!("{op} is not an ALU op on floats"))),
        })
    }

    /// ALU `op` on integers or bools of `s`, `w` lanes.
    fn int_op(&mut self, n: &UOp, op: Op, s: Scalar, w: u8, a: &[String]) -> Result<String> {
        let ty = Ty::reg(s, w);
        let t = ty.name();
        let boolean = s == Scalar::Bool;
        let bin = |c: &mut Code, i: &str| c.ins(format!("{i} {t} {}, {}", a[0], a[1]));
        let sign = |signed: &str, unsigned: &str| if s.is_signed() { signed.to_string() } else { unsigned.to_string() };
        Ok(match op {
            // C computes bools in int and converts back (`!= 0`): + is OR, - is XOR, * is AND.
            Op::Add if boolean => bin(&mut self.c, "or"),
            Op::Sub if boolean => bin(&mut self.c, "xor"),
            Op::Mul if boolean => bin(&mut self.c, "and"),
            Op::Add => bin(&mut self.c, "add"),
            Op::Sub => bin(&mut self.c, "sub"),
            Op::Mul => bin(&mut self.c, "mul"),
            Op::And => bin(&mut self.c, "and"),
            Op::Or => bin(&mut self.c, "or"),
            Op::Xor => bin(&mut self.c, "xor"),
            Op::Neg | Op::Not if boolean => self.c.ins(format!("xor {t} {}, {}", a[0], ty.splat("true"))),
            Op::Neg => self.c.ins(format!("sub {t} {}, {}", ty.splat("0"), a[0])),
            Op::Not => self.c.ins(format!("xor {t} {}, {}", a[0], ty.splat("-1"))),
            Op::Abs if s.is_signed() => {
                let neg = self.c.ins(format!("sub {t} {}, {}", ty.splat("0"), a[0]));
                let below = self.c.ins(format!("icmp slt {t} {}, {}", a[0], ty.splat("0")));
                self.c.select(&below, ty, &neg, &a[0])
            }
            Op::Abs => a[0].clone(),
            Op::Max | Op::Min => {
                let cmp = match op {
                    Op::Max => sign("sgt", "ugt"),
                    _ => sign("slt", "ult"),
                };
                let pick = self.c.ins(format!("icmp {cmp} {t} {}, {}", a[0], a[1]));
                self.c.select(&pick, ty, &a[0], &a[1])
            }
            Op::MulAcc => {
                let (mul, add) = if boolean { ("and", "or") } else { ("mul", "add") };
                let p = self.c.ins(format!("{mul} {t} {}, {}", a[0], a[1]));
                self.c.ins(format!("{add} {t} {p}, {}", a[2]))
            }
            // A bool shifts as the int it promotes to: left by 0 or 1 keeps it, right by 1 clears it.
            Op::Shl if boolean => a[0].clone(),
            Op::Shr if boolean => {
                let keep = self.c.ins(format!("xor {t} {}, {}", a[1], ty.splat("true")));
                self.c.ins(format!("and {t} {}, {keep}", a[0]))
            }
            Op::Shl | Op::Shr => {
                let mask = (bits(s) - 1).to_string();
                let count = self.c.ins(format!("and {t} {}, {}", a[1], ty.splat(&mask)));
                let i = match op {
                    Op::Shl => "shl".to_string(),
                    _ => sign("ashr", "lshr"),
                };
                self.c.ins(format!("{i} {t} {}, {count}", a[0]))
            }
            Op::Lt => bin(&mut self.c, &format!("icmp {}", sign("slt", "ult"))),
            Op::Le => bin(&mut self.c, &format!("icmp {}", sign("sle", "ule"))),
            Op::Eq => bin(&mut self.c, "icmp eq"),
            Op::Ne => bin(&mut self.c, "icmp ne"),
            Op::Idiv | Op::Mod => self.int_division(n, op, s, w, &a[0], &a[1]),
            op => return Err(render_err(n, format!("{op} is not an ALU op on {s}"))),
        })
    }

    /// IDIV or MOD with kiln's defined results (see the module docs): the divisor is replaced
    /// by 1 where the division would trap, and the result by the defined value where it is 0.
    /// A constant divisor that cannot trap divides plainly.
    fn int_division(&mut self, n: &UOp, op: Op, s: Scalar, w: u8, x: &str, d: &str) -> String {
        let ty = Ty::reg(s, w);
        let t = ty.name();
        let i = match (op, s.is_signed()) {
            (Op::Idiv, true) => "sdiv",
            (Op::Idiv, false) => "udiv",
            (_, true) => "srem",
            (_, false) => "urem",
        };
        let divisor = n.src().get(1).and_then(|d| const_int_operand(d));
        if divisor.is_some_and(|c| wrap(c, s) != 0 && !(s.is_signed() && wrap(c, s) == -1)) {
            return self.c.ins(format!("{i} {t} {x}, {d}"));
        }
        let (zero, one) = (literal(Lit::Int(0), s), literal(Lit::Int(1), s));
        let is_zero = self.c.ins(format!("icmp eq {t} {d}, {}", ty.splat(&zero)));
        let traps = match s.int_range() {
            Some((min, _)) if s.is_signed() => {
                let is_min = self.c.ins(format!("icmp eq {t} {x}, {}", ty.splat(&literal(Lit::Int(min as i64), s))));
                let minus_one = self.c.ins(format!("icmp eq {t} {d}, {}", ty.splat("-1")));
                let overflow = self.c.ins(format!("and {} {is_min}, {minus_one}", ty.with("i1").name()));
                self.c.ins(format!("or {} {is_zero}, {overflow}", ty.with("i1").name()))
            }
            _ => is_zero.clone(),
        };
        let safe = self.c.select(&traps, ty, &ty.splat(&one), d);
        let q = self.c.ins(format!("{i} {t} {x}, {safe}"));
        let by_zero = if op == Op::Idiv { ty.splat(&zero) } else { x.to_string() };
        self.c.select(&is_zero, ty, &by_zero, &q)
    }

    /// `v`, `w` lanes of f64, rounded to f32 by round-to-odd (the C pair's
    /// `kiln_f64_to_f32_odd`), so that one more rounding to f16/bf16 rounds the f64 once.
    fn f64_to_f32_odd(&mut self, v: &str, w: u8) -> String {
        let (d, f) = (Ty::new("double", w), Ty::new("float", w));
        let (dt, ft, it) = (d.name(), f.name(), f.with("i32").name());
        let b = f.with("i1").name();
        let r = self.c.ins(format!("fptrunc {dt} {v} to {ft}"));
        let back = self.c.ins(format!("fpext {ft} {r} to {dt}"));
        let exact = self.c.ins(format!("fcmp oeq {dt} {back}, {v}"));
        let nan = self.c.ins(format!("fcmp uno {dt} {v}, {v}"));
        let keep = self.c.ins(format!("or {b} {exact}, {nan}"));
        let u = self.c.ins(format!("bitcast {ft} {r} to {it}"));
        let (ab, av) = (self.c.intrinsic("fabs", d, &[&back]), self.c.intrinsic("fabs", d, &[v]));
        let away = self.c.ins(format!("fcmp ogt {dt} {ab}, {av}"));
        let down = self.c.ins(format!("sub {it} {u}, {}", f.with("i32").splat("1")));
        let toward = self.c.select(&away, f.with("i32"), &down, &u);
        let odd = self.c.ins(format!("or {it} {toward}, {}", f.with("i32").splat("1")));
        let oddf = self.c.ins(format!("bitcast {it} {odd} to {ft}"));
        self.c.select(&keep, f, &r, &oddf)
    }

    /// CAST of `w` lanes of `from` to `to`, as the C pair's conversions.
    fn cast(&mut self, v: &str, from: Scalar, to: Scalar, w: u8) -> String {
        if from == to {
            return v.to_string();
        }
        let (ft, tt) = (Ty::reg(from, w), Ty::reg(to, w));
        if to == Scalar::Bool {
            let (x, xs) =
                if is_half(from) { (to_f32(&mut self.c, v, from, w), Scalar::F32) } else { (v.to_string(), from) };
            let xt = Ty::reg(xs, w);
            return if xs.is_float() {
                self.c.ins(format!("fcmp une {} {x}, {}", xt.name(), xt.splat(&float_lit(0.0, xt.elem))))
            } else {
                self.c.ins(format!("icmp ne {} {x}, zeroinitializer", xt.name()))
            };
        }
        if is_half(from) {
            let f = to_f32(&mut self.c, v, from, w);
            return if to == Scalar::F32 { f } else { self.cast(&f, Scalar::F32, to, w) };
        }
        if is_half(to) {
            let f = match from {
                Scalar::F32 => v.to_string(),
                Scalar::F64 => self.f64_to_f32_odd(v, w),
                _ => {
                    let i = if from.is_signed() { "sitofp" } else { "uitofp" };
                    self.c.ins(format!("{i} {} {v} to {}", ft.name(), Ty::new("float", w).name()))
                }
            };
            return from_f32(&mut self.c, &f, to, w);
        }
        match (from.is_float(), to.is_float()) {
            (true, false) => {
                let base = if to.is_signed() { "fptosi.sat" } else { "fptoui.sat" };
                let name = format!("llvm.{base}.{}.{}", tt.mangle(), ft.mangle());
                self.c.call(&tt.name(), &name, &[(ft.name(), v.to_string())])
            }
            (true, true) => {
                let i = if bits(to) > bits(from) { "fpext" } else { "fptrunc" };
                self.c.ins(format!("{i} {} {v} to {}", ft.name(), tt.name()))
            }
            (false, true) => {
                let i = if from.is_signed() { "sitofp" } else { "uitofp" };
                self.c.ins(format!("{i} {} {v} to {}", ft.name(), tt.name()))
            }
            (false, false) => self.int_resize(v, from, to, w),
        }
    }

    /// BITCAST of `v` from `from` to `to` (equal sizes); bools are their bytes.
    fn bitcast(&mut self, n: &UOp, v: &str, from: DType, to: DType) -> Result<String> {
        let ((fs, fw), (ts, tw)) = (lanes(n, from)?, lanes(n, to)?);
        if fs.size() * fw as usize != ts.size() * tw as usize {
            return Err(render_err(n, format!("BITCAST of {from} to {to} changes the size")));
        }
        let (mut x, mut xt) = (v.to_string(), Ty::reg(fs, fw));
        if fs == Scalar::Bool {
            let bytes = Ty::mem(fs, fw);
            x = self.c.ins(format!("zext {} {x} to {}", xt.name(), bytes.name()));
            xt = bytes;
        }
        let target = Ty::mem(ts, tw);
        if xt != target {
            x = self.c.ins(format!("bitcast {} {x} to {}", xt.name(), target.name()));
        }
        if ts == Scalar::Bool {
            x = self.c.ins(format!("icmp ne {} {x}, zeroinitializer", target.name()));
        }
        Ok(x)
    }
}

/// A constant's payload.
#[derive(Clone, Copy)]
enum Lit {
    Int(i64),
    Float(f64),
}

/// The operand text of constant `v` as a value of `s`.
fn literal(v: Lit, s: Scalar) -> String {
    match (v, s) {
        (Lit::Int(i), s) if !s.is_float() => int_lit(wrap(i, s), s),
        (Lit::Float(f), s) if !s.is_float() => int_lit(wrap(f as i64, s), s),
        (v, s) => {
            let f = match v {
                Lit::Int(i) => i as f64,
                Lit::Float(f) => f,
            };
            match s {
                Scalar::F16 => int_lit(i64::from(f16_bits(f)), Scalar::I16),
                Scalar::BF16 => int_lit(i64::from(bf16_bits(f)), Scalar::I16),
                Scalar::F32 => float_lit(f, "float"),
                _ => float_lit(f, "double"),
            }
        }
    }
}

/// `v` wrapped into the range of `s` (bools: 0 or 1).
fn wrap(v: i64, s: Scalar) -> i64 {
    kiln_cstyle::wrap_int(v, s)
}

fn zero(s: Scalar) -> String {
    literal(Lit::Int(0), s)
}

/// The bit width of `s` in registers (bool: 1).
fn bits(s: Scalar) -> usize {
    if s == Scalar::Bool { 1 } else { s.size() * 8 }
}

fn op_arity(op: Op) -> usize {
    if matches!(op, Op::Where | Op::MulAcc) {
        3
    } else if op.is_binary() {
        2
    } else {
        1
    }
}

/// The integer value of an operand known when rendering: a CONST, or a VECTORIZE that
/// broadcasts one CONST.
fn const_int_operand(n: &UOp) -> Option<i64> {
    let c = match n.op() {
        Op::Vectorize if n.src().iter().all(|l| l.content_hash() == n.src()[0].content_hash()) => n.src().first()?,
        _ => n,
    };
    if c.op() == Op::Const { c.arg_int() } else { None }
}

/// `(x, its type, lo, hi)` where `n` is `AND(CMPLT(lo, x), CMPLT(x, hi))`, in either order, of a
/// scalar integer `x` and constants with `lo + 1 < hi`, so that `x - (lo + 1)` taken modulo the
/// type's width is below `hi - lo - 1` exactly where `lo < x < hi` (a padded image's bounds test).
fn range_test(n: &UOp) -> Option<(Arc<UOp>, Scalar, i128, i128)> {
    if n.dtype() != DType::Scalar(Scalar::Bool) || n.src().len() != 2 {
        return None;
    }
    // (x, its type, the constant, whether x is above it) of one CMPLT with a constant side
    let side = |c: &Arc<UOp>| -> Option<(Arc<UOp>, Scalar, i128, bool)> {
        let [a, b] = c.src() else { return None };
        let DType::Scalar(s) = a.dtype() else { return None };
        if c.op() != Op::Lt || !s.is_int() || b.dtype() != a.dtype() {
            return None;
        }
        let value = |k: &Arc<UOp>| {
            let v = k.arg_int()?;
            Some(if s.is_signed() { v as i128 } else { unsigned(v, s) })
        };
        match (a.op() == Op::Const, b.op() == Op::Const) {
            (true, false) => Some((b.clone(), s, value(a)?, true)),
            (false, true) => Some((a.clone(), s, value(b)?, false)),
            _ => None,
        }
    };
    let (first, second) = (side(&n.src()[0])?, side(&n.src()[1])?);
    let ((x, s, lo, _), (y, _, hi, _)) = match (first.3, second.3) {
        (true, false) => (first, second),
        (false, true) => (second, first),
        _ => return None,
    };
    (Arc::ptr_eq(&x, &y) && lo + 1 < hi).then_some((x, s, lo, hi))
}

/// The unsigned value of an integer constant of `s` held in `v`'s low bits.
fn unsigned(v: i64, s: Scalar) -> i128 {
    let bits = 8 * s.size() as u32;
    if bits >= 64 { v as u64 as i128 } else { (v as u64 & ((1u64 << bits) - 1)) as i128 }
}

/// The DEFINE_ACC a valued END (or ASSIGN/AFTER) stands for, if any.
fn acc_of(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let mut node = n.clone();
    loop {
        let next = match node.op() {
            Op::DefineAcc => return Some(node),
            Op::Assign | Op::After => node.src().first()?.clone(),
            Op::End if node.dtype() != DType::Void && node.src().len() > 1 => node.src()[1].clone(),
            _ => return None,
        };
        node = next;
    }
}

/// Every node the SPECIAL extents depend on: constants, variables and arithmetic only (they
/// are computed before any launch index exists).
fn extent_closure(specials: &[Arc<UOp>]) -> Result<HashSet<ContentHash>> {
    let mut out = HashSet::new();
    let mut stack: Vec<Arc<UOp>> = specials.iter().filter_map(|s| s.src().first().cloned()).collect();
    while let Some(n) = stack.pop() {
        if !out.insert(n.content_hash()) {
            continue;
        }
        if !(matches!(n.op(), Op::Const | Op::DefineVar | Op::Bind | Op::Cast) || n.op().is_alu()) {
            return Err(render_err(
                &n,
                "a launch extent may only use constants, variables and arithmetic (no loads, loops or launch indices)",
            ));
        }
        stack.extend(n.src().iter().cloned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::kiln_ir::{KernelBuilder, Val, Wmma};

    fn renderer() -> LlvmRenderer {
        LlvmRenderer::new(64, true)
    }

    #[test]
    fn the_entry_has_the_c_pairs_abi_and_no_fast_math() {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        let v = x.at(&i).load();
        k.store(&y.at(&i), &v.mul_acc(&v, &v.exp()));
        let spec = renderer().render(&k.finish().unwrap(), Some("entry-1")).unwrap();
        assert!(spec.name.starts_with("entry_1_"), "{}", spec.name);
        let header = format!("define void @{}(ptr %bufs, ptr %vals, i64 %core, i64 %ncores) nounwind {{", spec.name);
        assert!(spec.src.contains(&header), "{}", spec.src);
        for needle in ["%data1 = load ptr", "load i64, ptr", "srem i64", "@llvm.fma.f32", "call float @expf("] {
            assert!(spec.src.contains(needle), "`{needle}` missing:\n{}", spec.src);
        }
        for flag in [" fast ", " contract ", " reassoc ", " afn "] {
            assert!(!spec.src.contains(flag), "`{flag}` in:\n{}", spec.src);
        }
    }

    /// The launch loop counts in the index's own type with a no-wrap increment, as the C pair's
    /// `for (int32_t i = ...; i++)`: an i64 counter truncated at every use hid the induction
    /// variable from LLVM's loop analyses, and the loop was never vectorized.
    #[test]
    fn the_launch_loop_counts_in_the_index_type() {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        k.store(&y.at(&i), &(x.at(&i).load() + 1.0f32));
        let src = renderer().render(&k.finish().unwrap(), Some("inc")).unwrap().src;
        assert!(src.contains(" = phi i32 [") && src.contains(" = add nsw i32 "), "{src}");
        assert!(!src.contains(" = phi i64 ["), "{src}");
    }

    #[test]
    fn a_kernel_without_global_axis_0_runs_in_chunk_0_only() {
        let mut k = KernelBuilder::new();
        let y = k.param(0, Scalar::I32, 1);
        k.store(&y.at(&Val::int(0)), &Val::int(7).cast(DType::I32));
        let src = renderer().render(&k.finish().unwrap(), Some("one")).unwrap().src;
        assert!(src.contains("icmp ne i64 %core, 0") && src.contains("label %exit"), "{src}");
    }

    #[test]
    fn warp_wmma_is_a_render_error_naming_the_op() {
        for w in Wmma::warp_shapes() {
            let mut k = KernelBuilder::new();
            let [a, b, c] = w.operand_dtypes();
            let zero = Val::int(0);
            let load = |k: &mut KernelBuilder, slot: usize, dt: DType| {
                k.param(slot, dt.scalar().unwrap_or(Scalar::F32), 64).at_vec(&zero, dt.width()).load()
            };
            let (va, vb, vc) = (load(&mut k, 0, a), load(&mut k, 1, b), load(&mut k, 2, c));
            let out = k.param(3, w.acc, 64);
            k.store(&out.at_vec(&zero, c.width()), &va.wmma(&vb, &vc, w));
            match renderer().render(&k.finish().unwrap(), Some("k")) {
                Err(Error::Render(m)) => assert!(m.contains("unsupported op WMMA"), "{m}"),
                other => panic!("{w}: {:?}", other.map(|s| s.src)),
            }
        }
    }

    fn chain_breaks(src: &str) -> usize {
        src.matches("store volatile i8 0, ptr ").count()
    }

    /// A straight-line stretch of many loads starts a new memory chain every [`CHAIN_LOADS`]
    /// of them, through one stack byte; one of more than [`NO_SLP_INSTRUCTIONS`] instructions
    /// marks the module for the pipeline without the SLP vectorizer. Small kernels get neither:
    /// their IR is as before (issue 44: LLVM's time grew quadratically with such stretches).
    #[test]
    fn long_straight_line_code_breaks_memory_chains_and_goes_without_slp() {
        let small = renderer().render(&crate::testing::products(100), Some("small")).unwrap().src;
        assert_eq!(chain_breaks(&small), 0, "{small}");
        assert!(!without_slp(&small) && !small.contains("alloca i8"), "{small}");
        let medium = renderer().render(&crate::testing::products(300), Some("medium")).unwrap().src;
        assert_eq!(chain_breaks(&medium), 600 / CHAIN_LOADS, "a break every {CHAIN_LOADS} of 600 loads");
        assert_eq!(medium.matches("= alloca i8").count(), 1, "one slot for every break");
        assert!(!without_slp(&medium), "{} lines", medium.lines().count());
        let large = renderer().render(&crate::testing::products(1000), Some("large")).unwrap().src;
        assert_eq!(chain_breaks(&large), 2000 / CHAIN_LOADS);
        assert!(without_slp(&large), "{}", large.lines().take(3).collect::<Vec<_>>().join("\n"));
        assert!(large.lines().nth(1).is_some_and(|l| l.starts_with(NO_SLP)), "the mark is the module's second line");
    }

    /// A kernel of more than [`NO_INDVARS_STORES`] stores to buffers is marked for the pipeline
    /// without IndVarSimplify, one of as many is not (a vector store counts once).
    #[test]
    fn many_stores_go_without_indvars() {
        let stores = |n: i64| {
            let mut k = KernelBuilder::new();
            let (x, out) = (k.param(0, Scalar::F32, 1024), k.param(1, Scalar::F32, 1024));
            let r = k.range(4);
            let stores: Vec<Val> =
                (0..n).map(|i| k.store(&out.at(&(&r * 256 + i)), &(x.at(&(&r * 256 + i)).load() * 2.0f32))).collect();
            k.end(&r, &stores.iter().collect::<Vec<_>>());
            renderer().render(&k.finish().unwrap(), Some("stores")).unwrap().src
        };
        let (few, many) = (stores(NO_INDVARS_STORES as i64), stores(NO_INDVARS_STORES as i64 + 1));
        assert!(!marked(&few, NO_INDVARS), "{}", few.lines().take(3).collect::<Vec<_>>().join("\n"));
        assert!(
            marked(&many, NO_INDVARS) && !marked(&many, NO_SLP),
            "{}",
            many.lines().take(3).collect::<Vec<_>>().join("\n")
        );
    }

    /// A loop boundary ends a stretch: 200 loads before a loop and 200 in its body are two
    /// stretches, neither long enough for a chain break (a volatile store in a loop body would
    /// keep LLVM from vectorizing the loop).
    #[test]
    fn a_stretch_ends_at_a_loop_boundary() {
        let mut k = KernelBuilder::new();
        let (x, out) = (k.param(0, Scalar::F32, 1000), k.param(1, Scalar::F32, 1));
        let before = (0..200).map(|i| x.at(&Val::int(i)).load()).reduce(|s, v| s + v).unwrap();
        let r = k.range(4);
        let acc = k.acc(&Val::constant(DType::F32, 0.0), &[&r]);
        let body = (0..200).map(|i| x.at(&(&r * 200 + i)).load()).reduce(|s, v| s + v).unwrap();
        let total = acc.update(&(acc.get() + body));
        k.store(&out.at(&Val::int(0)), &(total + before));
        let src = renderer().render(&k.finish().unwrap(), Some("stretches")).unwrap().src;
        assert_eq!(src.matches(" = load float, ptr %t").count(), 400, "{src}");
        assert_eq!(chain_breaks(&src), 0, "{src}");
    }

    #[test]
    fn vector_math_fuses_where_the_c_pair_does() {
        let wide = LlvmRenderer::new(64, true);
        let narrow = LlvmRenderer::new(32, true);
        assert!(wide.fused_madd(64) && !narrow.fused_madd(64) && narrow.fused_madd(32));
        assert!(!wide.fused_madd(8) && !wide.fused_madd(128), "the C pair's lane-loop sizes multiply, then add");
        assert!(!LlvmRenderer::for_isa(Isa::Sse2).fused_madd(16));
    }
}
