//! The statements and the few expressions whose form differs between the languages on the
//! core: declarations, selects, loops, gated loads and stores, element addresses, shifts and
//! the wrap of narrow integers. Every method but [`Syntax::scalar_type`] has C's spelling as
//! its default, so a C-family dialect only names its types; WGSL overrides the rest.

use kiln_ir::{AddrSpace, Op, Scalar, UOp};

use crate::dialect::{Address, KernelParam, Prelude};
use crate::reserved::var_c_name;

/// How a language writes statements (see the module docs). Expressions returned must be
/// self-contained (parenthesized where precedence could matter); statements end in `;` or
/// `}`.
pub trait Syntax {
    /// The register type of a scalar (`float`, `int32_t`, `bool`, `f32`, ...).
    fn scalar_type(&self, s: Scalar, p: &mut Prelude) -> String;

    /// The name of the kernel variable `ir_name`, `position` in the launch's `vals`.
    fn var_name(&self, ir_name: &str, position: usize) -> String {
        var_c_name(ir_name, position)
    }

    /// Where buffer parameter `param` starts: its name, at element `0`.
    fn buffer(&self, param: &KernelParam) -> Address {
        Address { base: param.name.clone(), index: "0".into(), scalar: param.scalar, space: param.space }
    }

    /// The address of element `index` past `base` (INDEX). C takes the base's own element
    /// offset into a pointer.
    fn element(&self, base: Address, index: String, scalar: Scalar, space: AddrSpace) -> Address {
        let base = if base.index == "0" { base.base } else { base.pointer() };
        Address { base, index, scalar, space }
    }

    /// A declaration of `name` of type `ty`, never assigned again.
    fn declare(&self, ty: &str, name: &str, init: &str) -> String {
        format!("const {ty} {name} = {init};")
    }

    /// A declaration of the variable `name` of type `ty` (an accumulator, a carried value).
    fn declare_mut(&self, ty: &str, name: &str, init: &str) -> String {
        format!("{ty} {name} = {init};")
    }

    /// `t` where `cond` holds, else `f`; both may be evaluated.
    fn select(&self, cond: &str, t: &str, f: &str) -> String {
        format!("({cond} ? {t} : {f})")
    }

    /// A statement that runs only where `gate` holds.
    fn gated(&self, gate: &str, stmt: &str) -> String {
        format!("if ({gate}) {stmt}")
    }

    /// The declaration of `name` (type `ty`): `load` where `gate` holds, else `alt`. The
    /// load must not run where the gate is false.
    fn gated_load(&self, ty: &str, name: &str, load: &str, alt: &str, gate: &str) -> Vec<String> {
        vec![self.declare(ty, name, &self.select(gate, load, alt))]
    }

    /// The line that opens the loop of `range` over `index` (type `ty`) from 0 to `extent`.
    fn open_loop(&self, _range: &UOp, ty: &str, index: &str, extent: &str) -> String {
        format!("for ({ty} {index} = 0; {index} < {extent}; {index}++) {{")
    }

    /// The lines of a loop's body as it closes (`pad`: their indentation), given those the
    /// core wrote for it; a language that repeats the body (unrolling) rewrites them here.
    fn close_loop(&self, _range: &UOp, _index: &str, _extent: &str, body: Vec<String>, _pad: &str) -> Vec<String> {
        body
    }

    /// SHL or SHR (`op`) of `a` by `b` on integers of `s`: the count taken modulo the bit
    /// width; SHL of signed values shifts the unsigned bits (C's signed overflow is undefined).
    fn shift(&self, op: Op, s: Scalar, a: &str, b: &str, p: &mut Prelude) -> String {
        let mask = s.size() * 8 - 1;
        if op == Op::Shr {
            return format!("({a} >> ({b} & {mask}))");
        }
        if !s.is_signed() {
            return format!("({a} << ({b} & {mask}))");
        }
        let (st, ut) = (self.scalar_type(s, p), self.scalar_type(unsigned_of(s), p));
        format!("(({st})(({ut}){a} << ({b} & {mask})))")
    }

    /// `e`, the result of an operation on bools or integers narrower than 32 bits (which a
    /// language may compute in wider registers), brought back into the range of `s`.
    fn wrap(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        format!("(({}){e})", self.scalar_type(s, p))
    }

    /// A language's own spelling of ALU `op` on scalar operands of `s`, where the core's
    /// would not have the IR meaning in it (e.g. float comparisons that must hold for NaN
    /// by their bits); `None` takes the core's.
    fn scalar_op(&self, _op: Op, _s: Scalar, _args: &[String], _p: &mut Prelude) -> Option<String> {
        None
    }
}

/// The unsigned integer type of the same size.
pub fn unsigned_of(s: Scalar) -> Scalar {
    match s {
        Scalar::I8 => Scalar::U8,
        Scalar::I16 => Scalar::U16,
        Scalar::I32 => Scalar::U32,
        Scalar::I64 => Scalar::U64,
        other => other,
    }
}
