//! A tiny tensor compiler on kiln: how an ML compiler is meant to use it.
//!
//! The front end describes a computation as tensor ops over *named* sizes (`m`, `k`, `n`):
//! a matmul, elementwise expressions with broadcasting (fused into one kernel each), and
//! reductions along rows. The compiler lowers every op to one kernel with the
//! [`KernelBuilder`], where each size is a kernel variable, so a kernel compiles once and
//! serves every size. It allocates the buffers once, records the launches into an
//! [`ExecutionPlan`] (which orders them by the bytes they read and write), and replays the
//! plan with new sizes and new input data. Every run is checked against a host interpreter
//! of the same program.
//!
//! The program is a dense layer and a softmax, row by row: `y = softmax(relu(x · w + b))`.
//!
//! `cargo run --release -p kiln-runtime --example tensor_compiler [-- DEVICE]`: any device
//! `kiln devices` lists (`OPENCL:0`, `CUDA:0`, ...); the CPU by default.

use std::collections::HashMap;
use std::error::Error;
use std::ops;
use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, IrError, KernelBuilder, Scalar, UOp, Val};
use kiln_device::{Buffer, Device, Kernel};
use kiln_runtime::ExecutionPlan;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The largest value a size may take: the bound of every kernel variable, and what the
/// buffers are allocated for.
const MAX_SIZE: usize = 128;

// ------------------------------------------------------------------------- the front end

/// A size, by name: every kernel that uses it takes it as the variable of that name, and
/// the plan binds it once for all of them.
type Dim = &'static str;

/// A tensor of the program (an index into [`Program::shapes`]). Row-major.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tensor(usize);

/// An elementwise expression, evaluated at element `[i, j]` of a `[rows, cols]` result.
#[derive(Clone, Debug)]
enum Expr {
    /// `t[i, j]` of a matrix of the result's shape.
    At(Tensor),
    /// `t[i]`: one value per row, broadcast along the row.
    Row(Tensor),
    /// `t[j]`: one value per column, broadcast down the columns.
    Col(Tensor),
    Const(f32),
    Bin(BinOp, Box<Expr>, Box<Expr>),
    Exp(Box<Expr>),
}

#[derive(Clone, Copy, Debug)]
enum BinOp {
    Add,
    Sub,
    Div,
    Max,
}

impl Expr {
    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Bin(op, Box::new(a), Box::new(b))
    }
    fn max(self, o: Expr) -> Expr {
        Expr::bin(BinOp::Max, self, o)
    }
    fn exp(self) -> Expr {
        Expr::Exp(Box::new(self))
    }
}

impl ops::Add for Expr {
    type Output = Expr;
    fn add(self, o: Expr) -> Expr {
        Expr::bin(BinOp::Add, self, o)
    }
}
impl ops::Sub for Expr {
    type Output = Expr;
    fn sub(self, o: Expr) -> Expr {
        Expr::bin(BinOp::Sub, self, o)
    }
}
impl ops::Div for Expr {
    type Output = Expr;
    fn div(self, o: Expr) -> Expr {
        Expr::bin(BinOp::Div, self, o)
    }
}

#[derive(Clone, Copy, Debug)]
enum Reduction {
    Sum,
    Max,
}

/// How a tensor is computed.
#[derive(Clone, Debug)]
enum Step {
    /// `[m, k] · [k, n] → [m, n]`.
    MatMul(Tensor, Tensor),
    /// `[rows, cols]` from an elementwise expression.
    Map { rows: Dim, cols: Dim, expr: Expr },
    /// `[rows]`: each row's sum or maximum of an expression over `[rows, cols]`.
    Reduce { rows: Dim, cols: Dim, op: Reduction, expr: Expr },
}

/// Tensors and the steps that compute the non-input ones, in order.
#[derive(Default)]
struct Program {
    shapes: Vec<Vec<Dim>>,
    steps: Vec<(Tensor, Step)>,
}

impl Program {
    fn input(&mut self, shape: &[Dim]) -> Tensor {
        self.shapes.push(shape.to_vec());
        Tensor(self.shapes.len() - 1)
    }
    fn push(&mut self, shape: &[Dim], step: Step) -> Tensor {
        let t = self.input(shape);
        self.steps.push((t, step));
        t
    }
    fn matmul(&mut self, a: Tensor, b: Tensor) -> Tensor {
        let shape = [self.shapes[a.0][0], self.shapes[b.0][1]];
        self.push(&shape, Step::MatMul(a, b))
    }
    fn map(&mut self, rows: Dim, cols: Dim, expr: Expr) -> Tensor {
        self.push(&[rows, cols], Step::Map { rows, cols, expr })
    }
    fn reduce(&mut self, op: Reduction, rows: Dim, cols: Dim, expr: Expr) -> Tensor {
        self.push(&[rows], Step::Reduce { rows, cols, op, expr })
    }
}

// ------------------------------------------------------------------------- lowering

/// One kernel being built: the variables and buffer parameters it has used so far.
struct Lowering<'p> {
    program: &'p Program,
    k: KernelBuilder,
    vars: HashMap<Dim, Val>,
    /// The tensor of each buffer slot, and its parameter.
    params: Vec<(Tensor, Val)>,
}

impl<'p> Lowering<'p> {
    fn new(program: &'p Program) -> Self {
        Lowering { program, k: KernelBuilder::new(), vars: HashMap::new(), params: Vec::new() }
    }

    fn size(&mut self, d: Dim) -> Val {
        if let Some(v) = self.vars.get(d) {
            return v.clone();
        }
        let v = self.k.var(d, 1, MAX_SIZE as i64);
        self.vars.insert(d, v.clone());
        v
    }

    /// The buffer parameter of `t`: the next slot, holding as many elements as `t` has for
    /// the sizes of each launch (kiln checks every access against that at each launch).
    fn buffer(&mut self, t: Tensor) -> Val {
        if let Some((_, p)) = self.params.iter().find(|(u, _)| *u == t) {
            return p.clone();
        }
        let dims = self.program.shapes[t.0].clone();
        let len = dims.iter().skip(1).fold(self.size(dims[0]), |len, d| len * self.size(d));
        let p = self.k.param(self.params.len(), Scalar::F32, &len);
        self.params.push((t, p.clone()));
        p
    }

    /// `e` at `[i, j]` of a result with `cols` columns. Equal subexpressions (the same load,
    /// the same `exp`) become one node: kiln's graph is hash-consed.
    fn expr(&mut self, e: &Expr, i: &Val, j: &Val, cols: &Val) -> Val {
        match e {
            Expr::At(t) => self.buffer(*t).at(&(i * cols + j)).load(),
            Expr::Row(t) => self.buffer(*t).at(i).load(),
            Expr::Col(t) => self.buffer(*t).at(j).load(),
            Expr::Const(c) => Val::f32(*c),
            Expr::Exp(a) => self.expr(a, i, j, cols).exp(),
            Expr::Bin(op, a, b) => {
                let (a, b) = (self.expr(a, i, j, cols), self.expr(b, i, j, cols));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Div => a / b,
                    BinOp::Max => a.max(b),
                }
            }
        }
    }

    /// Lowers the step computing `out` to a kernel; returns it with the tensor of each slot.
    fn step(mut self, out: Tensor, step: &Step) -> std::result::Result<(Arc<UOp>, Vec<Tensor>), IrError> {
        match step {
            Step::MatMul(a, b) => {
                let [m, kk] = [self.program.shapes[a.0][0], self.program.shapes[a.0][1]];
                let n = self.program.shapes[b.0][1];
                let (m, kk, n) = (self.size(m), self.size(kk), self.size(n));
                let (pa, pb, pc) = (self.buffer(*a), self.buffer(*b), self.buffer(out));
                let (i, j) = (self.k.global(0, &m), self.k.global(1, &n));
                let r = self.k.range(&kk);
                let acc = self.k.acc(&Val::f32(0.0), &[&r]);
                let prod = pa.at(&(&i * &kk + &r)).load().mul_acc(&pb.at(&(&r * &n + &j)).load(), &acc.get());
                let total = acc.update(&prod);
                self.k.store(&pc.at(&(&i * &n + &j)), &total);
            }
            Step::Map { rows, cols, expr } => {
                let (rows, cols) = (self.size(rows), self.size(cols));
                let (i, j) = (self.k.global(0, &rows), self.k.global(1, &cols));
                let v = self.expr(expr, &i, &j, &cols);
                let po = self.buffer(out);
                self.k.store(&po.at(&(&i * &cols + &j)), &v);
            }
            Step::Reduce { rows, cols, op, expr } => {
                let (rows, cols) = (self.size(rows), self.size(cols));
                let i = self.k.global(0, &rows);
                let j = self.k.range(&cols);
                let init = match op {
                    Reduction::Sum => 0.0,
                    Reduction::Max => f32::NEG_INFINITY,
                };
                let acc = self.k.acc(&Val::f32(init), &[&j]);
                let v = self.expr(expr, &i, &j, &cols);
                let next = match op {
                    Reduction::Sum => acc.get() + v,
                    Reduction::Max => acc.get().max(v),
                };
                let total = acc.update(&next); // the accumulator after the loop over j
                let po = self.buffer(out);
                self.k.store(&po.at(&i), &total);
            }
        }
        let slots = self.params.iter().map(|(t, _)| *t).collect();
        Ok((self.k.finish()?, slots))
    }
}

/// A compiled step: its kernel and the tensor of each buffer slot.
struct Compiled {
    kernel: Kernel,
    slots: Vec<Tensor>,
}

/// Lowers every step, then compiles the kernels together on all cores (those the cache holds
/// are only loaded).
fn compile(device: &Device, program: &Program) -> Result<Vec<Compiled>> {
    let lowered = program
        .steps
        .iter()
        .map(|(t, step)| Lowering::new(program).step(*t, step))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let names: Vec<String> = (0..lowered.len()).map(|n| format!("step{n}")).collect();
    let batch: Vec<_> =
        lowered.iter().zip(&names).map(|((sink, _), name)| (sink.clone(), Some(name.as_str()))).collect();
    let kernels = device.compile_many(&batch); // render, compile, cache
    lowered.into_iter().zip(kernels).map(|((_, slots), kernel)| Ok(Compiled { kernel: kernel?, slots })).collect()
}

// ------------------------------------------------------------------------- the host reference

/// The program run on the host, as plainly as possible: every tensor's values.
fn interpret(program: &Program, sizes: &HashMap<Dim, usize>, inputs: &[(Tensor, Vec<f32>)]) -> Vec<Vec<f32>> {
    let mut vals: Vec<Vec<f32>> = vec![Vec::new(); program.shapes.len()];
    for (t, data) in inputs {
        vals[t.0] = data.clone();
    }
    fn eval(e: &Expr, v: &[Vec<f32>], i: usize, j: usize, cols: usize) -> f32 {
        match e {
            Expr::At(t) => v[t.0][i * cols + j],
            Expr::Row(t) => v[t.0][i],
            Expr::Col(t) => v[t.0][j],
            Expr::Const(c) => *c,
            Expr::Exp(a) => eval(a, v, i, j, cols).exp(),
            Expr::Bin(op, a, b) => {
                let (a, b) = (eval(a, v, i, j, cols), eval(b, v, i, j, cols));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Div => a / b,
                    BinOp::Max => a.max(b),
                }
            }
        }
    }
    for (t, step) in &program.steps {
        vals[t.0] = match step {
            Step::MatMul(a, b) => {
                let [m, kk, n] =
                    [program.shapes[a.0][0], program.shapes[a.0][1], program.shapes[b.0][1]].map(|d| sizes[d]);
                let (x, y) = (&vals[a.0], &vals[b.0]);
                let dot = |i: usize, j: usize| (0..kk).fold(0.0f32, |acc, r| x[i * kk + r].mul_add(y[r * n + j], acc));
                (0..m * n).map(|e| dot(e / n, e % n)).collect()
            }
            Step::Map { rows, cols, expr } => {
                let (rows, cols) = (sizes[rows], sizes[cols]);
                (0..rows * cols).map(|e| eval(expr, &vals, e / cols, e % cols, cols)).collect()
            }
            Step::Reduce { rows, cols, op, expr } => {
                let (rows, cols) = (sizes[rows], sizes[cols]);
                let v = &vals;
                let row = |i: usize| (0..cols).map(move |j| eval(expr, v, i, j, cols));
                (0..rows)
                    .map(|i| match op {
                        Reduction::Sum => row(i).fold(0.0, |a, b| a + b),
                        Reduction::Max => row(i).fold(f32::NEG_INFINITY, f32::max),
                    })
                    .collect()
            }
        };
    }
    vals
}

// ------------------------------------------------------------------------- the driver

fn main() -> Result<()> {
    kiln_backends::register_all();
    let spec: DeviceSpec = std::env::args().nth(1).as_deref().unwrap_or("CPU").parse()?;
    let device = kiln_device::open_device(&spec.to_string())?;

    // y = softmax(relu(x · w + b)), one softmax per row.
    let mut p = Program::default();
    let (x, w, b) = (p.input(&["m", "k"]), p.input(&["k", "n"]), p.input(&["n"]));
    let h = p.matmul(x, w);
    let a = p.map("m", "n", (Expr::At(h) + Expr::Col(b)).max(Expr::Const(0.0)));
    let top = p.reduce(Reduction::Max, "m", "n", Expr::At(a)); // subtracted, so exp never overflows
    let shifted = || (Expr::At(a) - Expr::Row(top)).exp();
    let sum = p.reduce(Reduction::Sum, "m", "n", shifted());
    let y = p.map("m", "n", shifted() / Expr::Row(sum));

    // Compile once; allocate once, for the largest sizes the kernels accept.
    let steps = compile(&device, &p)?;
    let capacity = |t: Tensor| MAX_SIZE.pow(p.shapes[t.0].len() as u32);
    let bufs = (0..p.shapes.len())
        .map(|t| device.buffer(Scalar::F32, capacity(Tensor(t))))
        .collect::<kiln_device::Result<Vec<Buffer>>>()?;

    // Record once, with the first sizes; each kernel binds the sizes it uses.
    let runs: [[(&str, i64); 3]; 3] =
        [[("m", 64), ("k", 96), ("n", 48)], [("m", 3), ("k", 5), ("n", 7)], [("m", 128), ("k", 17), ("n", 100)]];
    let mut plan = ExecutionPlan::new(&device)?;
    for s in &steps {
        let slots: Vec<&Buffer> = s.slots.iter().map(|t| &bufs[t.0]).collect();
        let vars: Vec<(&str, i64)> =
            runs[0].iter().filter(|(d, _)| s.kernel.spec.var_names.iter().any(|v| v == d)).copied().collect();
        plan.exec(&s.kernel, &slots, &vars)?;
    }
    println!("{} kernels compiled once and recorded into one plan on {}", steps.len(), device.spec());

    // Replay with new sizes and data, and check every run against the host.
    for (seed, sizes) in runs.iter().enumerate() {
        let dims: HashMap<Dim, usize> = sizes.iter().map(|&(d, v)| (d, v as usize)).collect();
        let len = |t: Tensor| p.shapes[t.0].iter().map(|d| dims[d]).product::<usize>();
        let inputs: Vec<(Tensor, Vec<f32>)> =
            [x, w, b].iter().map(|&t| (t, random(len(t), (3 * seed + t.0) as u64))).collect();
        for (t, data) in &inputs {
            bufs[t.0].view(0, data.len())?.copy_from_slice(data)?;
        }
        plan.run(sizes)?;
        let got = bufs[y.0].view(0, len(y))?.to_vec::<f32>()?;
        let want = &interpret(&p, &dims, &inputs)[y.0];
        let err = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        let shown = sizes.map(|(d, v)| format!("{d}={v}")).join(" ");
        if err > 1e-5 {
            return Err(format!("{shown}: y differs from the host reference by up to {err:e}").into());
        }
        println!("{shown}: y ({} values) matches the host reference (max error {err:.1e})", got.len());
    }
    Ok(())
}

/// `n` deterministic pseudo-random values in [-1, 1).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
