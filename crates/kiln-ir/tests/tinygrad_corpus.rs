//! kiln's bounds proof over real compiler output: the kernels tinygrad 0.14 generates for a fixed
//! list of tensor expressions (conv2d with padding and dilation, conv_transpose2d, pooling,
//! cumsum, topk, matmul, softmax, ...) on its CPU and OpenCL renderers, with its default
//! optimizer, NOOPT=1 and BEAM candidates, converted to kiln text by `tools/tinygrad_corpus.py`
//! (which also checked by brute force that each of them stays inside its buffers).
//!
//! Every one of them is correct, so the proof must never refuse one: each kernel is parsed,
//! validated and proven as `ProgramSpec::from_sink` (kiln-device) does, then checked for the
//! launch its constants (and its variables' smallest and largest values) give. The test prints how
//! many kernels and accesses were proven when built, at launch, or refused, and fails on any
//! refusal (a launch the proof refuses would run guarded: correct, but not proven).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_ir::bounds::{Bounds, LAUNCH_SLOTS};
use kiln_ir::{Arg, Op, UOp, eval_int, parse_kernel, variables};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("tinygrad")
}

/// `ProgramSpec::from_sink`'s reading of a launch index name: `(kind, axis)` with kind `g`
/// (global), `l` (local) or `i` (direct global); `core_id` is global axis 0.
fn special_axis(name: &str) -> Option<(char, usize)> {
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

fn launch_slot(name: &str) -> Option<usize> {
    special_axis(name).map(|(kind, axis)| if kind == 'l' { 3 + axis } else { axis })
}

/// One kernel's proof, as kiln-device sets it up: buffer lengths by slot and the six launch
/// sizes (global axes, then local axes; 1 where absent), all as expressions over the variables.
struct Setup {
    bounds: Bounds,
    lens: Vec<Arc<UOp>>,
    launch: [Arc<UOp>; LAUNCH_SLOTS],
    /// (name, min, max), sorted by name: the order of `vals`.
    vars: Vec<(String, i64, i64)>,
    accesses: usize,
}

fn setup(sink: &Arc<UOp>) -> Result<Setup, String> {
    let one = || UOp::index_const(1);
    let mut launch: [Arc<UOp>; LAUNCH_SLOTS] = std::array::from_fn(|_| one());
    let mut params: Vec<(usize, Arc<UOp>)> = Vec::new();
    let mut accesses = 0;
    for node in sink.toposort() {
        match node.op() {
            Op::Param => {
                let slot = node.arg_int().unwrap_or(0) as usize;
                if !params.iter().any(|(s, _)| *s == slot) {
                    params.push((slot, node.src()[0].clone()));
                }
            }
            Op::Special => {
                let name = node.arg_name().unwrap_or_default();
                let slot = launch_slot(name).ok_or_else(|| format!("unknown launch index `{name}`"))?;
                launch[slot] = node.src()[0].clone();
            }
            Op::Load | Op::Store => accesses += 1,
            _ => {}
        }
    }
    params.sort_by_key(|(s, _)| *s);
    if let Some((i, (s, _))) = params.iter().enumerate().find(|(i, (s, _))| i != s) {
        return Err(format!("buffer slots must be dense: slot {i} is missing (found {s})"));
    }
    let lens: Vec<Arc<UOp>> = params.into_iter().map(|(_, len)| len).collect();
    let vars = variables(sink)
        .iter()
        .filter_map(|v| match v.arg() {
            Arg::Var { name, min, max } => Some((name.clone(), *min, *max)),
            _ => None,
        })
        .collect();
    let bounds = Bounds::prove(sink, &lens, &launch, &launch_slot);
    Ok(Setup { bounds, lens, launch, vars, accesses })
}

/// `Bounds::check` for one choice of variable values (positional, sorted by name).
fn check_at(s: &Setup, vals: &[i64]) -> Result<(), String> {
    let lookup = |name: &str| s.vars.iter().position(|(n, _, _)| n == name).map(|k| vals[k]);
    let eval = |e: &Arc<UOp>| eval_int(e, &lookup).map_err(|e| e.to_string());
    let mut launch = [1i64; LAUNCH_SLOTS];
    for (k, e) in s.launch.iter().enumerate() {
        launch[k] = eval(e)?;
    }
    let lens = s.lens.iter().map(|l| eval(l).map(|v| v.max(0) as usize)).collect::<Result<Vec<_>, _>>()?;
    s.bounds.check(vals, &launch, &lens).map_err(|e| e.to_string())
}

#[derive(Default)]
struct Tally {
    kernels: usize,
    accesses: usize,
}

#[test]
fn tinygrad_kernels_are_never_refused() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the corpus folder crates/kiln-ir/tests/tinygrad exists")
        .map(|e| e.expect("a readable corpus entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "kiln"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .kiln files in {}", corpus_dir().display());

    let (mut built, mut launched, mut refused) = (Tally::default(), Tally::default(), Tally::default());
    let mut refused_files: Vec<String> = Vec::new();
    let mut invalid: Vec<String> = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).expect("a readable corpus file");
        let sink = match parse_kernel(&text) {
            Ok(sink) => sink,
            Err(e) => {
                invalid.push(format!("{name}: {e}"));
                continue;
            }
        };
        let s = match setup(&sink) {
            Ok(s) => s,
            Err(e) => {
                invalid.push(format!("{name}: {e}"));
                continue;
            }
        };
        let pending = s.bounds.pending_nodes().len();
        if pending == 0 {
            built.kernels += 1;
            built.accesses += s.accesses;
            continue;
        }
        // Constant shapes in practice; a variable is checked at its smallest and largest value.
        let corners: Vec<Vec<i64>> = [false, true]
            .iter()
            .map(|&hi| s.vars.iter().map(|(_, lo, max)| if hi { *max } else { *lo }).collect())
            .collect();
        match corners.iter().map(|vals| check_at(&s, vals)).find(|r| r.is_err()) {
            None => {
                launched.kernels += 1;
                launched.accesses += pending;
                built.accesses += s.accesses - pending;
            }
            Some(Err(e)) => {
                refused.kernels += 1;
                refused.accesses += pending;
                built.accesses += s.accesses - pending;
                refused_files.push(format!("{name}: {e}"));
            }
            Some(Ok(())) => unreachable!("find returns an error"),
        }
    }

    let accesses = built.accesses + launched.accesses + refused.accesses;
    eprintln!("tinygrad corpus: {} kernels, {accesses} accesses (LOAD and STORE)", files.len());
    eprintln!("  proven when built: {} kernels, {} accesses", built.kernels, built.accesses);
    eprintln!(
        "  proven at launch:  {} kernels, {} accesses left to the launch check",
        launched.kernels, launched.accesses
    );
    eprintln!(
        "  refused:           {} kernels, {} accesses left open (the check names the first)",
        refused.kernels, refused.accesses
    );
    for r in &refused_files {
        eprintln!("  refused {r}");
    }
    assert!(invalid.is_empty(), "corpus kernels kiln does not accept:\n{}", invalid.join("\n"));
    assert!(
        refused_files.is_empty(),
        "kiln's proof refused {} correct tinygrad kernels:\n{}",
        refused_files.len(),
        refused_files.join("\n")
    );
}
