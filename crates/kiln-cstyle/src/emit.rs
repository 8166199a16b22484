//! The emitter: one walk over a kernel's linear order, writing C through a [`Dialect`]
//! (see the crate docs for the emission model and the semantics it keeps).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kiln_device::{Error, ProgramSpec, Result, special_axis};
use kiln_ir::{AddrSpace, Arg, ContentHash, DType, Op, Scalar, StoreHint, UOp};

use crate::dialect::{Address, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude};
use crate::literal::wrap_int;

/// The value of a node as later nodes refer to it.
#[derive(Clone, Debug)]
enum Value {
    Expr(String),
    Addr(Address),
}

/// An open block: a loop or an IF block (`range`: its RANGE or IF) or the kernel body (`None`).
struct Block {
    range: Option<ContentHash>,
    /// Accumulator write-backs `(acc, value)` deferred to the end of this block.
    commits: Vec<(String, String)>,
    /// For a loop: its index and extent, and the first line of its body.
    open: Option<Loop>,
}

struct Loop {
    index: String,
    extent: String,
    start: usize,
}

impl Block {
    fn new(range: Option<ContentHash>, open: Option<Loop>) -> Block {
        Block { range, commits: Vec::new(), open }
    }
}

/// A valued END that is not an accumulator: `name` is declared before the loop of `range`
/// and set to the value of `value` at the end of every iteration.
#[derive(Clone)]
struct Carry {
    name: String,
    value: ContentHash,
    dtype: DType,
}

pub(crate) struct Emitter<'a, D: ?Sized> {
    d: &'a D,
    p: Prelude,
    values: HashMap<ContentHash, Value>,
    lines: Vec<String>,
    indent: usize,
    blocks: Vec<Block>,
    counters: HashMap<&'static str, usize>,
    used_names: HashSet<String>,
    carries: HashMap<ContentHash, Vec<Carry>>,
}

fn render_err(node: &UOp, msg: impl std::fmt::Display) -> Error {
    Error::Render(format!("{} {}: {msg}", node.op(), node.dtype()))
}

impl<'a, D: Dialect + ?Sized> Emitter<'a, D> {
    pub(crate) fn new(d: &'a D) -> Self {
        Emitter {
            d,
            p: Prelude::default(),
            values: HashMap::new(),
            lines: Vec::new(),
            indent: 1,
            blocks: vec![Block::new(None, None)],
            counters: HashMap::new(),
            used_names: HashSet::new(),
            carries: HashMap::new(),
        }
    }

    pub(crate) fn run(mut self, spec: &ProgramSpec, linear: &[Arc<UOp>]) -> Result<String> {
        for n in linear {
            if matches!(n.op(), Op::Program | Op::Device | Op::Linear | Op::Source | Op::Binary) {
                return Err(render_err(n, "compiled-program stages cannot appear inside a kernel"));
            }
        }
        // Parameters and variables: names and declarations.
        let mut params: Vec<KernelParam> = spec
            .params
            .iter()
            .map(|pi| KernelParam {
                slot: pi.slot,
                name: format!("data{}", pi.slot),
                scalar: pi.scalar,
                space: AddrSpace::Global,
                written: spec.outs.contains(&pi.slot),
                read: spec.ins.contains(&pi.slot),
            })
            .collect();
        let mut vars: Vec<KernelVar> = Vec::new();
        for n in linear {
            match (n.op(), n.arg()) {
                (Op::Param, Arg::Int(slot)) => {
                    if let (DType::Ptr { space, .. }, Some(kp)) =
                        (n.dtype(), params.iter_mut().find(|kp| kp.slot as i64 == *slot))
                    {
                        kp.space = space;
                        self.values.insert(n.content_hash(), Value::Addr(self.d.buffer(kp)));
                    }
                }
                (Op::DefineVar, Arg::Var { name, .. }) => {
                    let position = spec.var_names.iter().position(|v| v == name).unwrap_or(0);
                    let c_name = self.d.var_name(name, position);
                    if !vars.iter().any(|v| v.ir_name == *name) {
                        vars.push(KernelVar {
                            name: c_name.clone(),
                            ir_name: name.clone(),
                            dtype: n.dtype(),
                            position,
                        });
                    }
                    self.values.insert(n.content_hash(), Value::Expr(c_name));
                }
                _ => {}
            }
        }
        vars.sort_by_key(|v| v.position);
        for name in params.iter().map(|p| &p.name).chain(vars.iter().map(|v| &v.name)) {
            self.used_names.insert(name.clone());
        }

        // Launch indices, and the nodes their extents need (emitted before the launch opens).
        let specials: Vec<&Arc<UOp>> = linear.iter().filter(|n| n.op() == Op::Special).collect();
        let mut seen_names: HashMap<String, ContentHash> = HashMap::new();
        let mut slots: HashMap<(char, usize), String> = HashMap::new();
        for s in &specials {
            let name = s.arg_name().unwrap_or_default().to_string();
            let (kind, axis) =
                special_axis(&name).ok_or_else(|| render_err(s, format!("unknown launch index `{name}`")))?;
            if seen_names.insert(name.clone(), s.content_hash()).is_some_and(|h| h != s.content_hash()) {
                return Err(render_err(s, format!("launch index `{name}` appears with two different extents")));
            }
            let global_kind = if kind == 'l' { 'l' } else { 'g' };
            if let Some(other) = slots.insert((global_kind, axis), name.clone())
                && other != name
            {
                return Err(render_err(s, format!("`{other}` and `{name}` both claim launch axis {axis}")));
            }
            self.values.insert(s.content_hash(), Value::Expr(name.clone()));
            self.used_names.insert(name);
        }
        let direct = specials.iter().any(|s| s.arg_name().is_some_and(|n| n.starts_with("idx")));
        if direct && slots.keys().any(|(k, _)| *k == 'l') {
            return Err(Error::Render("direct launch indices (idxN) cannot be mixed with local ones (lidxN)".into()));
        }
        if let Some(n) = linear.iter().find(|n| matches!(n.op(), Op::DefineLocal | Op::Barrier))
            && direct
        {
            return Err(render_err(
                n,
                "work-group local memory and barriers need work groups: launch with gidxN/lidxN, not idxN",
            ));
        }
        // Launch extents and local memory come before the launch indices open.
        let mut hoisted = extent_closure(&specials)?;
        hoisted.extend(linear.iter().filter(|n| n.op() == Op::DefineLocal).map(|n| n.content_hash()));

        // Carried END values are declared before their loop.
        for n in linear {
            if n.op() == Op::End && n.dtype() != DType::Void && acc_of(n).is_none() {
                let name = self.fresh("end");
                self.carries.entry(n.src()[0].content_hash()).or_default().push(Carry {
                    name: name.clone(),
                    value: n.src()[1].content_hash(),
                    dtype: n.dtype(),
                });
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
        }

        let mut head = String::new();
        let signature = self.d.signature(&spec.name, &params, &vars, &mut self.p);
        for line in self.d.prologue(&params, &vars, &mut self.p) {
            self.line(line);
        }
        for n in linear.iter().filter(|n| hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        let mut indices = Vec::new();
        for s in &specials {
            let name = s.arg_name().unwrap_or_default().to_string();
            let (kind, axis) = special_axis(&name).unwrap_or(('g', 0));
            let extent = self.expr(&s.src()[0])?;
            indices.push(LaunchIndex { name, kind, axis, dtype: s.dtype(), extent });
        }
        let launch = self.d.open_launch(&indices, &mut self.p)?;
        let mut launch_depth = 0;
        for line in launch {
            let opens = line.trim_end().ends_with('{');
            self.line(line);
            if opens {
                self.indent += 1;
                launch_depth += 1;
            }
        }
        for n in linear.iter().filter(|n| !hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        if self.blocks.len() != 1 {
            return Err(Error::Render("a loop is still open at the end of the kernel".into()));
        }
        for (acc, value) in std::mem::take(&mut self.blocks[0].commits) {
            self.line(format!("{acc} = {value};"));
        }
        for _ in 0..launch_depth {
            self.indent -= 1;
            self.line("}".into());
        }
        for line in self.d.kernel_end(&mut self.p) {
            self.line(line);
        }

        head.push_str(&self.d.header());
        if !head.ends_with('\n') {
            head.push('\n');
        }
        for item in self.p.items() {
            head.push_str(item);
            if !item.ends_with('\n') {
                head.push('\n');
            }
        }
        head.push('\n');
        head.push_str(&signature);
        head.push('\n');
        for l in &self.lines {
            head.push_str(l);
            head.push('\n');
        }
        head.push_str("}\n");
        Ok(head)
    }

    fn line(&mut self, text: String) {
        self.lines.push(format!("{}{text}", "  ".repeat(self.indent)));
    }

    /// A new name `{prefix}{N}` not used anywhere in the kernel.
    fn fresh(&mut self, prefix: &'static str) -> String {
        loop {
            let c = self.counters.entry(prefix).or_insert(0);
            let name = format!("{prefix}{c}");
            *c += 1;
            if self.used_names.insert(name.clone()) {
                return name;
            }
        }
    }

    fn value(&self, n: &UOp) -> Result<Value> {
        self.values.get(&n.content_hash()).cloned().ok_or_else(|| render_err(n, "used before it is defined"))
    }

    /// The node as a value expression (pointers become `base + index`).
    fn expr(&mut self, n: &UOp) -> Result<String> {
        if n.op() == Op::Const {
            return self.constant(n);
        }
        Ok(match self.value(n)? {
            Value::Expr(e) => e,
            Value::Addr(a) => a.pointer(),
        })
    }

    fn address(&mut self, n: &UOp) -> Result<Address> {
        match self.value(n)? {
            Value::Addr(a) => Ok(a),
            Value::Expr(base) => match n.dtype() {
                DType::Ptr { scalar, space, .. } => Ok(Address { base, index: "0".into(), scalar, space }),
                other => Err(render_err(n, format!("is used as an address but has dtype {other}"))),
            },
        }
    }

    fn ty(&mut self, n: &UOp, dt: DType) -> Result<String> {
        match dt {
            DType::Scalar(s) => Ok(self.d.scalar_type(s, &mut self.p)),
            DType::Vector(s, w) => Ok(self.d.vector_type(s, w, &mut self.p)),
            other => Err(render_err(n, format!("has no value type for {other}"))),
        }
    }

    fn declare(&mut self, n: &UOp, prefix: &'static str, init: String) -> Result<()> {
        let ty = self.ty(n, n.dtype())?;
        let name = self.fresh(prefix);
        let decl = self.d.declare(&ty, &name, &init);
        self.line(decl);
        self.values.insert(n.content_hash(), Value::Expr(name));
        Ok(())
    }

    fn constant(&mut self, n: &UOp) -> Result<String> {
        let DType::Scalar(s) = n.dtype() else {
            return Err(render_err(n, "constants are scalars (broadcast vectors with VECTORIZE)"));
        };
        Ok(match n.arg() {
            Arg::Bool(b) => self.d.int_const(*b as i64, s),
            Arg::Int(v) => self.d.int_const(wrap_int(*v, s), s),
            Arg::Float(v) => self.d.float_const(*v, s, &mut self.p),
            other => return Err(render_err(n, format!("unsupported constant {other}"))),
        })
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
                let ty = self.ty(n, n.dtype())?;
                let extent = self.expr(&src[0])?;
                let axis = n.arg_int().unwrap_or(0);
                let mut name = format!("ridx{}", axis.to_string().replace('-', "m"));
                if !self.used_names.insert(name.clone()) {
                    name = self.fresh("ridx");
                }
                for carry in self.carries.get(&n.content_hash()).cloned().unwrap_or_default() {
                    let end = self.carry_decl(n, &carry)?;
                    self.line(end);
                }
                let open = self.d.open_loop(n, &ty, &name, &extent);
                self.line(open);
                self.indent += 1;
                let open = Loop { index: name.clone(), extent, start: self.lines.len() };
                self.blocks.push(Block::new(Some(n.content_hash()), Some(open)));
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::End | Op::EndIf => self.end(n)?,
            Op::If => {
                let cond = self.expr(&src[0])?;
                self.line(format!("if ({cond}) {{"));
                self.indent += 1;
                self.blocks.push(Block::new(Some(n.content_hash()), None));
            }
            Op::DefineLocal => {
                let (DType::Ptr { scalar, .. }, Some(len)) = (n.dtype(), src[0].arg_int()) else {
                    return Err(render_err(n, "local memory needs a pointer dtype and a constant size"));
                };
                let name = self.fresh("lmem");
                let len = usize::try_from(len).map_err(|_| render_err(n, format!("size {len} is not a size")))?;
                if let Some(decl) = self.d.local_memory(&name, scalar, len, &mut self.p)? {
                    self.line(format!("{decl};"));
                }
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::Barrier => {
                let stmt = self.d.barrier(&mut self.p)?;
                self.line(format!("{stmt};"));
            }
            Op::Index => {
                let base = self.address(&src[0])?;
                let idx = self.expr(&src[1])?;
                let DType::Ptr { scalar, space, .. } = n.dtype() else {
                    return Err(render_err(n, "INDEX must yield a pointer"));
                };
                let addr = self.d.element(base, idx, scalar, space);
                self.values.insert(n.content_hash(), Value::Addr(addr));
            }
            Op::Load => {
                let addr = self.address(&src[0])?;
                let load = self.d.load(&addr, n.dtype(), &mut self.p);
                if src.len() == 3 {
                    let (alt, gate) = (self.expr(&src[1])?, self.expr(&src[2])?);
                    let ty = self.ty(n, n.dtype())?;
                    let name = self.fresh("val");
                    for line in self.d.gated_load(&ty, &name, &load, &alt, &gate) {
                        self.line(line);
                    }
                    self.values.insert(n.content_hash(), Value::Expr(name));
                } else {
                    self.declare(n, "val", load)?;
                }
            }
            Op::Store => {
                let addr = self.address(&src[0])?;
                let value = self.expr(&src[1])?;
                let stmt = match n.store_hint() {
                    StoreHint::NonTemporal if addr.space == AddrSpace::Global => {
                        self.d.store_nontemporal(&addr, &value, src[1].dtype(), &mut self.p)
                    }
                    _ => self.d.store(&addr, &value, src[1].dtype(), &mut self.p),
                };
                let stmt = format!("{stmt};");
                if src.len() == 3 {
                    let gate = self.expr(&src[2])?;
                    let gated = self.d.gated(&gate, &stmt);
                    self.line(gated);
                } else {
                    self.line(stmt);
                }
            }
            Op::DefineAcc => {
                let ty = self.ty(n, n.dtype())?;
                let init = self.expr(&src[0])?;
                let name = self.fresh("acc");
                let decl = self.d.declare_mut(&ty, &name, &init);
                self.line(decl);
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::Assign => {
                let acc = self.expr(&src[0])?;
                let value = self.expr(&src[1])?;
                if let Some(block) = self.blocks.last_mut() {
                    block.commits.push((acc, value.clone()));
                }
                self.values.insert(n.content_hash(), Value::Expr(value));
            }
            op if op.is_alu() => {
                let args = src.iter().map(|s| Ok((self.expr(s)?, s.dtype()))).collect::<Result<Vec<_>>>()?;
                let e = self.alu(n, op, &args)?;
                self.declare(n, "alu", e)?;
            }
            Op::Wmma => {
                let Arg::Wmma(w) = n.arg() else { return Err(render_err(n, "needs its shape argument")) };
                let args = [self.expr(&src[0])?, self.expr(&src[1])?, self.expr(&src[2])?];
                let e = self.d.wmma(w, &args, &mut self.p)?;
                self.declare(n, "wmma", e)?;
            }
            Op::Cast => {
                let e = self.convert(n, &src[0])?;
                self.declare(n, "cast", e)?;
            }
            Op::Bitcast => {
                let v = self.expr(&src[0])?;
                let e = self.d.bitcast(&v, src[0].dtype(), n.dtype(), &mut self.p)?;
                self.declare(n, "cast", e)?;
            }
            Op::Vectorize => {
                let lanes: Vec<String> = if src.len() == 1 {
                    vec![self.expr(&src[0])?; n.dtype().width() as usize]
                } else {
                    src.iter().map(|s| self.expr(s)).collect::<Result<_>>()?
                };
                let e = self.d.vector_literal(n.dtype(), &lanes, &mut self.p);
                self.declare(n, "vec", e)?;
            }
            Op::Gep => {
                let v = self.expr(&src[0])?;
                let lane = n.arg_int().unwrap_or(0) as u8;
                let e = self.d.lane(&v, src[0].dtype(), lane);
                self.declare(n, "gep", e)?;
            }
            op => return Err(render_err(n, format!("{op} cannot be rendered"))),
        }
        Ok(())
    }

    fn value_or_const(&mut self, n: &UOp) -> Result<Value> {
        if n.op() == Op::Const { Ok(Value::Expr(self.constant(n)?)) } else { self.value(n) }
    }

    fn carry_decl(&mut self, range: &UOp, carry: &Carry) -> Result<String> {
        let dt = carry.dtype;
        let ty = self.ty(range, dt)?;
        let zero = match dt {
            DType::Scalar(s) => self.zero(s),
            DType::Vector(s, w) => {
                let z = self.zero(s);
                self.d.vector_literal(dt, &vec![z; w as usize], &mut self.p)
            }
            _ => return Err(render_err(range, format!("cannot carry a {dt} out of a loop"))),
        };
        Ok(self.d.declare_mut(&ty, &carry.name, &zero))
    }

    fn zero(&mut self, s: Scalar) -> String {
        if s.is_float() { self.d.float_const(0.0, s, &mut self.p) } else { self.d.int_const(0, s) }
    }

    fn end(&mut self, n: &Arc<UOp>) -> Result<()> {
        let range = n.src()[0].content_hash();
        if self.blocks.last().is_some_and(|b| b.range == Some(range)) {
            let block = self.blocks.pop().unwrap_or(Block::new(None, None));
            for (acc, value) in block.commits {
                self.line(format!("{acc} = {value};"));
            }
            let carries: Vec<(String, ContentHash)> = self
                .carries
                .get(&range)
                .map(|cs| cs.iter().map(|c| (c.name.clone(), c.value)).collect())
                .unwrap_or_default();
            for (name, value) in carries {
                let v = match self.values.get(&value) {
                    Some(Value::Expr(e)) => e.clone(),
                    Some(Value::Addr(a)) => a.pointer(),
                    None => return Err(render_err(n, "the value carried out of the loop is not defined in it")),
                };
                self.line(format!("{name} = {v};"));
            }
            if let Some(open) = block.open {
                let body = self.lines.split_off(open.start.min(self.lines.len()));
                let pad = "  ".repeat(self.indent);
                let body = self.d.close_loop(&n.src()[0], &open.index, &open.extent, body, &pad);
                self.lines.extend(body);
            }
            self.indent -= 1;
            self.line("}".into());
        } else if self.blocks.iter().any(|b| b.range == Some(range)) {
            return Err(render_err(n, "closes a loop while an inner loop is still open"));
        }
        if n.dtype() != DType::Void
            && let Some(acc) = acc_of(n)
        {
            let v = self.value(&acc)?;
            // The END's value is the accumulator after its updates: write back any update
            // still pending in an enclosing block (one the linearizer placed outside the loop).
            if let Value::Expr(name) = &v {
                let mut pending = Vec::new();
                for block in &mut self.blocks {
                    block.commits.retain(|(a, value)| {
                        let keep = a != name;
                        if !keep {
                            pending.push(value.clone());
                        }
                        keep
                    });
                }
                for value in pending {
                    self.line(format!("{name} = {value};"));
                }
            }
            self.values.insert(n.content_hash(), v);
        }
        Ok(())
    }

    /// CAST of `src` to `n.dtype()`.
    fn convert(&mut self, n: &UOp, src: &UOp) -> Result<String> {
        let v = self.expr(src)?;
        match (src.dtype(), n.dtype()) {
            (DType::Scalar(a), DType::Scalar(b)) => Ok(if a == b { v } else { self.d.cast(&v, a, b, &mut self.p) }),
            (DType::Vector(a, w), DType::Vector(b, _)) => {
                if a == b {
                    return Ok(v);
                }
                let lanes: Vec<String> = (0..w)
                    .map(|i| {
                        let l = self.d.lane(&v, src.dtype(), i);
                        self.d.cast(&l, a, b, &mut self.p)
                    })
                    .collect();
                Ok(self.d.vector_literal(n.dtype(), &lanes, &mut self.p))
            }
            (a, b) => Err(render_err(n, format!("cannot cast {a} to {b}"))),
        }
    }

    fn alu(&mut self, n: &UOp, op: Op, args: &[(String, DType)]) -> Result<String> {
        let operand = args.get(if op == Op::Where { 1 } else { 0 }).map(|a| a.1).unwrap_or(DType::Void);
        match operand {
            DType::Scalar(s) => {
                let exprs: Vec<String> = args.iter().map(|a| a.0.clone()).collect();
                self.scalar_alu(n, op, s, &exprs)
            }
            DType::Vector(s, w) => {
                if op == Op::Where && args[0].1 == DType::BOOL {
                    return Ok(self.d.select(&args[0].0, &args[1].0, &args[2].0));
                }
                let infix = matches!(op, Op::Add | Op::Sub | Op::Mul | Op::Div | Op::And | Op::Or | Op::Xor);
                if (infix || op == Op::Neg) && self.d.native_vector_op(op, operand) {
                    return Ok(if op == Op::Neg {
                        format!("(-{})", args[0].0)
                    } else {
                        format!("({} {} {})", args[0].0, infix_symbol(op), args[1].0)
                    });
                }
                let exprs: Vec<String> = args.iter().map(|a| a.0.clone()).collect();
                if let Some(e) = self.d.vector_alu(op, operand, &exprs, &mut self.p) {
                    return Ok(e);
                }
                let mut lanes = Vec::with_capacity(w as usize);
                for i in 0..w {
                    let exprs: Vec<String> = args.iter().map(|(e, dt)| self.d.lane(e, *dt, i)).collect();
                    lanes.push(self.scalar_alu(n, op, s, &exprs)?);
                }
                Ok(self.d.vector_literal(n.dtype(), &lanes, &mut self.p))
            }
            other => Err(render_err(n, format!("arithmetic on {other}"))),
        }
    }

    /// One lane of an ALU op on operands of scalar `s` (for WHERE: `s` is the value type).
    fn scalar_alu(&mut self, n: &UOp, op: Op, s: Scalar, args: &[String]) -> Result<String> {
        if op == Op::Where {
            return Ok(self.d.select(&args[0], &args[1], &args[2]));
        }
        let via = s.is_float() && self.d.float_via_f32(s);
        let cs = if via { Scalar::F32 } else { s };
        let a: Vec<String> =
            if via { args.iter().map(|e| self.d.to_f32(e, s, &mut self.p)).collect() } else { args.to_vec() };
        if let Some(r) = self.d.scalar_op(op, cs, &a, &mut self.p) {
            return Ok(self.finish(op, s, via, r));
        }
        let math = |this: &mut Self, f: MathFn| this.d.math(f, cs, &a, &mut this.p);
        let r = match op {
            Op::Neg if s == Scalar::Bool => format!("(!{})", a[0]),
            Op::Neg => format!("(-{})", a[0]),
            Op::Not if s == Scalar::Bool => format!("(!{})", a[0]),
            Op::Not => format!("(~{})", a[0]),
            Op::Sqrt => math(self, MathFn::Sqrt),
            Op::Exp2 => math(self, MathFn::Exp2),
            Op::Log2 => math(self, MathFn::Log2),
            Op::Exp => math(self, MathFn::Exp),
            Op::Log => math(self, MathFn::Log),
            Op::Sin => math(self, MathFn::Sin),
            Op::Cos => math(self, MathFn::Cos),
            Op::Trunc => math(self, MathFn::Trunc),
            Op::Recip => {
                let one = self.d.float_const(1.0, cs, &mut self.p);
                format!("({one} / {})", a[0])
            }
            Op::Abs if s.is_float() => math(self, MathFn::Fabs),
            Op::Abs if s.is_signed() => self.d.select(&format!("{} < 0", a[0]), &format!("-{}", a[0]), &a[0]),
            Op::Abs => a[0].clone(),
            Op::Max if s.is_float() => math(self, MathFn::Fmax),
            Op::Min if s.is_float() => math(self, MathFn::Fmin),
            Op::Max => self.d.select(&format!("{} > {}", a[0], a[1]), &a[0], &a[1]),
            Op::Min => self.d.select(&format!("{} < {}", a[0], a[1]), &a[0], &a[1]),
            Op::Pow => math(self, MathFn::Pow),
            Op::MulAcc if s.is_float() => math(self, MathFn::Fma),
            Op::MulAcc => format!("({} * {} + {})", a[0], a[1], a[2]),
            Op::Shl | Op::Shr => self.d.shift(op, s, &a[0], &a[1], &mut self.p),
            Op::Idiv | Op::Mod if s.is_int() => self.int_division(n, op, s, &a[0], &a[1]),
            op if op.is_binary() => format!("({} {} {})", a[0], infix_symbol(op), a[1]),
            op => return Err(render_err(n, format!("{op} is not an ALU op on {s}"))),
        };
        Ok(self.finish(op, s, via, r))
    }

    /// The result `r` of ALU `op` on `s` (computed in f32 when `via`) as a value of `s`.
    fn finish(&mut self, op: Op, s: Scalar, via: bool, r: String) -> String {
        if via && !op.is_comparison() {
            return self.d.from_f32(&r, s, &mut self.p);
        }
        // C promotes narrow integers and bools to int: bring the result back into the type so
        // lanes and inits hold exactly what the IR says.
        let wraps = matches!(op, Op::Neg | Op::Not | Op::Add | Op::Sub | Op::Mul | Op::Shl | Op::MulAcc | Op::Abs)
            || (s == Scalar::Bool && matches!(op, Op::And | Op::Or | Op::Xor | Op::Idiv | Op::Mod));
        if !op.is_comparison() && wraps && (s == Scalar::Bool || (s.is_int() && s.size() < 4)) {
            return self.d.wrap(&r, s, &mut self.p);
        }
        r
    }

    /// IDIV or MOD of `x` by `d` (scalar `s`, an integer type) with the defined results of
    /// the module docs: `x / 0 == 0`, `x % 0 == x`, `MIN / -1 == MIN`, `MIN % -1 == 0`. The
    /// divisor is replaced by 1 where C would trap (a select, no branch), and the result by
    /// the defined value where the divisor is 0. A constant divisor other than 0 (and -1 for
    /// signed types) cannot trap: it stays a plain `/` or `%`, which compilers strength-reduce.
    fn int_division(&mut self, n: &UOp, op: Op, s: Scalar, x: &str, d: &str) -> String {
        let symbol = infix_symbol(op);
        let divisor = n.src().get(1).and_then(|d| const_int_operand(d));
        if divisor.is_some_and(|c| c != 0 && !(s.is_signed() && c == -1)) {
            return format!("({x} {symbol} {d})");
        }
        let (zero, one) = (self.d.int_const(0, s), self.d.int_const(1, s));
        let is_zero = format!("({d} == {zero})");
        let traps = match s.int_range() {
            Some((min, _)) if s.is_signed() => {
                let (min, minus_one) = (self.d.int_const(min as i64, s), self.d.int_const(-1, s));
                format!("({is_zero} | (({x} == {min}) & ({d} == {minus_one})))")
            }
            _ => is_zero.clone(),
        };
        let safe = format!("({x} {symbol} {})", self.d.select(&traps, &one, d));
        let by_zero = if op == Op::Idiv { zero } else { x.to_string() };
        self.d.select(&is_zero, &by_zero, &safe)
    }
}

/// The integer value of an operand known when rendering: a CONST, or a VECTORIZE that
/// broadcasts one CONST.
fn const_int_operand(n: &UOp) -> Option<i64> {
    let c = match n.op() {
        Op::Vectorize if n.src().iter().all(|l| l.content_hash() == n.src()[0].content_hash()) => &n.src()[0],
        _ => n,
    };
    if c.op() == Op::Const { c.arg_int() } else { None }
}

fn infix_symbol(op: Op) -> &'static str {
    match op {
        Op::Add => "+",
        Op::Sub => "-",
        Op::Mul => "*",
        Op::Div | Op::Idiv => "/",
        Op::Mod => "%",
        Op::And => "&",
        Op::Or => "|",
        Op::Xor => "^",
        Op::Lt => "<",
        Op::Le => "<=",
        Op::Eq => "==",
        Op::Ne => "!=",
        _ => "?",
    }
}

/// The DEFINE_ACC a valued END (or ASSIGN/AFTER) stands for, if any.
fn acc_of(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let mut node = n.clone();
    loop {
        let next = match node.op() {
            Op::DefineAcc => return Some(node),
            Op::Assign | Op::After => node.src()[0].clone(),
            Op::End if node.dtype() != DType::Void && node.src().len() > 1 => node.src()[1].clone(),
            _ => return None,
        };
        node = next;
    }
}

/// Every node the SPECIAL extents depend on. They must be plain integer expressions over
/// constants and variables (they are evaluated before any launch index exists).
fn extent_closure(specials: &[&Arc<UOp>]) -> Result<HashSet<ContentHash>> {
    let mut out = HashSet::new();
    let mut stack: Vec<Arc<UOp>> = specials.iter().map(|s| s.src()[0].clone()).collect();
    while let Some(n) = stack.pop() {
        if !out.insert(n.content_hash()) {
            continue;
        }
        let ok = matches!(n.op(), Op::Const | Op::DefineVar | Op::Bind | Op::Cast) || n.op().is_alu();
        if !ok {
            return Err(render_err(
                &n,
                "a launch extent may only use constants, variables and arithmetic (no loads, loops or launch indices)",
            ));
        }
        stack.extend(n.src().iter().cloned());
    }
    Ok(out)
}
