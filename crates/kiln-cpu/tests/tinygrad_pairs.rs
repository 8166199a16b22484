//! The CPU's two compiler pairs on the kernels a real compiler generates: every kernel of
//! kiln-device's tinygrad corpus (`crates/kiln-device/tests/tinygrad/`, 267 kernels of
//! convolutions, pooling, cumsum, topk, matmul, softmax and movement ops from tinygrad 0.14's
//! CPU and OpenCL renderers) is compiled with the C pair and with the LLVM pair, run on the same
//! pseudo-random inputs, and must leave bit for bit the same bytes in every buffer (a NaN may
//! differ in sign and payload: which NaN an operation returns is unspecified in C and in LLVM
//! IR, and the compilers commute operands; see `kiln_conformance::host::same_bits`). Without
//! libLLVM 16 the test reports itself skipped (failing instead when `KILN_REQUIRE` names
//! `cpu-llvm`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_conformance::host::{Value, decode, encode, launch_bytes, same_bits};
use kiln_conformance::races::races;
use kiln_cpu::{CC_PAIR, LLVM_PAIR};
use kiln_device::kiln_ir::{Scalar, UOp, parse_kernel};
use kiln_device::{Error, ProgramSpec};

/// The corpus files, sorted.
fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-device/tests/tinygrad");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")).path())
        .filter(|p| p.extension().is_some_and(|x| x == "kiln"))
        .collect();
    files.sort();
    files
}

/// `n` elements of `s` as bytes, from `seed`: floats uniform in [-4, 4) with a zero, a
/// negative zero, infinities, a NaN and a subnormal among the first, integers mostly in
/// [-64, 64) with their type's edges (wrapped by the encoding) now and then, bools at random.
fn data(s: Scalar, n: usize, seed: u64) -> Vec<u8> {
    const SPECIALS: [f64; 6] = [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-40];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n * s.size());
    for i in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let v = match s {
            Scalar::Bool => Value::B(state & 1 == 1),
            s if s.is_float() && i % 17 == 5 => Value::F(SPECIALS[(i / 17) % SPECIALS.len()]),
            s if s.is_float() => Value::F((state >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0),
            _ if i % 13 == 7 => Value::I([0, -1, i128::from(i64::MIN), i128::from(u64::MAX)][(i / 13) % 4]),
            _ => Value::I((state % 128) as i128 - 64),
        };
        encode(v, s, &mut out);
    }
    out
}

/// The first element where `c` and `llvm` differ, described; `None` when every element holds the
/// same bits, or a NaN in both ([`same_bits`]: which NaN is unspecified).
fn first_difference(spec: &ProgramSpec, c: &[Vec<u8>], llvm: &[Vec<u8>]) -> Option<String> {
    spec.params.iter().zip(c).zip(llvm).find_map(|((p, c), l)| {
        let n = p.scalar.size();
        let i = (0..c.len() / n).find(|&i| !same_bits(&c[i * n..][..n], &l[i * n..][..n], p.scalar))?;
        let show = |b: &[u8]| {
            let bytes = &b[i * n..][..n];
            format!("{} {bytes:02x?}", decode(bytes, p.scalar).map_or_else(|e| e, |v| v.to_string()))
        };
        Some(format!("slot {} element {i}: C {} vs LLVM {}", p.slot, show(c), show(l)))
    })
}

/// Every corpus kernel the CPU renders gives the same bits with the LLVM pair as with the C pair,
/// at each variable's smallest and largest value, wherever the result does not depend on the
/// order of the work items ([`races`]: no two items write, or write and read, one element).
/// Kernels the CPU refuses with `Error::Render` (work-group memory and barriers) are counted, not
/// run; most of the corpus must run and be compared, and the LLVM pair must accept and run every
/// kernel the C pair does.
#[test]
fn tinygrad_corpus_gives_the_same_bits_with_both_pairs() {
    const TEST: &str = "tinygrad_corpus_gives_the_same_bits_with_both_pairs";
    let cpu = kiln_cpu::open(&kiln_cpu::CPU).unwrap_or_else(|e| panic!("{e}"));
    let c = cpu.with_default_compiler(CC_PAIR).unwrap_or_else(|e| panic!("{e}"));
    let llvm = match cpu.with_default_compiler(LLVM_PAIR) {
        Ok(llvm) => llvm,
        Err(why) => {
            kiln_device::testing::skip_unless_required("cpu-llvm", TEST, &why);
            return;
        }
    };
    let files = corpus();
    let names: Vec<String> =
        files.iter().map(|f| f.file_stem().unwrap_or_default().to_string_lossy().into_owned()).collect();
    let sinks: Vec<Arc<UOp>> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            parse_kernel(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect();
    // Symbol names: the file names with `.` and `-` as `_`.
    let symbols: Vec<String> = names.iter().map(|n| n.replace(['.', '-'], "_")).collect();
    let jobs: Vec<(Arc<UOp>, Option<&str>)> =
        sinks.iter().cloned().zip(symbols.iter().map(|s| Some(s.as_str()))).collect();
    let (c_kernels, llvm_kernels) = (c.compile_many(&jobs), llvm.compile_many(&jobs));
    let (mut refused, mut racing, mut undecided) = (Vec::new(), Vec::new(), Vec::new());
    // Launches (a kernel with variables launches at both ends), and those compared.
    let (mut launches, mut compared) = (0, 0);
    let mut failures = Vec::new();
    for (k, (name, (ck, lk))) in names.iter().zip(c_kernels.into_iter().zip(llvm_kernels)).enumerate() {
        let (ck, lk) = match (ck, lk) {
            (Ok(ck), Ok(lk)) => (ck, lk),
            (Err(Error::Render(_)), Err(Error::Render(_))) => {
                refused.push(name.as_str());
                continue;
            }
            (ck, lk) => {
                failures.push(format!(
                    "{name}: the pairs disagree on compiling it: C {:?}, LLVM {:?}",
                    ck.err(),
                    lk.err()
                ));
                continue;
            }
        };
        let spec = &ck.spec;
        let ends: Vec<Vec<i64>> = if spec.vars.is_empty() {
            vec![Vec::new()]
        } else {
            vec![spec.vars.iter().map(|v| v.min).collect(), spec.vars.iter().map(|v| v.max).collect()]
        };
        for vals in ends {
            launches += 1;
            match races(&sinks[k], &vals) {
                Some(false) => {}
                Some(true) => {
                    racing.push(format!("{name} {vals:?}"));
                    continue;
                }
                None => {
                    undecided.push(format!("{name} {vals:?}"));
                    continue;
                }
            }
            let lens = spec.param_lens(&vals).unwrap_or_else(|e| panic!("{name}: {e}"));
            let inputs: Vec<Vec<u8>> =
                spec.params.iter().zip(&lens).map(|(p, &n)| data(p.scalar, n, (k * 8 + p.slot) as u64)).collect();
            let outcome = launch_bytes(&c, &ck, &inputs, &vals)
                .and_then(|want| Ok((want, launch_bytes(&llvm, &lk, &inputs, &vals)?)));
            match outcome {
                Ok((want, got)) => {
                    if let Some(diff) = first_difference(spec, &want, &got) {
                        failures.push(format!("{name} {vals:?}: {diff}"));
                    }
                    compared += 1;
                }
                Err(e) => failures.push(format!("{name} {vals:?}: launch failed: {e}")),
            }
        }
    }
    eprintln!(
        "tinygrad corpus, C pair vs LLVM pair: {} kernels; {} refused by the CPU (work-group constructs); \
         {compared} of {launches} launches compared bit for bit; not compared: {} racing {racing:?}, {} undecided {undecided:?}",
        names.len(),
        refused.len(),
        racing.len(),
        undecided.len(),
    );
    assert!(failures.is_empty(), "{} corpus kernel(s) differ:\n{}", failures.len(), failures.join("\n"));
    assert!(
        refused.len() * 4 < names.len(),
        "the CPU refused {} of {} kernels: {refused:?}",
        refused.len(),
        names.len()
    );
    assert!(compared * 10 >= launches * 9, "only {compared} of {launches} launches compared");
}
