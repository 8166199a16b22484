//! The benchmark kernels: ordinary kiln kernels built with the builder. Their speed comes
//! from the IR (vector dtypes, unrolled accumulators, core splitting), not from hand C.

use std::sync::Arc;

use kiln_device::kiln_ir::{DType, IrError, KernelBuilder, Scalar, StoreHint, UOp, Val};

/// The launch index that spreads work: `gidx0` on the CPU (split over its cores by the
/// renderer), `idx0` elsewhere (one work item each; the driver picks the group size).
pub type Axis = &'static str;

/// The f32 lanes the bench kernels use when the device does not report its vector width:
/// one AVX2 register (also the width of the shipped kernel files).
pub const DEFAULT_WIDTH: u8 = 8;

/// The widths the bench kernels are built for: the f32 lanes of one vector register of SSE2
/// or NEON (4), AVX2 (8) and AVX-512 (16).
pub const WIDTHS: [u8; 3] = [4, 8, 16];

/// The vector width for a device whose widest vector holds `lanes` f32s: the widest of
/// [`WIDTHS`] that fits, else [`DEFAULT_WIDTH`] when the device does not say.
pub fn width_for(lanes: Option<usize>) -> u8 {
    match lanes {
        Some(l) => WIDTHS.iter().rev().copied().find(|&w| w as usize <= l).unwrap_or(WIDTHS[0]),
        None => DEFAULT_WIDTH,
    }
}

/// Refuses a `width` that is not one of [`WIDTHS`] or does not divide `step` (the elements
/// one loop iteration covers), instead of building a kernel that skips elements.
fn check_width(width: u8, step: usize) -> Result<(), IrError> {
    if !WIDTHS.contains(&width) || !step.is_multiple_of(width as usize) {
        return Err(IrError::Invalid(format!(
            "bench kernels take a vector width of {WIDTHS:?} lanes that divides {step}, not {width}"
        )));
    }
    Ok(())
}

/// The store hint for an output that is written once: non-temporal when the caller found
/// that the kernel's data does not fit in the device's cache (then caching the output only
/// evicts the inputs and costs a read of every output line before it is written).
fn output_hint(nontemporal: bool) -> StoreHint {
    if nontemporal { StoreHint::NonTemporal } else { StoreHint::Normal }
}

/// `c[i] = a[i] + b[i]` for `n` elements (n a multiple of the 4096-element block),
/// vectorized `w` lanes wide; `nontemporal` stores `c` with non-temporal stores (for data
/// larger than the cache).
pub fn add_f32(axis: Axis, n: usize, w: u8, nontemporal: bool) -> Result<Arc<UOp>, IrError> {
    let block = 4096usize; // elements per work item
    check_width(w, block)?;
    let mut k = KernelBuilder::new();
    let (a, b, c) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n), k.param(2, Scalar::F32, n));
    let g = k.special(axis, (n / block) as i64);
    let r = k.range((block / w as usize) as i64);
    let idx = &g * block as i64 + &r * w as i64;
    let v = a.at_vec(&idx, w).load() + b.at_vec(&idx, w).load();
    let st = k.store_hinted(&c.at_vec(&idx, w), &v, output_hint(nontemporal));
    k.end(&r, &[&st]);
    k.finish()
}

/// Partial sums: `partial[g] = sum(a[g·chunk .. (g+1)·chunk])` with 4 independent
/// accumulators of `w` lanes to hide add latency, then a horizontal sum.
pub fn sum_partials_f32(axis: Axis, n: usize, chunks: usize, w: u8) -> Result<Arc<UOp>, IrError> {
    let chunk = n / chunks;
    let unroll = 4usize;
    check_width(w, chunk / unroll)?;
    let step = w as usize * unroll;
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, n);
    let out = k.param(1, Scalar::F32, chunks);
    let g = k.special(axis, chunks as i64);
    let r = k.range((chunk / step) as i64);
    let zero = Val::constant(DType::vec(Scalar::F32, w), 0.0);
    let mut finals = Vec::new();
    for u in 0..unroll {
        let acc = k.acc(&zero, &[&r]);
        let idx = &g * chunk as i64 + &r * step as i64 + (u * w as usize) as i64;
        let v = a.at_vec(&idx, w).load();
        finals.push(acc.update(&(acc.get() + v)));
    }
    let mut total = finals[0].clone();
    for f in &finals[1..] {
        total = total + f;
    }
    let mut s = total.gep(0);
    for l in 1..w {
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

/// The register tile of a matmul: `rows` rows × `vecs` vectors of `width` f32 lanes of C,
/// held in rows·vecs accumulators across the whole k loop. Each k step loads `vecs` vectors
/// of packed B, broadcasts `rows` elements of A and issues rows·vecs FMAs, so a larger tile
/// needs fewer loads per FMA and hides the FMA latency behind more independent chains, as
/// long as the accumulators, the B vectors and a broadcast fit the vector registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulTile {
    pub rows: usize,
    pub vecs: usize,
    /// f32 lanes per vector: 8 (AVX2, one ymm) or 16 (AVX-512, one zmm).
    pub width: u8,
}

impl MatmulTile {
    /// The tile for vectors of `width` f32 lanes. 16 (AVX-512): 8×32, 16 zmm accumulators
    /// of 32 registers, no spills (on a Zen 4 core ~1.3× the 4×16 ymm tile, ~1.1× OpenBLAS).
    /// Otherwise 8 (AVX2): 4×16, 8 ymm accumulators, the largest power-of-two tile whose
    /// accumulators, B vectors and broadcast fit AVX2's 16 registers (8×16 and 4×32 spill).
    pub fn for_width(width: u8) -> MatmulTile {
        if width >= 16 { MatmulTile { rows: 8, vecs: 2, width: 16 } } else { MatmulTile { rows: 4, vecs: 2, width: 8 } }
    }

    /// Columns of C (and of a packed strip of B) per tile.
    pub fn cols(self) -> usize {
        self.vecs * self.width as usize
    }

    /// n must be a positive multiple of the tile's rows and columns: the kernels have no
    /// edge tiles.
    fn check(self, n: usize) -> Result<(), IrError> {
        let splits = self.rows > 0 && self.cols() > 0 && n > 0;
        if !splits || !n.is_multiple_of(self.rows) || !n.is_multiple_of(self.cols()) {
            return Err(IrError::Structure(format!(
                "a {n}×{n} matmul does not split into {}×{} tiles: use a multiple of both",
                self.rows,
                self.cols()
            )));
        }
        Ok(())
    }
}

/// `C = A·B` for n×n row-major matrices, B packed by [`pack_b_f32`] for the same tile. Work
/// item g owns a strip of `tile.cols()` columns of C; inside, a loop over blocks of
/// `tile.rows` rows keeps one tile in registers across the k loop.
pub fn matmul_f32(axis: Axis, n: usize, tile: MatmulTile) -> Result<Arc<UOp>, IrError> {
    matmul_tiles(axis, None, n, tile)
}

/// [`matmul_f32`] with one tile per work item: strips on `idx0`, row blocks on `idx1`, so
/// the device gets n²/(rows·cols) independent work items instead of n/cols that each loop
/// over every row block (on PoCL: ~1.3× the strip shape, which leaves cores idle).
pub fn matmul_tile_f32(n: usize, tile: MatmulTile) -> Result<Arc<UOp>, IrError> {
    matmul_tiles("idx0", Some("idx1"), n, tile)
}

/// The matmul of [`matmul_f32`]; `rows_axis` launches the row blocks instead of looping.
fn matmul_tiles(axis: Axis, rows_axis: Option<Axis>, n: usize, tile: MatmulTile) -> Result<Arc<UOp>, IrError> {
    tile.check(n)?;
    let (w, cols) = (tile.width, tile.cols() as i64);
    let nn = (n * n) as i64;
    let ni = n as i64;
    let mut k = KernelBuilder::new();
    let (a, b, c) = (k.param(0, Scalar::F32, nn), k.param(1, Scalar::F32, nn), k.param(2, Scalar::F32, nn));
    let strip = k.special(axis, ni / cols);
    let rb = match rows_axis {
        Some(name) => k.special(name, (n / tile.rows) as i64),
        None => k.range((n / tile.rows) as i64),
    };
    let kk = k.range(ni);
    let zero = Val::constant(DType::vec(Scalar::F32, w), 0.0);
    let col0 = &strip * cols;
    // B is read from its packed form: strip-major, so one strip's k rows are contiguous.
    let packed = &(&strip * ni + &kk) * cols;
    let bvec: Vec<Val> = (0..tile.vecs as i64).map(|v| b.at_vec(&(&packed + v * w as i64), w).load()).collect();
    let mut stores = Vec::new();
    for row in 0..tile.rows as i64 {
        let i = &rb * tile.rows as i64 + row;
        let aval = a.at(&(&i * ni + &kk)).load().broadcast(w);
        for (v, bv) in (0i64..).zip(&bvec) {
            let acc = k.acc(&zero, &[&kk]);
            let sum = acc.update(&aval.mul_acc(bv, &acc.get()));
            stores.push(k.store(&c.at_vec(&(&i * ni + &col0 + v * w as i64), w), &sum));
        }
    }
    if rows_axis.is_none() {
        let refs: Vec<&Val> = stores.iter().collect();
        k.end(&rb, &refs);
    }
    k.finish()
}

/// Packs B (n×n) into strips of `tile.cols()` columns, `bp[(s·n + k)·cols + c] = b[k·n +
/// cols·s + c]`, so the matmul streams each strip contiguously instead of at a 4 KiB stride
/// (which aliases cache sets).
pub fn pack_b_f32(axis: Axis, n: usize, tile: MatmulTile) -> Result<Arc<UOp>, IrError> {
    tile.check(n)?;
    let (w, cols) = (tile.width, tile.cols() as i64);
    let nn = (n * n) as i64;
    let ni = n as i64;
    let mut k = KernelBuilder::new();
    let (b, bp) = (k.param(0, Scalar::F32, nn), k.param(1, Scalar::F32, nn));
    let strip = k.special(axis, ni / cols);
    let kk = k.range(ni);
    let stores: Vec<Val> = (0..tile.vecs as i64)
        .map(|v| {
            let x = b.at_vec(&(&kk * ni + &strip * cols + v * w as i64), w).load();
            k.store(&bp.at_vec(&(&(&strip * ni + &kk) * cols + v * w as i64), w), &x)
        })
        .collect();
    let refs: Vec<&Val> = stores.iter().collect();
    k.end(&kk, &refs);
    k.finish()
}

/// Row-wise softmax of a rows×cols matrix, `w` lanes at a time: max, exp(x - max) summed, then scaled. Plain,
/// pass 2 writes exp(x - max) to `y` and pass 3 scales it in place (the row is in L1). With
/// `nontemporal`, pass 2 only sums and pass 3 recomputes exp(x - max) before its one
/// non-temporal store of `y` (a non-temporal store to a line that pass 2 left dirty in the
/// cache would write that line to memory twice): 8 bytes of memory traffic per element
/// instead of 12, for a second exp per element, so it pays only where softmax is memory
/// bound (measured on a 2-core Zen 4 with 4096×1024: compute bound, half the speed).
pub fn softmax_f32(axis: Axis, rows: usize, cols: usize, w: u8, nontemporal: bool) -> Result<Arc<UOp>, IrError> {
    check_width(w, cols)?;
    let mut k = KernelBuilder::new();
    let total = (rows * cols) as i64;
    let (x, y) = (k.param(0, Scalar::F32, total), k.param(1, Scalar::F32, total));
    let row = k.special(axis, rows as i64);
    let base = &row * cols as i64;
    let vw = w as i64;
    let vecs = cols as i64 / vw;
    let dt = DType::vec(Scalar::F32, w);
    // Pass 1: max.
    let r1 = k.range(vecs);
    let m = k.acc(&Val::constant(dt, f64::NEG_INFINITY), &[&r1]);
    let mv = m.update(&m.get().max(x.at_vec(&(&base + &r1 * vw), w).load()));
    let mut mx = mv.gep(0);
    for l in 1..w {
        mx = mx.max(mv.gep(l));
    }
    let mxv = mx.broadcast(w);
    // Pass 2: exp(x - max) summed (and written out, unless pass 3 recomputes it).
    let r2 = k.range(vecs);
    let s = k.acc(&Val::constant(dt, 0.0), &[&r2]);
    let addr2 = &base + &r2 * vw;
    let e = (x.at_vec(&addr2, w).load() - &mxv).exp();
    let sv = s.update(&(s.get() + &e));
    let stored = (!nontemporal).then(|| {
        let st = k.store(&y.at_vec(&addr2, w), &e);
        k.end(&r2, &[&st])
    });
    let mut sum = sv.gep(0);
    for l in 1..w {
        sum = sum + sv.gep(l);
    }
    let inv = sum.recip().broadcast(w);
    // Pass 3: scale, reloading pass 2's stores (AFTER orders the reload behind them), or
    // recomputing exp(x - max) from the row of x that is still in L1.
    let r3 = k.range(vecs);
    let addr3 = &base + &r3 * vw;
    let ptr = y.at_vec(&addr3, w);
    let e3 = match &stored {
        Some(e2) => ptr.after(&[e2]).load(),
        None => (x.at_vec(&addr3, w).load() - &mxv).exp(),
    };
    let st3 = k.store_hinted(&ptr, &(e3 * inv), output_hint(nontemporal));
    k.end(&r3, &[&st3]);
    k.finish()
}

/// Every benchmark kernel for the CPU as the bench runs them where `add`'s 64 MiB output
/// exceeds the cache and `softmax`'s 16 MiB does not (so only `add` stores non-temporally),
/// with the file name it is shipped under in
/// `examples/kernels/bench/` (regenerate with `cargo run -p kiln --example bench_kernels`).
/// The plain names are built [`DEFAULT_WIDTH`] (AVX2) wide; `_x16` names are the 16-lane
/// (AVX-512) kernels that the bench runs on a CPU reporting 64-byte vectors.
pub fn shipped() -> Result<Vec<(&'static str, Arc<UOp>)>, IrError> {
    let cpu = "gidx0";
    let w = DEFAULT_WIDTH;
    Ok(vec![
        ("add_f32_16m.kiln", add_f32(cpu, 1 << 24, w, true)?),
        ("sum_partials_f32_16m.kiln", sum_partials_f32(cpu, 1 << 24, 64, w)?),
        ("sum_finish_f32_64.kiln", sum_finish_f32(64)?),
        ("pack_b_f32_1024.kiln", pack_b_f32(cpu, 1024, MatmulTile::for_width(w))?),
        ("matmul_f32_1024.kiln", matmul_f32(cpu, 1024, MatmulTile::for_width(w))?),
        ("softmax_f32_4096x1024.kiln", softmax_f32(cpu, 4096, 1024, w, false)?),
        ("add_f32_16m_x16.kiln", add_f32(cpu, 1 << 24, 16, true)?),
        ("sum_partials_f32_16m_x16.kiln", sum_partials_f32(cpu, 1 << 24, 64, 16)?),
        ("pack_b_f32_1024_x16.kiln", pack_b_f32(cpu, 1024, MatmulTile::for_width(16))?),
        ("matmul_f32_1024_x16.kiln", matmul_f32(cpu, 1024, MatmulTile::for_width(16))?),
        ("softmax_f32_4096x1024_x16.kiln", softmax_f32(cpu, 4096, 1024, 16, false)?),
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

    /// Runs add, sum and softmax `w` lanes wide on `dev` and compares them with a host reference.
    fn check_bandwidth_kernels(dev: &kiln_device::Device, axis: Axis, w: u8) -> Result<(), String> {
        use kiln_device::Buffer;
        let at = format!("{} at width {w}", dev.spec());
        let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).map_err(|e| format!("{at}: {e}"));
        let run = |sink: Result<Arc<UOp>, IrError>, bufs: &[&Buffer]| -> Result<(), String> {
            let sink = sink.map_err(|e| format!("{at}: {e}"))?;
            let k = dev.compile(&sink, Some("bench_kernel")).map_err(|e| format!("{at}: {e}"))?;
            k.launch(bufs, &[]).map_err(|e| format!("{at}: {e}"))
        };
        let read = |b: &Buffer| b.to_vec::<f32>().map_err(|e| format!("{at}: {e}"));

        let n = 4096 * 8;
        let a: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.25).collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 777) as f32 * 0.5).collect();
        let (ba, bb, bc) = (buf(&a)?, buf(&b)?, buf(&vec![0f32; n])?);
        run(add_f32(axis, n, w, false), &[&ba, &bb, &bc])?;
        if let Some(i) = read(&bc)?.iter().zip(a.iter().zip(&b)).position(|(c, (x, y))| *c != x + y) {
            return Err(format!("{at}: add is wrong at element {i}"));
        }

        let chunks = 8;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1024) as f32 / 1024.0 - 0.5).collect();
        let (bx, bp, bo) = (buf(&x)?, buf(&[0f32; 8])?, buf(&[0f32])?);
        run(sum_partials_f32(axis, n, chunks, w), &[&bx, &bp])?;
        run(sum_finish_f32(chunks), &[&bp, &bo])?;
        let (got, want) = (read(&bo)?[0] as f64, x.iter().map(|&v| v as f64).sum::<f64>());
        if (got - want).abs() > 1e-6 * x.iter().map(|&v| (v as f64).abs()).sum::<f64>() {
            return Err(format!("{at}: sum = {got}, reference {want}"));
        }

        let (rows, cols) = (4, 256);
        let (bx, by) = (buf(&x[..rows * cols])?, buf(&vec![0f32; rows * cols])?);
        run(softmax_f32(axis, rows, cols, w, false), &[&bx, &by])?;
        let y = read(&by)?;
        for (row, got) in x[..rows * cols].chunks(cols).zip(y.chunks(cols)) {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            for (v, g) in row.iter().zip(got) {
                let want = (*v as f64 - m).exp() / s;
                if (*g as f64 - want).abs() > 1e-5 * want.max(1e-3) + 1e-7 {
                    return Err(format!("{at}: softmax gives {g}, reference {want}"));
                }
            }
        }
        Ok(())
    }

    /// The add, sum and softmax kernels are correct at every width on the CPU and on OpenCL
    /// when a device is present, and the CPU picks the width its instruction set reports.
    #[test]
    fn bandwidth_kernels_are_correct_at_every_width() {
        kiln_backends::register_all();
        let cpu = kiln_device::open_device("CPU").unwrap();
        let lanes = cpu.properties().f32_lanes();
        assert!(lanes.is_some(), "the CPU reports its vector width: {:?}", cpu.properties());
        assert!(WIDTHS.contains(&width_for(lanes)) && width_for(lanes) as usize <= lanes.unwrap_or(0));
        for w in WIDTHS {
            check_bandwidth_kernels(&cpu, "gidx0", w).unwrap();
        }
        match kiln_device::open_device("OPENCL:0") {
            Ok(dev) => {
                for w in WIDTHS {
                    check_bandwidth_kernels(&dev, "idx0", w).unwrap();
                }
            }
            Err(e) if !kiln_device::required("opencl") => {
                println!("skipped OPENCL:0: {e}")
            }
            Err(e) => panic!("OPENCL:0: {e}"),
        }
        for bad in [0, 3, 32] {
            assert!(matches!(add_f32("gidx0", 4096, bad, false), Err(IrError::Invalid(_))), "width {bad}");
        }
    }

    /// The AVX2 code path on any CPU that has AVX2: the device forced to AVX2 reports 32-byte
    /// vectors, so the bench picks 8 lanes, and its kernels (compiled with `-march=x86-64-v3`,
    /// no AVX-512 instruction) are correct at that width and at 16.
    #[test]
    fn bandwidth_kernels_are_correct_on_a_cpu_forced_to_avx2() {
        use kiln_cpu::{Isa, IsaTarget};
        let Ok(avx2) = IsaTarget::force(Isa::Avx2) else {
            println!("skipped: this CPU has no AVX2");
            return;
        };
        let dev = kiln_cpu::open_with_isa(avx2).unwrap();
        let props = dev.properties();
        assert_eq!((props.isa.as_deref(), props.vector_bytes), (Some("AVX2"), Some(32)));
        assert!(dev.description().contains("this device's set"), "{}", dev.description());
        let w = width_for(props.f32_lanes());
        assert_eq!(w, 8);
        for w in [w, 16] {
            check_bandwidth_kernels(&dev, "gidx0", w).unwrap();
        }
    }

    /// `add` and `softmax` compute the same with non-temporal output stores as without (add
    /// exactly; softmax, whose non-temporal shape recomputes exp, to a few ulps), on the CPU.
    #[test]
    fn nontemporal_add_and_softmax_match_the_plain_kernels() {
        use kiln_device::Buffer;
        kiln_backends::register_all();
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
            dev.compile(&add_f32("gidx0", n, 16, nt).unwrap(), Some("add"))
                .unwrap()
                .launch(&[&buf(&a), &buf(&b), &c], &[])
                .unwrap();
            let sm = dev.compile(&softmax_f32("gidx0", rows, cols, 16, nt).unwrap(), Some("softmax")).unwrap();
            sm.launch(&[&buf(&x), &y], &[]).unwrap();
            outs.push((c.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap()));
        }
        let want: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        assert!(outs[0].0 == want && outs[1].0 == want);
        for (p, q) in outs[0].1.iter().zip(&outs[1].1) {
            assert!((p - q).abs() <= 4.0 * f32::EPSILON * p.abs(), "softmax: {p} plain, {q} non-temporal");
        }
    }

    /// Both matmul shapes compute the exact product for every tile (each width's own and
    /// odd shapes; inputs in 1/8 steps, so any order of summation is exact), on the CPU and
    /// on OpenCL when a device is present.
    #[test]
    fn tile_and_strip_matmuls_compute_the_product() {
        use kiln_device::Buffer;
        kiln_backends::register_all();
        let n = 96usize;
        let tiles = [
            MatmulTile::for_width(8),
            MatmulTile::for_width(16),
            MatmulTile { rows: 6, vecs: 3, width: 8 },
            MatmulTile { rows: 3, vecs: 1, width: 16 },
        ];
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
                Err(e) if name != "CPU" && !kiln_device::required("opencl") => {
                    println!("skipped {name}: {e}");
                    continue;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
            let (ba, bb, bp) = (buf(&a), buf(&b), buf(&vec![0f32; n * n]));
            for tile in tiles {
                dev.compile(&pack_b_f32(axis, n, tile).unwrap(), Some("pack_b"))
                    .unwrap()
                    .launch(&[&bb, &bp], &[])
                    .unwrap();
                for (shape, sink) in [("strip", matmul_f32(axis, n, tile)), ("tile", matmul_tile_f32(n, tile))] {
                    let c = buf(&vec![0f32; n * n]);
                    let k = dev.compile(&sink.unwrap(), Some("mm")).unwrap();
                    k.launch(&[&ba, &bp, &c], &[]).unwrap();
                    assert_eq!(c.to_vec::<f32>().unwrap(), want, "{shape} matmul with {tile:?} on {name}");
                }
            }
        }
    }

    /// A size the tile does not divide is a typed error, not a wrong or out-of-bounds kernel.
    #[test]
    fn a_size_the_tile_does_not_divide_is_refused() {
        let tile = MatmulTile::for_width(16);
        for n in [100, 1000, 8, 0] {
            let Err(e) = matmul_f32("gidx0", n, tile) else { panic!("n = {n} was accepted") };
            assert!(e.to_string().contains("does not split into"), "{e}");
            assert!(pack_b_f32("gidx0", n, tile).is_err() && matmul_tile_f32(n, tile).is_err());
        }
        let empty = MatmulTile { vecs: 0, ..tile };
        assert!(matmul_f32("gidx0", 64, empty).is_err(), "a tile without columns is refused");
    }
}
