//! Byte-level fuzzing of everything a caller hands kiln as data: kernel text, `.npy` files
//! and kernel cache entries. Every case must come back as `Ok` or a typed error: a panic
//! fails the test (each case runs under `catch_unwind`, so the failure names the input), and
//! a hang, stack overflow or absurd allocation kills the test binary.
//!
//! Deterministic (fixed seeds) and bounded by case count, so it runs in seconds in CI; the
//! kernel text fuzz takes `KILN_FUZZ_CASES` (default 4000) and `KILN_FUZZ_SEED`, like the
//! structured fuzzer of `kiln-conformance`.

mod common;
use common::Rng;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, Mutex};

use kiln::npy::{self, NpyArray};
use kiln_device::{CacheConfig, KernelCache, Program, Renderer, RuntimeFactory, Toolchain};
use kiln_ir::{DeviceSpec, Scalar, parse, validate};

/// Runs `f` on `input`; a panic becomes a failure message that shows the input.
fn no_panic<T>(what: &str, input: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what} panicked ({msg}) on:\n{input}\n")
    })
}

/// Every example kernel's text.
fn kernel_files() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("bench")] {
        let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
        paths.sort();
        files.extend(paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "kiln")));
    }
    files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect()
}

/// Extreme values for numeric fields: sizes, slots, lanes, bounds, axes.
const EXTREMES: &[&str] = &[
    "0",
    "-1",
    "1",
    "64",
    "65",
    "255",
    "256",
    "2147483647",
    "2147483648",
    "-2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-0.0",
    "nan",
    "inf",
    "0x7fffffffffffffff",
];
const DTYPES: &[&str] =
    &["f32x64", "f32x65", "i32x2", "ptr<f32x64>", "lptr<f64>", "ptr<ptr<f32>>", "bool", "u64", "void", "f16x3"];

/// One byte-level or token-level mutation of kernel text.
fn mutate(text: &str, files: &[String], rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let at = rng.below(lines.len());
    match rng.below(6) {
        // Flip a byte (kept only if the result is still UTF-8: the parser takes &str).
        0 => {
            let mut bytes = text.as_bytes().to_vec();
            let i = rng.below(bytes.len());
            bytes[i] ^= 1 << rng.below(8);
            return String::from_utf8(bytes).unwrap_or_else(|_| text.to_string());
        }
        // A line from another kernel spliced in.
        1 => {
            let other: Vec<&str> = rng.pick(files).lines().collect();
            lines.insert(at, rng.pick(&other).to_string());
        }
        // A numeric token replaced by an extreme.
        2 | 3 => {
            let mut toks: Vec<String> = lines[at].split(' ').map(str::to_string).collect();
            let numeric: Vec<usize> = (0..toks.len())
                .filter(|&t| toks[t].trim_matches(|c| "(),".contains(c)).parse::<f64>().is_ok())
                .collect();
            if numeric.is_empty() {
                return text.to_string();
            }
            let t = *rng.pick(&numeric);
            toks[t] = rng.pick(EXTREMES).to_string();
            lines[at] = toks.join(" ");
        }
        // A dtype replaced.
        4 => {
            let mut toks: Vec<String> = lines[at].split(' ').map(str::to_string).collect();
            if let Some(t) = (0..toks.len()).find(|&t| toks[t].contains("ptr<") || toks[t].starts_with('f')) {
                toks[t] = rng.pick(DTYPES).to_string();
            }
            lines[at] = toks.join(" ");
        }
        // A line removed or duplicated under a fresh name.
        _ => {
            if rng.below(2) == 0 {
                lines.remove(at);
            } else {
                let copy = lines[at].clone();
                lines.insert(at, copy);
            }
        }
    }
    lines.join("\n")
}

/// Parse, then validate, then render for the CPU: each stage may refuse, none may panic.
/// Returns whether the text rendered.
fn text_case(text: &str, renderer: &dyn Renderer) -> Result<bool, String> {
    let Ok(root) = no_panic("parse", text, || parse(text))? else { return Ok(false) };
    if no_panic("validate", text, || validate(&root))?.is_err() {
        return Ok(false);
    }
    let _ = no_panic("parse_kernel", text, || kiln_ir::parse_kernel(text))?;
    let Ok(spec) = no_panic("render", text, || renderer.render(&root, Some("fuzz")))? else { return Ok(false) };
    // The launch arithmetic at the variables' extremes, as `kiln run --var` would reach it.
    for pick in 0..3 {
        let vals: Vec<i64> = spec.vars.iter().map(|v| [v.min, v.max, v.min / 2 + v.max / 2][pick]).collect();
        no_panic("launch sizes", text, || {
            if let (Ok(dims), Ok(lens)) = (spec.launch_dims(&vals), spec.param_lens(&vals)) {
                let _ = spec.check_bounds(&vals, &dims, &lens);
            }
        })?;
    }
    Ok(true)
}

#[test]
fn mutated_kernel_text_parses_validates_and_renders_without_panicking() {
    let renderer = kiln_cpu::cpu_renderer();
    let files = kernel_files();
    let mut failures = Vec::new();
    let mut rendered = 0;
    // Every truncation of a few files.
    for f in files.iter().take(3) {
        for (cut, _) in f.char_indices() {
            match text_case(&f[..cut], &renderer) {
                Ok(ok) => rendered += ok as usize,
                Err(e) => failures.push(e),
            }
        }
    }
    let mut rng =
        Rng(std::env::var("KILN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x2545_f491_4f6c_dd1d) | 1);
    let cases: usize = std::env::var("KILN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    for _ in 0..cases {
        let mut text = rng.pick(&files).clone();
        for _ in 0..1 + rng.below(3) {
            text = mutate(&text, &files, &mut rng);
        }
        match text_case(&text, &renderer) {
            Ok(ok) => rendered += ok as usize,
            Err(e) => failures.push(e),
        }
        if failures.len() >= 5 {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rendered * 20 > cases, "only {rendered} of {cases} mutants rendered: the fuzz misses the happy path");
    let add = parse(&files[0]).unwrap();
    assert!(renderer.render(&add, Some("add")).is_ok());
}

/// A version-`major` `.npy` file with header `dict` (padded as NumPy pads it) and `data`.
fn npy_file(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let mut v = b"\x93NUMPY".to_vec();
    v.extend_from_slice(&[major, 0]);
    let len = dict.len() + 1;
    if major == 1 {
        v.extend_from_slice(&(len as u16).to_le_bytes());
    } else {
        v.extend_from_slice(&(len as u32).to_le_bytes());
    }
    v.extend_from_slice(dict.as_bytes());
    v.push(b'\n');
    v.extend_from_slice(data);
    v
}

/// Header dicts that stress the reader: odd spellings, wrong types, shapes whose product
/// overflows, nesting, duplicate and missing keys.
const DICTS: &[&str] = &[
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
    "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": [4]}",
    "{'descr': '<f4', 'fortran_order': True, 'shape': (6,)}",
    "{'descr': '>f8', 'fortran_order': False, 'shape': (6,)}",
    "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551615, 2)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 18446744073709551615)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': ((6,),)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': ()}",
    "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}",
    "{'descr': '<f4', 'shape': (6,)}",
    "{'descr': '', 'fortran_order': False, 'shape': (6,)}",
    "{'descr': '<\u{e9}', 'fortran_order': False, 'shape': (6,)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (6L,)}",
    "{",
    "",
];

/// Whatever `npy::read` accepts is self-consistent and writes back to the same array.
fn npy_case(bytes: &[u8]) -> Result<bool, String> {
    let shown = || format!("{:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(300)]));
    let Ok(array) = no_panic("npy::read", &shown(), || npy::read(bytes))? else { return Ok(false) };
    let count = array.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if count != Some(array.len()) || array.data.len() != array.len() * array.scalar.size() {
        return Err(format!("npy::read accepted an inconsistent array {:?} from {}", array.shape, shown()));
    }
    let again = npy::write(&array).and_then(|b| npy::read(&b));
    if again.as_ref() != Ok(&array) {
        return Err(format!("npy::read's array does not round-trip ({again:?}) from {}", shown()));
    }
    Ok(true)
}

#[test]
fn mutated_npy_files_are_read_or_refused_without_panicking() {
    let six_f32: Vec<u8> = (0..6u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut seeds =
        vec![npy::write(&NpyArray { scalar: Scalar::F32, shape: vec![2, 3], data: six_f32.clone() }).unwrap()];
    for dict in DICTS {
        for major in [1, 2, 3] {
            seeds.push(npy_file(major, dict, &six_f32));
        }
    }
    let mut failures = Vec::new();
    let mut read = 0;
    let mut check = |bytes: &[u8], failures: &mut Vec<String>| match npy_case(bytes) {
        Ok(ok) => read += ok as usize,
        Err(e) => failures.push(e),
    };
    for seed in &seeds {
        check(seed, &mut failures);
    }
    // Every truncation of a file, and every header length field value near the real one and
    // at the extremes.
    for cut in 0..seeds[0].len() {
        check(&seeds[0][..cut], &mut failures);
    }
    for len in [0u32, 1, 9, 10, 0x75, 0x77, 0xffff, 0x1_0000, u32::MAX] {
        for major in [1u8, 2] {
            let mut b = seeds[3].clone();
            b[6] = major;
            b[8..12].copy_from_slice(&len.to_le_bytes());
            check(&b, &mut failures);
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut b = rng.pick(&seeds).clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(b.len());
            match rng.below(4) {
                0 => b[i] ^= 1 << rng.below(8),
                1 => b[i] = *rng.pick(b"(),:'\" 0123456789L{}[]TrueFalse<>|\n\x00\xff"),
                2 => b.truncate(i),
                _ => {
                    b.remove(i);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        check(&b, &mut failures);
        if failures.len() >= 5 {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(read > 20, "only {read} mutants read: the fuzz misses the happy path");
}

/// A damaged kernel cache entry (bit flips, truncation, appended bytes, anywhere in the header
/// or the native code it holds) is refused and recompiled: the CPU runtime only ever loads
/// the bytes the compiler produced, and the fresh entry replaces the damaged one.
#[test]
fn damaged_cache_entries_are_recompiled_never_loaded() {
    let Ok(compiler) = kiln_cpu::CCompiler::detect() else { return };
    let loaded: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let seen = loaded.clone();
    let runtime: RuntimeFactory = Arc::new(move |compiled| {
        seen.lock().unwrap().push(compiled.bytes.clone());
        Ok(Arc::new(kiln_cpu::CpuProgram::load(compiled)?) as Arc<dyn Program>)
    });
    let toolchain = Toolchain::new(Arc::new(kiln_cpu::cpu_renderer()), Arc::new(compiler), runtime.into());
    let sink = parse(&kernel_files()[0]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lookup = || {
        let cache = KernelCache::new(CacheConfig::at(dir.path()));
        cache.get_or_compile(&sink, Some("add"), &DeviceSpec::new("CPU", 0), &toolchain).unwrap();
        cache.stats()
    };
    lookup();
    let entry = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "kiln-bin"))
        .expect("the compile wrote a cache entry");
    let good = std::fs::read(&entry).unwrap();
    let compiled = loaded.lock().unwrap()[0].clone();
    let hit = lookup();
    assert_eq!((hit.disk_hits, hit.misses), (1, 0), "an intact entry is a hit");
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    // Header fields first (magic, version, key, length, checksum), then the payload.
    let mut damage: Vec<Vec<u8>> = [0, 9, 20, 45, 60, 84, 85, 90, 100, 200, good.len() / 2, good.len() - 1]
        .iter()
        .map(|&i| {
            let mut b = good.clone();
            b[i] ^= 1 << rng.below(8);
            b
        })
        .collect();
    for cut in [0, 8, 83, 84, 85, good.len() / 2, good.len() - 1] {
        damage.push(good[..cut].to_vec());
    }
    damage.push([good.as_slice(), b"\0"].concat());
    for (case, bytes) in damage.iter().enumerate() {
        std::fs::write(&entry, bytes).unwrap();
        let s = lookup();
        assert_eq!(
            (s.disk_hits, s.misses, s.disk_rejected),
            (0, 1, 1),
            "case {case}: the damaged entry was not refused"
        );
        assert_eq!(std::fs::read(&entry).unwrap(), good, "case {case}: the entry was not rewritten");
    }
    assert!(loaded.lock().unwrap().iter().all(|b| *b == compiled), "damaged native code was loaded");
}

/// Kernel and variable names that C, OpenCL C or CUDA read as keywords or types (the
/// command line names a kernel after its file) still make source the compiler accepts.
#[test]
fn kernels_and_variables_named_like_keywords_types_or_each_other_compile() {
    kiln_backends::register_all();
    let add = &kernel_files()[0];
    // A C keyword of its own, GNU C's and C23's `typeof`, an OpenCL vector type, macro and
    // built-in function (the unit tests of `kernel_name` cover the rest of the kinds).
    let names = ["_Bool", "typeof", "uint8", "M_PI", "sinpi"];
    // A variable named like the C name made for another variable (`x!` at position 1).
    let shadow = "%a = DEFINE_VAR i32 \"var1_x_\" 1 16\n%b = DEFINE_VAR i32 \"x!\" 1 16\n\
                  %n = ADD i32 (%a, %b)\n%c = PARAM ptr<f32> 0 (%n)\n%i = SPECIAL i32 \"idx0\" (%n)\n\
                  %pc = INDEX ptr<f32> (%c, %i)\n%one = CONST f32 1.0\n%st = STORE void (%pc, %one)\nSINK void (%st)";
    for device in ["CPU", "OPENCL"] {
        let Ok(dev) = kiln_device::open_device(device) else { continue };
        for name in names {
            let sink = parse(&add.replace("\"n\"", &format!("\"{name}\""))).unwrap();
            if let Err(e) = dev.compile(&sink, Some(name)) {
                panic!("{device}: a kernel and variable named `{name}` did not compile: {e}");
            }
        }
        if let Err(e) = dev.compile(&parse(shadow).unwrap(), Some("shadow")) {
            panic!("{device}: variables `var1_x_` and `x!` did not compile: {e}");
        }
    }
}
