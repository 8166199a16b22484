//! The CPU's LLVM pair against its C pair: transcendental and MAX/MIN kernels give the same
//! bits, and LLVM's objects (constant pools, libm calls) load with kiln's ELF loader. The whole
//! conformance suite runs on the pair as `cpu-llvm` (kiln-conformance). Without libLLVM 16
//! every test reports itself skipped (failing instead when `KILN_REQUIRE` names `cpu-llvm`).

use std::sync::Arc;

use kiln_conformance::host::same_bits;
use kiln_cpu::LLVM_PAIR;
use kiln_device::kiln_ir::{KernelBuilder, Scalar, Val};
use kiln_device::{Buffer, Device};

/// The CPU device (its default pair is the C compiler), or `None` after reporting `test`
/// skipped when it cannot offer the LLVM pair.
fn device(test: &str) -> Option<Arc<Device>> {
    let dev = kiln_cpu::open(&kiln_cpu::CPU).unwrap_or_else(|e| panic!("{e}"));
    let missing = dev.missing_compilers().into_iter().find(|(name, _)| name == LLVM_PAIR);
    match missing {
        None => Some(dev),
        Some((_, why)) => {
            kiln_device::testing::skip_unless_required("cpu-llvm", test, &why);
            None
        }
    }
}

/// Deterministic pseudo-random 64-bit words.
fn words(n: usize, seed: u64) -> Vec<u64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect()
}

/// `n` inputs of `s` as bytes: the special values (zeros, infinities, NaN, subnormals, the
/// edges of exp's range), values spread over the magnitudes the math functions reduce, and
/// random bit patterns, with signalling NaNs made quiet: what MAX, MIN and LOG return for a
/// signalling NaN is the implementation's choice (IEEE 754 lets `maxNum` return either the
/// other operand or a quiet NaN, and gcc's C and LLVM choose differently).
fn inputs(s: Scalar, n: usize, seed: u64) -> Vec<u8> {
    let special =
        [0.0, -0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-310, -1e-40, 88.7, -103.9, 709.9];
    let w = words(n, seed);
    let mut out = Vec::with_capacity(n * s.size());
    for (i, r) in w.iter().enumerate() {
        let spread = ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * [2.0, 20.0, 200.0, 2000.0][i % 4];
        let v = if i < special.len() { special[i] } else { spread };
        // A NaN's bits with its quiet bit (the mantissa's highest) set.
        let quiet = |bits: u64, exponent: u64, quiet_bit: u64| {
            let nan = bits & exponent == exponent && bits & (quiet_bit * 2 - 1) != 0;
            if nan { bits | quiet_bit } else { bits }
        };
        match s {
            Scalar::F32 if i % 3 == 2 => {
                out.extend_from_slice(&(quiet(*r as u32 as u64, 0x7f80_0000, 1 << 22) as u32).to_le_bytes())
            }
            Scalar::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            Scalar::F64 if i % 3 == 2 => out.extend_from_slice(&quiet(*r, 0x7ff0 << 48, 1 << 51).to_le_bytes()),
            Scalar::F64 => out.extend_from_slice(&v.to_le_bytes()),
            Scalar::F16 => out.extend_from_slice(&(quiet(*r as u16 as u64, 0x7c00, 1 << 9) as u16).to_le_bytes()),
            _ => out.extend_from_slice(&(quiet(*r as u16 as u64, 0x7f80, 1 << 6) as u16).to_le_bytes()),
        }
    }
    out
}

/// Whether the math kernel `op` reads a second operand.
fn binary(op: &str) -> bool {
    matches!(op, "max" | "min" | "pow" | "mulacc")
}

/// `y = op(x)` (or `op(x, z)`) on `w`-lane vectors of `s`, over `n` elements.
fn math_kernel(s: Scalar, w: u8, n: i64, op: &str) -> Arc<kiln_device::kiln_ir::UOp> {
    let mut k = KernelBuilder::new();
    let (x, y) = (k.param(0, s, n), k.param(1, s, n));
    let i = k.global(0, n / i64::from(w));
    let at = &i * i64::from(w);
    let a = x.at_vec(&at, w).load();
    let b = if binary(op) { k.param(2, s, n).at_vec(&at, w).load() } else { a.clone() };
    let r = match op {
        "exp" => a.exp(),
        "exp2" => a.exp2(),
        "log" => a.log(),
        "log2" => a.log2(),
        "sin" => a.sin(),
        "cos" => a.cos(),
        "sqrt" => a.sqrt(),
        "max" => a.max(&b),
        "min" => a.min(&b),
        "pow" => a.pow(&b),
        _ => a.mul_acc(&b, &a),
    };
    k.store(&y.at_vec(&at, w), &r);
    k.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// The transcendental and MAX/MIN kernels give the C pair's bits exactly (any NaN for a NaN:
/// which NaN an operation returns is not specified): libm where it calls libm, its vector math
/// on f32/f64 vectors (every width, padded ones and those wider than a register included), its
/// `maxps` forms, f16 through f32. With gcc's C pair too.
#[test]
fn math_matches_the_c_pair_bit_for_bit() {
    let Some(dev) = device("math_matches_the_c_pair_bit_for_bit") else { return };
    let n = 96 * 32;
    let ops = ["exp", "exp2", "log", "log2", "sin", "cos", "sqrt", "max", "min", "pow", "mulacc"];
    let cases: [(Scalar, &[u8]); 4] = [
        (Scalar::F32, &[1, 2, 3, 4, 8, 16, 32]),
        (Scalar::F64, &[1, 2, 3, 4, 8]),
        (Scalar::F16, &[1, 4]),
        (Scalar::BF16, &[8]),
    ];
    let mut bad = Vec::new();
    for (s, widths) in cases {
        let (x, z) = (inputs(s, n, 1), inputs(s, n, 2));
        for &w in widths {
            for op in ops {
                let sink = math_kernel(s, w, n as i64, op);
                let name = format!("m_{op}_{}x{w}", s.name());
                let run = |pair: &str| {
                    let kernel = dev.compile_with(pair, &sink, Some(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let data: &[&Vec<u8>] = if binary(op) { &[&x, &x, &z] } else { &[&x, &x] };
                    let bufs: Vec<Buffer> = data
                        .iter()
                        .map(|bytes| {
                            let b = dev.buffer(s, n).unwrap_or_else(|e| panic!("{e}"));
                            b.copyin(bytes).unwrap_or_else(|e| panic!("{e}"));
                            b
                        })
                        .collect();
                    let views: Vec<&Buffer> = bufs.iter().collect();
                    kernel.launch(&views, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let mut out = vec![0u8; n * s.size()];
                    bufs[1].copyout(&mut out).unwrap_or_else(|e| panic!("{e}"));
                    out
                };
                let (want, got) = (run(kiln_cpu::CC_PAIR), run(LLVM_PAIR));
                let lane = |b: &[u8], e: usize| b[e * s.size()..][..s.size()].to_vec();
                if let Some(e) = (0..n).find(|&e| !same_bits(&lane(&want, e), &lane(&got, e), s)) {
                    bad.push(format!("{name}: element {e}: C {:02x?}, LLVM {:02x?}", lane(&want, e), lane(&got, e)));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} kernel(s) differ:\n{}", bad.len(), bad.join("\n"));
}

/// Float MAX and MIN pick by one rule on both pairs, for scalars and every vector width: the
/// first operand where it is greater (less for MIN) or the second is NaN, else the second (so
/// the second of two equal zeros). kiln-ir lifts a tile's MAX into vectors on that promise.
#[test]
fn max_and_min_pick_by_one_rule_in_scalars_and_vectors() {
    let Some(dev) = device("max_and_min_pick_by_one_rule_in_scalars_and_vectors") else { return };
    let special = [0.0, -0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    let n = 240; // every pair of specials, repeated: a multiple of every width below
    let pairs: Vec<(f64, f64)> = (0..n).map(|i| (special[i % 7], special[(i / 7) % 7])).collect();
    let mut bad = Vec::new();
    for s in [Scalar::F32, Scalar::F64] {
        let bytes = |v: &mut dyn Iterator<Item = f64>| -> Vec<u8> {
            v.flat_map(|x| if s == Scalar::F32 { (x as f32).to_le_bytes().to_vec() } else { x.to_le_bytes().to_vec() })
                .collect()
        };
        let (x, z) = (bytes(&mut pairs.iter().map(|p| p.0)), bytes(&mut pairs.iter().map(|p| p.1)));
        for op in ["max", "min"] {
            let want = bytes(&mut pairs.iter().map(|&(a, b)| {
                let first = if op == "max" { a > b } else { a < b };
                if first || b.is_nan() { a } else { b }
            }));
            for w in [1u8, 3, 4, 8, 16] {
                for pair in [kiln_cpu::CC_PAIR, LLVM_PAIR] {
                    let name = format!("pick_{op}_{}x{w}", s.name());
                    let kernel = dev
                        .compile_with(pair, &math_kernel(s, w, n as i64, op), Some(&name))
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    let bufs: Vec<Buffer> = [&x, &x, &z]
                        .iter()
                        .map(|data| {
                            let b = dev.buffer(s, n).unwrap_or_else(|e| panic!("{e}"));
                            b.copyin(data).unwrap_or_else(|e| panic!("{e}"));
                            b
                        })
                        .collect();
                    kernel.launch(&bufs.iter().collect::<Vec<_>>(), &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let mut got = vec![0u8; n * s.size()];
                    bufs[1].copyout(&mut got).unwrap_or_else(|e| panic!("{e}"));
                    let lane = |b: &[u8], e: usize| b[e * s.size()..][..s.size()].to_vec();
                    // bit for bit: a NaN result is the first operand's NaN, so even the NaN's bits
                    if let Some(e) = (0..n).find(|&e| lane(&want, e) != lane(&got, e)) {
                        bad.push(format!(
                            "{pair} {name}: {op}{:?}: want {:02x?}, got {:02x?}",
                            pairs[e],
                            lane(&want, e),
                            lane(&got, e)
                        ));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} kernel(s) pick otherwise:\n{}", bad.len(), bad.join("\n"));
}

/// `out[i] = lo < x[i] && x[i] < hi` over `n` values of `t`, the two compares in the order
/// given (`swapped`: the upper bound first).
fn bounds_test_kernel(t: Scalar, n: usize, lo: &str, hi: &str, swapped: bool) -> Arc<kiln_device::kiln_ir::UOp> {
    let (a, b) = if swapped { ("%8", "%7") } else { ("%7", "%8") };
    let t = t.name();
    let text = format!(
        "%0 = CONST i32 {n}\n%1 = RANGE i32 0 (%0)\n%2 = PARAM ptr<{t}> 0 (%0)\n%3 = INDEX ptr<{t}> (%2, %1)\n\
         %4 = LOAD {t} (%3)\n%5 = CONST {t} {lo}\n%6 = CONST {t} {hi}\n%7 = CMPLT bool (%5, %4)\n\
         %8 = CMPLT bool (%4, %6)\n%9 = AND bool ({a}, {b})\n%10 = PARAM ptr<i32> 1 (%0)\n\
         %11 = INDEX ptr<i32> (%10, %1)\n%12 = CONST i32 1\n%13 = CONST i32 0\n%14 = WHERE i32 (%9, %12, %13)\n\
         %15 = STORE void (%11, %14)\n%16 = END void (%1, %15)\nSINK void (%16)\n"
    );
    kiln_device::kiln_ir::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// A two-sided bounds test of one integer, `lo < x && x < hi` (a padded image's gate), is one
/// unsigned compare in the LLVM pair's IR (as two, LLVM made them a switch, which its loop
/// vectorizer refuses), with the same truth as the C pair's two compares for every `x`: the
/// bounds' neighbours, the type's extremes, either order of the compares, signed and unsigned
/// types, bounds across the whole range and an empty range.
#[test]
fn two_sided_bounds_tests_are_one_unsigned_compare_with_the_same_truth() {
    let Some(dev) = device("two_sided_bounds_tests_are_one_unsigned_compare_with_the_same_truth") else { return };
    let cases: [(Scalar, i128, i128); 7] = [
        (Scalar::I32, 0, 57),
        (Scalar::I32, -3, 4),
        (Scalar::I32, i32::MIN as i128, i32::MAX as i128),
        (Scalar::I32, 5, 6),
        (Scalar::I64, -(1 << 40), 1 << 40),
        (Scalar::U32, 0, u32::MAX as i128),
        (Scalar::U32, 7, 300),
    ];
    let mut bad = Vec::new();
    for (t, lo, hi) in cases {
        let (min, max) = match t {
            Scalar::I32 => (i32::MIN as i128, i32::MAX as i128),
            Scalar::I64 => (i64::MIN as i128, i64::MAX as i128),
            _ => (0, u32::MAX as i128),
        };
        let mut xs: Vec<i128> = [lo - 1, lo, lo + 1, lo + 2, hi - 2, hi - 1, hi, hi + 1, min, min + 1, max - 1, max, 0]
            .into_iter()
            .filter(|x| (min..=max).contains(x))
            .collect();
        xs.resize(16, 0);
        let bytes: Vec<u8> = xs
            .iter()
            .flat_map(|&x| {
                if t == Scalar::I64 { (x as i64).to_le_bytes().to_vec() } else { (x as u32).to_le_bytes().to_vec() }
            })
            .collect();
        let want: Vec<i32> = xs.iter().map(|&x| i32::from(lo < x && x < hi)).collect();
        for swapped in [false, true] {
            let kernel = bounds_test_kernel(t, xs.len(), &lo.to_string(), &hi.to_string(), swapped);
            let r = kiln_cpu::llvm::LlvmRenderer::for_isa(kiln_cpu::IsaTarget::native().isa);
            let src = kiln_device::Renderer::render(&r, &kernel, Some("bounds")).unwrap_or_else(|e| panic!("{e}")).src;
            if src.contains("icmp ult") != (lo + 1 < hi) {
                bad.push(format!(
                    "{} {lo} < x < {hi}: one unsigned compare only where the range is not empty:\n{src}",
                    t.name()
                ));
            }
            for pair in [kiln_cpu::CC_PAIR, LLVM_PAIR] {
                let compiled =
                    dev.compile_with(pair, &kernel, Some("bounds")).unwrap_or_else(|e| panic!("{pair}: {e}"));
                let x = dev.buffer(t, xs.len()).unwrap_or_else(|e| panic!("{e}"));
                x.copyin(&bytes).unwrap_or_else(|e| panic!("{e}"));
                let out = Buffer::from_slice(dev.allocator(), &vec![-1i32; xs.len()]).unwrap_or_else(|e| panic!("{e}"));
                compiled.launch(&[&x, &out], &[]).unwrap_or_else(|e| panic!("{pair}: {e}"));
                let got = out.to_vec::<i32>().unwrap_or_else(|e| panic!("{e}"));
                if got != want {
                    bad.push(format!(
                        "{pair} {} {lo} < x < {hi} (swapped {swapped}) on {xs:?}: {got:?}, want {want:?}",
                        t.name()
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A register tile of `rows` vectors of 16 f32 lanes over a 3-step reduction (a convolution's
/// taps of one row): `out[j] = Σ_t a[t] · b[t·rows + j]`, `a[t]` a vector, `b[..]` broadcast.
fn tile_kernel(rows: usize) -> Arc<kiln_device::kiln_ir::UOp> {
    let vector = kiln_device::kiln_ir::DType::Vector(Scalar::F32, 16);
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, 3 * 16);
    let b = k.param(1, Scalar::F32, 3 * rows as i64);
    let out = k.param(2, Scalar::F32, 16 * rows as i64);
    let t = k.range(3);
    let lanes = a.at_vec(&(&t * 16), 16).load();
    for j in 0..rows {
        let acc = k.acc(&Val::constant(vector, 0.0), &[&t]);
        let pixel = b.at(&(&t * rows as i64 + j as i64)).load().broadcast(16);
        let total = acc.update(&lanes.mul_acc(&pixel, &acc.get()));
        k.store(&out.at_vec(&Val::int(16 * j as i64), 16), &total);
    }
    k.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// A loop whose body holds a register tile with accumulators in three quarters of the vector
/// registers or more (13 rows of two AVX-512 vectors, 24 of 32) is marked not to be unrolled:
/// unrolled, LLVM kept pixel broadcasts live across taps and the tile spilled. A smaller tile's
/// loop is not marked; both give the C pair's bits.
#[test]
fn loops_of_register_tiles_that_fill_the_registers_are_not_unrolled() {
    let Some(dev) = device("loops_of_register_tiles_that_fill_the_registers_are_not_unrolled") else { return };
    let isa = kiln_cpu::IsaTarget::native().isa;
    let registers = if isa.vector_bytes().unwrap_or(16) >= 64 { 32 } else { 16 };
    for rows in [8usize, 26] {
        let kernel = tile_kernel(rows);
        let r = kiln_cpu::llvm::LlvmRenderer::for_isa(isa);
        let src = kiln_device::Renderer::render(&r, &kernel, Some("tile")).unwrap_or_else(|e| panic!("{e}")).src;
        let marked = src.contains("llvm.loop.unroll.disable");
        assert_eq!(marked, rows * 4 >= registers * 3, "{rows} rows, {registers} registers:\n{src}");
        let inputs = [inputs(Scalar::F32, 48, 7), inputs(Scalar::F32, 3 * rows, 8)];
        let mut outs = Vec::new();
        for pair in [kiln_cpu::CC_PAIR, LLVM_PAIR] {
            let compiled = dev.compile_with(pair, &kernel, Some("tile")).unwrap_or_else(|e| panic!("{pair}: {e}"));
            let bufs: Vec<Buffer> = [&inputs[0][..], &inputs[1][..], &vec![0u8; 64 * rows][..]]
                .iter()
                .map(|data| {
                    let b = dev.buffer(Scalar::F32, data.len() / 4).unwrap_or_else(|e| panic!("{e}"));
                    b.copyin(data).unwrap_or_else(|e| panic!("{e}"));
                    b
                })
                .collect();
            compiled.launch(&bufs.iter().collect::<Vec<_>>(), &[]).unwrap_or_else(|e| panic!("{pair}: {e}"));
            outs.push(bufs[2].to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")));
        }
        assert!(outs[0].iter().zip(&outs[1]).all(|(x, y)| x.to_bits() == y.to_bits()), "{rows} rows: the pairs differ");
    }
}

/// LLVM's objects (constant pools in `.rodata.cst*` sections, libm calls through PLT32
/// relocations) load with kiln's ELF loader.
#[test]
fn llvm_objects_with_constant_pools_and_libm_calls_load() {
    let Some(dev) = device("llvm_objects_with_constant_pools_and_libm_calls_load") else { return };
    for (name, op, w, needle) in [("pools", "exp", 8, &b".rodata.cst"[..]), ("libm", "sin", 1, &b"sinf"[..])] {
        let kernel = dev
            .compile_with(LLVM_PAIR, &math_kernel(Scalar::F32, w, 64, op), Some(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = &kernel.compiled().unwrap_or_else(|| panic!("{name}: no compiled form")).bytes;
        assert!(bytes.windows(needle.len()).any(|w| w == needle), "{name}: the object has no {needle:?}");
    }
}

/// `y[i] = x[i] * 2 + 1` over `n` f32 (`y` written, never read), or in place on `x`.
fn scale_kernel(n: i64, in_place: bool) -> Arc<kiln_device::kiln_ir::UOp> {
    let mut k = KernelBuilder::new();
    let x = k.param(0, Scalar::F32, n);
    let y = if in_place { x.clone() } else { k.param(1, Scalar::F32, n) };
    let i = k.global(0, n / 16);
    let at = &i * 16;
    let v = x.at_vec(&at, 16).load();
    k.store(&y.at_vec(&at, 16), &(&v * 2.0 + 1.0));
    k.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// A buffer the kernel writes and never reads is streamed when the launch's view of it is large
/// (non-temporal stores where aligned, plain ones elsewhere), and holds what plain stores write,
/// on aligned and unaligned views alike; a buffer the kernel also reads is never streamed.
#[test]
fn large_write_only_outputs_are_streamed_and_hold_the_same_values() {
    let Some(dev) = device("large_write_only_outputs_are_streamed_and_hold_the_same_values") else { return };
    let n = (kiln_cpu::program::stream_threshold() / 4 + 64) as i64 / 16 * 16;
    let src = |in_place| {
        let r = kiln_cpu::llvm::LlvmRenderer::for_isa(kiln_cpu::IsaTarget::native().isa);
        kiln_device::Renderer::render(&r, &scale_kernel(n, in_place), Some("scale"))
            .unwrap_or_else(|e| panic!("{e}"))
            .src
    };
    assert!(src(false).contains("call void @kiln_stnt_"), "a write-only output is streamed:\n{}", src(false));
    assert!(!src(true).contains("kiln_stnt_"), "an output the kernel reads is not:\n{}", src(true));
    let kernel = dev.compile_with(LLVM_PAIR, &scale_kernel(n, false), Some("scale")).unwrap_or_else(|e| panic!("{e}"));
    let len = n as usize;
    let x: Vec<f32> = (0..len + 8).map(|i| (i % 977) as f32 * 0.25).collect();
    for offset in [0usize, 1, 3] {
        let xb = Buffer::from_slice(dev.allocator(), &x).unwrap_or_else(|e| panic!("{e}"));
        let yb = Buffer::from_slice(dev.allocator(), &vec![-1f32; len + 8]).unwrap_or_else(|e| panic!("{e}"));
        let (xv, yv) = (xb.view(offset, len).unwrap(), yb.view(offset, len).unwrap());
        kernel.launch(&[&xv, &yv], &[]).unwrap_or_else(|e| panic!("{e}"));
        let y = yb.to_vec::<f32>().unwrap_or_else(|e| panic!("{e}"));
        for (e, &got) in y.iter().enumerate() {
            let want = if (offset..offset + len).contains(&e) { x[e] * 2.0 + 1.0 } else { -1.0 };
            assert_eq!(got, want, "element {e} of the view at +{offset}");
        }
    }
}

/// `out[0] = Σ a[i]·b[i]` over `n` products at constant indices, summed as a balanced tree.
fn products_kernel(n: usize) -> Arc<kiln_device::kiln_ir::UOp> {
    let mut k = KernelBuilder::new();
    let (a, b, out) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n), k.param(2, Scalar::F32, 1));
    let mut terms: Vec<Val> = (0..n as i64).map(|i| a.at(&Val::int(i)).load() * b.at(&Val::int(i)).load()).collect();
    while terms.len() > 1 {
        let odd = (terms.len() % 2 == 1).then(|| terms[terms.len() - 1].clone());
        terms = terms.chunks_exact(2).map(|p| &p[0] + &p[1]).chain(odd).collect();
    }
    k.store(&out.at(&Val::int(0)), &terms[0]);
    k.finish().unwrap_or_else(|e| panic!("{e}"))
}

/// A kernel of 1,500 products in one straight-line stretch (chain breaks every 256 loads, the
/// pipeline without the SLP vectorizer: see `llvm::render`'s "Large kernels") gives the C pair's
/// bits and the exact sum. The compile time this shape took (issue 44) is measured with `kiln
/// run` in the README, not here.
#[test]
fn a_long_straight_line_kernel_matches_the_c_pair() {
    let Some(dev) = device("a_long_straight_line_kernel_matches_the_c_pair") else { return };
    let n = 1500;
    let sink = products_kernel(n);
    let src = kiln_device::Renderer::render(
        &kiln_cpu::llvm::LlvmRenderer::for_isa(kiln_cpu::IsaTarget::native().isa),
        &sink,
        Some("products"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .src;
    assert!(src.lines().nth(1).is_some_and(|l| l.contains("no SLP vectorizer")), "{}", &src[..200.min(src.len())]);
    assert_eq!(src.matches("store volatile i8 0").count(), 2 * n / 256);
    // Small integers: every partial sum is exact in f32, in any order.
    let a: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
    let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let run = |pair: &str| {
        let kernel = dev.compile_with(pair, &sink, Some("products")).unwrap_or_else(|e| panic!("{pair}: {e}"));
        let (ba, bb) =
            (Buffer::from_slice(dev.allocator(), &a).unwrap(), Buffer::from_slice(dev.allocator(), &b).unwrap());
        let out = Buffer::from_slice(dev.allocator(), &[f32::NAN]).unwrap();
        kernel.launch(&[&ba, &bb, &out], &[]).unwrap_or_else(|e| panic!("{pair}: {e}"));
        out.to_vec::<f32>().unwrap()[0]
    };
    assert_eq!((run(LLVM_PAIR), run(kiln_cpu::CC_PAIR)), (want, want));
}
