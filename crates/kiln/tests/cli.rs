//! End-to-end tests of the `kiln` binary: every example kernel on real inputs against a
//! Rust reference, and a catalogue of bad inputs, each of which must exit non-zero with a
//! clear message and no panic.
//!
//! Every test gets its own temporary directory and kernel cache (`KILN_CACHE_DIR`), so
//! tests neither see each other's compiled kernels nor the user's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln::npy::{self, NpyArray};
use kiln_ir::Scalar;

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// A private scratch directory, removed when dropped.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = tempfile::Builder::new().prefix(&format!("kiln-cli-{name}-")).tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cache")).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// Writes a text file and returns its path.
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Writes an f32 `.npy` file and returns its path as a string.
    fn f32s(&self, name: &str, values: &[f32]) -> String {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bytes = npy::write(&NpyArray::from_bytes(Scalar::F32, data).unwrap()).unwrap();
        let p = self.path(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    }

    fn read_f32s(&self, name: &str) -> Vec<f32> {
        let a = npy::read(&std::fs::read(self.path(name)).unwrap()).unwrap();
        assert_eq!(a.scalar, Scalar::F32);
        a.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// Runs `kiln args...` with this scratch's kernel cache and `env`.
    fn kiln(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(KILN);
        cmd.args(args).env("KILN_CACHE_DIR", self.path("cache")).env_remove("KILN_CACHE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
fn ok(o: Output) -> String {
    assert!(o.status.success(), "kiln failed ({:?}):\n{}", o.status.code(), stderr(&o));
    stdout(&o)
}

/// Asserts a clean failure with `code` whose message contains every one of `wants`.
fn fails(o: Output, code: i32, wants: &[&str]) -> String {
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "exit status; stderr:\n{err}\nstdout:\n{}", stdout(&o));
    assert!(err.starts_with("error: ") || err.contains("\nerror: "), "no `error:` line:\n{err}");
    assert!(!err.contains("panicked"), "kiln panicked:\n{err}");
    for w in wants {
        assert!(err.contains(w), "expected `{w}` in:\n{err}");
    }
    err
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels").join(name).display().to_string()
}

/// Deterministic pseudo-random floats in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: got {g}, want {w}");
    }
}

/// The devices the example kernels run on: the CPU always, OpenCL when a device is present
/// (and required when `KILN_REQUIRE` names `opencl`).
fn devices(s: &Scratch) -> Vec<String> {
    let listing = ok(s.kiln(&["devices"], &[]));
    let mut out = vec!["CPU".to_string()];
    let cl_available =
        listing.lines().any(|l| l.split_whitespace().next() == Some("OPENCL") && l.contains(" available "));
    let required = kiln_device::required("opencl");
    assert!(cl_available || !required, "KILN_REQUIRE names opencl but `kiln devices` says:\n{listing}");
    if cl_available {
        out.push("OPENCL".into());
    }
    out
}

// ---------------------------------------------------------------- example kernels

#[test]
fn add_matches_the_reference() {
    let s = Scratch::new("add");
    let n = 1000;
    let (a, b) = (noise(n, 1), noise(n, 2));
    let (fa, fb) = (s.f32s("a.npy", &a), s.f32s("b.npy", &b));
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    for dev in devices(&s) {
        let out = format!("2={}", s.path("c.npy").display());
        let args = ["run", &example("add.kiln"), "--device", &dev, "--var", "n=1000"];
        ok(s.kiln(
            &[&args[..], &["--in", &format!("0={fa}"), "--in", &format!("1={fb}"), "--out", &out]].concat(),
            &[],
        ));
        assert_close(&s.read_f32s("c.npy"), &want, 0.0, &format!("add on {dev}"));
    }
}

#[test]
fn sum_matches_the_reference() {
    let s = Scratch::new("sum");
    let n = 4099;
    let a = noise(n, 3);
    let fa = s.f32s("a.npy", &a);
    let want = a.iter().map(|&x| x as f64).sum::<f64>() as f32;
    for dev in devices(&s) {
        let out = format!("1={}", s.path("out.npy").display());
        let var = format!("n={n}");
        ok(s.kiln(
            &["run", &example("sum.kiln"), "-d", &dev, "--var", &var, "--in", &format!("0={fa}"), "--out", &out],
            &[],
        ));
        assert_close(&s.read_f32s("out.npy"), &[want], 1e-4, &format!("sum on {dev}"));
        // Without --out the single output value is printed.
        let printed =
            ok(s.kiln(&["run", &example("sum.kiln"), "-d", &dev, "--var", &var, "--in", &format!("0={fa}")], &[]));
        assert!(printed.starts_with("slot 1: f32 x 1 ["), "{printed}");
    }
}

#[test]
fn matmul_matches_the_reference() {
    let s = Scratch::new("matmul");
    let (m, k, n) = (5usize, 7usize, 3usize);
    let (a, b) = (noise(m * k, 4), noise(k * n, 5));
    let (fa, fb) = (s.f32s("a.npy", &a), s.f32s("b.npy", &b));
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|r| a[i * k + r] * b[r * n + j]).sum();
        }
    }
    for dev in devices(&s) {
        let out = format!("2={}", s.path("c.npy").display());
        let vars = ["--var", "m=5", "--var", "k=7", "--var", "n=3"];
        let io = ["--in", &format!("0={fa}"), "--in", &format!("1={fb}"), "--out", &out];
        ok(s.kiln(&[&["run", &example("matmul.kiln"), "--device", &dev][..], &vars, &io].concat(), &[]));
        assert_close(&s.read_f32s("c.npy"), &want, 1e-5, &format!("matmul on {dev}"));
    }
}

#[test]
fn softmax_matches_the_reference() {
    let s = Scratch::new("softmax");
    let (rows, cols) = (3usize, 10usize);
    // Large logits: without subtracting the row maximum, exp() would overflow to inf.
    let x: Vec<f32> = noise(rows * cols, 6).iter().map(|v| v * 100.0).collect();
    let fx = s.f32s("x.npy", &x);
    let mut want = vec![0f32; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = row.iter().map(|v| (v - mx).exp()).sum();
        for c in 0..cols {
            want[r * cols + c] = (row[c] - mx).exp() / total;
        }
    }
    for dev in devices(&s) {
        let out = format!("1={}", s.path("y.npy").display());
        let args = ["run", &example("softmax.kiln"), "--device", &dev, "--var", "rows=3", "--var", "cols=10"];
        ok(s.kiln(&[&args[..], &["--in", &format!("0={fx}"), "--out", &out]].concat(), &[]));
        let got = s.read_f32s("y.npy");
        assert_close(&got, &want, 1e-5, &format!("softmax on {dev}"));
        for r in 0..rows {
            let total: f32 = got[r * cols..(r + 1) * cols].iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "row {r} sums to {total}");
        }
    }
}

#[test]
fn saxpy_handles_a_size_that_is_not_a_multiple_of_the_group() {
    let s = Scratch::new("saxpy");
    for n in [1usize, 64, 1000] {
        let (x, y) = (noise(n, 7), noise(n, 8));
        let (fa, fx, fy) = (s.f32s("alpha.npy", &[2.5]), s.f32s("x.npy", &x), s.f32s("y.npy", &y));
        let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| 2.5f32.mul_add(*x, *y)).collect();
        for dev in devices(&s) {
            let out = format!("2={}", s.path("y_out.npy").display());
            let var = format!("n={n}");
            let io =
                ["--in", &format!("0={fa}"), "--in", &format!("1={fx}"), "--in", &format!("2={fy}"), "--out", &out];
            ok(s.kiln(
                &[&["run", &example("saxpy_symbolic.kiln"), "--device", &dev, "--var", &var][..], &io].concat(),
                &[],
            ));
            assert_close(&s.read_f32s("y_out.npy"), &want, 1e-6, &format!("saxpy n={n} on {dev}"));
        }
    }
}

#[test]
fn slots_without_files_start_zeroed_with_a_note() {
    let s = Scratch::new("zeroed");
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4"], &[]);
    let out = ok(o.clone());
    assert_eq!(out.trim(), "slot 2: f32 x 4 [0.0, 0.0, 0.0, 0.0]");
    let err = stderr(&o);
    assert!(err.contains("note: slot 0") && err.contains("note: slot 1"), "{err}");
}

#[test]
fn compile_emits_source_spec_and_linear_order() {
    let s = Scratch::new("compile");
    let src = ok(s.kiln(&["compile", &example("add.kiln")], &[]));
    assert!(src.contains("add"), "{src}");
    let spec = ok(s.kiln(&["compile", &example("matmul.kiln"), "--emit", "spec"], &[]));
    for want in
        ["globals:     0, 1, 2", "ins:         0, 1", "outs:        2", "k in [1, 4096]", "global size: [n, m, 1]"]
    {
        assert!(spec.contains(want), "expected `{want}` in:\n{spec}");
    }
    let linear = ok(s.kiln(&["compile", &example("softmax.kiln"), "--emit=linear"], &[]));
    assert_eq!(linear.lines().filter(|l| l.contains("= RANGE")).count(), 3, "{linear}");
    assert!(linear.lines().last().is_some_and(|l| l.contains("SINK")), "{linear}");
    // --check compiles too (through the cache).
    ok(s.kiln(&["compile", &example("sum.kiln"), "--check"], &[]));
}

/// `--emit linear` looks like kernel text but is not (an accumulator comes before its loop, a
/// forward reference): the listing says so on its first line, and so does the help.
#[test]
fn the_linear_listing_says_it_is_not_kernel_text() {
    let s = Scratch::new("linear-label");
    let label = "# kiln linear order listing (not kernel text: it does not parse back)";
    for kernel in ["add.kiln", "sum.kiln", "matmul.kiln"] {
        let listing = ok(s.kiln(&["compile", &example(kernel), "--emit", "linear"], &[]));
        assert_eq!(listing.lines().next(), Some(label), "{kernel}:\n{listing}");
        let file = kernel_with(&s, kernel, &listing);
        fails(s.kiln(&["compile", &file], &[]), 1, &["cannot parse kernel"]);
    }
    let help = ok(s.kiln(&["compile", "--help"], &[]));
    assert!(help.contains("not kernel text"), "{help}");
}

#[test]
fn devices_lists_every_backend() {
    let s = Scratch::new("devices");
    let out = ok(s.kiln(&["devices"], &[]));
    assert!(out.lines().any(|l| l.starts_with("CPU") && l.contains(" available ")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("OPENCL")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("CUDA") && l.contains("unavailable")), "{out}");
    let verbose = ok(s.kiln(&["devices", "--verbose"], &[]));
    for want in ["memory: allocated", "high-water", "hits", "misses", "kernel cache:"] {
        assert!(verbose.contains(want), "expected `{want}` in:\n{verbose}");
    }
}

/// The CPU row names the instruction set and vector width; `KILN_CPU_ISA` forces an older
/// set (kernels still run) and a bad value is a clean configuration error.
#[test]
fn devices_show_the_cpu_isa_and_kiln_cpu_isa_forces_it() {
    let s = Scratch::new("isa");
    let out = ok(s.kiln(&["devices"], &[]));
    let cpu = out.lines().find(|l| l.starts_with("CPU")).unwrap_or_default();
    assert!(cpu.contains("-byte vectors") || cpu.contains("generic"), "{out}");
    let add = example("add.kiln");
    let run = ["run", add.as_str(), "--var", "n=4"];
    let forced = ok(s.kiln(&["devices"], &[("KILN_CPU_ISA", "sse2")]));
    if cfg!(target_arch = "x86_64") {
        assert!(forced.contains("SSE2 (16-byte vectors, forced by KILN_CPU_ISA)"), "{forced}");
        ok(s.kiln(&run[..], &[("KILN_CPU_ISA", "sse2")]));
    }
    fails(s.kiln(&run[..], &[("KILN_CPU_ISA", "avx9")]), 1, &["KILN_CPU_ISA=`avx9`", "native, avx512, avx2"]);
}

#[test]
fn cache_stats_and_clear_see_compiled_kernels() {
    let s = Scratch::new("cache");
    let before = ok(s.kiln(&["cache", "stats"], &[]));
    assert!(before.contains("0 kernel(s)"), "{before}");
    ok(s.kiln(&["run", &example("add.kiln"), "--var", "n=4"], &[]));
    let after = ok(s.kiln(&["cache", "stats"], &[]));
    assert!(after.contains("1 kernel(s)"), "{after}");
    let cleared = ok(s.kiln(&["cache", "clear"], &[]));
    assert!(cleared.starts_with("cleared 1 kernel(s)"), "{cleared}");
    assert!(ok(s.kiln(&["cache", "stats"], &[])).contains("0 kernel(s)"));
    let off = ok(s.kiln(&["cache", "stats"], &[("KILN_CACHE", "0")]));
    assert!(off.contains("memory only"), "{off}");
}

#[test]
fn trace_writes_a_chrome_trace() {
    let s = Scratch::new("trace");
    for dev in devices(&s) {
        let trace = s.path("trace.json");
        let _ = std::fs::remove_file(&trace);
        let args = ["run", &example("add.kiln"), "--device", &dev, "--var", "n=16"];
        let o = s.kiln(&[&args[..], &["--trace", &trace.display().to_string()]].concat(), &[]);
        let err = stderr(&o);
        ok(o);
        let text = std::fs::read_to_string(&trace).unwrap();
        assert!(text.starts_with("{\"traceEvents\":["), "{text}");
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok(), "{dev}: not JSON: {text}");
        // The CPU's queues run the timed program; OpenCL's report the device's own times.
        assert!(text.contains("\"name\":\"add\",\"cat\":\"kernel\",\"ph\":\"X\""), "{dev}: {text}");
        assert!(!err.contains("no kernel slices"), "{dev}: {err}");
    }
}

// ---------------------------------------------------------------- bad inputs

/// Writes a kernel text file and returns its path.
fn kernel_with(s: &Scratch, name: &str, text: &str) -> String {
    s.file(name, text).display().to_string()
}

#[test]
fn malformed_text_reports_line_and_column() {
    let s = Scratch::new("malformed");
    let k = kernel_with(&s, "bad.kiln", "%n = DEFINE_VAR i32 \"n\" 1 10\n%a = PARAM ptr<f32> 0 (%n\nSINK void ()\n");
    fails(s.kiln(&["run", &k, "--var", "n=1"], &[]), 1, &["bad.kiln", "line 2, column"]);
}

#[test]
fn unknown_op_is_named() {
    let s = Scratch::new("unknown-op");
    let k = kernel_with(&s, "op.kiln", "%c = CONST f32 1.0\n%x = FROB f32 (%c)\nSINK void (%x)\n");
    fails(s.kiln(&["compile", &k], &[]), 1, &["line 2", "FROB"]);
}

#[test]
fn alu_dtype_mismatch_is_reported_at_its_line() {
    let s = Scratch::new("alu");
    let text = "\
%one = CONST i32 1
%a   = PARAM ptr<f32> 0 (%one)
%z   = CONST i32 0
%p   = INDEX ptr<f32> (%a, %z)
%x   = LOAD f32 (%p)
%bad = ADD f32 (%x, %one)
%st  = STORE void (%p, %bad)
SINK void (%st)
";
    let k = kernel_with(&s, "alu.kiln", text);
    fails(s.kiln(&["run", &k], &[]), 1, &["line 6", "%bad", "different dtypes: f32 and i32"]);
}

#[test]
fn store_through_a_non_pointer_is_refused() {
    let s = Scratch::new("store");
    let text = "\
%v  = CONST f32 1.0
%st = STORE void (%v, %v)
SINK void (%st)
";
    let k = kernel_with(&s, "store.kiln", text);
    fails(s.kiln(&["run", &k], &[]), 1, &["line 2", "store through a non-pointer"]);
}

#[test]
fn variables_must_be_given_and_within_bounds() {
    let s = Scratch::new("vars");
    fails(s.kiln(&["run", &example("add.kiln")], &[]), 1, &["variable `n` has no value", "--var n="]);
    fails(s.kiln(&["run", &example("add.kiln"), "--var", "n=0"], &[]), 1, &["`n` = 0", "[1, 16777216]"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--var", "n=16777217"], &[]), 1, &["outside its bounds"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--var", "n=4", "--var", "m=2"], &[]), 1, &["no variable `m`"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--var", "n=four"], &[]), 2, &["`four` is not a 64-bit integer"]);
}

#[test]
fn bad_launch_dimensions_are_refused() {
    let s = Scratch::new("launch");
    // Global size n - 10: zero or negative for n ≤ 10.
    let text = "\
%n   = DEFINE_VAR i64 \"n\" 1 4611686018427387904
%ten = CONST i64 10
%ext = SUB i64 (%n, %ten)
%one = CONST i32 1
%a   = PARAM ptr<f32> 0 (%one)
%i   = SPECIAL i64 \"idx0\" (%ext)
%z   = CONST i32 0
%p   = INDEX ptr<f32> (%a, %z)
%v   = CAST f32 (%i)
%st  = STORE void (%p, %v)
SINK void (%st)
";
    let k = kernel_with(&s, "dims.kiln", text);
    fails(s.kiln(&["run", &k, "--var", "n=4"], &[]), 1, &["global size on axis 0 evaluated to -6"]);
    fails(s.kiln(&["run", &k, "--var", "n=10"], &[]), 1, &["evaluated to 0"]);
    // Global size n * n: overflows 64 bits for large n.
    let k2 = kernel_with(&s, "overflow.kiln", &text.replace("SUB i64 (%n, %ten)", "MUL i64 (%n, %n)"));
    fails(s.kiln(&["run", &k2, "--var", "n=4611686018427387904"], &[]), 1, &["overflow"]);
}

#[test]
fn an_impossible_buffer_is_an_out_of_memory_error() {
    let s = Scratch::new("oom");
    // 2^40 f32 elements: 4 TiB.
    let text = "\
%len = CONST i64 1099511627776
%a   = PARAM ptr<f32> 0 (%len)
%z   = CONST i32 0
%p   = INDEX ptr<f32> (%a, %z)
%c   = CONST f32 1.0
%st  = STORE void (%p, %c)
SINK void (%st)
";
    let k = kernel_with(&s, "huge.kiln", text);
    for dev in devices(&s) {
        fails(s.kiln(&["run", &k, "--device", &dev], &[]), 1, &["cannot allocate buffer 0", "out of memory on"]);
    }
}

#[test]
fn a_very_deep_kernel_does_not_overflow_the_stack() {
    let s = Scratch::new("deep");
    // A PARAM size that is a chain of 30000 additions (8 MiB of stack overflowed at 20000): walks over it recurse per level.
    let depth = 30_000;
    let mut text = String::from("%n = DEFINE_VAR i32 \"n\" 1 10\n%one = CONST i32 1\n%s0 = ADD i32 (%n, %one)\n");
    for i in 1..depth {
        text.push_str(&format!("%s{i} = ADD i32 (%s{}, %one)\n", i - 1));
    }
    text.push_str(&format!("%a = PARAM ptr<f32> 0 (%s{})\n", depth - 1));
    text.push_str("%z = CONST i32 0\n%p = INDEX ptr<f32> (%a, %z)\n%c = CONST f32 1.0\n%st = STORE void (%p, %c)\nSINK void (%st)\n");
    let k = kernel_with(&s, "deep.kiln", &text);
    assert!(ok(s.kiln(&["compile", &k, "--emit", "spec"], &[])).contains("slot 0:"));
    assert!(ok(s.kiln(&["compile", &k, "--emit", "linear"], &[])).lines().count() > depth);
    let out = ok(s.kiln(&["run", &k, "--var", "n=2"], &[]));
    assert!(out.starts_with(&format!("slot 0: f32 x {} [1.0, 0.0", depth + 2)), "{out}");
}

#[test]
fn npy_inputs_must_match_the_param() {
    let s = Scratch::new("npy");
    let good = s.f32s("good.npy", &[1.0; 8]);
    let short = s.f32s("short.npy", &[1.0; 7]);
    let ints = {
        let data = [1i32; 8].iter().flat_map(|v| v.to_le_bytes()).collect();
        let p = s.path("ints.npy");
        std::fs::write(&p, npy::write(&NpyArray::from_bytes(Scalar::I32, data).unwrap()).unwrap()).unwrap();
        p.display().to_string()
    };
    let run = |input: &str| s.kiln(&["run", &example("add.kiln"), "--var", "n=8", "--in", &format!("0={input}")], &[]);
    fails(run(&ints), 1, &["slot 0", "8 x f32", "ints.npy holds 8 x i32"]);
    fails(run(&short), 1, &["slot 0", "8 x f32", "short.npy holds 7 x f32 (shape (7,))"]);
    // Any shape with the right element count is fine.
    let square = {
        let data = [1f32; 8].iter().flat_map(|v| v.to_le_bytes()).collect();
        let p = s.path("square.npy");
        std::fs::write(&p, npy::write(&NpyArray { scalar: Scalar::F32, shape: vec![2, 4], data }).unwrap()).unwrap();
        p.display().to_string()
    };
    ok(run(&square));
    ok(run(&good));
    // Not a .npy file at all, a Fortran-order array, a missing file, a slot the kernel lacks.
    let garbage = s.file("garbage.npy", "hello").display().to_string();
    fails(run(&garbage), 1, &["garbage.npy is not a usable .npy file", "not a .npy file"]);
    let mut fortran = std::fs::read(s.path("good.npy")).unwrap();
    let at = fortran.windows(5).position(|w| w == b"False").unwrap();
    fortran.splice(at..at + 5, b"True ".iter().copied());
    std::fs::write(s.path("fortran.npy"), fortran).unwrap();
    fails(run(&s.path("fortran.npy").display().to_string()), 1, &["Fortran"]);
    fails(run(&s.path("missing.npy").display().to_string()), 1, &["cannot read input file", "missing.npy"]);
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=8", "--in", &format!("7={good}")], &[]);
    fails(o, 1, &["slot 7", "its slots are 0, 1, 2"]);
}

#[test]
fn usage_errors_exit_with_status_2() {
    let s = Scratch::new("usage");
    fails(s.kiln(&[], &[]), 2, &["missing command", "run, run-plan, bench"]);
    fails(s.kiln(&["frobnicate"], &[]), 2, &["unrecognized subcommand 'frobnicate'"]);
    fails(s.kiln(&["run"], &[]), 2, &["required arguments were not provided", "<FILE>"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--bogus"], &[]), 2, &["unexpected argument '--bogus'"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--var"], &[]), 2, &["a value is required for '--var"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--in", "x=a.npy"], &[]), 2, &["slot `x`"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--out", "2"], &[]), 2, &["expected SLOT=FILE.npy"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--device", "TPU"], &[]), 2, &["unknown device `TPU`"]);
    fails(
        s.kiln(&["compile", &example("add.kiln"), "--emit", "asm"], &[]),
        2,
        &["invalid value 'asm' for '--emit", "possible values: source, spec, linear"],
    );
    fails(s.kiln(&["devices", "--verbose=yes"], &[]), 2, &["unexpected value 'yes' for '--verbose'"]);
    fails(s.kiln(&["cache"], &[]), 2, &["requires a subcommand", "stats, clear"]);
    fails(s.kiln(&["bench", "--only", "add"], &[]), 2, &["invalid value 'add' for '--only", "'add_f32_16m'"]);
    fails(s.kiln(&["run", "/nonexistent/k.kiln"], &[]), 1, &["cannot read kernel file", "/nonexistent/k.kiln"]);
}

/// Mesa's device-select layer complains about an unset XDG_RUNTIME_DIR on every listing
/// unless NODEVICE_SELECT is set; kiln sets it for itself when the user has not.
#[test]
fn listing_devices_prints_no_vulkan_layer_chatter() {
    let s = Scratch::new("quiet-devices");
    let mut devices = Command::new(KILN);
    devices.arg("devices").env("KILN_CACHE_DIR", s.path("cache")).env_remove("NODEVICE_SELECT");
    let out = devices.env_remove("XDG_RUNTIME_DIR").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("XDG_RUNTIME_DIR"), "{err}");
}

#[test]
fn typos_get_suggestions() {
    let s = Scratch::new("typos");
    fails(s.kiln(&["compil", "k.kiln"], &[]), 2, &["similar subcommands exist", "'compile'"]);
    // Swapped letters, which clap's own similarity misses.
    fails(s.kiln(&["rnu"], &[]), 2, &["a similar subcommand exists: 'run'"]);
    fails(s.kiln(&["xyzzy"], &[]), 2, &["unrecognized subcommand 'xyzzy'"]);
    fails(s.kiln(&["run", &example("add.kiln"), "--dvice", "CPU"], &[]), 2, &["a similar argument exists: '--device'"]);
    fails(s.kiln(&["compile", &example("add.kiln"), "--emit", "spek"], &[]), 2, &["a similar value exists: 'spec'"]);
}

#[test]
fn help_version_and_completions_are_generated() {
    let s = Scratch::new("help");
    let help = ok(s.kiln(&["--help"], &[]));
    for want in ["Usage: kiln [COMMAND]", "devices", "compile", "run", "bench", "cache", "completions", "kiln run"] {
        assert!(help.contains(want), "expected `{want}` in:\n{help}");
    }
    assert_eq!(ok(s.kiln(&["help"], &[])), help);
    let run_help = ok(s.kiln(&["run", "--help"], &[]));
    for want in ["Usage: kiln run [OPTIONS] <FILE>", "--var <NAME=VALUE>", "--in <SLOT=FILE.npy>", "--trace <OUT.json>"]
    {
        assert!(run_help.contains(want), "expected `{want}` in:\n{run_help}");
    }
    assert_eq!(ok(s.kiln(&["help", "run"], &[])), run_help);
    // The --device help lists the backends this build registers, from the registry.
    kiln_backends::register_all();
    let backends = kiln_device::device_names();
    assert!(
        backends.starts_with("CPU") && !backends.contains("CPU-"),
        "the ISA variants are compiler pairs: {backends}"
    );
    for command in ["run", "bench", "compile"] {
        let help = ok(s.kiln(&[command, "--help"], &[]));
        assert!(help.contains(&format!(": {backends} (NAME:n for a backend's device n)")), "{command}:\n{help}");
    }
    assert!(ok(s.kiln(&["bench", "-h"], &[])).contains("--only <NAME,...>"));
    assert!(!ok(s.kiln(&["bench", "-h"], &[])).contains("disk-hit-child"), "internal flags stay hidden");
    assert_eq!(ok(s.kiln(&["--version"], &[])), format!("kiln {}\n", env!("CARGO_PKG_VERSION")));
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(s.kiln(&["completions", shell], &[]));
        assert!(script.contains("kiln") && script.contains("trace") && script.contains("emit"), "{shell}:\n{script}");
    }
    fails(s.kiln(&["completions", "cmd.exe"], &[]), 2, &["invalid value 'cmd.exe'"]);
}

#[test]
fn a_repeated_var_is_a_usage_error_naming_it() {
    let s = Scratch::new("repeated-var");
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4", "--var", "n=8"], &[]);
    fails(o, 2, &["--var n is given 2 times (n=4, n=8)"]);
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4", "--out", "2=a.npy", "--out", "2=b.npy"], &[]);
    fails(o, 2, &["--out names slot 2 twice"]);
}

#[test]
fn unwritable_destinations_are_refused_before_the_run() {
    let s = Scratch::new("unwritable");
    // A path under a regular file can be written by nobody (not even root).
    let blocker = s.file("plain-file", "");
    let bad = blocker.join("trace.json").display().to_string();
    let good_out = s.path("c.npy");
    let out = format!("2={}", good_out.display());
    // No C compiler: a destination checked before the kernel is compiled is the only error.
    let no_cc = [("KILN_CC", "/nonexistent/cc")];
    let args = ["run", &example("add.kiln"), "--var", "n=4", "--out", &out];
    let err = fails(s.kiln(&[&args[..], &["--trace", &bad]].concat(), &no_cc), 1, &["cannot write the trace file"]);
    assert_eq!(err.matches(&bad).count(), 1, "the path is named once:\n{err}");
    assert!(!err.contains("compiler"), "checked before compiling:\n{err}");
    assert!(!good_out.exists(), "a run that did not happen leaves no output file behind");
    let bad_out = format!("2={}", blocker.join("c.npy").display());
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4", "--out", &bad_out], &no_cc);
    let err = fails(o, 1, &["cannot write output file", "plain-file/c.npy"]);
    assert!(!err.contains("compiler"), "checked before compiling:\n{err}");
    // With writable destinations, both the output and the trace are written.
    let trace = s.path("t.json");
    ok(s.kiln(&[&args[..], &["--trace", &trace.display().to_string()]].concat(), &[]));
    assert_eq!(s.read_f32s("c.npy"), [0.0; 4]);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(json["traceEvents"].as_array().is_some_and(|e| !e.is_empty()), "{json}");
}

/// Two destinations that are one file, written two ways or through a link, whether or not it
/// exists yet: a usage error before the run (one output would overwrite the other), and the
/// file is left as it was.
#[test]
fn destinations_naming_one_file_are_a_usage_error() {
    let s = Scratch::new("same-file");
    let ramp: Vec<f32> = (0..8).map(|x| x as f32).collect();
    let (in0, in1) = (format!("0={}", s.f32s("ramp.npy", &ramp)), format!("1={}", s.f32s("ones.npy", &[1.0; 8])));
    let add = example("add.kiln");
    let run = |cwd: &Path, dests: &[&str]| {
        let args = [&["run", add.as_str(), "--var", "n=8", "--in", &in0, "--in", &in1][..], dests].concat();
        let mut cmd = Command::new(KILN);
        cmd.args(args).current_dir(cwd).env("KILN_CACHE_DIR", s.path("cache")).env_remove("KILN_CACHE");
        cmd.output().unwrap()
    };
    let f = s.path("f.npy");
    std::fs::create_dir(s.path("sub")).unwrap();
    let (link, hard) = (s.path("link.npy"), s.path("hard.npy"));
    std::os::unix::fs::symlink("f.npy", &link).unwrap(); // dangling until f.npy exists
    for exists in [false, true] {
        if exists {
            std::fs::write(&f, "old").unwrap();
            std::fs::hard_link(&f, &hard).unwrap();
        }
        let mut same = vec![f.clone(), s.path("sub/../f.npy"), s.path("./f.npy"), link.clone()];
        if exists {
            same.push(hard.clone());
        }
        for other in &same {
            let (first, other) = (format!("2={}", f.display()), other.display().to_string());
            let second = format!("0={other}");
            let err = fails(run(s.0.path(), &["--out", &first, "--out", &second]), 2, &["name the same file"]);
            assert!(err.contains(&format!("--out {first} and --out {second}")), "{err}");
            fails(run(s.0.path(), &["--out", &first, "--trace", &other]), 2, &[&format!("--trace {other}")]);
            // Relative to the working directory, as typed on a command line.
            fails(run(s.0.path(), &["--out", "2=f.npy", "--out", &second]), 2, &["name the same file"]);
            assert_eq!(std::fs::read(&f).ok(), exists.then(|| b"old".to_vec()), "{other}: the file is untouched");
        }
    }
    // Distinct files, one of them a link to a third: every output is written.
    let o = run(s.0.path(), &["--out", "2=c.npy", "--out", "0=link.npy", "--trace", "t.json"]);
    ok(o);
    assert_eq!(s.read_f32s("c.npy"), ramp.iter().map(|x| x + 1.0).collect::<Vec<_>>());
    assert_eq!(s.read_f32s("f.npy"), ramp);
    // Devices are written to, not replaced: two outputs to /dev/null lose nothing.
    ok(run(s.0.path(), &["--out", "2=/dev/null", "--out", "0=/dev/null"]));
}

#[test]
fn existing_destinations_are_replaced_whatever_their_old_length() {
    let s = Scratch::new("replace");
    let (c, trace) = (s.path("c.npy"), s.path("t.json"));
    let (out, trace_arg) = (format!("2={}", c.display()), trace.display().to_string());
    let args = ["run", &example("add.kiln"), "--var", "n=4", "--out", &out, "--trace", &trace_arg];
    // Longer old contents (the new bytes are written over them, then the file is cut), the
    // same length (a kernel run again) and shorter ones all leave exactly the new output.
    for old in [vec![b'#'; 10_000], Vec::new(), b"x".to_vec()] {
        std::fs::write(&c, &old).unwrap();
        std::fs::write(&trace, &old).unwrap();
        ok(s.kiln(&args, &[]));
        assert_eq!(s.read_f32s("c.npy"), [0.0; 4]);
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
        assert!(json["traceEvents"].as_array().is_some_and(|e| !e.is_empty()), "{json}");
        let again = std::fs::read(&c).unwrap();
        ok(s.kiln(&args, &[]));
        assert_eq!(std::fs::read(&c).unwrap(), again, "a rerun rewrites the same bytes");
    }
}

// ---------------------------------------------------------------- the C toolchain

/// Writes an executable shell script.
fn script(s: &Scratch, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = s.file(name, &format!("#!/bin/sh\n{body}\n"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

/// Whether this machine's CPU device offers the LLVM pair; `KILN_REQUIRE` naming `cpu-llvm`
/// makes its absence a failure.
fn llvm_offered(s: &Scratch) -> bool {
    let listing = ok(s.kiln(&["devices"], &[]));
    let offered = listing.lines().any(|l| l.trim_start().starts_with("compilers:") && l.contains("llvm"));
    assert!(offered || !kiln_device::required("cpu-llvm"), "KILN_REQUIRE names cpu-llvm but:\n{listing}");
    offered
}

/// The LLVM pair runs kernels where libLLVM 16 opens, and is then the default unless `KILN_CC`
/// names a C compiler or `KILN_CPU_COMPILER` picks `cc`; without libLLVM (`KILN_LIBLLVM` naming
/// nothing) kiln still runs on the C pair, `kiln devices` says why the pair is missing, and
/// asking for it is a clean error.
#[test]
fn the_llvm_pair_runs_and_kiln_runs_without_libllvm() {
    let s = Scratch::new("llvm");
    let (a, b) = (s.f32s("a.npy", &[1.0, 2.0, 3.0, 4.0]), s.f32s("b.npy", &[0.5; 4]));
    let out = s.path("c.npy").display().to_string();
    let add = example("add.kiln");
    let (ia, ib, oc) = (format!("0={a}"), format!("1={b}"), format!("2={out}"));
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let args = ["run", &add, "--var", "n=4", "--in", &ia, "--in", &ib, "--out", &oc];
        s.kiln(&[&args[..], extra].concat(), env)
    };
    let no_llvm = [("KILN_LIBLLVM", "/nonexistent/libLLVM-16.so.1")];
    let listing = ok(s.kiln(&["devices"], &no_llvm));
    assert!(listing.contains("not offered: llvm: no usable libLLVM 16 was found"), "{listing}");
    assert!(listing.contains("/nonexistent/libLLVM-16.so.1"), "{listing}");
    ok(run(&[], &no_llvm));
    assert_eq!(s.read_f32s("c.npy"), [1.5, 2.5, 3.5, 4.5]);
    fails(run(&["--compiler", "llvm"], &no_llvm), 1, &["cannot offer its compiler pair `llvm`", "libLLVM 16"]);
    let default_llvm = [no_llvm[0], ("KILN_CPU_COMPILER", "llvm")];
    fails(run(&[], &default_llvm), 1, &["KILN_CPU_COMPILER=llvm, but the CPU device has no `llvm` pair", "libLLVM 16"]);
    fails(run(&[], &[("KILN_CPU_COMPILER", "gcc")]), 1, &["KILN_CPU_COMPILER=`gcc`", "`cc`", "`llvm`"]);
    if !llvm_offered(&s) {
        return;
    }
    std::fs::remove_file(s.path("c.npy")).unwrap();
    ok(run(&["--compiler", "llvm"], &[]));
    assert_eq!(s.read_f32s("c.npy"), [1.5, 2.5, 3.5, 4.5]);
    let first = |env: &[(&str, &str)]| {
        let listing = ok(s.kiln(&["devices"], env));
        let line = listing.lines().find(|l| l.trim_start().starts_with("compilers:")).map(str::to_string);
        line.unwrap_or_else(|| panic!("no compilers line:\n{listing}"))
    };
    assert!(first(&[]).contains("compilers: llvm, cc"), "llvm is the default");
    assert!(first(&[("KILN_CPU_COMPILER", "llvm")]).contains("compilers: llvm, cc"));
    assert!(first(&[("KILN_CPU_COMPILER", "cc")]).contains("compilers: cc, llvm"));
    assert!(first(&[("KILN_CC", real_cc())]).contains("compilers: cc, llvm"), "a named C compiler is the default");
    // Without any C compiler on PATH the CPU compiles with LLVM alone.
    std::fs::remove_file(s.path("c.npy")).unwrap();
    ok(run(&[], &[("PATH", "/nonexistent")]));
    assert_eq!(s.read_f32s("c.npy"), [1.5, 2.5, 3.5, 4.5]);
    let listing = ok(s.kiln(&["devices"], &[("PATH", "/nonexistent")]));
    assert!(listing.contains("compilers: llvm (default first)") && listing.contains("not offered: cc:"), "{listing}");
}

/// `KILN_CPU_COMPILER` takes every pair name `--compiler` and `compiler=` take: `cc-avx2` makes
/// that pair the default (it made the whole CPU device unavailable, issue 44), and the device
/// then describes itself as that pair compiles; a name of no pair is refused listing them all.
#[test]
fn kiln_cpu_compiler_takes_every_pair_name() {
    let s = Scratch::new("pair-env");
    let listing = ok(s.kiln(&["devices"], &[]));
    let offered: Vec<String> = listing
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("compilers: "))
        .map(|l| l.trim_end_matches(" (default first)").split(", ").map(str::to_string).collect())
        .unwrap_or_else(|| panic!("no compilers line:\n{listing}"));
    let (a, b) = (s.f32s("a.npy", &[1.0, 2.0, 3.0, 4.0]), s.f32s("b.npy", &[0.5; 4]));
    let out = s.path("c.npy").display().to_string();
    let add = example("add.kiln");
    let (ia, ib, oc) = (format!("0={a}"), format!("1={b}"), format!("2={out}"));
    for pair in &offered {
        let env = [("KILN_CPU_COMPILER", pair.as_str())];
        let listing = ok(s.kiln(&["devices"], &env));
        assert!(listing.contains(&format!("default pair {pair},")), "{pair}:\n{listing}");
        assert!(listing.contains(&format!("compilers: {pair}")), "{pair} is listed first:\n{listing}");
        if pair == "cc-avx2" {
            assert!(listing.contains("AVX2 (32-byte vectors"), "the device describes its default pair:\n{listing}");
        }
        let args = ["run", &add, "--var", "n=4", "--in", &ia, "--in", &ib, "--out", &oc];
        ok(s.kiln(&args, &env));
        assert_eq!(s.read_f32s("c.npy"), [1.5, 2.5, 3.5, 4.5], "{pair}");
    }
    assert!(offered.iter().any(|p| p == "cc-sse2") || !cfg!(target_arch = "x86_64"), "{offered:?}");
    let bad = s.kiln(&["devices"], &[("KILN_CPU_COMPILER", "cc-avx9")]);
    let listing = ok(bad);
    assert!(listing.contains("KILN_CPU_COMPILER=`cc-avx9`") && listing.contains("`cc-avx2`"), "{listing}");
}

/// The libraries the dynamic loader opened while `kiln args...` ran, from glibc's `LD_DEBUG=files`
/// log (every library, `dlopen`ed ones included), and the command's output.
fn loaded_libraries(s: &Scratch, tag: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let log = s.path(&format!("ld-{tag}"));
    let log_text = log.display().to_string();
    let env = [env, &[("LD_DEBUG", "files"), ("LD_DEBUG_OUTPUT", log_text.as_str())]].concat();
    let out = s.kiln(args, &env);
    // The loader writes LD_DEBUG_OUTPUT.<pid>, one file per process.
    let mut text = String::new();
    for entry in std::fs::read_dir(s.0.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("ld-{tag}."))) {
            text.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    (out, text)
}

/// libLLVM is opened by the LLVM pair's first compile, not when the CPU device opens: `kiln run`
/// of a kernel in the cache never loads it (issue 43: every cached run paid 40 ms and 47 MiB for
/// it), while the run that compiles it does. The loader's own log says what was loaded.
#[test]
fn a_cached_run_on_the_llvm_pair_does_not_load_libllvm() {
    let s = Scratch::new("lazy-llvm");
    if !llvm_offered(&s) {
        return;
    }
    let (a, b) = (s.f32s("a.npy", &[1.0, 2.0, 3.0, 4.0]), s.f32s("b.npy", &[0.5; 4]));
    let out = s.path("c.npy").display().to_string();
    let add = example("add.kiln");
    let (ia, ib, oc) = (format!("0={a}"), format!("1={b}"), format!("2={out}"));
    let args = ["run", &add, "--var", "n=4", "--in", &ia, "--in", &ib, "--out", &oc];
    let llvm = [("KILN_CPU_COMPILER", "llvm")];
    let (first, compiling) = loaded_libraries(&s, "compile", &args, &llvm);
    ok(first);
    assert!(compiling.contains("libLLVM-16"), "the compiling run loads libLLVM:\n{compiling}");
    std::fs::remove_file(s.path("c.npy")).unwrap();
    let (second, cached) = loaded_libraries(&s, "cached", &args, &llvm);
    ok(second);
    assert_eq!(s.read_f32s("c.npy"), [1.5, 2.5, 3.5, 4.5]);
    assert!(cached.contains("kiln"), "the loader logged the cached run:\n{cached}");
    assert!(!cached.contains("libLLVM"), "a cached run loaded libLLVM:\n{cached}");
    // `kiln devices` says the pair is offered without loading the library either.
    let (listing, listed) = loaded_libraries(&s, "devices", &["devices"], &[]);
    assert!(ok(listing).contains("compilers: llvm"));
    let cpu_only: Vec<&str> = listed.lines().filter(|l| l.contains("libLLVM-16")).collect();
    assert!(cpu_only.is_empty(), "kiln devices loaded libLLVM 16: {cpu_only:?}");
}

/// A libLLVM that is not LLVM 16 is never the `llvm` pair: Debian's LLVM 14 and 15 (where
/// installed) are refused by their soname, a library without a telling name is opened and asked
/// (`LLVMGetVersion`), and a library whose name claims 16 but is not fails its first compile with
/// the version it reports. In each refused case `kiln devices` says why and the CPU runs on its
/// C pair (issue 44: LLVM 14 was taken as the pair and every compile failed).
#[test]
fn a_libllvm_of_another_version_is_not_offered() {
    let s = Scratch::new("wrong-llvm");
    let (a, b) = (s.f32s("a.npy", &[1.0, 2.0, 3.0, 4.0]), s.f32s("b.npy", &[0.5; 4]));
    let out = s.path("c.npy").display().to_string();
    let add = example("add.kiln");
    let (ia, ib, oc) = (format!("0={a}"), format!("1={b}"), format!("2={out}"));
    let run = |env: &[(&str, &str)]| {
        let args = ["run", &add, "--var", "n=4", "--in", &ia, "--in", &ib, "--out", &oc];
        s.kiln(&args, env)
    };
    let refused = |library: &str, says: &[&str]| {
        let env = [("KILN_LIBLLVM", library)];
        let listing = ok(s.kiln(&["devices"], &env));
        let not_offered = listing.lines().find(|l| l.contains("not offered: llvm:")).unwrap_or_else(|| {
            panic!("{library} was offered as the llvm pair:\n{listing}");
        });
        for want in says {
            assert!(not_offered.contains(want), "{library}: {want:?} not in {not_offered}");
        }
        assert!(listing.contains("default pair cc"), "{listing}");
        ok(run(&env));
        assert_eq!(s.read_f32s("c.npy"), [1.5, 2.5, 3.5, 4.5], "{library}: the C pair runs");
        std::fs::remove_file(s.path("c.npy")).unwrap();
        let asked = [env[0], ("KILN_CPU_COMPILER", "llvm")];
        fails(run(&asked), 1, &["KILN_CPU_COMPILER=llvm, but the CPU device has no `llvm` pair", says[0]]);
    };
    for major in [14, 15] {
        let library = format!("/usr/lib/x86_64-linux-gnu/libLLVM-{major}.so.1");
        if Path::new(&library).exists() {
            refused(&library, &[&format!("is LLVM {major} (its soname is libLLVM-{major}.so.1), not LLVM 16")]);
        }
    }
    // Stubs reporting LLVM 15.0.7: one named for nothing, one named (and with the soname of) 16.
    let source =
        s.file("stub.c", "void LLVMGetVersion(unsigned *a, unsigned *b, unsigned *c) { *a = 15; *b = 0; *c = 7; }\n");
    let build = |name: &str, extra: &[&str]| {
        let so = s.path(name).display().to_string();
        let source = source.display().to_string();
        let status =
            Command::new(real_cc()).args(["-shared", "-fPIC", "-o", &so, &source]).args(extra).status().unwrap();
        assert!(status.success(), "building the stub {name}");
        so
    };
    let plain = build("libstub.so", &[]);
    refused(&plain, &["is LLVM 15.0.7 (its LLVMGetVersion says so), not LLVM 16"]);
    let liar = build("libLLVM-16.so.1", &["-Wl,-soname,libLLVM-16.so.1"]);
    let o = s.kiln(
        &["run", &add, "--var", "n=4", "--compiler", "llvm"],
        &[("KILN_LIBLLVM", liar.as_str()), ("KILN_CACHE", "0")],
    );
    fails(o, 1, &["is LLVM 15.0.7 (its LLVMGetVersion says so), not LLVM 16"]);
}

#[test]
fn a_missing_c_compiler_is_reported() {
    let s = Scratch::new("no-cc");
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4"], &[("KILN_CC", "/nonexistent/cc")]);
    fails(o, 1, &["compiler not available", "/nonexistent/cc"]);
}

#[test]
fn a_failing_c_compiler_is_reported_with_its_output() {
    let s = Scratch::new("bad-cc");
    // Answers `--version` (the backend identifies its compiler) and rejects every kernel.
    let cc = script(
        &s,
        "cc",
        "if [ \"$1\" = --version ]; then echo 'failing-cc 1.0'; exit 0; fi\n\
         echo 'add.c:3:5: error: something is wrong' >&2\nexit 1",
    );
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4"], &[("KILN_CC", &cc)]);
    fails(o, 1, &["cannot compile", "add.kiln", "compile failed", "something is wrong", "offending line: 3:"]);
}

#[test]
fn a_library_without_the_kernel_symbol_is_reported() {
    let s = Scratch::new("no-symbol");
    // Ignores the kernel and builds a shared library that defines something else, at the
    // output path the backend asked for (the argument after -o).
    let cc = script(
        &s,
        "cc",
        "if [ \"$1\" = --version ]; then echo 'stub-cc 1.0'; exit 0; fi\nout=''\nprev=''\nfor a in \"$@\"; do\n  if [ \"$prev\" = '-o' ]; then out=\"$a\"; fi\n  prev=\"$a\"\ndone\n\
         echo 'int kiln_unrelated_symbol = 1;' | cc -shared -fPIC -x c - -o \"$out\"",
    );
    let o = s.kiln(&["run", &example("add.kiln"), "--var", "n=4"], &[("KILN_CC", &cc)]);
    fails(o, 1, &["load failed", "add"]);
}

// ---------------------------------------------------------------- the kernel cache across processes

/// A C compiler wrapper that logs every kernel it builds (not `--version` probes), then
/// runs the real compiler.
/// The system C compiler the wrapper scripts below run.
fn real_cc() -> &'static str {
    ["clang", "cc"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
        .expect("a C compiler for the test")
}

fn logging_cc(s: &Scratch) -> (String, PathBuf) {
    let log = s.path("cc.log");
    let real = real_cc();
    let cc = script(
        s,
        "logging-cc",
        &format!("if [ \"$1\" != --version ]; then echo \"$@\" >> '{}'; fi\nexec {real} \"$@\"", log.display()),
    );
    (cc, log)
}

fn compiles(log: &Path) -> usize {
    std::fs::read_to_string(log).map(|t| t.lines().count()).unwrap_or(0)
}

fn run_add(s: &Scratch, cc: &str) -> Vec<f32> {
    let (fa, fb) = (s.f32s("a.npy", &[1.0, 2.0, 3.0, 4.0]), s.f32s("b.npy", &[10.0, 20.0, 30.0, 40.0]));
    let out = format!("2={}", s.path("c.npy").display());
    let args = ["run", &example("add.kiln"), "--var", "n=4", "--in", &format!("0={fa}"), "--in", &format!("1={fb}")];
    ok(s.kiln(&[&args[..], &["--out", &out]].concat(), &[("KILN_CC", cc)]));
    s.read_f32s("c.npy")
}

#[test]
fn a_second_process_loads_the_kernel_without_the_c_compiler() {
    let s = Scratch::new("second-run");
    let (cc, log) = logging_cc(&s);
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(compiles(&log), 1, "the first run compiles once");
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(compiles(&log), 1, "the second process must load from the disk cache");
}

/// A C compiler that logs every time it is started, `--version` included.
fn counting_cc(s: &Scratch) -> (String, PathBuf) {
    let log = s.path("starts.log");
    let cc = script(s, "counting-cc", &format!("echo \"$@\" >> '{}'\nexec {} \"$@\"", log.display(), real_cc()));
    (cc, log)
}

/// The CPU row names the C compiler of its C pairs and why: `KILN_CC` when set, else
/// clang when it is on `PATH`, else `cc`. Saying so starts no compiler.
#[test]
fn devices_name_the_c_compiler_and_why() {
    let s = Scratch::new("cc-choice");
    let (cc, log) = counting_cc(&s);
    let cpu_row = |out: &str| out.lines().find(|l| l.starts_with("CPU")).unwrap_or_default().to_string();
    let out = ok(s.kiln(&["devices"], &[("KILN_CC", &cc)]));
    assert!(cpu_row(&out).contains(&format!("(KILN_CC={cc})")), "{out}");
    assert_eq!(compiles(&log), 0, "`kiln devices` starts no compiler");
    let mut unset = Command::new(KILN);
    unset.arg("devices").env("KILN_CACHE_DIR", s.path("cache")).env_remove("KILN_CC");
    let out = ok(unset.output().unwrap());
    let path = std::env::var_os("PATH").unwrap_or_default();
    let clang = std::env::split_paths(&path).any(|dir| dir.join("clang").is_file());
    let why = if clang { "clang found on PATH; KILN_CC unset" } else { "cc found on PATH, no clang; KILN_CC unset" };
    assert!(cpu_row(&out).contains(&format!("({why})")), "{out}");
}

#[test]
fn a_warm_run_starts_no_compiler_process_at_all() {
    let s = Scratch::new("warm-run");
    let (cc, log) = counting_cc(&s);
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    let cold = compiles(&log);
    assert!(cold >= 1, "the first run compiles");
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(compiles(&log), cold, "a warm run must not start the compiler, not even for --version");
}

#[test]
fn the_warm_run_bench_entry_is_verified_and_starts_no_compiler() {
    let s = Scratch::new("warm-bench");
    let (cc, log) = counting_cc(&s);
    let json = ok(s.kiln(&["bench", "--only", "warm_run_process", "--quick", "--json"], &[("KILN_CC", &cc)]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let r = &v["results"][0];
    assert_eq!(
        (r["name"].as_str(), r["verified"].as_bool(), r["unit"].as_str()),
        (Some("warm_run_process"), Some(true), Some("ms")),
        "{json}"
    );
    assert!(
        r["median"].as_f64().is_some_and(|m| m > 0.0) && r["baseline_median"].as_f64().is_some_and(|m| m > 0.0),
        "{json}"
    );
    assert_eq!(compiles(&log), 1, "only the warm-up run starts the compiler, once");
}

/// `kiln bench --quick` completes on every device present here (the CPU, PoCL's `OPENCL:0`,
/// lavapipe's `WEBGPU:0`; `KILN_REQUIRE` makes a missing one a failure): every entry of a whole
/// run is in the report, each row verified or skipped with a reason, and only for a reason that
/// means "cannot run on this device" (a limit of it, its memory, an entry shaped for other
/// devices). `kiln bench --device WEBGPU:0` stopped at its first entry whose buffers exceed the
/// adapter's storage binding limit (issue 43), losing every figure.
#[test]
fn a_quick_bench_completes_on_every_device_with_each_entry_verified_or_skipped() {
    let s = Scratch::new("bench-devices");
    let listing = ok(s.kiln(&["devices"], &[]));
    let available = |backend: &str| listing.lines().any(|l| l.starts_with(backend) && l.contains(" available "));
    let mut devices = vec!["CPU"];
    for (backend, device, require) in [("OPENCL", "OPENCL:0", "opencl"), ("WEBGPU", "WEBGPU:0", "webgpu")] {
        if available(backend) {
            devices.push(device);
        } else {
            assert!(!kiln_device::required(require), "KILN_REQUIRE names {require} but:\n{listing}");
        }
    }
    let cannot_run = ["beyond a limit of", "out of memory", "shaped for GPUs"];
    for device in devices {
        let json = ok(s.kiln(&["bench", "--device", device, "--quick", "--json"], &[]));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let rows = v["results"].as_array().unwrap_or_else(|| panic!("{device}: no results:\n{json}"));
        for entry in kiln::bench::ENTRIES.iter().filter(|e| **e != "allreduce_mpi") {
            let row_of = |r: &&serde_json::Value| {
                let name = r["name"].as_str().unwrap_or_default();
                name == *entry || name.starts_with(&format!("{entry}/"))
            };
            assert!(rows.iter().any(|r| row_of(&r)), "{device}: {entry} is not in the report:\n{json}");
        }
        for r in rows {
            match (r["verified"].as_bool(), r["skipped"].as_str()) {
                (Some(true), None) => assert!(r["median"].as_f64().is_some(), "{device}: {r}"),
                (Some(false), Some(why)) => {
                    assert!(cannot_run.iter().any(|c| why.contains(c)), "{device}: {} skipped for {why}", r["name"])
                }
                _ => panic!("{device}: a row neither verified nor skipped with a reason: {r}"),
            }
        }
        let skipped: Vec<&str> =
            rows.iter().filter(|r| !r["skipped"].is_null()).filter_map(|r| r["name"].as_str()).collect();
        if device == "CPU" {
            assert_eq!(skipped, ["matmul_f32_4096"], "the CPU runs every other entry");
        }
    }
}

/// The bandwidth limit is verified like every entry, and the add names which of its variants
/// (STREAM copy or add, plain or non-temporal stores) it was measured against.
#[test]
fn the_bandwidth_limit_is_verified_and_named_as_the_adds_baseline() {
    let s = Scratch::new("bandwidth-bench");
    let json = ok(s.kiln(&["bench", "--only", "bandwidth_limit,add_f32_16m", "--quick", "--json"], &[]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let (limit, add) = (&v["results"][0], &v["results"][1]);
    assert_eq!((limit["name"].as_str(), add["name"].as_str()), (Some("bandwidth_limit"), Some("add_f32_16m")));
    for r in [limit, add] {
        assert_eq!((r["verified"].as_bool(), r["unit"].as_str()), (Some(true), Some("GB/s")), "{json}");
        assert!(r["median"].as_f64().is_some_and(|m| m > 0.0), "{json}");
    }
    let named = add["baseline"].as_str().unwrap_or_default();
    assert!(named.starts_with("bandwidth_limit: STREAM ") && named.contains(" stores, "), "{json}");
}

#[test]
fn a_cache_of_garbage_still_gives_correct_results() {
    let s = Scratch::new("garbage-cache");
    let (cc, log) = logging_cc(&s);
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    // Overwrite every file under the cache directory with garbage (same length and shorter).
    let mut stack = vec![s.path("cache")];
    let mut overwritten = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let len = std::fs::metadata(&path).unwrap().len() as usize;
                let junk: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
                std::fs::write(&path, &junk[..len.saturating_sub(overwritten % 2 * 9)]).unwrap();
                overwritten += 1;
            }
        }
    }
    assert!(overwritten > 0, "the first run left no cache file to corrupt");
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(compiles(&log), 2, "the corrupt entry is rejected and the kernel rebuilt");
    // The rebuilt entry is valid again: a third process loads it without compiling.
    assert_eq!(run_add(&s, &cc), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(compiles(&log), 2);
}

/// Issue 9's first out-of-bounds kernel: the buffer holds 4 elements, the store runs over
/// `idx0 < n`. Refused before it runs, naming the store's line; in bounds it runs.
#[test]
fn an_unproven_access_is_refused_or_guarded_at_its_line() {
    let s = Scratch::new("oob");
    let text = "\
%n    = DEFINE_VAR i32 \"n\" 1 100
%four = CONST i32 4
%a    = PARAM ptr<f32> 0 (%four)
%i    = SPECIAL i32 \"idx0\" (%n)
%one  = CONST f32 1.0
%p    = INDEX ptr<f32> (%a, %i)
%st   = STORE void (%p, %one)
SINK void (%st)
";
    let k = kernel_with(&s, "oob.kiln", text);
    for dev in devices(&s) {
        fails(
            s.kiln(&["run", &k, "--device", &dev, "--var", "n=64"], &[("KILN_BOUNDS", "refuse")]),
            1,
            &["%st (line 7)", "not proven in bounds", "elements 0..=63 of buffer 0, which holds 4"],
        );
        // Under the default guard the launch runs guarded and fails naming an element it tried.
        let err = fails(
            s.kiln(&["run", &k, "--device", &dev, "--var", "n=64"], &[]),
            1,
            &["%st (line 7)", "left its buffer", "STORE tried to access element", "of buffer 0, which holds 4"],
        );
        assert!(!err.contains("refused"), "{dev}: {err}");
        fails(
            s.kiln(&["run", &k, "--device", &dev, "--var", "n=4"], &[("KILN_BOUNDS", "sometimes")]),
            1,
            &["KILN_BOUNDS=sometimes is not a bounds policy; use `guard` or `refuse`"],
        );
        let out = ok(s.kiln(&["run", &k, "--device", &dev, "--var", "n=4"], &[]));
        assert!(out.contains("[1.0, 1.0, 1.0, 1.0]"), "{dev}: {out}");
    }
}

/// `--target cuda:sm_XY` compiles without a GPU: PTX to stdout, a cubin only to `-o FILE`;
/// a PTX needs no ptxas (a broken `KILN_PTXAS` fails only the cubin), and a bad
/// `KILN_NVRTC` or architecture is a clean error. Skipped when NVRTC is absent.
#[test]
fn cuda_targets_compile_offline() {
    let s = Scratch::new("cuda");
    let add = example("add.kiln");
    let probe = s.kiln(&["compile", &add, "--target", "cuda:sm_90", "--emit", "ptx"], &[]);
    let why = stderr(&probe);
    if !probe.status.success()
        && ["compiler not available", "built without", "invalid value"].iter().any(|w| why.contains(w))
    {
        println!("skipped: {why}");
        return;
    }
    let ptx = ok(probe);
    assert!(ptx.contains(".target sm_90") && ptx.contains(".entry add("), "{ptx}");
    let no_ptxas = [("KILN_PTXAS", "/bin/false")];
    let ptx = ok(s.kiln(&["compile", &add, "--target", "cuda:sm_90", "--emit", "ptx"], &no_ptxas));
    assert!(ptx.contains(".entry add("), "{ptx}");
    fails(
        s.kiln(&["compile", &add, "--target", "cuda:sm_90", "--emit", "cubin", "-o", "x"], &no_ptxas),
        1,
        &["KILN_PTXAS"],
    );
    let cubin = s.path("add.cubin");
    ok(s.kiln(
        &["compile", &add, "--target", "cuda:sm_90", "--emit", "cubin", "-o", &cubin.display().to_string()],
        &[],
    ));
    assert!(std::fs::read(&cubin).unwrap().starts_with(b"\x7fELF"));
    fails(s.kiln(&["compile", &add, "--target", "cuda:sm_90", "--emit", "cubin"], &[]), 2, &["-o FILE"]);
    fails(s.kiln(&["compile", &add, "--emit", "ptx"], &[]), 2, &["--target cuda:sm_XY"]);
    fails(s.kiln(&["compile", &add, "--target", "cuda:sm_9"], &[]), 2, &["sm_XY"]);
    fails(
        s.kiln(&["compile", &add, "--target", "cuda:sm_90", "--emit", "ptx"], &[("KILN_NVRTC", "/nonexistent")]),
        1,
        &["KILN_NVRTC"],
    );
}

/// The matmul entry names its baseline in the JSON: OpenBLAS where it loads (and the
/// fallback, matrixmultiply, where it does not or when asked for), verified like kiln.
#[test]
fn bench_matmul_names_its_verified_baseline() {
    use kiln::bench::openblas::{BASELINE_ENV, LIBRARY_NAMES, OpenBlas};
    let s = Scratch::new("bench-baseline");
    let baseline = |mode: &str| {
        let out = ok(s.kiln(&["bench", "--quick", "--json", "--only", "matmul_f32_1024"], &[(BASELINE_ENV, mode)]));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let entry = &v["results"][0];
        assert_eq!((entry["verified"].as_bool(), entry["baseline_median"].is_f64()), (Some(true), true), "{out}");
        entry["baseline"].as_str().unwrap_or_default().to_string()
    };
    let fallback = baseline("matrixmultiply");
    assert!(fallback.starts_with("matrixmultiply"), "{fallback}");
    let auto = baseline("auto");
    if OpenBlas::load(LIBRARY_NAMES, 1).is_ok() {
        assert!(auto.starts_with("OpenBLAS") && auto.contains("cblas_sgemm"), "{auto}");
    } else {
        assert_eq!(auto, fallback, "without OpenBLAS the baseline is matrixmultiply");
        fails(
            s.kiln(&["bench", "--only", "matmul_f32_1024"], &[(BASELINE_ENV, "openblas")]),
            1,
            &["OpenBLAS not found"],
        );
    }
    fails(
        s.kiln(&["bench", "--only", "matmul_f32_1024"], &[(BASELINE_ENV, "mkl")]),
        1,
        &["KILN_BENCH_MATMUL_BASELINE=\"mkl\"", "expected auto, openblas or matrixmultiply"],
    );
}

/// `--emit spec` says where each access is proven: issue 19's cumsum load when the kernel is
/// built (its gate bounds the index's sum), the add example's accesses when built too (the
/// launch index is below `n`, the buffers hold `n`), and an access that needs the bound
/// values at launch.
#[test]
fn the_spec_says_where_each_access_is_proven() {
    let s = Scratch::new("spec");
    let spec = ok(s.kiln(&["compile", &example("cumsum.kiln"), "--emit", "spec"], &[]));
    assert!(spec.contains("accesses:    2 (2 proven in bounds when built, 0 proven at each launch"), "{spec}");
    assert!(spec.contains("LOAD  %21 (line 34) buffer 1: proven when built"), "{spec}");
    let spec = ok(s.kiln(&["compile", &example("add.kiln"), "--emit", "spec"], &[]));
    assert!(spec.contains("accesses:    3 (3 proven in bounds when built"), "{spec}");
    let text = "\
%n    = DEFINE_VAR i32 \"n\" 1 100
%m    = DEFINE_VAR i32 \"m\" 1 100
%a    = PARAM ptr<f32> 0 (%m)
%i    = SPECIAL i32 \"idx0\" (%n)
%one  = CONST f32 1.0
%p    = INDEX ptr<f32> (%a, %i)
%st   = STORE void (%p, %one)
SINK void (%st)
";
    let k = kernel_with(&s, "n_into_m.kiln", text);
    let spec = ok(s.kiln(&["compile", &k, "--emit", "spec"], &[]));
    assert!(spec.contains("STORE %st (line 7) buffer 0: proven at launch, else guarded"), "{spec}");
}

/// `--repeat N` launches the kernel N more times after the run and prints one table row with
/// the run count, median and minimum; the outputs stay those of the first run (saxpy updates
/// y in place, so a repeated run would change them). N must be at least 1.
#[test]
fn repeat_prints_the_median_and_minimum_time() {
    let s = Scratch::new("repeat");
    let data =
        |name: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/data").join(name).display().to_string();
    let saxpy = example("saxpy_symbolic.kiln");
    let (alpha, x) = (format!("0={}", data("two1.npy")), format!("1={}", data("ramp8.npy")));
    let args = ["run", saxpy.as_str(), "--var", "n=8", "--in", &alpha, "--in", &x];
    let plain = ok(s.kiln(&args, &[]));
    assert!(plain.contains("[0.0, 2.0, 4.0"), "{plain}");
    let repeated = ok(s.kiln(&[&args[..], &["--repeat", "5"]].concat(), &[]));
    assert!(repeated.starts_with(&plain), "the outputs changed:\n{plain}\n---\n{repeated}");
    let table: Vec<&str> = repeated[plain.len()..].lines().collect();
    assert_eq!(table.len(), 2, "{repeated}");
    assert!(table[0].contains("runs") && table[0].contains("median") && table[0].contains("min"), "{repeated}");
    let row: Vec<&str> = table[1].split_whitespace().collect();
    assert_eq!(row[..3], ["saxpy_symbolic", "CPU", "5"], "{repeated}");
    assert!(table[1].ends_with(['s']), "{repeated}");
    fails(s.kiln(&[&args[..], &["--repeat", "0"]].concat(), &[]), 2, &["--repeat"]);
}
