//! kiln's bounds proof over the kernels a real compiler generates.
//!
//! `tests/tinygrad/` holds the kernels tinygrad 0.14 generates for convolutions, pooling,
//! cumsum, topk, matmul, softmax and movement ops, on its CPU and OpenCL renderers, with and
//! without optimizations and across BEAM-search candidates, in kiln's text format
//! (`tools/tinygrad_corpus.py` exports them and checks each by brute force: every access is
//! in bounds). Each is set up exactly as a launch sets it up (`ProgramSpec::from_sink`), and
//! its accesses must all be proven: when the kernel is built, or else by the launch check at
//! its variables' smallest and largest values. A kernel left to its guarded form would still
//! run correctly, but tinygrad's everyday kernels must not need the guard.

use std::path::{Path, PathBuf};

use kiln_device::ProgramSpec;
use kiln_device::kiln_ir::{DeviceSpec, parse_kernel};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("tinygrad")
}

/// The launch check of `spec` at `vals` (launch sizes, lengths, bounds), as an error text.
fn check_at(spec: &ProgramSpec, vals: &[i64]) -> Result<(), String> {
    let dims = spec.launch_dims(vals).map_err(|e| e.to_string())?;
    let lens = spec.param_lens(vals).map_err(|e| e.to_string())?;
    spec.check_bounds(vals, &dims, &lens).map_err(|e| e.to_string())
}

#[test]
fn tinygrad_kernels_are_proven_in_bounds() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the corpus folder tests/tinygrad exists")
        .map(|e| e.expect("a readable corpus entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "kiln"))
        .collect();
    files.sort();
    assert!(files.len() > 200, "the corpus has only {} kernels", files.len());
    let (mut accesses, mut at_launch, mut launch_kernels) = (0, 0, 0);
    let mut failures: Vec<String> = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).expect("a readable corpus file");
        let spec = parse_kernel(&text).map_err(|e| e.to_string()).and_then(|sink| {
            ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &sink).map_err(|e| e.to_string())
        });
        let spec = match spec {
            Ok(spec) => spec,
            Err(e) => {
                failures.push(format!("{name}: not accepted: {e}"));
                continue;
            }
        };
        let proofs = spec.access_proofs();
        accesses += proofs.len();
        let pending = proofs.iter().filter(|p| p.at_launch).count();
        if pending == 0 {
            continue;
        }
        at_launch += pending;
        launch_kernels += 1;
        for hi in [false, true] {
            let vals: Vec<i64> = spec.vars.iter().map(|v| if hi { v.max } else { v.min }).collect();
            if let Err(e) = check_at(&spec, &vals) {
                failures.push(format!("{name} at {vals:?}: {e}"));
            }
        }
    }
    eprintln!(
        "tinygrad corpus: {} kernels, {accesses} accesses: {} proven when built, {at_launch} (in {launch_kernels} kernels) at launch",
        files.len(),
        accesses - at_launch
    );
    assert!(failures.is_empty(), "{} corpus kernels not proven:\n{}", failures.len(), failures.join("\n"));
}
