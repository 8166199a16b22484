//! Fuzzing of the command line: random combinations of subcommands, kernel files, `--var`,
//! `--device`, `--in`/`--out`, `--emit`, `--target` and `--only` values, well-formed and not,
//! in range and far out of it. Every case must end with an exit status (0, 1 or 2) and never
//! a panic. Runs `kiln::main` in this process (spawning a process per case would cost
//! seconds), so a panic is caught and reported with the command line that caused it.
//!
//! Deterministic (fixed seed) and bounded by case count (`KILN_FUZZ_CASES`, default 200).

mod common;
use common::Rng;

use std::ffi::OsString;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use kiln::npy::{self, NpyArray};
use kiln_ir::Scalar;

/// A kernel whose variable and buffer sizes span all of i64: `--var n=...` reaches sizes no
/// machine can allocate.
const HUGE_KERNEL: &str = "%n = DEFINE_VAR i64 \"n\" 1 9223372036854775807\n\
                           %c = PARAM ptr<f32> 0 (%n)\n\
                           %one = CONST i64 1\n\
                           %i = SPECIAL i64 \"idx0\" (%one)\n\
                           %p = INDEX ptr<f32> (%c, %i)\n\
                           %v = CONST f32 1.0\n\
                           %st = STORE void (%p, %v)\n\
                           SINK void (%st)\n";

const VAR_NAMES: &[&str] = &["n", "rows", "cols", "m", "k", "x", "", " n ", "n=1", "漢"];
const VAR_VALUES: &[&str] = &[
    "0",
    "1",
    "8",
    "-1",
    "16777216",
    "16777217",
    "2147483647",
    "4611686018427387904",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "99999999999999999999999",
    "",
    " 8",
    "0x10",
    "1e3",
    "8.0",
    "--",
    "\u{0}",
];
const DEVICES: &[&str] =
    &["CPU", "cpu:0", "CPU:1", "cpu:-1", "OPENCL", "cl:0", "OPENCL:99", "CUDA:0", "gpu:4294967296", "", ":", "TPU"];
const SLOTS: &[&str] = &["0", "1", "2", "3", "99", "-1", "18446744073709551615", "18446744073709551616", "x", ""];
const EMITS: &[&str] = &["source", "spec", "linear", "ptx", "cubin", "asm", ""];
const TARGETS: &[&str] = &["cuda:sm_90", "cuda:sm_", "cuda:sm_99999999999", "cuda", "cuda:", "opencl:0", ""];
const ONLY: &[&str] = &["add", "", ",", "add_f32_16m_", "ADD_F32_16M", "bandwidth", "漢"];

/// Runs one command line in this process; `Err` when it panicked or exited oddly.
fn kiln(args: &[String]) -> Result<i32, String> {
    let os: Vec<OsString> = args.iter().map(OsString::from).collect();
    match catch_unwind(AssertUnwindSafe(|| kiln::main(os))) {
        Ok(code @ 0..=2) => Ok(code),
        Ok(code) => Err(format!("exit status {code} for kiln {args:?}")),
        Err(_) => Err(format!("panicked for kiln {args:?}")),
    }
}

#[test]
fn random_command_lines_exit_with_a_status_never_a_panic() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::create_dir(dir.join("cache")).unwrap();
    // SAFETY: set before this binary's only test starts any thread that reads the
    // environment; the cache and compilers of every case then stay inside the scratch folder.
    unsafe {
        std::env::set_var("KILN_CACHE_DIR", dir.join("cache"));
        std::env::remove_var("KILN_CACHE");
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let file = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    };
    let kernels: Vec<String> = ["add", "sum", "softmax", "saxpy_symbolic", "matmul"]
        .iter()
        .map(|k| examples.join(format!("kernels/{k}.kiln")).display().to_string())
        .chain([
            file("huge.kiln", HUGE_KERNEL.as_bytes()),
            file("garbage.kiln", b"\xff\xfe%a = ADD\n\0"),
            file("empty.kiln", b""),
            dir.display().to_string(),
            dir.join("missing.kiln").display().to_string(),
        ])
        .collect();
    let eight = NpyArray { scalar: Scalar::F32, shape: vec![8], data: vec![0; 32] };
    let inputs: Vec<String> = vec![
        examples.join("data/ramp8.npy").display().to_string(),
        examples.join("data/two1.npy").display().to_string(),
        file("eight.npy", &npy::write(&eight).unwrap()),
        file("i32.npy", &npy::write(&NpyArray { scalar: Scalar::I32, ..eight.clone() }).unwrap()),
        file("corrupt.npy", b"\x93NUMPY\x01\x00\xff\xff{'descr'"),
        dir.display().to_string(),
        dir.join("missing.npy").display().to_string(),
    ];
    let outputs: Vec<String> =
        vec![dir.join("out.npy").display().to_string(), dir.display().to_string(), "/nonexistent/o.npy".into()];

    let cases: usize = std::env::var("KILN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let seed = std::env::var("KILN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x1234_5678_9abc_def1) | 1;
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    let mut codes = [0usize; 3];
    for _ in 0..cases {
        let mut args: Vec<String> = Vec::new();
        match rng.below(10) {
            0 => args.extend(["bench".into(), "--only".into(), rng.pick(ONLY).to_string()]),
            1 => args.extend(["devices".into(), rng.pick(&["--verbose", "-v", "-x", "--json"]).to_string()]),
            2 => args.extend(["cache".into(), rng.pick(&["stats", "clear", "", "purge"]).to_string()]),
            3..=5 => {
                // Output to a file: the in-process kiln writes stdout past the test's capture.
                let out = dir.join("compiled").display().to_string();
                args.extend(["compile".into(), rng.pick(&kernels).clone(), "-o".into(), out]);
                for _ in 0..rng.below(3) {
                    match rng.below(3) {
                        0 => args.extend(["--emit".into(), rng.pick(EMITS).to_string()]),
                        1 => args.extend(["--target".into(), rng.pick(TARGETS).to_string()]),
                        _ => args.push("--check".into()),
                    }
                }
            }
            _ => {
                args.extend(["run".into(), rng.pick(&kernels).clone()]);
                for _ in 0..rng.below(6) {
                    match rng.below(5) {
                        0 | 1 => {
                            args.extend(["--var".into(), format!("{}={}", rng.pick(VAR_NAMES), rng.pick(VAR_VALUES))])
                        }
                        2 => args.extend(["--in".into(), format!("{}={}", rng.pick(SLOTS), rng.pick(&inputs).clone())]),
                        3 => {
                            args.extend(["--out".into(), format!("{}={}", rng.pick(SLOTS), rng.pick(&outputs).clone())])
                        }
                        _ => args.extend(["--trace".into(), rng.pick(&outputs).clone()]),
                    }
                }
            }
        }
        if rng.below(3) == 0 && args[0] != "cache" {
            args.extend(["--device".into(), rng.pick(DEVICES).to_string()]);
        }
        match kiln(&args) {
            Ok(code) => codes[code as usize] += 1,
            Err(e) => failures.push(e),
        }
        if failures.len() >= 5 {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A known-good command line still works, and the fuzz reached every outcome.
    let add = kernels[0].clone();
    let good = ["run", &add, "--var", "n=8", "--in", &format!("0={}", inputs[0]), "--in", &format!("1={}", inputs[0])];
    assert_eq!(kiln(&good.map(String::from)), Ok(0));
    assert!(
        cases < 100 || codes.iter().all(|&n| n > 0),
        "exit statuses 0, 1, 2 seen {codes:?} times: the fuzz is too narrow"
    );
}
