//! The structured fuzzer: mutates the example kernels and runs every variant through parse,
//! validate, render, compile and run, on the CPU over guard-page buffers (with its C pair and
//! its LLVM pair) and on OpenCL.
//!
//! For every mutant it asserts:
//! - no panic (each stage runs under `catch_unwind`) and no signal (a fault kills the test);
//! - no C, LLVM or OpenCL compiler error for a kernel that validated (a compiler error is never
//!   the user's message);
//! - no out-of-bounds access: CPU buffers end at a `PROT_NONE` page
//!   ([`kiln_cpu::GuardPageAllocator`]), so an overrun the bounds proof let through faults;
//! - the CPU's LLVM pair ([`kiln_cpu::LLVM_PAIR`], on the same guard-page device, so an overrun
//!   faults there too) compiles every mutant its C pair compiled, runs it with the same inputs
//!   and variable values, and writes the same bits into every buffer (a NaN may differ in sign
//!   and payload, see [`same_bits`]) where the kernel is deterministic (no two work items write,
//!   or write and read, the same element: checked by enumerating the addresses of every access
//!   on the host, see [`kiln_conformance::races`]). Where libLLVM 16 is missing this part is
//!   reported skipped, and fails the test when `KILN_REQUIRE` names `cpu-llvm`;
//! - identical results on CPU and OpenCL for the same kernel and inputs, where the kernel is
//!   deterministic (up to the last places of transcendental functions, see [`agree`]).
//!
//! Bounded by case count so CI stays fast: `KILN_FUZZ_CASES` (default 1000 mutants) and
//! `KILN_FUZZ_SEED` (default 1) reproduce or extend a run. A failure prints the mutant's text.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use kiln_conformance::backend;
use kiln_conformance::host::{Value, decode, encode_all, launch_bytes, same_bits};
use kiln_conformance::races::races;
use kiln_cpu::{CC_PAIR, LLVM_PAIR};
use kiln_device::kiln_ir::{Op, Scalar, parse};
use kiln_device::{Device, Error, Kernel, ProgramSpec};

/// A small deterministic generator (SplitMix64): the same seed gives the same mutants.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The seed corpus: every example kernel, comments dropped (mutating them is wasted work).
fn seeds() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("bench")] {
        let mut files: Vec<_> =
            std::fs::read_dir(&dir).expect("examples/kernels").flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "kiln")) {
            let text = std::fs::read_to_string(&f).expect("kernel text");
            let lines = text
                .lines()
                .map(|l| l.split('#').next().unwrap_or("").trim_end().to_string())
                .filter(|l| !l.trim().is_empty())
                .collect();
            out.push((f.file_name().unwrap_or_default().to_string_lossy().into_owned(), lines));
        }
    }
    out
}

const INTS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "7",
    "8",
    "9",
    "15",
    "16",
    "17",
    "63",
    "64",
    "65",
    "-1",
    "-2",
    "255",
    "256",
    "1024",
    "2147483647",
    "-2147483648",
    "4294967295",
    "0x10",
];
const FLOATS: &[&str] = &["0.0", "-0.0", "1.0", "-1.5", "0.5", "3.0", "1e30", "-1e-30", "3.5e38", "65504.0"];
const DTYPES: &[&str] = &["i32", "i64", "u32", "i16", "u8", "i8", "u64", "f32", "f16", "bf16", "f64", "bool"];
const PTRS: &[&str] = &["ptr<f32>", "ptr<f32x4>", "ptr<f32x8>", "ptr<i32>", "ptr<f16>", "ptr<u8>", "ptr<f64>"];
const BINARY: &[&str] =
    &["ADD", "SUB", "MUL", "IDIV", "MOD", "MAX", "MIN", "AND", "OR", "XOR", "SHL", "SHR", "DIV", "POW"];
const COMPARE: &[&str] = &["CMPLT", "CMPLE", "CMPEQ", "CMPNE"];
const UNARY: &[&str] = &["NEG", "NOT", "SQRT", "RECIP", "EXP2", "LOG2", "EXP", "LOG", "SIN", "COS", "TRUNC", "ABS"];
const SPECIALS: &[&str] = &["\"idx0\"", "\"idx1\"", "\"gidx0\"", "\"lidx0\"", "\"gidx1\"", "\"lidx1\"", "\"core_id\""];

/// One token-level mutation of one line: a literal, a dtype, an op, an operand or a launch
/// index replaced, or a line deleted or duplicated.
fn mutate(lines: &mut Vec<String>, rng: &mut Rng) {
    let at = rng.below(lines.len());
    if rng.below(12) == 0 && lines.len() > 2 {
        if rng.below(2) == 0 {
            lines.remove(at);
        } else {
            let copy = lines[at].clone();
            lines.insert(at + 1, copy);
        }
        return;
    }
    // Names defined before this line: candidates for an operand swap.
    let defined: Vec<String> = lines[..at]
        .iter()
        .filter_map(|l| l.split_whitespace().next().filter(|t| t.starts_with('%')).map(str::to_string))
        .collect();
    let tokens: Vec<String> = lines[at].split_whitespace().map(str::to_string).collect();
    if tokens.len() < 2 {
        return;
    }
    let t = 1 + rng.below(tokens.len() - 1);
    let tok = tokens[t].trim_matches(|c| c == '(' || c == ')' || c == ',');
    let replacement: String = if tok.starts_with('%') && !defined.is_empty() {
        rng.pick(&defined).clone()
    } else if tok.starts_with("ptr<") {
        rng.pick(PTRS).to_string()
    } else if DTYPES.contains(&tok) || tok.contains('x') && tok.len() <= 5 && !tok.starts_with('"') {
        rng.pick(DTYPES).to_string()
    } else if BINARY.contains(&tok) {
        rng.pick(BINARY).to_string()
    } else if COMPARE.contains(&tok) {
        rng.pick(COMPARE).to_string()
    } else if UNARY.contains(&tok) {
        rng.pick(UNARY).to_string()
    } else if tok.starts_with('"') && SPECIALS.contains(&tok) {
        rng.pick(SPECIALS).to_string()
    } else if tok.contains('.') && tok.parse::<f64>().is_ok() {
        rng.pick(FLOATS).to_string()
    } else if tok.parse::<i64>().is_ok() {
        let v: i64 = tok.parse().unwrap_or(0);
        match rng.below(4) {
            0 => (v + 1).to_string(),
            1 => (v - 1).to_string(),
            2 => v.saturating_mul(2).to_string(),
            _ => rng.pick(INTS).to_string(),
        }
    } else {
        return;
    };
    let new = tokens[t].replacen(tok, &replacement, 1);
    let mut out = tokens.clone();
    out[t] = new;
    lines[at] = out.join(" ");
}

/// What happened to the mutants, for the summary line.
#[derive(Default, Debug)]
struct Tally {
    cases: u64,
    parse_rejected: u64,
    validate_or_render_rejected: u64,
    launch_rejected: u64,
    out_of_bounds_refused: u64,
    /// Ran guarded, and a guard stopped an access outside its buffer.
    out_of_bounds_guarded: u64,
    ran_cpu: u64,
    /// Ran with the LLVM pair too, and of those, deterministic and compared bit for bit.
    ran_llvm: u64,
    llvm_compared: u64,
    /// Ran on OpenCL too: deterministic and compared, or not.
    compared: u64,
    not_compared: u64,
}

/// Largest buffer (bytes) and work (global items × loop trips) one case may use.
const MAX_BYTES: usize = 4 << 20;
const MAX_WORK: u128 = 1 << 22;

#[test]
fn mutated_example_kernels_are_typed_errors_or_run_in_bounds_and_agree() {
    const TEST: &str = "fuzz::mutated_example_kernels_are_typed_errors_or_run_in_bounds_and_agree";
    let Some(cpu) = backend("cpu-guarded", TEST) else { return };
    let ocl = backend("opencl", TEST);
    let llvm = match cpu.missing_compilers().into_iter().find(|(pair, _)| pair == LLVM_PAIR) {
        None => true,
        Some((_, why)) => {
            kiln_device::testing::skip_unless_required("cpu-llvm", &format!("{TEST} (its LLVM pair)"), &why);
            false
        }
    };
    let cases = env_u64("KILN_FUZZ_CASES", 1000);
    let mut rng = Rng(env_u64("KILN_FUZZ_SEED", 1));
    let corpus = seeds();
    assert!(!corpus.is_empty(), "no example kernels found");
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for case in 0..cases {
        let (name, seed) = rng.pick(&corpus).clone();
        let mut lines = seed;
        for _ in 0..1 + rng.below(3) {
            mutate(&mut lines, &mut rng);
        }
        let text = lines.join("\n");
        tally.cases += 1;
        let outcome =
            catch_unwind(AssertUnwindSafe(|| one_case(&cpu, llvm, ocl.as_deref(), &text, &mut rng, &mut tally)));
        let problem = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(p)) => p,
            Err(_) => "panicked".to_string(),
        };
        failures.push(format!("case {case} (from {name}): {problem}\n{text}\n"));
        if failures.len() >= 5 {
            break;
        }
    }
    eprintln!("fuzz: {tally:?}");
    assert!(failures.is_empty(), "{} failing mutants:\n{}", failures.len(), failures.join("\n"));
    // The fuzzer must exercise the run path, not only the rejections.
    assert!(tally.ran_cpu > 0 && (ocl.is_none() || tally.compared > 0), "no mutant ran: {tally:?}");
    assert!(!llvm || tally.llvm_compared > 0, "no mutant was compared with the LLVM pair: {tally:?}");
}

/// Runs one mutant; `Err` is a broken promise, with what broke.
fn one_case(
    cpu: &Arc<Device>,
    llvm: bool,
    ocl: Option<&Device>,
    text: &str,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<(), String> {
    let Ok(sink) = parse(text) else {
        tally.parse_rejected += 1;
        return Ok(());
    };
    let kernel = match cpu.compile_with(CC_PAIR, &sink, Some("fuzz")) {
        Ok(k) => k,
        Err(e) => {
            tally.validate_or_render_rejected += 1;
            return compiler_never_blamed("CPU", &e);
        }
    };
    let spec = &kernel.spec;
    let vals: Vec<i64> = spec.vars.iter().map(|v| pick_value(v.min, v.max, rng)).collect();
    let (Ok(dims), Ok(lens)) = (spec.launch_dims(&vals), spec.param_lens(&vals)) else {
        tally.launch_rejected += 1;
        return Ok(());
    };
    let work = dims.global.iter().chain(dims.local.iter().flatten()).map(|&d| d as u128).product::<u128>();
    let too_big = spec.params.iter().zip(&lens).any(|(p, &n)| n.saturating_mul(p.scalar.size()) > MAX_BYTES);
    if too_big || work.saturating_mul(loop_trips(spec, &vals)) > MAX_WORK {
        tally.launch_rejected += 1;
        return Ok(());
    }
    let inputs: Vec<Vec<Value>> = spec.params.iter().zip(&lens).map(|(p, &n)| data(p.scalar, n, rng)).collect();
    let cpu_out = match run(cpu, &kernel, &inputs, &vals) {
        Ok(out) => out,
        Err(Error::OutOfBounds { access, .. }) => {
            if access.guarded {
                tally.out_of_bounds_guarded += 1
            } else {
                // Under the guard only an access that cannot be guarded is refused: say which.
                tally.out_of_bounds_refused += 1;
                eprintln!("refused (not guardable): {access}\n{text}\n");
            }
            return Ok(());
        }
        Err(e) => return Err(format!("CPU launch failed after the kernel compiled: {e}")),
    };
    tally.ran_cpu += 1;
    let cpu_values = values(spec, &cpu_out).map_err(|e| format!("the CPU wrote {e}"))?;
    let deterministic = races(&sink, &vals) == Some(false);
    if llvm {
        // Both pairs take every kernel kiln accepts: any refusal is the LLVM pair's bug.
        let llvm_kernel = cpu
            .compile_with(LLVM_PAIR, &sink, Some("fuzz"))
            .map_err(|e| format!("the LLVM pair refused what the C pair compiled: {e}"))?;
        let llvm_out = run(cpu, &llvm_kernel, &inputs, &vals)
            .map_err(|e| format!("LLVM pair launch failed where the C pair's ran: {e}"))?;
        tally.ran_llvm += 1;
        if deterministic {
            tally.llvm_compared += 1;
            same_outputs(spec, &cpu_out, &llvm_out).map_err(|e| format!("C pair vs LLVM pair: {e} (vals {vals:?})"))?;
        }
    }
    let Some(ocl) = ocl else { return Ok(()) };
    let ocl_kernel = ocl.compile(&sink, Some("fuzz")).map_err(|e| format!("OpenCL refused what the CPU ran: {e}"))?;
    let ocl_out = run(ocl, &ocl_kernel, &inputs, &vals).map_err(|e| format!("OpenCL launch failed: {e}"))?;
    if !deterministic {
        tally.not_compared += 1;
        return Ok(());
    }
    tally.compared += 1;
    let ocl_values = values(spec, &ocl_out).map_err(|e| format!("OpenCL wrote {e}"))?;
    for ((p, a), b) in spec.params.iter().zip(&cpu_values).zip(&ocl_values) {
        if let Some(i) = (0..a.len()).find(|&i| !agree(a[i], b[i], p.scalar)) {
            return Err(format!("slot {} element {i}: CPU {} vs OpenCL {} (vals {vals:?})", p.slot, a[i], b[i]));
        }
    }
    Ok(())
}

/// A validated kernel may be refused with a typed error, but never by the backend compiler.
fn compiler_never_blamed(backend: &str, e: &Error) -> Result<(), String> {
    match e {
        Error::Compile { .. } => Err(format!("{backend} compiler rejected a kernel kiln accepted: {e}")),
        _ => Ok(()),
    }
}

fn pick_value(min: i64, max: i64, rng: &mut Rng) -> i64 {
    let small = min.saturating_add(rng.below(70) as i64).min(max);
    *rng.pick(&[min, max.min(min.saturating_add(1)), small, small, max])
}

/// Product of the kernel's loop extents for `vals` (1 when an extent can't be evaluated).
fn loop_trips(spec: &ProgramSpec, vals: &[i64]) -> u128 {
    spec.ast
        .toposort()
        .iter()
        .filter(|n| n.op() == Op::Range)
        .map(|r| spec.eval(&r.src()[0], vals).map_or(1, |e| e.max(1) as u128))
        .fold(1u128, |a, b| a.saturating_mul(b))
}

/// Inputs that keep float sums exact (multiples of 1/8) and integers near the edges that
/// matter (0, ±1, the type's extremes).
fn data(s: Scalar, n: usize, rng: &mut Rng) -> Vec<Value> {
    (0..n)
        .map(|_| match s {
            Scalar::Bool => Value::B(rng.below(2) == 1),
            s if s.is_float() => Value::F((rng.below(33) as f64 - 16.0) / 8.0),
            _ => match rng.below(8) {
                0 => Value::I(0),
                1 => Value::I(-1),
                2 => Value::I(i128::MIN),
                3 => Value::I(i128::MAX),
                _ => Value::I(rng.below(64) as i128 - 8),
            },
        })
        .collect()
}

/// Uploads `inputs`, launches, and downloads the bytes of every buffer.
fn run(dev: &Device, kernel: &Kernel, inputs: &[Vec<Value>], vals: &[i64]) -> Result<Vec<Vec<u8>>, Error> {
    let bytes: Vec<Vec<u8>> = kernel.spec.params.iter().zip(inputs).map(|(p, v)| encode_all(v, p.scalar)).collect();
    launch_bytes(dev, kernel, &bytes, vals)
}

/// The elements of every buffer of `spec` in `out` (a bool byte other than 0 or 1 is an error).
fn values(spec: &ProgramSpec, out: &[Vec<u8>]) -> Result<Vec<Vec<Value>>, String> {
    spec.params
        .iter()
        .zip(out)
        .map(|(p, bytes)| {
            bytes
                .chunks(p.scalar.size())
                .map(|c| decode(c, p.scalar).map_err(|e| format!("slot {}: {e}", p.slot)))
                .collect()
        })
        .collect()
}

/// `Ok` when every element of every buffer of `spec` holds the same bits in `a` and `b`, or a
/// NaN in both ([`same_bits`]: which NaN is unspecified), else the first element that differs.
fn same_outputs(spec: &ProgramSpec, a: &[Vec<u8>], b: &[Vec<u8>]) -> Result<(), String> {
    for ((p, a), b) in spec.params.iter().zip(a).zip(b) {
        let n = p.scalar.size();
        if let Some(i) = (0..a.len() / n).find(|&i| !same_bits(&a[i * n..][..n], &b[i * n..][..n], p.scalar)) {
            let (x, y) = (&a[i * n..][..n], &b[i * n..][..n]);
            let show = |bytes: &[u8]| decode(bytes, p.scalar).map_or_else(|e| e, |v| v.to_string());
            return Err(format!("slot {} element {i}: {} {x:02x?} vs {} {y:02x?}", p.slot, show(x), show(y)));
        }
    }
    Ok(())
}

/// Bit-equal, both NaN, or (floats) within a relative 1e-5: the backends' transcendental
/// functions may differ in the last places; everything else must match exactly.
fn agree(a: Value, b: Value, s: Scalar) -> bool {
    if a.same(b) {
        return true;
    }
    match (a, b) {
        (Value::F(x), Value::F(y)) if s.is_float() => {
            let tol = if matches!(s, Scalar::F16 | Scalar::BF16) { 1e-2 } else { 1e-5 };
            x == y || (x - y).abs() <= tol * x.abs().max(y.abs()) || (x.abs() < 1e-30 && y.abs() < 1e-30)
        }
        _ => false,
    }
}
