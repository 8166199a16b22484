//! Renderer → ProgramSpec → Compiler → CompiledSpec → RuntimeFactory → Program.
//!
//! Metadata about a kernel (its buffers, variables and launch sizes) is derived from the
//! graph in one place, [`ProgramSpec::from_sink`], so no renderer types it by hand.

use std::sync::Arc;

use kiln_ir::bounds::{Bounds, LAUNCH_SLOTS};
use kiln_ir::{Arg, DType, DeviceSpec, Op, Scalar, UOp, eval_int, linearize, validate_sorted, variables_sorted};

use crate::buffer::RawView;
use crate::error::{Error, Result};

/// A runtime integer variable of a kernel with its inclusive bounds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Variable {
    /// The name in the kernel (`DEFINE_VAR`); unique within a kernel.
    pub name: String,
    /// The smallest value a launch may bind.
    pub min: i64,
    /// The largest value a launch may bind; bounds proofs and launch checks rely on it.
    pub max: i64,
}

/// A buffer parameter: slot, element type and element count (an expression over the vars).
#[derive(Debug, Clone)]
pub struct ParamInfo {
    /// The positional index of the buffer in a launch's buffer list.
    pub slot: usize,
    /// The element type the buffer must have.
    pub scalar: Scalar,
    /// The declared element count, over the kernel's variables; a launch's buffer must be at
    /// least this long ([`ProgramSpec::param_lens`] evaluates it).
    pub len: Arc<UOp>,
}

/// Concrete launch sizes after binding the variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Work-group counts per axis (`gidxN` extents), or total work items for `idxN` kernels;
    /// every entry ≥ 1.
    pub global: [usize; 3],
    /// `None` when the kernel uses direct global indices (`idxN`): the backend picks.
    pub local: Option<[usize; 3]>,
}

/// A rendered kernel plus everything needed to launch it.
#[derive(Debug, Clone)]
pub struct ProgramSpec {
    /// Entry point name.
    pub name: String,
    /// Backend source code.
    pub src: String,
    /// The device family the source was rendered for.
    pub device: DeviceSpec,
    /// The kernel's SINK.
    pub ast: Arc<UOp>,
    /// Launch sizes as expressions over the variables (from SPECIAL extents).
    pub global_size: [Arc<UOp>; 3],
    /// Work-group sizes as expressions (from `lidxN` extents; ones without any); `None` for
    /// kernels whose launch indices are all direct (`idxN`), whose work-group size the backend
    /// picks.
    pub local_size: Option<[Arc<UOp>; 3]>,
    /// Variables sorted by name; `var_names` is the positional order of `vals`.
    pub vars: Vec<Variable>,
    /// The names of `vars`, same order: the order of the `vals` every launch passes.
    pub var_names: Vec<String>,
    /// Parameter slots (sorted), slots written by STOREs, slots read by LOADs.
    pub globals: Vec<usize>,
    /// Slots the kernel writes (sorted, deduplicated): what a queue orders later readers on.
    pub outs: Vec<usize>,
    /// Slots the kernel reads (sorted, deduplicated). A slot may be in both.
    pub ins: Vec<usize>,
    /// One entry per slot in `globals`, same order.
    pub params: Vec<ParamInfo>,
    /// What is left of the proof that every LOAD and STORE stays inside its buffer after
    /// proving it for all allowed variable values; [`ProgramSpec::check_bounds`] settles the
    /// rest at each launch.
    pub bounds: Arc<Bounds>,
}

impl ProgramSpec {
    /// Validates `sink` and derives all metadata from it; `src` is the rendered source.
    ///
    /// Slots must be dense (0..n): buffers are passed positionally.
    ///
    /// # Errors
    /// [`Error::Ir`] when `sink` fails validation; [`Error::Render`] for an unknown launch
    /// index name or a gap in the buffer slots.
    pub fn from_sink(name: &str, src: String, device: DeviceSpec, sink: &Arc<UOp>) -> Result<ProgramSpec> {
        let order = sink.toposort();
        validate_sorted(&order)?;
        let one = || UOp::index_const(1);
        let mut global = [one(), one(), one()];
        let mut local: Option<[Arc<UOp>; 3]> = Some([one(), one(), one()]);
        // A kernel that names only direct indices (`idxN`) lets the backend pick its work-group
        // size. One that also names a group index (`gidxN`) needs groups of the sizes its
        // `lidxN` say (one item each without any), or `gidxN` would not count its extent.
        let (mut direct, mut grouped) = (false, false);
        let (mut globals, mut outs, mut ins, mut params) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for node in &order {
            match node.op() {
                Op::Param => {
                    let slot = node.arg_int().unwrap_or(0) as usize;
                    if !globals.contains(&slot) {
                        globals.push(slot);
                        let scalar = node.dtype().scalar().unwrap_or(Scalar::U8);
                        params.push(ParamInfo { slot, scalar, len: node.src()[0].clone() });
                    }
                }
                Op::Special => {
                    let name = node.arg_name().unwrap_or_default();
                    let (kind, axis) = special_axis(name).ok_or_else(|| {
                        Error::Render(format!(
                            "unknown launch index `{name}` (use gidxN, lidxN, idxN with N < 3, or core_id)"
                        ))
                    })?;
                    let extent = node.src()[0].clone();
                    match kind {
                        'g' => {
                            global[axis] = extent;
                            grouped = true;
                        }
                        'l' => {
                            local.get_or_insert_with(|| [one(), one(), one()])[axis] = extent;
                            grouped = true;
                        }
                        _ => {
                            global[axis] = extent;
                            direct = true;
                        }
                    }
                }
                Op::Store | Op::Load => {
                    if let Some(slot) = param_slot(&node.src()[0]) {
                        if node.op() == Op::Store { outs.push(slot) } else { ins.push(slot) }
                    }
                }
                _ => {}
            }
        }
        if direct && !grouped {
            local = None;
        }
        params.sort_by_key(|p| p.slot);
        globals.sort_unstable();
        for v in [&mut outs, &mut ins] {
            v.sort_unstable();
            v.dedup();
        }
        if let Some((i, s)) = globals.iter().enumerate().find(|(i, s)| *i != **s) {
            return Err(Error::Render(format!(
                "buffer slots must be 0..{} without gaps; slot {i} is missing (found {s})",
                globals.len()
            )));
        }
        let vars: Vec<Variable> = variables_sorted(&order)
            .iter()
            .filter_map(|v| match v.arg() {
                Arg::Var { name, min, max } => Some(Variable { name: name.clone(), min: *min, max: *max }),
                _ => None,
            })
            .collect();
        let var_names = vars.iter().map(|v| v.name.clone()).collect();
        let lens: Vec<Arc<UOp>> = params.iter().map(|p| p.len.clone()).collect();
        let [g0, g1, g2] = global.clone();
        let [l0, l1, l2] = local.clone().unwrap_or_else(|| [one(), one(), one()]);
        let launch_slot = |name: &str| special_axis(name).map(|(kind, axis)| if kind == 'l' { 3 + axis } else { axis });
        let bounds = Arc::new(Bounds::prove(sink, &lens, &[g0, g1, g2, l0, l1, l2], &launch_slot));
        Ok(ProgramSpec {
            name: name.to_string(),
            src,
            device,
            ast: sink.clone(),
            global_size: global,
            local_size: local,
            vars,
            var_names,
            globals,
            outs,
            ins,
            params,
            bounds,
        })
    }

    /// Checks `vals` (positional, `var_names` order) against the variables' bounds.
    ///
    /// # Errors
    /// [`Error::Launch`] when the number of values is wrong; [`Error::Ir`]
    /// (`VarOutOfRange`) for the first value outside its variable's bounds.
    pub fn check_vals(&self, vals: &[i64]) -> Result<()> {
        if vals.len() != self.vars.len() {
            return Err(Error::Launch(format!(
                "kernel `{}` takes {} variable(s) ({}), got {} value(s)",
                self.name,
                self.vars.len(),
                self.var_names.join(", "),
                vals.len()
            )));
        }
        for (v, &x) in self.vars.iter().zip(vals) {
            if x < v.min || x > v.max {
                return Err(
                    kiln_ir::IrError::VarOutOfRange { name: v.name.clone(), value: x, min: v.min, max: v.max }.into()
                );
            }
        }
        Ok(())
    }

    /// Evaluates an expression of this kernel with positional `vals` (not checked against the
    /// bounds: see [`ProgramSpec::check_vals`]).
    ///
    /// # Errors
    /// [`Error::Ir`] when the arithmetic overflows, divides by zero or names a variable
    /// `vals` lacks.
    pub fn eval(&self, expr: &Arc<UOp>, vals: &[i64]) -> Result<i64> {
        let lookup = |name: &str| self.var_names.iter().position(|n| n == name).and_then(|i| vals.get(i).copied());
        Ok(eval_int(expr, &lookup)?)
    }

    /// Launch sizes for `vals`: checked arithmetic, every variable within bounds, and every
    /// dimension ≥ 1.
    ///
    /// # Errors
    /// The errors of [`ProgramSpec::check_vals`] and [`ProgramSpec::eval`];
    /// [`Error::Launch`] when a size evaluates below 1 or does not fit `usize`.
    pub fn launch_dims(&self, vals: &[i64]) -> Result<LaunchDims> {
        self.check_vals(vals)?;
        let dims = |exprs: &[Arc<UOp>; 3], what: &str| -> Result<[usize; 3]> {
            let mut out = [1usize; 3];
            for (axis, e) in exprs.iter().enumerate() {
                let v = self.eval(e, vals)?;
                if v <= 0 {
                    return Err(Error::Launch(format!("{what} size on axis {axis} evaluated to {v}; it must be ≥ 1")));
                }
                out[axis] = usize::try_from(v).map_err(|_| Error::Launch(format!("{what} size {v} does not fit")))?;
            }
            Ok(out)
        };
        Ok(LaunchDims {
            global: dims(&self.global_size, "global")?,
            local: self.local_size.as_ref().map(|l| dims(l, "local")).transpose()?,
        })
    }

    /// Element counts of every parameter for `vals`, in slot order (the minimum length of each
    /// launch buffer). Does not check `vals` against the bounds.
    ///
    /// # Errors
    /// The errors of [`ProgramSpec::eval`]; [`Error::Launch`] when a size is negative.
    pub fn param_lens(&self, vals: &[i64]) -> Result<Vec<usize>> {
        self.params
            .iter()
            .map(|p| {
                let n = self.eval(&p.len, vals)?;
                usize::try_from(n).map_err(|_| Error::Launch(format!("buffer {} has negative size {n}", p.slot)))
            })
            .collect()
    }

    /// Refuses a launch that could touch memory outside a buffer: the accesses not proven
    /// for every allowed variable value are decided for these `vals`, the launch sizes
    /// `dims` ([`ProgramSpec::launch_dims`]) and element counts `lens`
    /// ([`ProgramSpec::param_lens`]). Costs nothing for a kernel proven when it was built.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] naming the first access that may leave its buffer.
    pub fn check_bounds(&self, vals: &[i64], dims: &LaunchDims, lens: &[usize]) -> Result<()> {
        if self.bounds.pending() == 0 {
            return Ok(());
        }
        let local = dims.local.unwrap_or([1; 3]);
        let launch: [i64; LAUNCH_SLOTS] = std::array::from_fn(|k| {
            let v = if k < 3 { dims.global[k] } else { local[k - 3] };
            i64::try_from(v).unwrap_or(i64::MAX)
        });
        self.bounds
            .check(vals, &launch, lens)
            .map_err(|access| Error::OutOfBounds { kernel: self.name.clone(), access: Box::new(access) })
    }

    /// How the bounds proof settled each LOAD and STORE, in `%N` order: proven for every
    /// allowed variable value when the kernel was built (no check, no guard in its code), or
    /// left to each launch, which proves it from the bound values or else (under
    /// [`crate::BoundsPolicy::Guard`]) runs the kernel's guarded form ([`crate::guarded`]).
    pub fn access_proofs(&self) -> Vec<AccessProof> {
        let pending = self.bounds.pending_nodes();
        self.ast
            .toposort()
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.op(), Op::Load | Op::Store))
            .map(|(node, n)| AccessProof {
                node,
                op: n.op().name(),
                slot: param_slot(&n.src()[0]),
                at_launch: pending.binary_search(&node).is_ok(),
            })
            .collect()
    }

    /// The linearized kernel (what renderers walk).
    ///
    /// # Errors
    /// [`Error::Ir`] when the graph cannot be linearized.
    pub fn linear(&self) -> Result<Vec<Arc<UOp>>> {
        Ok(linearize(&self.ast)?)
    }

    /// This spec as a PROGRAM value: `PROGRAM(sink, DEVICE, LINEAR, SOURCE[, BINARY])`.
    /// A compiled kernel is then itself content-addressed.
    ///
    /// # Errors
    /// The errors of [`ProgramSpec::linear`].
    pub fn to_uop(&self, binary: Option<&[u8]>) -> Result<Arc<UOp>> {
        let device = UOp::new(Op::Device, DType::Void, Arg::Device(self.device.clone()), vec![]);
        let linear = UOp::new(Op::Linear, DType::Void, Arg::None, self.linear()?);
        let source = UOp::new(Op::Source, DType::Void, Arg::Str(self.src.clone()), vec![]);
        let mut src = vec![self.ast.clone(), device, linear, source];
        if let Some(b) = binary {
            src.push(UOp::new(Op::Binary, DType::Void, Arg::Bytes(b.to_vec()), vec![]));
        }
        Ok(UOp::new(Op::Program, DType::Void, Arg::Str(self.name.clone()), src))
    }

    /// Rebuilds the spec from a PROGRAM value; metadata is derived again from its SINK.
    ///
    /// # Errors
    /// [`Error::Load`] when `program` is not a PROGRAM or lacks its SINK, DEVICE or SOURCE
    /// stage; the errors of [`ProgramSpec::from_sink`].
    pub fn from_uop(program: &Arc<UOp>) -> Result<ProgramSpec> {
        let bad = |m: &str| Error::Load(format!("not a PROGRAM value: {m}"));
        if program.op() != Op::Program {
            return Err(bad(&format!("got {}", program.op())));
        }
        let stage = |op: Op| program.src().iter().find(|s| s.op() == op);
        let sink = stage(Op::Sink).ok_or_else(|| bad("no SINK stage"))?;
        let Some(Arg::Device(device)) = stage(Op::Device).map(|d| d.arg()) else {
            return Err(bad("no DEVICE stage"));
        };
        let Some(Arg::Str(src)) = stage(Op::Source).map(|s| s.arg()) else {
            return Err(bad("no SOURCE stage"));
        };
        let name = program.arg_name().unwrap_or("kernel");
        ProgramSpec::from_sink(name, src.clone(), device.clone(), sink)
    }
}

/// `gidx1` → ('g', 1), `lidx0` → ('l', 0), `idx2` → ('i', 2), `core_id` → ('g', 0).
pub fn special_axis(name: &str) -> Option<(char, usize)> {
    if name == "core_id" {
        return Some(('g', 0));
    }
    let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
    let prefix = &name[..name.len() - digits.len()];
    let axis: usize = digits.parse().ok().filter(|a| *a < 3)?;
    match prefix {
        "gidx" => Some(('g', axis)),
        "lidx" => Some(('l', axis)),
        "idx" => Some(('i', axis)),
        _ => None,
    }
}

/// The PARAM slot an INDEX (or a cast or AFTER of one) addresses.
fn param_slot(index: &Arc<UOp>) -> Option<usize> {
    let mut node = index;
    while matches!(node.op(), Op::Index | Op::Cast | Op::After) {
        node = &node.src()[0];
    }
    (node.op() == Op::Param).then(|| node.arg_int().unwrap_or(0) as usize)
}

/// One LOAD or STORE and where its bounds proof happens ([`ProgramSpec::access_proofs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessProof {
    /// The access's `%N` number in `kiln_ir::print` order.
    pub node: usize,
    /// `LOAD` or `STORE`.
    pub op: &'static str,
    /// The buffer slot it addresses (`None`: local memory).
    pub slot: Option<usize>,
    /// `false`: proven when the kernel was built. `true`: decided at each launch, and guarded
    /// in the launches where that fails.
    pub at_launch: bool,
}

/// A compiled kernel: bytes for AOT backends, plus its spec (whose source a JIT backend
/// compiles at load time).
#[derive(Debug, Clone)]
pub struct CompiledSpec {
    /// The entry point to load (may differ from `spec.name` when the compiler mangles it).
    pub name: String,
    /// The binary the runtime loads; empty for JIT backends (they load `spec.src`). The disk
    /// cache stores it as is.
    pub bytes: Vec<u8>,
    /// The spec it was compiled from, shared with every kernel loaded from it.
    pub spec: Arc<ProgramSpec>,
}

/// Turns a kernel graph into a [`ProgramSpec`] for one backend.
pub trait Renderer: Send + Sync {
    /// Renders `ast` (a SINK). Must call [`ProgramSpec::from_sink`] for metadata.
    ///
    /// # Errors
    /// [`Error::Render`] when the backend cannot express the kernel; the errors of
    /// [`ProgramSpec::from_sink`].
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec>;

    /// What `render` would return for `ast`, without its source (`src` empty), when that is
    /// cheaper than rendering: a disk-cache hit keyed by [`Renderer::identity`] needs only
    /// the metadata. The default renders.
    ///
    /// # Errors
    /// Those of [`Renderer::render`] for a kernel that does not validate.
    fn describe(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        self.render(ast, name)
    }

    /// Everything besides the kernel and kiln's own source that decides what `render` makes
    /// of a kernel (the target's vector width, the device's features), when the renderer can
    /// name it all. `Some` lets the disk cache find a kernel's binary by the kernel and this
    /// identity, without rendering it; `None` (the default) keys every kernel by its rendered
    /// source, which costs a render per lookup.
    fn identity(&self) -> Option<String> {
        None
    }

    /// The device family rendered for.
    fn device(&self) -> &DeviceSpec;

    /// Rewrites this backend needs before rendering (ops it lacks, expressed in ops it has).
    fn decompositor(&self) -> Option<kiln_ir::rewrite::RewriteRules> {
        None
    }
}

/// Turns source into something loadable.
pub trait Compiler: Send + Sync {
    /// Compiles `spec` to completion on the calling thread (it blocks: it may run an
    /// external compiler or the driver's, for milliseconds to seconds) and may be called from
    /// several threads at once. It never loads the result: the [`RuntimeFactory`] does.
    ///
    /// # Errors
    /// [`Error::Compile`] when the source is rejected (with the compiler's log),
    /// [`Error::CompilerMissing`] when the compiler cannot be found or started,
    /// [`Error::Driver`] when the driver fails otherwise (a fatal one loses the device).
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec>;

    /// The compiler's name ("clang", "opencl", ...): with [`Compiler::fingerprint`], all of
    /// the kernel cache's key besides the kernel and its rendered source.
    fn cache_key(&self) -> &'static str;

    /// Everything besides the kernel that changes the binary: the compiler's identity (its
    /// resolved path and the file's size, mtime and inode, or its version), flags, target. A
    /// toolchain change must change this string, and computing it should start no process
    /// (a warm start compiles nothing).
    fn fingerprint(&self) -> String;
}

/// A loaded kernel: what runs it, and nothing about who wraps it. Programs are `Send + Sync`
/// and reentrant: the runtime calls one program from several threads at once when the
/// buffers are provably disjoint.
///
/// What a device adds around its programs lives in the types that own it, never here: the
/// generation check and launch gate in the [`crate::Kernel`]'s origin ([`crate::kernel`]),
/// the compiled form in the kernel and its cache, graph capture in the device's
/// [`crate::GraphFactory`]. A backend queue that enqueues its own programs natively downcasts
/// the kernel's program (`Program: Any`).
pub trait Program: Send + Sync + std::any::Any {
    /// Runs the kernel to completion.
    ///
    /// # Errors
    /// [`Error::Driver`] when the backend fails to run it (a fatal one loses the device).
    ///
    /// # Safety
    /// `bufs` must be live device memory of this program's device, one per parameter slot,
    /// each at least as large as the parameter's declared size for `vals`; `vals` must be
    /// within the variables' bounds and `launch` must come from [`ProgramSpec::launch_dims`].
    /// Every LOAD and STORE the kernel executes with these values must stay inside its
    /// buffer's declared size: the caller proves it ([`ProgramSpec::check_bounds`] is one
    /// proof; a compiler that proves bounds itself may skip it). No other thread may write
    /// memory this launch reads or writes while it runs. [`crate::Kernel::launch`] checks
    /// all of this and the kernel's device generation; call that instead.
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()>;

    /// The entry point's name, for error messages and traces.
    fn name(&self) -> &str;
}

/// Loads a compiled kernel.
pub type RuntimeFactory = Arc<dyn Fn(&CompiledSpec) -> Result<Arc<dyn Program>> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{KernelBuilder, Scalar};

    fn elementwise() -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let a = k.param(0, Scalar::F32, &n);
        let c = k.param(1, Scalar::F32, &n);
        let i = k.special("gidx0", &n / 4);
        let l = k.special("lidx0", 4);
        let idx = &i * 4 + &l;
        let v = a.at(&idx).load();
        k.store(&c.at(&idx), &(v * 2.0));
        k.finish().unwrap()
    }

    #[test]
    fn metadata_is_derived_from_the_graph() {
        let spec = ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &elementwise()).unwrap();
        assert_eq!(spec.globals, vec![0, 1]);
        assert_eq!(spec.ins, vec![0]);
        assert_eq!(spec.outs, vec![1]);
        assert_eq!(spec.var_names, vec!["n".to_string()]);
        let d = spec.launch_dims(&[64]).unwrap();
        assert_eq!(d, LaunchDims { global: [16, 1, 1], local: Some([4, 1, 1]) });
        assert_eq!(spec.param_lens(&[64]).unwrap(), vec![64, 64]);
    }

    /// Found by the fuzzer (seed 1, case 18373): `gidx0` next to `idx1` made the launch direct,
    /// the OpenCL driver picked work-groups of several items, and `get_group_id(0)` then never
    /// reached most of its extent, leaving most of the output unwritten.
    #[test]
    fn a_group_index_next_to_a_direct_one_keeps_groups_of_one() {
        let spec_of = |axes: &[&str]| {
            let mut k = KernelBuilder::new();
            let c = k.param(0, Scalar::F32, 64);
            let idx = axes
                .iter()
                .enumerate()
                .fold(kiln_ir::Val::int(0), |acc, (i, name)| acc * 8 + k.special(&format!("{name}{i}"), 8));
            k.store(&c.at(&idx), &kiln_ir::Val::f32(1.0));
            ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &k.finish().unwrap()).unwrap()
        };
        let ones = LaunchDims { global: [8, 8, 1], local: Some([1, 1, 1]) };
        assert_eq!(spec_of(&["gidx", "idx"]).launch_dims(&[]).unwrap(), ones);
        assert_eq!(spec_of(&["idx", "gidx"]).launch_dims(&[]).unwrap(), ones);
        assert_eq!(spec_of(&["idx", "idx"]).launch_dims(&[]).unwrap().local, None, "direct: the backend picks");
        assert_eq!(spec_of(&["gidx", "gidx"]).launch_dims(&[]).unwrap(), ones);
    }

    #[test]
    fn bad_launches_are_errors() {
        let spec = ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &elementwise()).unwrap();
        // n / 4 == 0 for n = 3: a zero dimension.
        assert!(matches!(spec.launch_dims(&[3]), Err(Error::Launch(_))));
        assert!(matches!(spec.launch_dims(&[1 << 21]), Err(Error::Ir(kiln_ir::IrError::VarOutOfRange { .. }))));
        assert!(matches!(spec.launch_dims(&[]), Err(Error::Launch(_))));
    }

    #[test]
    fn program_value_round_trips() {
        let spec = ProgramSpec::from_sink("k", "src".into(), DeviceSpec::new("CPU", 0), &elementwise()).unwrap();
        let p = spec.to_uop(Some(b"bin")).unwrap();
        let back = ProgramSpec::from_uop(&p).unwrap();
        assert_eq!(back.src, "src");
        assert_eq!(back.outs, spec.outs);
        assert!(Arc::ptr_eq(&back.ast, &spec.ast));
        assert!(special_axis("gidx3").is_none() && special_axis("foo0").is_none());
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    /// Every shipped example and benchmark kernel is accepted for small, middling and
    /// mixed variable values. (Not at the upper corner of every one: `softmax.kiln` allows
    /// rows = cols = 65536, where its i32 index `row * cols` overflows, and is refused there.)
    /// `gather.kiln` is the one exception, by design: its table load reads an index from data,
    /// which no proof sees, so it is left open and runs guarded.
    #[test]
    fn shipped_kernels_are_proven_in_bounds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
        let mut files: Vec<_> = ["", "bench"]
            .iter()
            .flat_map(|d| std::fs::read_dir(root.join(d)).unwrap().map(|e| e.unwrap().path()))
            .filter(|p| p.extension().is_some_and(|e| e == "kiln"))
            .collect();
        files.sort();
        assert!(files.len() >= 11, "{files:?}");
        for file in files {
            let sink = kiln_ir::parse_kernel(&std::fs::read_to_string(&file).unwrap()).unwrap();
            let spec = ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &sink).unwrap();
            for pick in 0..4 {
                let vals: Vec<i64> = spec
                    .vars
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match (pick, i % 2) {
                        (0, _) => v.min,
                        (1, _) => v.min + (v.max - v.min) / 3,
                        (2, 0) | (3, 1) => (v.min + 7).min(v.max),
                        _ => v.min + (v.max - v.min) / 1000,
                    })
                    .collect();
                let dims = spec.launch_dims(&vals).unwrap();
                let lens = spec.param_lens(&vals).unwrap();
                let checked = spec.check_bounds(&vals, &dims, &lens);
                if file.ends_with("gather.kiln") {
                    assert!(checked.is_err(), "the gather's data-dependent load cannot be proven");
                    continue;
                }
                checked.unwrap_or_else(|e| panic!("{}: {vals:?}: {e}", file.display()));
            }
        }
    }
}
