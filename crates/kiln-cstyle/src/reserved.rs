//! Reserved names: the words a C, OpenCL C or CUDA C++ compiler reads as its own (keywords,
//! types, macros, built-in functions) and the names the core generates. A kernel or variable
//! whose IR name is one of them gets another C name.

use kiln_ir::UOp;

/// A C identifier for the entry point. A name that is not one already has its other
/// characters replaced by `_` and a hash of the whole name appended, so that two names never
/// meet in one identifier (`a b` and `a\0b`).
pub fn kernel_name(name: Option<&str>, ast: &UOp) -> String {
    match name {
        Some(n) if !n.is_empty() => {
            let mut s: String =
                n.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
            if s != n {
                s += &format!("_{:08x}", fnv1a(n.as_bytes()));
            }
            if s.starts_with(|c: char| c.is_ascii_digit()) || is_reserved(&s) {
                s.insert_str(0, "k_");
            }
            s
        }
        _ => format!("k_{}", &ast.content_hash().to_hex()[..12]),
    }
}

/// 32-bit FNV-1a: a small hash that is the same on every build.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Names the core generates or the dialects use, plus C/OpenCL keywords: a variable may not
/// take one of these as its C name.
fn is_reserved(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "auto",
        "break",
        "case",
        "char",
        "const",
        "continue",
        "default",
        "do",
        "double",
        "else",
        "enum",
        "extern",
        "float",
        "for",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "register",
        "restrict",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "struct",
        "switch",
        "typedef",
        "union",
        "unsigned",
        "void",
        "volatile",
        "while",
        "bool",
        "true",
        "false",
        "half",
        "uint",
        "ulong",
        "uchar",
        "ushort",
        "kernel",
        "global",
        "local",
        "constant",
        "private",
        "main",
        "bufs",
        "vals",
        "core_id",
        "NULL",
        "INFINITY",
        "NAN",
        "memcpy",
        "size_t",
        // C++ keywords and CUDA built-in variables (the CUDA dialect is C++).
        "class",
        "new",
        "delete",
        "this",
        "template",
        "typename",
        "namespace",
        "using",
        "operator",
        "public",
        "protected",
        "virtual",
        "friend",
        "mutable",
        "explicit",
        "try",
        "catch",
        "throw",
        "nullptr",
        "asm",
        "and",
        "or",
        "not",
        "xor",
        "threadIdx",
        "blockIdx",
        "blockDim",
        "gridDim",
        "warpSize",
        // C23 keywords (the default of newer C compilers; GNU C has `typeof` in every mode).
        "typeof",
        "typeof_unqual",
        "alignas",
        "alignof",
        "constexpr",
        "static_assert",
        "thread_local",
        // More C++ keywords and alternative tokens, and CUDA's `dim3`.
        "decltype",
        "noexcept",
        "concept",
        "requires",
        "consteval",
        "constinit",
        "co_await",
        "co_yield",
        "co_return",
        "static_cast",
        "dynamic_cast",
        "reinterpret_cast",
        "const_cast",
        "typeid",
        "export",
        "bitand",
        "bitor",
        "compl",
        "and_eq",
        "or_eq",
        "xor_eq",
        "not_eq",
        "dim3",
        // Reserved by OpenCL C.
        "complex",
        "imaginary",
        "quad",
        "generic",
        "read_only",
        "write_only",
        "read_write",
        "vec_step",
        "MAXFLOAT",
        // A macro PoCL's OpenCL C headers define.
        "INTTYPE",
        // A macro in CUDA.
        "assert",
    ];
    // C reserves names starting with `_` at file scope, where kernels are (`_Bool`,
    // `_mm256_max_ps`); OpenCL C predefines macros that start with a word in capitals and an
    // `_` (`M_PI`, `FLT_MAX`, `CLK_RGBx`) or with `cl_` (`cl_khr_fp64`).
    let macro_like = name.starts_with("cl_")
        || name.split_once('_').is_some_and(|(head, _)| {
            head.starts_with(|c: char| c.is_ascii_uppercase())
                && head.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        });
    if WORDS.contains(&name)
        || name.starts_with('_')
        || macro_like
        || is_vector_type(name)
        || name.starts_with("kiln_")
        || name.ends_with("_t")
    {
        return true;
    }
    if is_builtin_function(name) {
        return true;
    }
    const PREFIXES: &[&str] =
        &["alu", "val", "cast", "acc", "vec", "gep", "end", "ridx", "data", "gidx", "lidx", "idx", "lmem", "var"];
    PREFIXES
        .iter()
        .any(|p| name.strip_prefix(p).is_some_and(|rest| rest.chars().next().is_none_or(|c| c.is_ascii_digit())))
}

/// OpenCL C and CUDA vector and matrix type names: `float4`, `uint8`, `half16`, `float4x4`,
/// `longlong2`.
fn is_vector_type(name: &str) -> bool {
    const SCALARS: &[&str] = &[
        "char",
        "uchar",
        "short",
        "ushort",
        "int",
        "uint",
        "long",
        "ulong",
        "longlong",
        "ulonglong",
        "float",
        "double",
        "half",
        "bool",
    ];
    SCALARS.iter().any(|s| {
        name.strip_prefix(s).is_some_and(|rest| {
            rest.starts_with(|c: char| c.is_ascii_digit()) && rest.chars().all(|c| c.is_ascii_digit() || c == 'x')
        })
    })
}

/// C library and OpenCL C built-in functions: a kernel or variable of that name would clash
/// with (or shadow) the function, e.g. a kernel named `dot` in OpenCL C.
fn is_builtin_function(name: &str) -> bool {
    const FUNCTIONS: &[&str] = &[
        "abs",
        "fabs",
        "exp",
        "exp2",
        "exp10",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "sqrt",
        "rsqrt",
        "cbrt",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "pow",
        "pown",
        "powr",
        "rootn",
        "floor",
        "ceil",
        "round",
        "rint",
        "trunc",
        "fmod",
        "remainder",
        "fma",
        "mad",
        "hypot",
        "fmin",
        "fmax",
        "fdim",
        "frexp",
        "ldexp",
        "modf",
        "erf",
        "erfc",
        "tgamma",
        "lgamma",
        "sincos",
        "copysign",
        "nextafter",
        "nan",
        "isnan",
        "isinf",
        "isfinite",
        "signbit",
        "min",
        "max",
        "clamp",
        "mix",
        "step",
        "smoothstep",
        "sign",
        "degrees",
        "radians",
        "dot",
        "cross",
        "length",
        "distance",
        "normalize",
        "select",
        "bitselect",
        "any",
        "all",
        "shuffle",
        "shuffle2",
        "barrier",
        "printf",
        "malloc",
        "calloc",
        "realloc",
        "free",
        "exit",
        "abort",
        "memset",
        "memmove",
        "memcmp",
        "strlen",
        "rotate",
        "clz",
        "ctz",
        "popcount",
        "mul24",
        "mad24",
        "upsample",
        "hadd",
        "rhadd",
        "prefetch",
        "work_group_barrier",
        // The rest of OpenCL C's built-in functions, and CUDA's device functions.
        "abs_diff",
        "acospi",
        "add_sat",
        "asinpi",
        "atan2pi",
        "atanpi",
        "bit_reverse",
        "bitfield_extract_signed",
        "bitfield_extract_unsigned",
        "bitfield_insert",
        "capture_event_profiling_info",
        "cospi",
        "create_user_event",
        "enqueue_marker",
        "fast_distance",
        "fast_length",
        "fast_normalize",
        "fract",
        "ilogb",
        "is_valid_event",
        "is_valid_reserve_id",
        "isequal",
        "isgreater",
        "isgreaterequal",
        "isless",
        "islessequal",
        "islessgreater",
        "isnormal",
        "isnotequal",
        "isordered",
        "isunordered",
        "lgamma_r",
        "logb",
        "mad_hi",
        "mad_sat",
        "maxmag",
        "minmag",
        "mul_hi",
        "release_event",
        "remquo",
        "retain_event",
        "set_user_event_status",
        "sinpi",
        "sub_sat",
        "tanpi",
        "clock",
        "clock64",
        "norm",
        "norm3d",
        "norm4d",
        "rnorm",
        "rnorm3d",
        "rnorm4d",
        "rhypot",
        "fdivide",
        "sincospi",
        "erfinv",
        "erfcinv",
        "erfcx",
        "normcdf",
        "normcdfinv",
        "j0",
        "j1",
        "jn",
        "y0",
        "y1",
        "yn",
        "cyl_bessel_i0",
        "cyl_bessel_i1",
        "lrint",
        "llrint",
        "lround",
        "llround",
        "scalbn",
        "scalbln",
        "nearbyint",
        "rcbrt",
        "umin",
        "umax",
        "llmin",
        "llmax",
        "ullmin",
        "ullmax",
        "umul24",
        "mulhi",
        "umulhi",
        "mul64hi",
        "umul64hi",
        "labs",
        "llabs",
    ];
    const PREFIXES: &[&str] = &[
        "get_",
        "convert_",
        "as_",
        "vload",
        "vstore",
        "atomic_",
        "atom_",
        "native_",
        "half_",
        "mem_fence",
        "read_mem_fence",
        "write_mem_fence",
        "read_image",
        "write_image",
        "async_work_group",
        "wait_group",
        "sub_group",
        "work_group_",
        "amd_",
        "intel_",
        "arm_",
        "dot_",
    ];
    let base = name.strip_suffix(['f', 'l']).filter(|b| FUNCTIONS.contains(b)).unwrap_or(name);
    FUNCTIONS.contains(&base) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The C name of the variable `ir_name` at `position`: the name itself when it is a plain,
/// unreserved identifier, else `var<position>_<name>`, which no variable's own name can be
/// (`var` and a digit is reserved), so two variables never share a C name.
pub(crate) fn var_c_name(ir_name: &str, position: usize) -> String {
    let clean = !ir_name.is_empty()
        && ir_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !ir_name.starts_with(|c: char| c.is_ascii_digit());
    if clean && !is_reserved(ir_name) {
        ir_name.to_string()
    } else {
        let s: String = ir_name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        format!("var{position}_{s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Arg, DType, Op};

    #[test]
    fn names_never_clash_with_builtin_functions() {
        let ast = UOp::index_const(0);
        assert_eq!(kernel_name(Some("dot"), &ast), "k_dot");
        assert_eq!(kernel_name(Some("expf"), &ast), "k_expf");
        assert_eq!(kernel_name(Some("get_sum"), &ast), "k_get_sum");
        // OpenCL C's and CUDA's own functions, and vendor extensions.
        for name in ["sinpi", "ilogb", "remquo", "norm3df", "norm3d", "clock64", "j0", "umin", "amd_bfe"] {
            assert_eq!(kernel_name(Some(name), &ast), format!("k_{name}"));
        }
        assert_eq!(kernel_name(Some("matmul"), &ast), "matmul");
        assert_eq!(kernel_name(Some("shelf"), &ast), "shelf");
    }

    /// Names a C, OpenCL C or CUDA compiler reads as a keyword, type or macro: as a kernel
    /// name (a `.kiln` file's stem) or a variable they made the generated source fail to compile.
    #[test]
    fn names_never_clash_with_keywords_or_types() {
        let ast = UOp::index_const(0);
        for name in [
            "_Bool",
            "_Complex",
            "_Generic",
            "_mm256_max_ps",
            "_x",
            "typeof",
            "alignas",
            "uint8",
            "float4x4",
            "M_PI",
            "FLT_MAX",
            "MAXFLOAT",
            "CLK_RGBx",
            "cl_khr_fp64",
            "read_only",
            "assert",
        ] {
            assert_eq!(kernel_name(Some(name), &ast), format!("k_{name}"));
            assert_eq!(var_c_name(name, 0), format!("var0_{name}"));
        }
        // A variable's own name never takes the name made for another (`var<position>_...`).
        assert_eq!(var_c_name("x!", 1), "var1_x_");
        assert_eq!(var_c_name("var1_x_", 0), "var0_var1_x_");
        for name in ["x_", "N", "Mx_1", "intx", "float_4", "integer", "uint8_", "halfway", "variance"] {
            assert_eq!(kernel_name(Some(name), &ast), name);
        }
    }

    #[test]
    fn names_are_c_identifiers() {
        let sink = UOp::new(Op::Sink, DType::Void, Arg::None, vec![]);
        let spaced = kernel_name(Some("my kernel-1"), &sink);
        assert!(spaced.starts_with("my_kernel_1_") && spaced.len() == "my_kernel_1_".len() + 8, "{spaced}");
        assert_ne!(kernel_name(Some("a b"), &sink), kernel_name(Some("a\0b"), &sink));
        assert_ne!(kernel_name(Some("a b"), &sink), kernel_name(Some("a_b"), &sink));
        assert_eq!(kernel_name(Some("9lives"), &sink), "k_9lives");
        assert_eq!(kernel_name(Some("for"), &sink), "k_for");
        assert!(kernel_name(None, &sink).starts_with("k_"));
        assert_eq!(var_c_name("n", 0), "n");
        assert_eq!(var_c_name("alu3", 1), "var1_alu3");
        assert_eq!(var_c_name("a-b", 2), "var2_a_b");
    }
}
