//! The core's decisions, checked through a minimal dialect.

use std::sync::Arc;

use kiln_device::{Error, ProgramSpec, Renderer, Result};
use kiln_ir::{Arg, DType, DeviceSpec, KernelBuilder, Op, Scalar, UOp, Val};

use crate::{Address, CStyle, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude, Syntax, c_float_literal};

/// A minimal OpenCL-flavoured dialect: enough to check what the core decides.
struct Toy;

impl Syntax for Toy {
    fn scalar_type(&self, s: Scalar, _: &mut Prelude) -> String {
        s.name().into()
    }
}

impl Dialect for Toy {
    fn header(&self) -> String {
        "// toy".into()
    }
    fn vector_type(&self, s: Scalar, w: u8, p: &mut Prelude) -> String {
        let name = format!("{}x{w}", s.name());
        p.need(&name, |_| format!("typedef vec {}x{w};", s.name()));
        name
    }
    fn lane(&self, v: &str, _: DType, lane: u8) -> String {
        format!("{v}.s{lane}")
    }
    fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String {
        let t = match dtype {
            DType::Vector(s, w) => self.vector_type(s, w, p),
            _ => "?".into(),
        };
        format!("({t})({})", lanes.join(", "))
    }
    fn native_vector_op(&self, op: Op, _: DType) -> bool {
        op == Op::Add
    }
    fn to_f32(&self, e: &str, _: Scalar, _: &mut Prelude) -> String {
        format!("up({e})")
    }
    fn from_f32(&self, e: &str, _: Scalar, _: &mut Prelude) -> String {
        format!("down({e})")
    }
    fn math(&self, f: MathFn, _: Scalar, args: &[String], _: &mut Prelude) -> String {
        format!("{}({})", f.c_name(), args.join(", "))
    }
    fn cast(&self, e: &str, _: Scalar, to: Scalar, _: &mut Prelude) -> String {
        format!("convert_{}({e})", to.name())
    }
    fn bitcast(&self, e: &str, _: DType, to: DType, _: &mut Prelude) -> Result<String> {
        Ok(format!("as_{to}({e})"))
    }
    fn float_const(&self, v: f64, s: Scalar, _: &mut Prelude) -> String {
        c_float_literal(v, s)
    }
    fn signature(&self, name: &str, params: &[KernelParam], vars: &[KernelVar], _: &mut Prelude) -> String {
        let mut args: Vec<String> = params
            .iter()
            .map(|p| format!("{}{} *{}", if p.written { "" } else { "const " }, p.scalar.name(), p.name))
            .collect();
        args.extend(vars.iter().map(|v| format!("int {}", v.name)));
        format!("kernel void {name}({}) {{", args.join(", "))
    }
    fn prologue(&self, _: &[KernelParam], _: &[KernelVar], _: &mut Prelude) -> Vec<String> {
        Vec::new()
    }
    fn open_launch(&self, indices: &[LaunchIndex], _: &mut Prelude) -> Result<Vec<String>> {
        Ok(indices
            .iter()
            .map(|ix| format!("int {} = id('{}', {}); // < {}", ix.name, ix.kind, ix.axis, ix.extent))
            .collect())
    }
    fn load(&self, addr: &Address, _: DType, _: &mut Prelude) -> String {
        format!("{}[{}]", addr.base, addr.index)
    }
    fn store(&self, addr: &Address, value: &str, _: DType, _: &mut Prelude) -> String {
        format!("{}[{}] = {value}", addr.base, addr.index)
    }
}

fn render(sink: &Arc<UOp>) -> Result<ProgramSpec> {
    CStyle::new(Toy, DeviceSpec::new("CPU", 0)).render(sink, Some("k"))
}

#[test]
fn prelude_orders_dependencies_first_and_once() {
    let mut p = Prelude::default();
    p.need("b", |p| {
        p.need("a", |_| "A".into());
        "B".into()
    });
    p.need("a", |_| "A again".into());
    assert_eq!(p.items(), ["A", "B"]);
    assert!(p.contains("b"));
}

#[test]
fn core_structure_hoists_extents_and_scopes_loops() {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 4, 1024);
    let (a, out) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
    let g = k.special("gidx0", &n / 4);
    let r = k.range(4);
    let acc = k.acc(&Val::f32(0.0), &[&r]);
    let total = acc.update(&(acc.get() + a.at(&(&g * 4 + &r)).load()));
    k.store(&out.at(&g), &total);
    let spec = render(&k.finish().unwrap()).unwrap();
    let src = &spec.src;
    assert!(src.starts_with("// toy\n"), "{src}");
    assert!(src.contains("kernel void k(const f32 *data0, f32 *data1, int n) {"), "{src}");
    // The extent n/4 is computed before the launch index that needs it.
    let extent = src.find("const i32 alu0 = (n / 4);").expect("hoisted extent");
    let launch = src.find("int gidx0 = id('g', 0); // < alu0").expect("launch index");
    assert!(extent < launch, "{src}");
    // The accumulator is declared before its loop and written back at the loop's end.
    let decl = src.find("f32 acc0 = 0.0f;").expect("acc");
    let open = src.find("for (i32 ridx0 = 0; ridx0 < 4; ridx0++) {").expect("loop");
    let commit = src.find("acc0 = alu").expect("commit");
    let store = src.find("data1[gidx0] = acc0;").expect("store of the finished acc");
    assert!(decl < open && open < commit && commit < store, "{src}");
    assert_eq!(src.matches('{').count(), src.matches('}').count(), "{src}");
    assert_eq!(spec.outs, vec![1]);
}

#[test]
fn vectors_use_native_ops_or_go_lane_by_lane() {
    let mut k = KernelBuilder::new();
    let (a, out) = (k.param(0, Scalar::F32, 8), k.param(1, Scalar::F32, 8));
    let i = k.global(0, 2);
    let v = a.at_vec(&(&i * 4), 4).load();
    let r = (&v + &v) * &v;
    k.store(&out.at_vec(&(&i * 4), 4), &r);
    let src = render(&k.finish().unwrap()).unwrap().src;
    assert!(src.contains("typedef vec f32x4;"), "{src}");
    assert!(src.contains("const f32x4 alu1 = (val0 + val0);"), "{src}");
    assert!(src.contains("(f32x4)((alu1.s0 * val0.s0), (alu1.s1 * val0.s1)"), "{src}");
}

#[test]
fn half_arithmetic_goes_through_f32() {
    let mut k = KernelBuilder::new();
    let (a, out) = (k.param(0, Scalar::F16, 4), k.param(1, Scalar::F16, 4));
    let i = k.global(0, 4);
    let v = a.at(&i).load();
    k.store(&out.at(&i), &(&v * &v).sqrt());
    let src = render(&k.finish().unwrap()).unwrap().src;
    assert!(src.contains("down((up(val0) * up(val0)))"), "{src}");
    assert!(src.contains("down(sqrt(up(alu0)))"), "{src}");
}

#[test]
fn unrenderable_kernels_are_render_errors() {
    // Two different extents for one launch index.
    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::I32, 16);
    let g1 = k.special("gidx0", 4);
    let g2 = k.special("gidx0", 8);
    k.store(&out.at(&g1), &g2);
    let sink = UOp::new(Op::Sink, DType::Void, Arg::None, k_effects(&out, &g1, &g2));
    assert!(matches!(render(&sink), Err(Error::Render(m)) if m.contains("two different extents")));
    // An extent that reads memory.
    let mut k = KernelBuilder::new();
    let (sizes, out) = (k.param(0, Scalar::I32, 1), k.param(1, Scalar::I32, 16));
    let g = k.special("gidx0", sizes.at(&Val::int(0)).load());
    k.store(&out.at(&g), &g);
    assert!(matches!(render(&k.finish().unwrap()), Err(Error::Render(m)) if m.contains("launch extent")));
    // Not a SINK.
    assert!(matches!(render(&UOp::index_const(1)), Err(Error::Render(_))));
}

#[test]
fn loops_with_the_same_axis_get_distinct_names() {
    let range = |extent: i64| UOp::new(Op::Range, DType::I32, Arg::Int(5), vec![UOp::index_const(extent)]);
    let (outer, inner) = (range(3), range(2));
    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::I32, 6);
    let idx = &Val(outer.clone()) * 2 + &Val(inner.clone());
    let st = k.store(&out.at(&idx), &idx);
    let e_inner = k.end(&Val(inner), &[&st]);
    k.end(&Val(outer), &[&e_inner]);
    let src = render(&k.finish().unwrap()).unwrap().src;
    assert!(src.contains("for (i32 ridx5 = 0; ridx5 < 3; ridx5++) {"), "{src}");
    assert!(src.contains("for (i32 ridx0 = 0; ridx0 < 2; ridx0++) {"), "{src}");
}

fn k_effects(out: &Val, g1: &Val, g2: &Val) -> Vec<Arc<UOp>> {
    let st = |g: &Val| UOp::new(Op::Store, DType::Void, Arg::None, vec![out.at(g).0.clone(), g.0.clone()]);
    vec![st(g1), st(g2)]
}

/// An IF block renders as a C `if` block; local memory and barriers need a dialect that
/// spells them (the toy one keeps the refusing defaults) and a launch with work groups.
#[test]
fn if_blocks_render_and_work_group_constructs_need_work_groups() {
    let guarded = kiln_ir::parse_kernel(
        "%n = CONST i32 4\n%a = PARAM ptr<i32> 0 (%n)\n%i = SPECIAL i32 \"gidx0\" (%n)\n%z = CONST i32 0\n\
         %c = CMPNE bool (%i, %z)\n%if = IF (%c)\n%a1 = AFTER ptr<i32> (%a, %if)\n%p = INDEX ptr<i32> (%a1, %i)\n\
         %st = STORE (%p, %i)\n%e = ENDIF (%if, %st)\nSINK (%e)",
    )
    .unwrap();
    let src = render(&guarded).unwrap().src;
    assert!(src.contains("if (alu0) {\n") && src.contains("data0[gidx0] = gidx0;"), "{src}");
    let local = |index: &str| {
        kiln_ir::parse_kernel(&format!(
            "%n = CONST i32 4\n%i = SPECIAL i32 \"{index}\" (%n)\n%t = DEFINE_LOCAL lptr<i32> 0 (%n)\n\
             %p = INDEX lptr<i32> (%t, %i)\n%st = STORE (%p, %i)\n%b = BARRIER (%st)\nSINK (%b)"
        ))
        .unwrap()
    };
    let Err(Error::Render(m)) = render(&local("lidx0")) else { panic!("the toy dialect has no local memory") };
    assert!(m.contains("needs a backend with work groups"), "{m}");
    let Err(Error::Render(m)) = render(&local("idx0")) else { panic!("idx0 has no work groups") };
    assert!(m.contains("launch with gidxN/lidxN, not idxN"), "{m}");
}
