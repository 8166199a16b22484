//! The benchmark kernels: ordinary kiln kernels built with the builder. Their speed comes
//! from the IR (vector dtypes, unrolled accumulators, core splitting), not from hand C.

use std::sync::Arc;

use kiln_device::kiln_ir::{DType, IrError, KernelBuilder, Scalar, StoreHint, UOp, Val};

/// The launch index that spreads work: `gidx0` on the CPU (split over its cores by the
/// renderer), `idx0` elsewhere (one work item each; the driver picks the group size).
pub type Axis = &'static str;

const W: u8 = 8; // f32x8: one AVX2 register

/// The store hint for an output that is written once: non-temporal when the caller found
/// that the kernel's data does not fit in the device's cache (then caching the output only
/// evicts the inputs and costs a read of every output line before it is written).
fn output_hint(nontemporal: bool) -> StoreHint {
    if nontemporal { StoreHint::NonTemporal } else { StoreHint::Normal }
}

/// `c[i] = a[i] + b[i]` for `n` elements (n a multiple of 8·block), vectorized 8 wide;
/// `nontemporal` stores `c` with non-temporal stores (for data larger than the cache).
pub fn add_f32(axis: Axis, n: usize, nontemporal: bool) -> Result<Arc<UOp>, IrError> {
    let block = 4096usize; // elements per work item
    let mut k = KernelBuilder::new();
    let (a, b, c) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n), k.param(2, Scalar::F32, n));
    let g = k.special(axis, (n / block) as i64);
    let r = k.range((block / W as usize) as i64);
    let idx = &g * block as i64 + &r * W as i64;
    let v = a.at_vec(&idx, W).load() + b.at_vec(&idx, W).load();
    let st = k.store_hinted(&c.at_vec(&idx, W), &v, output_hint(nontemporal));
    k.end(&r, &[&st]);
    k.finish()
}

/// Partial sums: `partial[g] = sum(a[g·chunk .. (g+1)·chunk])` with 4 independent f32x8
/// accumulators to hide add latency, then a horizontal sum.
pub fn sum_partials_f32(axis: Axis, n: usize, chunks: usize) -> Result<Arc<UOp>, IrError> {
    let chunk = n / chunks;
    let unroll = 4usize;
    let step = W as usize * unroll;
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, n);
    let out = k.param(1, Scalar::F32, chunks);
    let g = k.special(axis, chunks as i64);
    let r = k.range((chunk / step) as i64);
    let zero = Val::constant(DType::vec(Scalar::F32, W), 0.0);
    let mut finals = Vec::new();
    for u in 0..unroll {
        let acc = k.acc(&zero, &[&r]);
        let idx = &g * chunk as i64 + &r * step as i64 + (u * W as usize) as i64;
        let v = a.at_vec(&idx, W).load();
        finals.push(acc.update(&(acc.get() + v)));
    }
    let mut total = finals[0].clone();
    for f in &finals[1..] {
        total = total + f;
    }
    let mut s = total.gep(0);
    for l in 1..W {
        s = s + total.gep(l);
    }
    k.store(&out.at(&g), &s);
    k.finish()
}

/// `out[0] = sum(partial[0..chunks])`.
pub fn sum_finish_f32(chunks: usize) -> Result<Arc<UOp>, IrError> {
    let mut k = KernelBuilder::new();
    let p = k.param(0, Scalar::F32, chunks);
    let out = k.param(1, Scalar::F32, 1);
    let r = k.range(chunks as i64);
    let acc = k.acc(&Val::f32(0.0), &[&r]);
    let total = acc.update(&(acc.get() + p.at(&r).load()));
    k.store(&out.at(&Val::int(0)), &total);
    k.finish()
}

/// `C = A·B` for n×n row-major matrices. Work item g owns a 16-column strip of C; inside,
/// a loop over 4-row blocks keeps a 4×16 tile in 8 f32x8 accumulators across the k loop,
/// so each k step is 2 vector loads of B, 4 broadcasts of A and 8 FMAs.
pub fn matmul_f32(axis: Axis, n: usize) -> Result<Arc<UOp>, IrError> {
    matmul_tiles(axis, None, n)
}

/// [`matmul_f32`] with one 4×16 tile per work item: strips on `idx0`, 4-row blocks on
/// `idx1`, so the device gets n²/64 independent work items instead of n/16 that each loop
/// over every row block (on PoCL: ~1.3× the strip shape, which leaves cores idle).
pub fn matmul_tile_f32(n: usize) -> Result<Arc<UOp>, IrError> {
    matmul_tiles("idx0", Some("idx1"), n)
}

/// The matmul of [`matmul_f32`]; `rows_axis` launches the row blocks instead of looping.
fn matmul_tiles(axis: Axis, rows_axis: Option<Axis>, n: usize) -> Result<Arc<UOp>, IrError> {
    const ROWS: usize = 4;
    const COLS: usize = 16;
    let halves = COLS / W as usize;
    let nn = (n * n) as i64;
    let ni = n as i64;
    let mut k = KernelBuilder::new();
    let (a, b, c) = (k.param(0, Scalar::F32, nn), k.param(1, Scalar::F32, nn), k.param(2, Scalar::F32, nn));
    let strip = k.special(axis, (n / COLS) as i64);
    let rb = match rows_axis {
        Some(name) => k.special(name, (n / ROWS) as i64),
        None => k.range((n / ROWS) as i64),
    };
    let kk = k.range(ni);
    let zero = Val::constant(DType::vec(Scalar::F32, W), 0.0);
    let col0 = &strip * COLS as i64;
    // B is read from its packed form: strip-major, so one strip's k rows are contiguous.
    let packed = &(&strip * ni + &kk) * COLS as i64;
    let bvec: Vec<Val> = (0..halves).map(|h| b.at_vec(&(&packed + (h * W as usize) as i64), W).load()).collect();
    let mut stores = Vec::new();
    for row in 0..ROWS {
        let i = &rb * ROWS as i64 + row as i64;
        let aval = a.at(&(&i * ni + &kk)).load().broadcast(W);
        for (h, bv) in bvec.iter().enumerate() {
            let acc = k.acc(&zero, &[&kk]);
            let tile = acc.update(&aval.mul_acc(bv, &acc.get()));
            let addr = c.at_vec(&(&i * ni + &col0 + (h * W as usize) as i64), W);
            stores.push(k.store(&addr, &tile));
        }
    }
    if rows_axis.is_none() {
        let refs: Vec<&Val> = stores.iter().collect();
        k.end(&rb, &refs);
    }
    k.finish()
}

/// Packs B (n×n) into 16-column strips: `bp[(s·n + k)·16 + c] = b[k·n + 16·s + c]`, so the
/// matmul streams each strip contiguously instead of at a 4 KiB stride (which aliases cache sets).
pub fn pack_b_f32(axis: Axis, n: usize) -> Result<Arc<UOp>, IrError> {
    let nn = (n * n) as i64;
    let ni = n as i64;
    let mut k = KernelBuilder::new();
    let (b, bp) = (k.param(0, Scalar::F32, nn), k.param(1, Scalar::F32, nn));
    let strip = k.special(axis, ni / 16);
    let kk = k.range(ni);
    let mut stores = Vec::new();
    for h in 0..2i64 {
        let v = b.at_vec(&(&kk * ni + &strip * 16 + h * 8), W).load();
        stores.push(k.store(&bp.at_vec(&(&(&strip * ni + &kk) * 16 + h * 8), W), &v));
    }
    k.end(&kk, &[&stores[0], &stores[1]]);
    k.finish()
}

/// Row-wise softmax of a rows×cols matrix: max, exp(x - max) summed, then scaled. Plain,
/// pass 2 writes exp(x - max) to `y` and pass 3 scales it in place (the row is in L1). With
/// `nontemporal`, pass 2 only sums and pass 3 recomputes exp(x - max) before its one
/// non-temporal store of `y` (a non-temporal store to a line that pass 2 left dirty in the
/// cache would write that line to memory twice): 8 bytes of memory traffic per element
/// instead of 12, for a second exp per element, so it pays only where softmax is memory
/// bound (measured on a 2-core Zen 4 with 4096×1024: compute bound, half the speed).
pub fn softmax_f32(axis: Axis, rows: usize, cols: usize, nontemporal: bool) -> Result<Arc<UOp>, IrError> {
    let mut k = KernelBuilder::new();
    let total = (rows * cols) as i64;
    let (x, y) = (k.param(0, Scalar::F32, total), k.param(1, Scalar::F32, total));
    let row = k.special(axis, rows as i64);
    let base = &row * cols as i64;
    let vw = W as i64;
    let vecs = cols as i64 / vw;
    let dt = DType::vec(Scalar::F32, W);
    // Pass 1: max.
    let r1 = k.range(vecs);
    let m = k.acc(&Val::constant(dt, f64::NEG_INFINITY), &[&r1]);
    let mv = m.update(&m.get().max(x.at_vec(&(&base + &r1 * vw), W).load()));
    let mut mx = mv.gep(0);
    for l in 1..W {
        mx = mx.max(mv.gep(l));
    }
    let mxv = mx.broadcast(W);
    // Pass 2: exp(x - max) summed (and written out, unless pass 3 recomputes it).
    let r2 = k.range(vecs);
    let s = k.acc(&Val::constant(dt, 0.0), &[&r2]);
    let addr2 = &base + &r2 * vw;
    let e = (x.at_vec(&addr2, W).load() - &mxv).exp();
    let sv = s.update(&(s.get() + &e));
    let stored = (!nontemporal).then(|| {
        let st = k.store(&y.at_vec(&addr2, W), &e);
        k.end(&r2, &[&st])
    });
    let mut sum = sv.gep(0);
    for l in 1..W {
        sum = sum + sv.gep(l);
    }
    let inv = sum.recip().broadcast(W);
    // Pass 3: scale, reloading pass 2's stores (AFTER orders the reload behind them), or
    // recomputing exp(x - max) from the row of x that is still in L1.
    let r3 = k.range(vecs);
    let addr3 = &base + &r3 * vw;
    let ptr = y.at_vec(&addr3, W);
    let e3 = match &stored {
        Some(e2) => ptr.after(&[e2]).load(),
        None => (x.at_vec(&addr3, W).load() - &mxv).exp(),
    };
    let st3 = k.store_hinted(&ptr, &(e3 * inv), output_hint(nontemporal));
    k.end(&r3, &[&st3]);
    k.finish()
}

/// Every benchmark kernel for the CPU as the bench runs them where `add`'s 64 MiB output
/// exceeds the cache and `softmax`'s 16 MiB does not (so only `add` stores non-temporally),
/// with the file name it is shipped under in
/// `examples/kernels/bench/` (regenerate with `cargo run -p kiln --example bench_kernels`).
pub fn shipped() -> Result<Vec<(&'static str, Arc<UOp>)>, IrError> {
    let cpu = "gidx0";
    Ok(vec![
        ("add_f32_16m.kiln", add_f32(cpu, 1 << 24, true)?),
        ("sum_partials_f32_16m.kiln", sum_partials_f32(cpu, 1 << 24, 64)?),
        ("sum_finish_f32_64.kiln", sum_finish_f32(64)?),
        ("pack_b_f32_1024.kiln", pack_b_f32(cpu, 1024)?),
        ("matmul_f32_1024.kiln", matmul_f32(cpu, 1024)?),
        ("softmax_f32_4096x1024.kiln", softmax_f32(cpu, 4096, 1024, false)?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped text files are exactly the kernels the benchmark runs.
    #[test]
    fn shipped_files_match_the_builder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels/bench");
        for (file, sink) in shipped().unwrap() {
            let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            let parsed = kiln_device::kiln_ir::parse_kernel(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(Arc::ptr_eq(&parsed, &sink), "{file} is stale: run `cargo run -p kiln --example bench_kernels`");
        }
    }

    /// `add` and `softmax` compute the same with non-temporal output stores as without (add
    /// exactly; softmax, whose non-temporal shape recomputes exp, to a few ulps), on the CPU.
    #[test]
    fn nontemporal_add_and_softmax_match_the_plain_kernels() {
        use kiln_device::Buffer;
        crate::session::register_backends();
        let dev = kiln_device::open_device("CPU").unwrap();
        let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
        let n = 2 * 4096 * 8;
        let (a, b): (Vec<f32>, Vec<f32>) =
            ((0..n).map(|i| i as f32 * 0.5).collect(), (0..n).map(|i| (i % 7) as f32).collect());
        let (rows, cols) = (64, 1024);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 31) % 97) as f32 * 0.05 - 2.0).collect();
        let mut outs = Vec::new();
        for nt in [false, true] {
            let (c, y) = (buf(&vec![0.0; n]), buf(&vec![0.0; rows * cols]));
            dev.compile(&add_f32("gidx0", n, nt).unwrap(), Some("add"))
                .unwrap()
                .launch(&[&buf(&a), &buf(&b), &c], &[])
                .unwrap();
            let sm = dev.compile(&softmax_f32("gidx0", rows, cols, nt).unwrap(), Some("softmax")).unwrap();
            sm.launch(&[&buf(&x), &y], &[]).unwrap();
            outs.push((c.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap()));
        }
        let want: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        assert!(outs[0].0 == want && outs[1].0 == want);
        for (p, q) in outs[0].1.iter().zip(&outs[1].1) {
            assert!((p - q).abs() <= 4.0 * f32::EPSILON * p.abs(), "softmax: {p} plain, {q} non-temporal");
        }
    }

    /// Both matmul shapes compute the exact product (inputs in 1/8 steps, so any order of
    /// summation is exact), on the CPU and on OpenCL when a device is present.
    #[test]
    fn tile_and_strip_matmuls_compute_the_product() {
        use kiln_device::Buffer;
        crate::session::register_backends();
        let n = 64usize;
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.75).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.125 - 0.625).collect();
        let mut want = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                want[i * n + j] = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
            }
        }
        for (name, axis) in [("CPU", "gidx0"), ("OPENCL:0", "idx0")] {
            let dev = match kiln_device::open_device(name) {
                Ok(d) => d,
                Err(e) if name != "CPU" && !std::env::var("KILN_REQUIRE").is_ok_and(|r| r.contains("opencl")) => {
                    println!("skipped {name}: {e}");
                    continue;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
            let (ba, bb, bp) = (buf(&a), buf(&b), buf(&vec![0f32; n * n]));
            dev.compile(&pack_b_f32(axis, n).unwrap(), Some("pack_b")).unwrap().launch(&[&bb, &bp], &[]).unwrap();
            for (shape, sink) in [("strip", matmul_f32(axis, n)), ("tile", matmul_tile_f32(n))] {
                let c = buf(&vec![0f32; n * n]);
                let k = dev.compile(&sink.unwrap(), Some("mm")).unwrap();
                k.launch(&[&ba, &bp, &c], &[]).unwrap();
                assert_eq!(c.to_vec::<f32>().unwrap(), want, "{shape} matmul on {name}");
            }
        }
    }
}
