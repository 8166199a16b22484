//! WMMA, `D = A·B + C` on register fragments, against [`crate::reference::wmma`].
//!
//! A device runs the forms its properties declare (`DeviceProperties::wmma`) and must match
//! the reference: the one-thread (CPU) form bit for bit for f32 inputs; for f16 and bf16
//! inputs within one unit in the last place of an f16 or bf16 accumulator, or within one
//! rounding of the accumulator per term of the sum (a CPU's matrix instructions add in pairs
//! or round each step); a warp form within the
//! accumulator's (and for f32 inputs tf32's) rounding of the sum, since a matrix unit adds in
//! an order of its own. A form the device does not declare is either refused at compile time
//! with a render error naming WMMA (the typed "unsupported op" every backend without a
//! matrix unit gives), or run and checked the same way.

use std::sync::Arc;

use kiln_device::kiln_ir::{KernelBuilder, Scalar, UOp, Wmma};
use kiln_device::{Device, Error, Kernel};

use crate::host::{Value, download, round_float, upload};
use crate::reference::{ulps, wmma as reference};
use crate::{Failure, Mismatches, Outcome, ensure};

/// Tiles (work items) of the one-thread kernel, and k-blocks each accumulates.
const TILES: i64 = 3;
const K_BLOCKS: i64 = 2;

/// Deterministic values of dtype `s` in [-2, 2] with full mantissas (a 64-bit LCG).
fn values(count: usize, seed: u64, s: Scalar) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
            round_float(unit * 4.0 - 2.0, s)
        })
        .collect()
}

fn lanes(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// The one-thread kernel: work item `t` of [`TILES`] starts from its C tile and accumulates
/// WMMAs over [`K_BLOCKS`] (A, B) fragment pairs in a loop (a vector DEFINE_ACC), then
/// stores D. Slots: 0 = A (`TILES·K_BLOCKS` fragments), 1 = B (as many), 2 = C and 3 = D
/// (`TILES` fragments each); each fragment is contiguous, row-major.
pub fn tile_kernel(w: Wmma) -> Result<Arc<UOp>, Failure> {
    let (ae, be, ce) = (w.a_elems() as i64, w.b_elems() as i64, w.c_elems() as i64);
    let mut k = KernelBuilder::new();
    let pa = k.param(0, w.input, TILES * K_BLOCKS * ae);
    let pb = k.param(1, w.input, TILES * K_BLOCKS * be);
    let pc = k.param(2, w.acc, TILES * ce);
    let pd = k.param(3, w.acc, TILES * ce);
    let tile = k.global(0, TILES);
    let r = k.range(K_BLOCKS);
    let c = pc.at_vec(&(&tile * ce), lanes(w.c_elems())).load();
    let acc = k.acc(&c, &[&r]);
    let block = &tile * K_BLOCKS + &r;
    let a = pa.at_vec(&(&block * ae), lanes(w.a_elems())).load();
    let b = pb.at_vec(&(&block * be), lanes(w.b_elems())).load();
    let d = acc.update(&a.wmma(&b, &acc.get(), w));
    k.store(&pd.at_vec(&(&tile * ce), lanes(w.c_elems())), &d);
    Ok(k.finish()?)
}

/// The warp kernel: one group of 32 work items (`lidx0`), each loading its A, B and C
/// fragments (slots 0, 1, 2: fragment-major, thread `t`'s fragment at `t·elems`), running
/// the WMMA and storing its D fragment (slot 3, as C).
pub fn warp_kernel(w: Wmma) -> Result<Arc<UOp>, Failure> {
    let (ae, be, ce) = (w.a_elems() as i64, w.b_elems() as i64, w.c_elems() as i64);
    let threads = w.threads as i64;
    let mut k = KernelBuilder::new();
    let pa = k.param(0, w.input, threads * ae);
    let pb = k.param(1, w.input, threads * be);
    let pc = k.param(2, w.acc, threads * ce);
    let pd = k.param(3, w.acc, threads * ce);
    let _group = k.special("gidx0", 1);
    let lane = k.special("lidx0", threads);
    let a = pa.at_vec(&(&lane * ae), lanes(w.a_elems())).load();
    let b = pb.at_vec(&(&lane * be), lanes(w.b_elems())).load();
    let c = pc.at_vec(&(&lane * ce), lanes(w.c_elems())).load();
    k.store(&pd.at_vec(&(&lane * ce), lanes(w.c_elems())), &a.wmma(&b, &c, w));
    Ok(k.finish()?)
}

/// Compiles `sink`; `None` (after a note) when the device refuses the undeclared form `w`
/// with a render error naming WMMA. Any refusal of a declared form is a failure.
fn compile_form(dev: &Device, sink: &Arc<UOp>, name: &str, w: Wmma) -> Result<Option<Kernel>, Failure> {
    let declared = dev.properties().wmma.contains(&w);
    match dev.compile(sink, Some(name)) {
        Ok(k) => Ok(Some(k)),
        Err(Error::Render(m)) if !declared => {
            ensure!(m.contains("WMMA"), "{}: the refusal of WMMA {w} does not name the op: {m}", dev.spec());
            println!("note: {} does not render WMMA {w} ({name}): {m}", dev.spec());
            Ok(None)
        }
        Err(e) if declared => {
            Err(Failure::Violation(format!("{} declares WMMA {w} but does not compile it: {e}", dev.spec())))
        }
        Err(e) => Err(Failure::Violation(format!(
            "{}: undeclared WMMA {w} is refused without a render error: {e}",
            dev.spec()
        ))),
    }
}

/// The one-thread forms for `input` → `acc`: every shape the device declares, else m4n4k4
/// (which a device without the form must refuse with a render error, or run correctly).
pub fn tile(dev: &Arc<Device>, input: Scalar, acc: Scalar) -> Outcome {
    let mut forms: Vec<Wmma> =
        dev.properties().wmma.iter().copied().filter(|w| w.threads == 1 && w.input == input && w.acc == acc).collect();
    if forms.is_empty() {
        forms.push(Wmma::single(4, 4, 4, input, acc));
    }
    forms.into_iter().try_for_each(|w| tile_form(dev, w))
}

/// One one-thread form through [`tile_kernel`], against the reference.
fn tile_form(dev: &Arc<Device>, w: Wmma) -> Outcome {
    let (input, acc) = (w.input, w.acc);
    let sink = tile_kernel(w)?;
    let name = format!("conf_wmma_{}_{}_{}", w.shape_name(), input.name(), acc.name());
    let Some(kernel) = compile_form(dev, &sink, &name, w)? else { return Ok(()) };
    let blocks = (TILES * K_BLOCKS) as usize;
    let (ae, be, ce) = (w.a_elems(), w.b_elems(), w.c_elems());
    let (n, k) = (w.n as usize, w.k as usize);
    let a = values(blocks * ae, 1, input);
    let b = values(blocks * be, 2, input);
    let c = values(TILES as usize * ce, 3, acc);
    let mut want = Vec::new();
    // The sum of the magnitudes of each element's terms, C's included.
    let mut magnitude = Vec::new();
    for t in 0..TILES as usize {
        let mut d = c[t * ce..][..ce].to_vec();
        let mut mag: Vec<f64> = d.iter().map(|x| x.abs()).collect();
        for r in 0..K_BLOCKS as usize {
            let blk = t * K_BLOCKS as usize + r;
            let (fa, fb) = (&a[blk * ae..][..ae], &b[blk * be..][..be]);
            d = reference(&w, fa, fb, &d)
                .ok_or_else(|| Failure::Violation(format!("reference WMMA {w}: fragments of the wrong size")))?;
            for (e, s) in mag.iter_mut().enumerate() {
                *s += (0..k).map(|kk| (fa[e / n * k + kk] * fb[kk * n + e % n]).abs()).sum::<f64>();
            }
        }
        want.extend(d);
        magnitude.extend(mag);
    }
    let f = |v: &[f64]| v.iter().map(|x| Value::F(*x)).collect::<Vec<_>>();
    let (ba, bb, bc) = (upload(dev, input, &f(&a))?, upload(dev, input, &f(&b))?, upload(dev, acc, &f(&c))?);
    let bd = upload(dev, acc, &vec![Value::F(f64::NAN); want.len()])?;
    kernel.launch(&[&ba, &bb, &bc, &bd], &[])?;
    let got = download(&bd)?;
    // f32 inputs: the fma chain exactly. f16 and bf16 inputs: within one unit of an f16 or
    // bf16 accumulator, or of the error a matrix instruction's own order and rounding may add
    // (one rounding of the accumulator per term: AVX512-BF16 adds k in pairs, AVX512-FP16
    // rounds each k to f16).
    let unit = match acc {
        Scalar::F16 => 2f64.powi(-10),
        Scalar::BF16 => 2f64.powi(-7),
        _ => 2f64.powi(-23),
    };
    let terms = (K_BLOCKS as usize * k) as f64;
    let mut bad = Mismatches::new();
    for (i, (g, want)) in got.iter().zip(&want).enumerate() {
        let d = ulps(g.as_f64(), *want, acc);
        let exact = input == Scalar::F32 && acc == Scalar::F32;
        let ok = if exact {
            d == 0
        } else {
            d <= u64::from(acc != Scalar::F32) || (g.as_f64() - want).abs() <= terms * unit * magnitude[i]
        };
        if !ok {
            bad.push(format!("tile {} element {}: got {g}, want {want} ({d} ulps)", i / ce, i % ce));
        }
    }
    bad.finish(&format!("WMMA {w} on {}", dev.spec()))
}

/// Warp form `index` of [`Wmma::warp_shapes`]: one warp's fragments through the device's
/// matrix unit, against the whole-warp reference.
pub fn warp(dev: &Arc<Device>, index: usize) -> Outcome {
    let Some(w) = Wmma::warp_shapes().get(index).copied() else {
        return Err(Failure::Violation(format!("there is no warp WMMA form {index}")));
    };
    let sink = warp_kernel(w)?;
    let name = format!("conf_wmma_warp_{}_{}_{}", w.shape_name(), w.input.name(), w.acc.name());
    let Some(kernel) = compile_form(dev, &sink, &name, w)? else { return Ok(()) };
    let threads = w.threads as usize;
    let a = values(threads * w.a_elems(), 4, w.input);
    let b = values(threads * w.b_elems(), 5, w.input);
    let c = values(threads * w.c_elems(), 6, w.acc);
    let want = reference(&w, &a, &b, &c)
        .ok_or_else(|| Failure::Violation(format!("reference WMMA {w}: fragments of the wrong size")))?;
    let f = |v: &[f64]| v.iter().map(|x| Value::F(*x)).collect::<Vec<_>>();
    let (ba, bb, bc) = (upload(dev, w.input, &f(&a))?, upload(dev, w.input, &f(&b))?, upload(dev, w.acc, &f(&c))?);
    let bd = upload(dev, w.acc, &vec![Value::F(f64::NAN); want.len()])?;
    kernel.launch(&[&ba, &bb, &bc, &bd], &[])?;
    let got = download(&bd)?;
    // The sum of magnitudes of each element's terms bounds what a different order and the
    // unit's own precision may change: the accumulator's epsilon per term, and tf32's (10
    // mantissa bits) for f32 inputs.
    let mut ma = vec![0f64; w.m as usize * w.k as usize];
    let mut mb = vec![0f64; w.k as usize * w.n as usize];
    for (j, v) in a.iter().enumerate() {
        let (r, col) = w.a_coord(j / w.a_elems(), j % w.a_elems());
        ma[r * w.k as usize + col] = *v;
    }
    for (j, v) in b.iter().enumerate() {
        let (r, col) = w.b_coord(j / w.b_elems(), j % w.b_elems());
        mb[r * w.n as usize + col] = *v;
    }
    let eps = match (w.input, w.acc) {
        (Scalar::F32, _) => 2f64.powi(-10),
        (_, Scalar::F16) => 2f64.powi(-10),
        (_, Scalar::BF16) => 2f64.powi(-7),
        _ => 2f64.powi(-22),
    };
    let mut bad = Mismatches::new();
    for (j, (g, want)) in got.iter().zip(&want).enumerate() {
        let (r, col) = w.c_coord(j / w.c_elems(), j % w.c_elems());
        let magnitude: f64 = c[j].abs()
            + (0..w.k as usize).map(|kk| (ma[r * w.k as usize + kk] * mb[kk * w.n as usize + col]).abs()).sum::<f64>();
        let bound = 2.0 * eps * magnitude;
        let diff = (g.as_f64() - want).abs();
        if diff.is_nan() || diff > bound {
            bad.push(format!(
                "D[{r}][{col}] (thread {} lane {}): got {g}, want {want} (bound {bound:e})",
                j / w.c_elems(),
                j % w.c_elems()
            ));
        }
    }
    bad.finish(&format!("WMMA {w} on {}", dev.spec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_builds_a_valid_kernel() {
        for w in Wmma::warp_shapes() {
            assert!(warp_kernel(w).is_ok(), "{w}");
        }
        for (i, a) in [(Scalar::F32, Scalar::F32), (Scalar::F16, Scalar::F16), (Scalar::BF16, Scalar::F32)] {
            assert!(tile_kernel(Wmma::single(4, 16, 4, i, a)).is_ok());
            assert!(tile_kernel(Wmma::single(1, 1, 1, i, a)).is_ok(), "scalar fragments");
        }
        let v = values(1000, 7, Scalar::BF16);
        assert!(v.iter().all(|x| (-2.0..=2.0).contains(x) && round_float(*x, Scalar::BF16) == *x));
        assert!(v.iter().any(|x| *x != v[0]));
    }
}
