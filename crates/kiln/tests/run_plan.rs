//! `kiln run-plan` end to end: a small model recorded and saved from Rust
//! (`kiln_runtime::saved::SampleMlp`), run by the binary on every device this machine has, its
//! output against a host reference; and the errors a user meets (wrong names, shapes, dtypes, a
//! damaged file), each a clean exit with a message that names what was wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::npy::{self, NpyArray};
use kiln_ir::{DeviceSpec, Scalar};
use kiln_runtime::saved::{MlpShape, SampleMlp, SavedPlan};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(name: &str) -> Scratch {
        Scratch(tempfile::Builder::new().prefix(&format!("kiln-run-plan-{name}-")).tempdir().unwrap())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// The sample model saved on the CPU, with its shape.
    fn plan(&self) -> (PathBuf, MlpShape) {
        let device = kiln_cpu::open(&DeviceSpec::new("CPU", 0)).unwrap();
        let shape = MlpShape::default();
        let model = SampleMlp::record(&device, shape, 4).unwrap();
        let path = self.path("mlp.kplan");
        SavedPlan::save(&model.plan, &model.interface, &path).unwrap();
        (path, shape)
    }

    fn npy(&self, name: &str, scalar: Scalar, shape: &[usize], data: Vec<u8>) -> String {
        let bytes = npy::write(&NpyArray { scalar, shape: shape.to_vec(), data }).unwrap();
        let p = self.path(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    }

    fn f32s(&self, name: &str, shape: &[usize], values: &[f32]) -> String {
        self.npy(name, Scalar::F32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn kiln(&self, args: &[&str]) -> Output {
        Command::new(KILN)
            .args(args)
            .env("KILN_CACHE_DIR", self.path("cache"))
            .env_remove("KILN_CACHE")
            .env("NODEVICE_SELECT", "1")
            .output()
            .unwrap()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "kiln failed ({:?}):\n{}", o.status.code(), stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts a clean failure with `code` whose message contains every one of `wants`.
fn fails(o: Output, code: i32, wants: &[&str]) -> String {
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "exit status; stderr:\n{err}");
    assert!(err.starts_with("error: "), "no `error:` line:\n{err}");
    assert!(!err.contains("panicked"), "kiln panicked:\n{err}");
    for w in wants {
        assert!(err.contains(w), "expected `{w}` in:\n{err}");
    }
    err
}

fn x_values(rows: usize, inputs: usize) -> Vec<f32> {
    (0..rows * inputs).map(|i| ((i * 5) % 23) as f32 / 11.0 - 1.0).collect()
}

fn read_f32s(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let a = npy::read(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(a.scalar, Scalar::F32);
    (a.shape, a.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The devices `kiln devices` lists as available among `CPU`, `OPENCL` and `WEBGPU` (one that
/// `KILN_REQUIRE` names must be).
fn devices(s: &Scratch) -> Vec<String> {
    let listing = ok(s.kiln(&["devices"]));
    let mut out = vec!["CPU".to_string()];
    for (name, backend) in [("OPENCL", "opencl"), ("WEBGPU", "webgpu")] {
        let available = listing.lines().any(|l| l.split_whitespace().next() == Some(name) && l.contains(" available "));
        assert!(
            available || !kiln_device::required(backend),
            "KILN_REQUIRE names {backend}; `kiln devices` says:\n{listing}"
        );
        if available {
            out.push(format!("{name}:0"));
        } else {
            // Past the harness's capture, as kiln_device::testing::report_skip writes it.
            let line = format!("SKIPPED run-plan on {name}: `kiln devices` lists no {name} device here\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }
    out
}

#[test]
fn run_plan_matches_the_host_reference_on_every_device() {
    let s = Scratch::new("devices");
    let (plan, shape) = s.plan();
    let plan = plan.display().to_string();
    for rows in [3, 8] {
        let x = x_values(rows, shape.inputs);
        let xin = s.f32s("x.npy", &[rows, shape.inputs], &x);
        let want = shape.reference(&x);
        for device in devices(&s) {
            let out = s.path(&format!("y-{device}.npy").replace(':', "_"));
            let stdout = ok(s.kiln(&[
                "run-plan",
                &plan,
                "--in",
                &format!("x={xin}"),
                "--out",
                &format!("y={}", out.display()),
                "--device",
                &device,
            ]));
            assert!(stdout.is_empty(), "an output saved to a file is not summarized: {stdout}");
            let (got_shape, got) = read_f32s(&out);
            assert_eq!(got_shape, [rows, shape.outputs], "{device}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{device}, {rows} rows: {g} vs the host's {w}");
            }
        }
    }
}

#[test]
fn outputs_without_out_are_summarized_and_timings_go_to_stderr() {
    let s = Scratch::new("summary");
    let (plan, shape) = s.plan();
    let xin = s.f32s("x.npy", &[2, shape.inputs], &x_values(2, shape.inputs));
    let o = s.kiln(&[
        "run-plan",
        &plan.display().to_string(),
        "--in",
        &format!("x={xin}"),
        "--timings",
        "--compiler",
        "cc",
    ]);
    let err = stderr(&o);
    let stdout = ok(o);
    assert!(stdout.starts_with("y: f32 (2, 8) ["), "{stdout}");
    assert!(stdout.contains("(8 more)"), "{stdout}");
    assert!(err.contains("4 kernels, 4 nodes") && err.contains("mapped"), "{err}");
    // Not a terminal: no progress bar.
    assert!(!err.contains("compiling kernels"), "{err}");
}

/// `--profile`: one more run with every node timed, its trace written as Chrome-trace JSON and
/// its longest kernels printed.
#[test]
fn a_profiled_run_writes_its_trace_and_names_its_longest_kernels() {
    let s = Scratch::new("profile");
    let (plan, shape) = s.plan();
    let xin = s.f32s("x.npy", &[2, shape.inputs], &x_values(2, shape.inputs));
    let trace = s.path("trace.json");
    let o = s.kiln(&[
        "run-plan",
        &plan.display().to_string(),
        "--in",
        &format!("x={xin}"),
        "--profile",
        &trace.display().to_string(),
    ]);
    let err = stderr(&o);
    ok(o);
    assert!(err.contains("profiled run: 4 nodes in ") && err.contains("% ") && err.contains(" ms "), "{err}");
    let json = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 4, "one complete event per node: {json}");
}

#[test]
fn wrong_inputs_are_errors_that_name_the_input_and_what_it_takes() {
    let s = Scratch::new("inputs");
    let (plan, shape) = s.plan();
    let plan = plan.display().to_string();
    let good = s.f32s("x.npy", &[2, shape.inputs], &x_values(2, shape.inputs));
    let run = |args: &[&str]| s.kiln(&[&["run-plan", plan.as_str()], args].concat());

    fails(run(&["--in", &format!("z={good}")]), 1, &["--in z", "no input `z`", "x (f32 [batch, 16])"]);
    fails(run(&[]), 1, &["input `x` (f32 [batch, 16]) has no --in"]);
    fails(run(&["--in", &format!("x={good}"), "--out", "w=/dev/null"]), 1, &["no output `w`", "y (f32 [batch, 8])"]);
    let wide = s.f32s("wide.npy", &[2, 5], &[0.0; 10]);
    fails(run(&["--in", &format!("x={wide}")]), 1, &["input `x`", "dimension 1 is 5", "f32 [batch, 16]"]);
    let flat = s.f32s("flat.npy", &[32], &[0.0; 32]);
    fails(run(&["--in", &format!("x={flat}")]), 1, &["input `x`", "1 dimensions", "f32 [batch, 16]"]);
    let ints = s.npy("ints.npy", Scalar::I32, &[2, 16], vec![0; 128]);
    fails(run(&["--in", &format!("x={ints}")]), 1, &["input `x`", "got i32", "f32 [batch, 16]"]);
    let big = s.f32s("big.npy", &[9, 16], &[0.0; 144]);
    fails(run(&["--in", &format!("x={big}")]), 1, &["input `x`", "batch in [1, 8]"]);
    fails(run(&["--in", &format!("x={good}"), "--in", &format!("x={good}")]), 2, &["--in names `x` twice"]);
    fails(run(&["--in", &format!("x={good}"), "--var", "n=3"]), 1, &["no variable `n`", "batch"]);
    fails(run(&["--in", "x"]), 2, &["NAME=FILE.npy"]);
}

#[test]
fn a_damaged_or_missing_plan_file_is_a_clear_error() {
    let s = Scratch::new("damaged");
    let (plan, shape) = s.plan();
    let xin = s.f32s("x.npy", &[2, shape.inputs], &x_values(2, shape.inputs));
    let mut bytes = std::fs::read(&plan).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 1;
    let damaged = s.path("damaged.kplan");
    std::fs::write(&damaged, &bytes).unwrap();
    let input = format!("x={xin}");
    let run = |p: &Path| s.kiln(&["run-plan", &p.display().to_string(), "--in", &input]);
    fails(run(&damaged), 1, &["cannot load plan", "checksum of its constants", "save the plan again"]);
    std::fs::write(&damaged, &bytes[..100]).unwrap();
    fails(run(&damaged), 1, &["truncated"]);
    std::fs::write(&damaged, b"not a plan at all").unwrap();
    fails(run(&damaged), 1, &["not a kiln plan file"]);
    fails(run(&s.path("absent.kplan")), 1, &["cannot open", "absent.kplan"]);
    // The output file a failed run would have written is not left behind.
    let out = s.path("y.npy");
    std::fs::write(&damaged, &bytes).unwrap();
    let o =
        s.kiln(&["run-plan", &damaged.display().to_string(), "--in", &input, "--out", &format!("y={}", out.display())]);
    fails(o, 1, &["checksum"]);
    assert!(!out.exists());
}
