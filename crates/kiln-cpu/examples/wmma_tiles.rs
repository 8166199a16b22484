//! The CPU's WMMA micro-tiles as a 512³ matrix multiply, for each declared form: on the
//! native instruction set (AVX512-BF16's `vdpbf16ps` and AVX512-FP16's `vfmadd231ph` where
//! the CPU has them) against the same kernel built for `x86-64-v4` (the portable f32 body),
//! in one run. Every result is checked against an f64 product before a time is printed.
//!
//! `cargo run --release -p kiln-cpu --example wmma_tiles`

use std::sync::Arc;
use std::time::Instant;

use kiln_cpu::{Isa, IsaTarget, MatrixUnits};
use kiln_device::kiln_ir::{KernelBuilder, Scalar, UOp, Wmma, bf16_bits, f16_bits};
use kiln_device::{Buffer, Device, Error, Result};

/// M = N = K.
const SIDE: usize = 512;
/// Timed runs per form and device (the median is printed).
const REPS: usize = 15;

/// D = A·B + C over fragment-packed operands: A as `[M/m][K/k]` row-major m×k fragments,
/// B as `[N/n][K/k]` k×n fragments, C and D as `[M/m][N/n]` m×n fragments. Work item (i, j)
/// starts from its tile of C, accumulates K/k WMMAs and stores its tile of D.
fn kernel(w: Wmma) -> Result<Arc<UOp>> {
    let (m, n, k) = (w.m as usize, w.n as usize, w.k as usize);
    let (tm, tn, tk) = (SIDE / m, SIDE / n, SIDE / k);
    let (ae, be, ce) = (w.a_elems() as i64, w.b_elems() as i64, w.c_elems() as i64);
    let lanes = |e: i64| u8::try_from(e).unwrap_or(u8::MAX);
    let mut b = KernelBuilder::new();
    let pa = b.param(0, w.input, (SIDE * SIDE) as i64);
    let pb = b.param(1, w.input, (SIDE * SIDE) as i64);
    let pc = b.param(2, w.acc, (SIDE * SIDE) as i64);
    let pd = b.param(3, w.acc, (SIDE * SIDE) as i64);
    let i = b.global(0, tm as i64);
    let j = b.global(1, tn as i64);
    let r = b.range(tk as i64);
    let tile = (&i * tn as i64 + &j) * ce;
    let acc = b.acc(&pc.at_vec(&tile, lanes(ce)).load(), &[&r]);
    let fa = pa.at_vec(&((&i * tk as i64 + &r) * ae), lanes(ae)).load();
    let fb = pb.at_vec(&((&j * tk as i64 + &r) * be), lanes(be)).load();
    let d = acc.update(&fa.wmma(&fb, &acc.get(), w));
    b.store(&pd.at_vec(&tile, lanes(ce)), &d);
    Ok(b.finish()?)
}

/// Values in [-1, 1] exact in every dtype here (multiples of 1/64).
fn values(count: usize, seed: usize) -> Vec<f64> {
    (0..count).map(|x| (((x * 37 + seed * 11) % 129) as f64 - 64.0) / 64.0).collect()
}

fn bits(v: &[f64], s: Scalar) -> Vec<u8> {
    match s {
        Scalar::F16 => v.iter().flat_map(|x| f16_bits(*x).to_le_bytes()).collect(),
        Scalar::BF16 => v.iter().flat_map(|x| bf16_bits(*x).to_le_bytes()).collect(),
        _ => v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
    }
}

fn read(buf: &Buffer, s: Scalar) -> Result<Vec<f64>> {
    let mut raw = vec![0u8; buf.nbytes()];
    buf.copyout(&mut raw)?;
    Ok(match s {
        Scalar::F16 => raw.chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        Scalar::BF16 => raw.chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        _ => raw.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
    })
}

/// The median GFLOP/s of the form `w` on `dev` (C = 0), after checking D against `want`
/// (the row-major f64 product), whose elements' sums of term magnitudes are `magnitude`.
fn run(dev: &Arc<Device>, w: Wmma, a: &[f64], b: &[f64], want: &[f64], magnitude: &[f64]) -> Result<f64> {
    let (m, n, k) = (w.m as usize, w.n as usize, w.k as usize);
    let mut packed_a = Vec::with_capacity(SIDE * SIDE);
    for ti in 0..SIDE / m {
        for tk in 0..SIDE / k {
            for r in 0..m {
                packed_a.extend_from_slice(&a[(ti * m + r) * SIDE + tk * k..][..k]);
            }
        }
    }
    let mut packed_b = Vec::with_capacity(SIDE * SIDE);
    for tj in 0..SIDE / n {
        for tk in 0..SIDE / k {
            for r in 0..k {
                packed_b.extend_from_slice(&b[(tk * k + r) * SIDE + tj * n..][..n]);
            }
        }
    }
    let upload = |v: &[f64], s: Scalar| -> Result<Buffer> {
        let buf = dev.buffer(s, v.len())?;
        buf.copyin(&bits(v, s))?;
        Ok(buf)
    };
    let (ba, bb) = (upload(&packed_a, w.input)?, upload(&packed_b, w.input)?);
    let (bc, bd) = (upload(&vec![0.0; SIDE * SIDE], w.acc)?, upload(&vec![f64::NAN; SIDE * SIDE], w.acc)?);
    let kernel = dev.compile(&kernel(w)?, Some(&format!("wmma_{}_{}_{}", w.shape_name(), w.input, w.acc)))?;
    let bufs = [&ba, &bb, &bc, &bd];
    kernel.launch(&bufs, &[])?;
    let got = read(&bd, w.acc)?;
    // f32 accumulators: every partial sum is a multiple of 2^-12 below 2^10, so exact in any
    // order; f16 and bf16: one rounding of the accumulator per term.
    let unit = match w.acc {
        Scalar::F16 => 2f64.powi(-11),
        Scalar::BF16 => 2f64.powi(-8),
        _ => 0.0,
    };
    for (tile, chunk) in got.chunks(w.c_elems()).enumerate() {
        let (ti, tj) = (tile / (SIDE / n), tile % (SIDE / n));
        for (e, g) in chunk.iter().enumerate() {
            let (row, col) = (ti * m + e / n, tj * n + e % n);
            let x = want[row * SIDE + col];
            if (g - x).abs() > SIDE as f64 * unit * magnitude[row * SIDE + col] {
                return Err(Error::Invalid(format!("{w} on {}: C[{row}][{col}] = {g}, want {x}", dev.spec())));
            }
        }
    }
    let mut secs = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let t = Instant::now();
        kernel.launch(&bufs, &[])?;
        secs.push(t.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    Ok(2.0 * (SIDE * SIDE * SIDE) as f64 / secs[REPS / 2] / 1e9)
}

fn main() -> Result<()> {
    let native = kiln_cpu::open_with_isa(IsaTarget::native())?;
    let portable = match IsaTarget::force(Isa::Avx512) {
        Ok(isa) => kiln_cpu::open_with_isa(isa)?,
        Err(e) => {
            println!("no AVX-512 here ({e}); nothing to compare");
            return Ok(());
        }
    };
    println!("device: {}", native.description());
    println!("units: {:?}", MatrixUnits::of(IsaTarget::native()));
    let (a, b) = (values(SIDE * SIDE, 1), values(SIDE * SIDE, 2));
    let (mut want, mut magnitude) = (vec![0f64; SIDE * SIDE], vec![0f64; SIDE * SIDE]);
    for r in 0..SIDE {
        for kk in 0..SIDE {
            let x = a[r * SIDE + kk];
            for (c, y) in (r * SIDE..).zip(&b[kk * SIDE..][..SIDE]) {
                want[c] += x * y;
                magnitude[c] += (x * y).abs();
            }
        }
    }
    println!("{:<28} {:>12} {:>12} {:>8}", "form (512^3 matmul)", "native GF/s", "x86-64-v4", "ratio");
    for w in native.properties().wmma.iter().copied() {
        let fast = run(&native, w, &a, &b, &want, &magnitude)?;
        let base = run(&portable, w, &a, &b, &want, &magnitude)?;
        println!("{:<28} {fast:>12.1} {base:>12.1} {:>8.2}", w.to_string(), fast / base);
    }
    Ok(())
}
