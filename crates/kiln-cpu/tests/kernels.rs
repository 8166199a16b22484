//! End-to-end CPU kernels: built with the kernel builder, rendered to C, compiled, loaded,
//! launched, and checked against Rust references. What every backend must compute (each
//! ALU op, cast and bitcast of every dtype, scalar and on vectors) is checked by the
//! conformance suite, on the native instruction set and on the `cpu-avx2` and `cpu-sse2`
//! pseudo-backends; this file keeps what is the CPU's own (its C, its compilers, its vector
//! math, its launch splitting).

use std::sync::{Arc, OnceLock};

use kiln_conformance::suite::programs;
use kiln_cpu::{CCompiler, CpuProgram, cpu_renderer};
use kiln_device::kiln_ir::{Arg, DType, KernelBuilder, Op, Scalar, UOp, Val, bf16_bits, f16_bits};
use kiln_device::{Buffer, CompiledSpec, Compiler, Device, Error, Kernel, ProgramSpec, Renderer};

fn device() -> Arc<Device> {
    static DEVICE: OnceLock<Arc<Device>> = OnceLock::new();
    DEVICE.get_or_init(|| kiln_cpu::open(&kiln_cpu::CPU).unwrap_or_else(|e| panic!("{e}"))).clone()
}

fn compile(sink: &Arc<UOp>, name: &str) -> Kernel {
    device().compile(sink, Some(name)).unwrap_or_else(|e| {
        let src = cpu_renderer().render(sink, Some(name)).map(|s| s.src).unwrap_or_default();
        panic!("{e}\n--- source ---\n{src}")
    })
}

fn buffer_bytes(s: Scalar, bytes: &[u8]) -> Buffer {
    let b = device().buffer(s, bytes.len() / s.size()).unwrap();
    b.copyin(bytes).unwrap();
    b
}

fn bytes_of(b: &Buffer) -> Vec<u8> {
    let mut out = vec![0u8; b.nbytes()];
    b.copyout(&mut out).unwrap();
    out
}

fn f32s(b: &Buffer) -> Vec<f32> {
    b.to_vec::<f32>().unwrap()
}

fn from_f32s(v: &[f32]) -> Buffer {
    Buffer::from_slice(device().allocator(), v).unwrap()
}

fn node(op: Op, dt: DType, src: &[&Val]) -> Val {
    Val(UOp::new(op, dt, Arg::None, src.iter().map(|v| v.0.clone()).collect()))
}

/// Deterministic pseudo-random f32 values in [-1, 1).
fn randf(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

// ---------------------------------------------------------------- end-to-end kernels

#[test]
fn elementwise_add_with_a_symbolic_size() {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 20);
    let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
    let i = k.global(0, &n);
    let sum = a.at(&i).load() + b.at(&i).load();
    k.store(&c.at(&i), &sum);
    let kernel = compile(&k.finish().unwrap(), "add");
    for n in [1usize, 37, 1000, 100_003] {
        let (x, y) = (randf(n, 1), randf(n, 2));
        let (bx, by, bz) = (from_f32s(&x), from_f32s(&y), device().buffer(Scalar::F32, n).unwrap());
        kernel.launch(&[&bx, &by, &bz], &[n as i64]).unwrap();
        let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        assert_eq!(f32s(&bz), want, "n = {n}");
    }
}

#[test]
fn sum_reduction_per_row_and_total() {
    // out[r] = sum_c x[r, c] over a symbolic number of columns.
    let mut k = KernelBuilder::new();
    let (rows, cols) = (k.var("rows", 1, 4096), k.var("cols", 1, 4096));
    let size = &rows * &cols;
    let (x, out) = (k.param(0, Scalar::F32, &size), k.param(1, Scalar::F32, &rows));
    let r = k.global(0, &rows);
    let c = k.range(&cols);
    let acc = k.acc(&Val::f32(0.0), &[&c]);
    let total = acc.update(&(acc.get() + x.at(&(&r * &cols + &c)).load()));
    k.store(&out.at(&r), &total);
    let kernel = compile(&k.finish().unwrap(), "row_sum");
    let (nr, nc) = (9usize, 133usize);
    let data = randf(nr * nc, 3);
    let (bx, bo) = (from_f32s(&data), device().buffer(Scalar::F32, nr).unwrap());
    kernel.launch(&[&bx, &bo], &[nc as i64, nr as i64]).unwrap();
    let want: Vec<f32> = (0..nr).map(|r| data[r * nc..(r + 1) * nc].iter().fold(0.0, |a, b| a + b)).collect();
    assert_eq!(f32s(&bo), want);
}

#[test]
fn matmul_with_an_accumulator() {
    let (m, n, kk) = (7usize, 5usize, 11usize);
    let mut k = KernelBuilder::new();
    let (a, b, c) = (
        k.param(0, Scalar::F32, (m * kk) as i64),
        k.param(1, Scalar::F32, (kk * n) as i64),
        k.param(2, Scalar::F32, (m * n) as i64),
    );
    let i = k.global(0, m as i64);
    let j = k.range(n as i64);
    let r = k.range(kk as i64);
    let acc = k.acc(&Val::f32(0.0), &[&r]);
    let prod = a.at(&(&i * kk as i64 + &r)).load().mul_acc(&b.at(&(&r * n as i64 + &j)).load(), &acc.get());
    let total = acc.update(&prod);
    let st = k.store(&c.at(&(&i * n as i64 + &j)), &total);
    k.end(&j, &[&st]);
    let kernel = compile(&k.finish().unwrap(), "matmul");
    let (x, y) = (randf(m * kk, 4), randf(kk * n, 5));
    let (bx, by, bz) = (from_f32s(&x), from_f32s(&y), device().buffer(Scalar::F32, m * n).unwrap());
    kernel.launch(&[&bx, &by, &bz], &[]).unwrap();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..kk).fold(0.0f32, |acc, r| x[i * kk + r].mul_add(y[r * n + j], acc));
        }
    }
    assert_eq!(f32s(&bz), want);
}

/// A matmul in the shape tinygrad hands kiln after unrolling two output axes: per step of the
/// reduction, `rows` scalars of A, `lanes` of B read as float4 loads and split into lanes,
/// and rows×lanes scalar accumulators, each stored back through float4 stores. With
/// `padded`, the reduction is split into two nested loops with nested accumulators (a
/// convolution's channels and window, as tinygrad's converter builds them) and B's reads are
/// gated, the zero-padding of a convolution's input.
fn scalar_tile_kernel(m: usize, n: usize, kk: usize, rows: usize, lanes: usize, padded: bool) -> Arc<UOp> {
    let mut k = KernelBuilder::new();
    let (a, b, c) = (
        k.param(0, Scalar::F32, (m * kk) as i64),
        k.param(1, Scalar::F32, (kk * n) as i64),
        k.param(2, Scalar::F32, (m * n) as i64),
    );
    let (rb, cb) = (k.range((m / rows) as i64), k.range((n / lanes) as i64));
    let (outer, inner) = if padded { (k.range(kk as i64 / 2), Some(k.range(2))) } else { (k.range(kk as i64), None) };
    let r = match &inner {
        Some(i) => &outer * 2 + i,
        None => outer.clone(),
    };
    let col0 = &cb * lanes as i64;
    let b_lanes: Vec<Val> = if padded {
        // lane j reads B[r][col0 + j] where col0 + j is not the first column of a 3-column block
        (0..lanes as i64)
            .map(|j| {
                let col = &col0 + j;
                let gate = (&col - &col.idiv(3i64) * 3i64).ne(0i64);
                // the address as tinygrad's symbolic leaves it: the lane's constant outermost
                b.at(&(&r * n as i64 + &col0 + j)).load_gated(&gate, 0.0)
            })
            .collect()
    } else {
        (0..lanes as i64 / 4)
            .flat_map(|v| {
                let quad = b.at_vec(&(&r * n as i64 + &col0 + 4 * v), 4).load();
                (0..4).map(move |l| quad.gep(l))
            })
            .collect()
    };
    let mut stores = Vec::new();
    for row in 0..rows as i64 {
        let i = &rb * rows as i64 + row;
        let x = a.at(&(&i * kk as i64 + &r)).load();
        let ends: Vec<Val> = b_lanes
            .iter()
            .map(|y| {
                // nested accumulators, as tinygrad's reductions over several loops arrive
                let acc = k.acc(&Val::f32(0.0), &[&outer]);
                match &inner {
                    Some(i) => {
                        let inner_acc = k.acc(&acc.get(), &[i]);
                        acc.update(&inner_acc.update(&x.mul_acc(y, &inner_acc.get())))
                    }
                    None => acc.update(&x.mul_acc(y, &acc.get())),
                }
            })
            .collect();
        for (v, quad) in ends.chunks(4).enumerate() {
            stores.push(k.store(&c.at_vec(&(&i * n as i64 + &col0 + 4 * v as i64), 4), &Val::vectorize(quad)));
        }
    }
    let refs: Vec<&Val> = stores.iter().collect();
    let inner_end = k.end(&cb, &refs);
    k.end(&rb, &[&inner_end]);
    k.finish().unwrap()
}

/// The scalar tile becomes vector accumulators on the CPU (`vectorize_outer_products`) and
/// gives the same bits as the scalar fused multiply-adds, in order, on the host.
#[test]
fn a_scalar_register_tile_runs_as_vector_accumulators_with_the_same_bits() {
    let (m, n, kk) = (16usize, 96usize, 24usize);
    for (rows, lanes, padded) in [(8, 32, false), (4, 16, true), (2, 12, false)] {
        let sink = scalar_tile_kernel(m, n, kk, rows, lanes, padded);
        let src = cpu_renderer().render(&sink, Some("tile")).unwrap().src;
        let widest = if lanes == 12 { "kiln_f32x8 acc" } else { "kiln_f32x16 acc" };
        assert!(src.contains(widest), "rows {rows} lanes {lanes}: no vector accumulator in\n{src}");
        let kernel = compile(&sink, "tile");
        let (x, y) = (randf(m * kk, 21), randf(kk * n, 22));
        let (bx, by, bz) = (from_f32s(&x), from_f32s(&y), device().buffer(Scalar::F32, m * n).unwrap());
        kernel.launch(&[&bx, &by, &bz], &[]).unwrap();
        let mut want = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let b_at = |r: usize| if padded && j % 3 == 0 { 0.0 } else { y[r * n + j] };
                want[i * n + j] = (0..kk).fold(0.0f32, |acc, r| x[i * kk + r].mul_add(b_at(r), acc));
            }
        }
        assert_eq!(f32s(&bz), want, "rows {rows} lanes {lanes} padded {padded}");
    }
}

/// A tile as tinygrad hands it when kiln's tile unrolls the rows only: the lanes are a loop
/// of up to two vectors' iterations around the reduction (nested accumulators, B's reads gated
/// like a padded convolution's input, or read through a ReLU as tinygrad fuses the layer
/// before's), with a bias, a ReLU and two stores, one transposed. kiln unrolls and jams that
/// loop into vector accumulators (28 lanes: vectors of 16, 8 and 4; 64 lanes are more than two
/// vectors hold and stay a loop), and every pair gives the bits of the scalar fused
/// multiply-adds, in order, on the host.
#[test]
fn a_tile_whose_lanes_are_a_loop_runs_as_vector_accumulators_with_the_same_bits() {
    for (rows, lanes, widest) in [(4usize, 32usize, Some(16)), (3, 28, Some(16)), (2, 12, Some(8)), (1, 64, None)] {
        lane_loop_tile(rows, lanes, widest, false);
    }
    lane_loop_tile(4, 32, Some(16), true);
}

/// With `relu_read`, B is read plainly through `WHERE(0 < b, b, 0)` instead of gated.
fn lane_loop_tile(rows: usize, lanes: usize, widest: Option<usize>, relu_read: bool) {
    let (m, n, kk) = (rows * 4, lanes * 2, 12usize);
    let mut k = KernelBuilder::new();
    let (a, b) = (k.param(0, Scalar::F32, (m * kk) as i64), k.param(1, Scalar::F32, (kk * n) as i64));
    let bias = k.param(2, Scalar::F32, n as i64);
    let (c, d) = (k.param(3, Scalar::F32, (m * n) as i64), k.param(4, Scalar::F32, (m * n) as i64));
    let (rb, cb, lane) = (k.range((m / rows) as i64), k.range((n / lanes) as i64), k.range(lanes as i64));
    let (outer, inner) = (k.range(kk as i64 / 3), k.range(3));
    let r = &outer * 3 + &inner;
    let col = &cb * lanes as i64 + &lane;
    let mut stores = Vec::new();
    for row in 0..rows as i64 {
        let i = &rb * rows as i64 + row;
        let x = a.at(&(&i * kk as i64 + &r)).load();
        let gate = (&col - &col.idiv(5i64) * 5i64).ne(0i64);
        let y = match relu_read {
            true => {
                let read = b.at(&(&r * n as i64 + &col)).load();
                Val::f32(0.0).lt(&read).select(&read, 0.0f32)
            }
            false => b.at(&(&r * n as i64 + &col)).load_gated(&gate, 0.0),
        };
        let acc = k.acc(&Val::f32(0.0), &[&outer]);
        let inner_acc = k.acc(&acc.get(), &[&inner]);
        let sum = acc.update(&inner_acc.update(&x.mul_acc(&y, &inner_acc.get())));
        let v = sum + bias.at(&col).load();
        let out = Val::f32(0.0).lt(&v).select(&v, 0.0f32);
        stores.push(k.store(&c.at(&(&i * n as i64 + &col)), &out));
        stores.push(k.store(&d.at(&(&col * m as i64 + &i)), &out));
    }
    let refs: Vec<&Val> = stores.iter().collect();
    let lane_end = k.end(&lane, &refs);
    let cb_end = k.end(&cb, &[&lane_end]);
    k.end(&rb, &[&cb_end]);
    let sink = k.finish().unwrap();
    let src = cpu_renderer().render(&sink, Some("lanes")).unwrap().src;
    match widest {
        Some(w) => {
            assert!(src.contains(&format!("kiln_f32x{w} acc")), "{lanes} lanes: no {w}-lane accumulator in\n{src}")
        }
        None => assert!(!src.contains("kiln_f32x"), "{lanes} lanes were unrolled:\n{src}"),
    }

    let (x, y, bv) = (randf(m * kk, 51), randf(kk * n, 52), randf(n, 53));
    let mut want_c = vec![0f32; m * n];
    let mut want_d = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let b_at = |r: usize| match relu_read {
                true if 0.0 < y[r * n + j] => y[r * n + j],
                true => 0.0,
                false if j % 5 == 0 => 0.0,
                false => y[r * n + j],
            };
            let v = (0..kk).fold(0.0f32, |acc, r| x[i * kk + r].mul_add(b_at(r), acc)) + bv[j];
            let out = if 0.0 < v { v } else { 0.0 };
            want_c[i * n + j] = out;
            want_d[j * m + i] = out;
        }
    }
    for pair in device().compiler_names() {
        let kernel = device().compile_with(&pair, &sink, Some("lanes")).unwrap();
        let bufs = [from_f32s(&x), from_f32s(&y), from_f32s(&bv)];
        let (bc, bd) = (device().buffer(Scalar::F32, m * n).unwrap(), device().buffer(Scalar::F32, m * n).unwrap());
        kernel.launch(&[&bufs[0], &bufs[1], &bufs[2], &bc, &bd], &[]).unwrap();
        assert_eq!(f32s(&bc), want_c, "pair {pair}, {lanes} lanes: C");
        assert_eq!(f32s(&bd), want_d, "pair {pair}, {lanes} lanes: D");
    }
}

/// A tile's epilogue as tinygrad writes it, lane by lane: a batch norm (`(acc - mean[j]) *
/// scale[j] / std[j] + bias[j]`), a residual add and a ReLU, stored to C (consecutive lanes:
/// one vector store) and transposed to D (lanes `m` apart: a store per lane). Lifted into
/// vectors by every pair, it gives the bits of the scalar ops, in order, on the host.
#[test]
fn a_tiles_epilogue_in_vectors_gives_the_bits_of_the_scalar_ops() {
    // 8 rows: 136 stores to buffers, so the LLVM pair compiles it without IndVarSimplify
    let (m, n, kk, rows, lanes) = (16usize, 32usize, 12usize, 8usize, 16usize);
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, (m * kk) as i64);
    let b = k.param(1, Scalar::F32, (kk * n) as i64);
    let params: Vec<Val> = (2..6).map(|slot| k.param(slot, Scalar::F32, n as i64)).collect();
    let res = k.param(6, Scalar::F32, (m * n) as i64);
    let (c, d) = (k.param(7, Scalar::F32, (m * n) as i64), k.param(8, Scalar::F32, (m * n) as i64));
    let (rb, cb) = (k.range((m / rows) as i64), k.range((n / lanes) as i64));
    let r = k.range(kk as i64);
    let col0 = &cb * lanes as i64;
    let mut stores = Vec::new();
    for row in 0..rows as i64 {
        let i = &rb * rows as i64 + row;
        let x = a.at(&(&i * kk as i64 + &r)).load();
        for j in 0..lanes as i64 {
            // addresses as tinygrad's symbolic leaves them: the lane's constant outermost
            let acc = k.acc(&Val::f32(0.0), &[&r]);
            let sum = acc.update(&x.mul_acc(&b.at(&(&r * n as i64 + &col0 + j)).load(), &acc.get()));
            let p = |q: usize| params[q].at(&(&col0 + j)).load();
            let v = (sum - p(0)) * p(1) / p(2) + p(3) + res.at(&(&i * n as i64 + &col0 + j)).load();
            let out = Val::f32(0.0).lt(&v).select(&v, 0.0f32);
            stores.push(k.store(&c.at(&(&i * n as i64 + &col0 + j)), &out));
            stores.push(k.store(&d.at(&(&col0 * m as i64 + &i + j * m as i64)), &out));
        }
    }
    let refs: Vec<&Val> = stores.iter().collect();
    let inner = k.end(&cb, &refs);
    k.end(&rb, &[&inner]);
    let sink = k.finish().unwrap();
    let src = cpu_renderer().render(&sink, Some("epilogue")).unwrap().src;
    assert!(src.contains("kiln_f32x16") && src.matches(" / ").count() <= 2 * rows, "not lifted:\n{src}");

    let (x, y, resv) = (randf(m * kk, 31), randf(kk * n, 32), randf(m * n, 33));
    let ps: Vec<Vec<f32>> =
        (0..4).map(|q| randf(n, 40 + q).iter().map(|v| if q == 2 { v.abs() + 0.5 } else { *v }).collect()).collect();
    let mut want_c = vec![0f32; m * n];
    let mut want_d = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let sum = (0..kk).fold(0.0f32, |acc, r| x[i * kk + r].mul_add(y[r * n + j], acc));
            let v = (sum - ps[0][j]) * ps[1][j] / ps[2][j] + ps[3][j] + resv[i * n + j];
            let out = if 0.0 < v { v } else { 0.0 };
            want_c[i * n + j] = out;
            want_d[j * m + i] = out;
        }
    }
    for pair in device().compiler_names() {
        let kernel = device().compile_with(&pair, &sink, Some("epilogue")).unwrap();
        let mut bufs: Vec<Buffer> = vec![from_f32s(&x), from_f32s(&y)];
        bufs.extend(ps.iter().map(|p| from_f32s(p)));
        bufs.push(from_f32s(&resv));
        bufs.push(device().buffer(Scalar::F32, m * n).unwrap());
        bufs.push(device().buffer(Scalar::F32, m * n).unwrap());
        let refs: Vec<&Buffer> = bufs.iter().collect();
        kernel.launch(&refs, &[]).unwrap();
        assert_eq!(f32s(&bufs[7]), want_c, "pair {pair}: C");
        assert_eq!(f32s(&bufs[8]), want_d, "pair {pair}: D");
    }
}

#[test]
fn softmax_rows() {
    let (rows, cols) = (6usize, 50usize);
    let mut k = KernelBuilder::new();
    let (x, out) = (k.param(0, Scalar::F32, (rows * cols) as i64), k.param(1, Scalar::F32, (rows * cols) as i64));
    let r = k.global(0, rows as i64);
    let base = &r * cols as i64;
    let c0 = k.range(cols as i64);
    let mx = k.acc(&Val::f32(f32::NEG_INFINITY), &[&c0]);
    let max = mx.update(&mx.get().max(x.at(&(&base + &c0)).load()));
    let c1 = k.range(cols as i64);
    let sm = k.acc(&Val::f32(0.0), &[&c1]);
    let sum = sm.update(&(sm.get() + (x.at(&(&base + &c1)).load() - &max).exp()));
    let c2 = k.range(cols as i64);
    let v = (x.at(&(&base + &c2)).load() - &max).exp() / &sum;
    let st = k.store(&out.at(&(&base + &c2)), &v);
    k.end(&c2, &[&st]);
    let kernel = compile(&k.finish().unwrap(), "softmax");
    let data: Vec<f32> = randf(rows * cols, 6).iter().map(|v| v * 10.0).collect();
    let (bx, bo) = (from_f32s(&data), device().buffer(Scalar::F32, rows * cols).unwrap());
    kernel.launch(&[&bx, &bo], &[]).unwrap();
    let got = f32s(&bo);
    for r in 0..rows {
        let row = &data[r * cols..(r + 1) * cols];
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let sum = row.iter().fold(0.0f32, |a, &b| a + (b - max).exp());
        for c in 0..cols {
            let want = (row[c] - max).exp() / sum;
            assert_eq!(got[r * cols + c], want, "row {r} col {c}");
        }
        let total: f32 = got[r * cols..(r + 1) * cols].iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}

#[test]
fn gated_loads_and_stores_do_not_touch_memory_outside_the_gate() {
    // x has only m elements; out[i] = i < m ? x[i] : -1, and only even i are stored.
    let mut k = KernelBuilder::new();
    let (n, m) = (k.var("n", 1, 1000), k.var("m", 1, 1000));
    let (x, out) = (k.param(0, Scalar::I32, &m), k.param(1, Scalar::I32, &n));
    let i = k.global(0, &n);
    let v = x.at(&i).load_gated(&i.lt(&m), -1);
    let even = (&i % 2).eq(0);
    k.store_gated(&out.at(&i), &v, &even);
    let kernel = compile(&k.finish().unwrap(), "gated");
    let (n, m) = (21usize, 8usize);
    // x sits at the very end of its allocation's use: the kernel must not read past it.
    let xs: Vec<i32> = (0..m as i32).map(|v| v * 10).collect();
    let bx = Buffer::from_slice(device().allocator(), &xs).unwrap();
    let bo = Buffer::from_slice(device().allocator(), &vec![7i32; n]).unwrap();
    kernel.launch(&[&bx, &bo], &[m as i64, n as i64]).unwrap();
    let want: Vec<i32> = (0..n)
        .map(|i| {
            if i % 2 == 1 {
                7
            } else if i < m {
                xs[i]
            } else {
                -1
            }
        })
        .collect();
    assert_eq!(bo.to_vec::<i32>().unwrap(), want);
}

#[test]
fn vector_loads_stores_vectorize_and_gep() {
    // Unaligned f32x4 loads at 4*i + 1, a VECTORIZE of four scalars, an f32x8 store, GEP lanes.
    let n = 5usize;
    let mut k = KernelBuilder::new();
    let (x, out, lanes) = (
        k.param(0, Scalar::F32, (4 * n + 4) as i64),
        k.param(1, Scalar::F32, (8 * n) as i64),
        k.param(2, Scalar::F32, n as i64),
    );
    let i = k.global(0, n as i64);
    let v4 = x.at_vec(&(&i * 4 + 1), 4).load();
    let scalars: Vec<Val> = (0..4).map(|l| x.at(&(&i * 4 + l)).load()).collect();
    let s4 = Val::vectorize(&scalars);
    let twice = &v4 * &Val::f32(2.0).broadcast(4);
    let eight = Val::vectorize(&[
        twice.gep(0),
        twice.gep(1),
        twice.gep(2),
        twice.gep(3),
        s4.gep(0),
        s4.gep(1),
        s4.gep(2),
        s4.gep(3),
    ]);
    k.store(&out.at_vec(&(&i * 8), 8), &eight);
    k.store(&lanes.at(&i), &(v4.gep(3) - s4.gep(0)));
    let kernel = compile(&k.finish().unwrap(), "vectors");
    let data = randf(4 * n + 4, 7);
    let (bx, bo, bl) =
        (from_f32s(&data), device().buffer(Scalar::F32, 8 * n).unwrap(), device().buffer(Scalar::F32, n).unwrap());
    kernel.launch(&[&bx, &bo, &bl], &[]).unwrap();
    let (got, got_l) = (f32s(&bo), f32s(&bl));
    for i in 0..n {
        for l in 0..4 {
            assert_eq!(got[8 * i + l], data[4 * i + 1 + l] * 2.0);
            assert_eq!(got[8 * i + 4 + l], data[4 * i + l]);
        }
        assert_eq!(got_l[i], data[4 * i + 4] - data[4 * i]);
    }
}

#[test]
fn odd_vector_widths_are_padded_but_touch_only_their_lanes() {
    // f32x3 loads and stores at 3*i: the element after the last vector must stay untouched.
    let n = 4usize;
    let mut k = KernelBuilder::new();
    let (x, out) = (k.param(0, Scalar::F32, (3 * n) as i64), k.param(1, Scalar::F32, (3 * n + 1) as i64));
    let i = k.global(0, n as i64);
    let v = x.at_vec(&(&i * 3), 3).load();
    let rr = k.range(2);
    let a = k.acc(&Val::f32(1.0).broadcast(3), &[&rr]);
    // acc = acc * (v + r): iteration 0 gives v, iteration 1 gives v * (v + 1).
    let r = a.update(&(a.get() * (&v + rr.cast(DType::F32).broadcast(3))));
    k.store(&out.at_vec(&(&i * 3), 3), &r);
    let kernel = compile(&k.finish().unwrap(), "vec3");
    let data = randf(3 * n, 8);
    let bo = from_f32s(&vec![42.0; 3 * n + 1]);
    kernel.launch(&[&from_f32s(&data), &bo], &[]).unwrap();
    let got = f32s(&bo);
    for (j, d) in data.iter().enumerate() {
        assert_eq!(got[j], d * (d + 1.0));
    }
    assert_eq!(got[3 * n], 42.0);
}

/// Non-temporal stores: on x86 the hinted vector and 4/8-byte scalar stores render to
/// `movnt*` behind an alignment check, other widths and types to plain stores, and the
/// kernel ends every call with a store fence (a kernel without hinted stores has none). All
/// of them store exactly, including a gated one, a padded f32x3 and a bf16.
#[test]
fn nontemporal_stores_render_per_width_and_fence_each_call() {
    use kiln_device::kiln_ir::StoreHint::NonTemporal;
    let n = 64usize;
    let mut k = KernelBuilder::new();
    let (x, out, o3, oh) = (
        k.param(0, Scalar::F32, n as i64),
        k.param(1, Scalar::F32, (2 * n) as i64),
        k.param(2, Scalar::F32, (3 * n / 8 + 1) as i64),
        k.param(3, Scalar::BF16, n as i64),
    );
    let i = k.special("gidx0", (n / 8) as i64);
    let store = |addr: Val, v: Val, gate: Option<&Val>| {
        let mut src = vec![addr.0, v.0];
        src.extend(gate.map(|g| g.0.clone()));
        UOp::new(Op::Store, DType::Void, NonTemporal.arg(), src)
    };
    let (v8, s) = (x.at_vec(&(&i * 8), 8).load(), x.at(&(&i * 8)).load());
    let effects = vec![
        store(out.at_vec(&(&i * 8), 8), &v8 + 1.0, None),
        store(out.at(&(&i + n as i64)), &s * 2.0, Some(&i.lt((n / 16) as i64))),
        store(o3.at_vec(&(&i * 3), 3), x.at_vec(&(&i * 8), 3).load(), None),
        store(oh.at(&(&i * 8)), s.cast(DType::Scalar(Scalar::BF16)), None),
    ];
    let sink = UOp::new(Op::Sink, DType::Void, Arg::None, effects);
    let src = cpu_renderer().render(&sink, Some("nt")).unwrap().src;
    if cfg!(target_arch = "x86_64") {
        for needle in ["kiln_stnt_f32x8(", "kiln_stnt_f32(", "vmovntdq %1, %0", "movnti %1, %0", "& 31) == 0"] {
            assert!(src.contains(needle), "{needle}\n{src}");
        }
    }
    assert!(!src.contains("kiln_stnt_f32x3") && !src.contains("kiln_stnt_bf16"), "{src}");
    assert!(src.ends_with("  }\n  kiln_sfence(); /* publish the non-temporal stores */\n}\n"), "{src}");
    let mut k = KernelBuilder::new();
    let y = k.param(0, Scalar::F32, 8i64);
    let j = k.special("gidx0", 8i64);
    k.store(&y.at(&j), &Val::f32(1.0));
    let plain = cpu_renderer().render(&k.finish().unwrap(), Some("plain")).unwrap().src;
    assert!(!plain.contains("sfence") && !plain.contains("movnt"), "{plain}");

    let kernel = compile(&sink, "nt");
    let data = randf(n, 11);
    let (bx, bo, b3, bh) = (
        from_f32s(&data),
        from_f32s(&vec![-1.0; 2 * n]),
        from_f32s(&vec![-1.0; 3 * n / 8 + 1]),
        device().buffer(Scalar::BF16, n).unwrap(),
    );
    bh.copyin(&vec![0u8; 2 * n]).unwrap();
    kernel.launch(&[&bx, &bo, &b3, &bh], &[]).unwrap();
    let (got, got3, goth) = (f32s(&bo), f32s(&b3), bytes_of(&bh));
    for g in 0..n / 8 {
        for l in 0..8 {
            assert_eq!(got[8 * g + l], data[8 * g + l] + 1.0);
        }
        assert_eq!(got[n + g], if g < n / 16 { data[8 * g] * 2.0 } else { -1.0 }, "gated store {g}");
        assert_eq!(&got3[3 * g..3 * g + 3], &data[8 * g..8 * g + 3]);
        let h = u16::from_le_bytes([goth[16 * g], goth[16 * g + 1]]);
        assert_eq!(h, bf16_bits(data[8 * g] as f64));
    }
    assert_eq!(got3[3 * n / 8], -1.0, "the padded f32x3 store wrote past its lanes");
}

#[test]
fn grouped_and_multi_axis_launch_indices() {
    // gidx0 x lidx0 over 16 elements, gidx1 over 3 rows: out[row, g*4+l] = row * 100 + g*4+l.
    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::I32, 48);
    let g = k.special("gidx0", 4);
    let l = k.special("lidx0", 4);
    let row = k.special("gidx1", 3);
    let col = &g * 4 + &l;
    k.store(&out.at(&(&row * 16 + &col)), &(&row * 100 + &col));
    let kernel = compile(&k.finish().unwrap(), "grid");
    let bo = device().buffer(Scalar::I32, 48).unwrap();
    kernel.launch(&[&bo], &[]).unwrap();
    let want: Vec<i32> = (0..48).map(|x| (x / 16) * 100 + x % 16).collect();
    assert_eq!(bo.to_vec::<i32>().unwrap(), want);
}

#[test]
fn every_chunk_split_gives_identical_results() {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 20);
    let (x, out) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
    let i = k.global(0, &n);
    let v = x.at(&i).load();
    k.store(&out.at(&i), &(&v * &v + i.cast(DType::F32)));
    let sink = k.finish().unwrap();
    let spec = cpu_renderer().render(&sink, Some("split")).unwrap();
    let compiled = CCompiler::detect().unwrap().compile(&spec).unwrap();
    let program = CpuProgram::load(&compiled).unwrap();
    for n in [1usize, 2, 3, 13, 1001] {
        let data = randf(n, 9);
        let want: Vec<f32> = data.iter().enumerate().map(|(i, v)| v * v + i as f32).collect();
        for chunks in [1usize, 2, 3, 4, 7, 2000] {
            let (bx, bo) = (from_f32s(&data), from_f32s(&vec![f32::NAN; n]));
            let views = [bx.raw().unwrap(), bo.raw().unwrap()];
            // SAFETY: both views are live buffers of n elements, n is within bounds.
            unsafe { program.execute_chunks(&views, &[n as i64], chunks).unwrap() };
            assert_eq!(f32s(&bo), want, "n = {n}, chunks = {chunks}");
        }
    }
}

#[test]
fn launches_from_many_threads_at_once() {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 22);
    let (x, out) = (k.param(0, Scalar::I32, &n), k.param(1, Scalar::I32, &n));
    let i = k.global(0, &n);
    k.store(&out.at(&i), &(x.at(&i).load() * 3 + 1));
    let kernel = compile(&k.finish().unwrap(), "threads");
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let kernel = kernel.clone();
            std::thread::spawn(move || {
                let n = 70_001 + t * 1000;
                let xs: Vec<i32> = (0..n as i32).collect();
                let bx = Buffer::from_slice(device().allocator(), &xs).unwrap();
                let bo = device().buffer(Scalar::I32, n).unwrap();
                for _ in 0..20 {
                    kernel.launch(&[&bx, &bo], &[n as i64]).unwrap();
                    assert!(bo.to_vec::<i32>().unwrap().iter().enumerate().all(|(i, v)| *v == 3 * i as i32 + 1));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn core_id_loops_and_carried_end_values() {
    // out[core] = the last x[r] seen in a loop (a carried END value) + core.
    let mut k = KernelBuilder::new();
    let (x, out) = (k.param(0, Scalar::I64, 10), k.param(1, Scalar::I64, 4));
    let core = k.special("core_id", 4);
    let r = k.range(10);
    let last = Val(UOp::new(Op::End, DType::I64, Arg::None, vec![r.0.clone(), x.at(&r).load().0.clone()]));
    k.store(&out.at(&core), &(last + core.cast(DType::I64)));
    let kernel = compile(&k.finish().unwrap(), "carry");
    let xs: Vec<i64> = (0..10).map(|v| v * v).collect();
    let bo = device().buffer(Scalar::I64, 4).unwrap();
    kernel.launch(&[&Buffer::from_slice(device().allocator(), &xs).unwrap(), &bo], &[]).unwrap();
    assert_eq!(bo.to_vec::<i64>().unwrap(), vec![81, 82, 83, 84]);
}

#[test]
fn accumulator_reads_see_the_value_from_the_start_of_the_iteration() {
    // Exclusive prefix sum: out[r] = acc (before this iteration's update), acc += x[r].
    let n = 9i64;
    let mut k = KernelBuilder::new();
    let (x, out, total) = (k.param(0, Scalar::I32, n), k.param(1, Scalar::I32, n), k.param(2, Scalar::I32, 1));
    let r = k.range(n);
    let acc = k.acc(&Val::int(0), &[&r]);
    let done = acc.update(&(acc.get() + x.at(&r).load()));
    let st = k.store(&out.at(&r), &acc.get());
    k.end(&r, &[&st]);
    k.store(&total.at(&Val::int(0)), &done);
    let kernel = compile(&k.finish().unwrap(), "scan");
    let xs: Vec<i32> = (1..=n as i32).collect();
    let (bo, bt) = (device().buffer(Scalar::I32, n as usize).unwrap(), device().buffer(Scalar::I32, 1).unwrap());
    kernel.launch(&[&Buffer::from_slice(device().allocator(), &xs).unwrap(), &bo, &bt], &[]).unwrap();
    let want: Vec<i32> = (0..n as i32).map(|r| r * (r + 1) / 2).collect();
    assert_eq!(bo.to_vec::<i32>().unwrap(), want);
    assert_eq!(bt.to_vec::<i32>().unwrap(), vec![45]);
}

#[test]
fn nested_reduce_over_two_ranges_and_awkward_variable_names() {
    // A variable named like a C keyword; a 2-range accumulator (sum over a block).
    let mut k = KernelBuilder::new();
    let w = k.var("for", 1, 64);
    let size = &w * &w;
    let (x, out) = (k.param(0, Scalar::F64, &size), k.param(1, Scalar::F64, 1));
    let (r0, r1) = (k.range(&w), k.range(&w));
    let acc = k.acc(&Val::constant(DType::F64, 0.5), &[&r0, &r1]);
    let total = acc.update(&(acc.get() + x.at(&(&r0 * &w + &r1)).load()));
    k.store(&out.at(&Val::int(0)), &total);
    let sink = k.finish().unwrap();
    let src = cpu_renderer().render(&sink, Some("block-sum")).unwrap().src;
    assert!(src.contains("var0_for") && src.contains("void block_sum_"), "{src}");
    let kernel = compile(&sink, "block-sum");
    let xs: Vec<f64> = (0..36).map(|v| v as f64 * 0.25).collect();
    let bo = device().buffer(Scalar::F64, 1).unwrap();
    kernel.launch(&[&Buffer::from_slice(device().allocator(), &xs).unwrap(), &bo], &[6]).unwrap();
    assert_eq!(bo.to_vec::<f64>().unwrap(), vec![0.5 + xs.iter().sum::<f64>()]);
}

#[test]
fn constants_of_every_dtype_are_exact() {
    let f32s_in = [0.1f64, -0.0, 1e-45, 3.4028234663852886e38, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 16777217.0];
    let f64s_in = [0.1f64, -0.0, 5e-324, f64::MAX, f64::INFINITY, f64::NEG_INFINITY, -f64::NAN, 1.0 / 3.0];
    // Constants must fit their dtype (65520 overflows f16, f32::MAX overflows bf16): the
    // largest finite values and the infinities instead.
    let f16s_in = [1.0f64, 65504.0, f64::INFINITY, 1e-8, 6e-8, -0.0, f64::NAN, 65519.0];
    let bf16s_in = [0.1f64, -0.0, 1e-45, 3.3895313892515355e38, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 16777217.0];
    let ints: [(Scalar, i64); 8] = [
        (Scalar::I64, i64::MIN),
        (Scalar::I64, i64::MAX),
        (Scalar::U64, -1),
        (Scalar::I32, i32::MIN as i64),
        (Scalar::U32, u32::MAX as i64),
        (Scalar::I8, -128),
        (Scalar::U8, 255),
        (Scalar::I16, -5),
    ];
    let mut k = KernelBuilder::new();
    let zero = Val::int(0);
    let mut slot = 0;
    let mut outs = Vec::new();
    let mut put = |k: &mut KernelBuilder, s: Scalar, vals: Vec<Arc<UOp>>| {
        let p = k.param(slot, s, vals.len() as i64);
        for (j, v) in vals.into_iter().enumerate() {
            k.store(&p.at(&Val::int(j as i64)), &Val(v));
        }
        outs.push(s);
        slot += 1;
    };
    put(&mut k, Scalar::F32, f32s_in.iter().map(|v| UOp::const_float(DType::F32, *v)).collect());
    put(&mut k, Scalar::F64, f64s_in.iter().map(|v| UOp::const_float(DType::F64, *v)).collect());
    put(&mut k, Scalar::F16, f16s_in.iter().map(|v| UOp::const_float(DType::F16, *v)).collect());
    put(&mut k, Scalar::BF16, bf16s_in.iter().map(|v| UOp::const_float(DType::Scalar(Scalar::BF16), *v)).collect());
    for (s, v) in ints {
        put(&mut k, s, vec![UOp::const_int(DType::Scalar(s), v)]);
    }
    put(&mut k, Scalar::Bool, vec![UOp::const_bool(true), UOp::const_bool(false)]);
    let _ = &zero;
    let kernel = compile(&k.finish().unwrap(), "consts");
    let bufs: Vec<Buffer> = kernel
        .spec
        .params
        .iter()
        .map(|p| {
            let n = kernel.spec.eval(&p.len, &[]).unwrap() as usize;
            device().buffer(p.scalar, n).unwrap()
        })
        .collect();
    let refs: Vec<&Buffer> = bufs.iter().collect();
    kernel.launch(&refs, &[]).unwrap();
    let got32 = bufs[0].to_vec::<f32>().unwrap();
    for (g, w) in got32.iter().zip(f32s_in) {
        assert!(g.to_bits() == (w as f32).to_bits() || (g.is_nan() && w.is_nan()), "{g} vs {w}");
    }
    let got64 = bufs[1].to_vec::<f64>().unwrap();
    for (g, w) in got64.iter().zip(f64s_in) {
        assert_eq!(g.to_bits(), w.to_bits(), "{g} vs {w}");
    }
    let h = bytes_of(&bufs[2]);
    let got16: Vec<u16> = h.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    assert_eq!(got16, f16s_in.iter().map(|v| f16_bits(*v)).collect::<Vec<_>>());
    assert_eq!(got16[..3], [0x3c00, 0x7bff, 0x7c00]);
    let b = bytes_of(&bufs[3]);
    let gotb: Vec<u16> = b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    assert_eq!(gotb, bf16s_in.iter().map(|v| bf16_bits(*v)).collect::<Vec<_>>());
    assert_eq!(gotb[3], 0x7f7f, "the largest finite bf16");
    let int_bytes: Vec<Vec<u8>> = bufs[4..12].iter().map(bytes_of).collect();
    assert_eq!(int_bytes[0], i64::MIN.to_le_bytes());
    assert_eq!(int_bytes[1], i64::MAX.to_le_bytes());
    assert_eq!(int_bytes[2], u64::MAX.to_le_bytes());
    assert_eq!(int_bytes[3], i32::MIN.to_le_bytes());
    assert_eq!(int_bytes[4], u32::MAX.to_le_bytes());
    assert_eq!(int_bytes[5], [0x80]);
    assert_eq!(int_bytes[6], [255]);
    assert_eq!(int_bytes[7], (-5i16).to_le_bytes());
    assert_eq!(bytes_of(&bufs[12]), [1, 0]);
}

/// One CPU device per C compiler on `PATH` (`gcc`, `clang`, `cc` and the default one, each
/// resolved file once) at the native instruction set and at SSE2 (x86-64): every spelling of
/// the f16 conversions (`_Float16`, the F16C builtins, the portable bits; see the renderer's
/// `F16_HELPERS`) that this machine's compilers produce.
fn devices_per_compiler() -> Vec<Arc<Device>> {
    let mut compilers: Vec<CCompiler> = Vec::new();
    let found = CCompiler::detect()
        .into_iter()
        .chain(["gcc", "clang", "cc"].iter().filter_map(|c| CCompiler::with_path(c).ok()));
    for cc in found {
        if !compilers.iter().any(|c| c.path() == cc.path()) {
            compilers.push(cc);
        }
    }
    let sse2 = kiln_cpu::IsaTarget::force(kiln_cpu::Isa::Sse2).ok();
    let mut devices = Vec::new();
    for cc in compilers {
        if let Some(isa) = sse2 {
            devices.push(kiln_cpu::open_with_compiler(cc.clone().with_isa(isa)).unwrap());
        }
        devices.push(kiln_cpu::open_with_compiler(cc).unwrap());
    }
    devices
}

/// CAST of every element of `input` (the bytes of `from` values) to `to` on `dev`, as bytes.
fn cast_on(dev: &Arc<Device>, from: Scalar, to: Scalar, input: &[u8]) -> Vec<u8> {
    let n = input.len() / from.size();
    let mut k = KernelBuilder::new();
    let (x, y) = (k.param(0, from, n as i64), k.param(1, to, n as i64));
    let i = k.global(0, n as i64);
    k.store(&y.at(&i), &x.at(&i).load().cast(DType::Scalar(to)));
    let name = format!("cast_{}_{}", from.name(), to.name());
    let kernel =
        dev.compile(&k.finish().unwrap(), Some(&name)).unwrap_or_else(|e| panic!("{}: {e}", dev.description()));
    let src = dev.buffer(from, n).unwrap();
    src.copyin(input).unwrap();
    let out = dev.buffer(to, n).unwrap();
    kernel.launch(&[&src, &out], &[]).unwrap();
    bytes_of(&out)
}

/// f16 ↔ f32 conversions (CAST), and f64 → f16/bf16 (one rounding, through round-to-odd), give
/// exactly the `half` crate's bits with every compiler and instruction set: all 65536 f16
/// values to f32, and to f16 every f16 value as an f32, each midpoint between neighbours and
/// the f32s on either side of it, the overflow edge, subnormals, and NaNs with payloads.
#[test]
fn f16_conversions_are_exact_with_every_compiler_and_isa() {
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    let mut f32s: Vec<f32> = Vec::new();
    let mut f64s: Vec<f64> = Vec::new();
    for &h in &halves {
        let (x, next) = (half::f16::from_bits(h), half::f16::from_bits(h.wrapping_add(1)));
        if !x.is_finite() {
            continue;
        }
        f32s.push(x.to_f32());
        if next.is_finite() || next.is_infinite() {
            // The midpoint of two neighbours has 12 significant bits: exact in f32.
            let mid = (x.to_f32() as f64 + next.to_f32() as f64) / 2.0;
            let mid = if next.is_infinite() { 65520.0f64.copysign(mid) } else { mid };
            let m = mid as f32;
            f32s.extend([m, f32::from_bits(m.to_bits() - 1), f32::from_bits(m.to_bits() + 1)]);
            let tiny = mid.abs() * f64::EPSILON * 64.0;
            f64s.extend([mid, mid + tiny, mid - tiny]);
        }
    }
    let nan_bits = [0x7f80_0001u32, 0x7fc0_0000, 0xffbf_ffff, 0x7f80_2000, 0xff80_1fff, 0x7fff_ffff];
    f32s.extend(nan_bits.map(f32::from_bits));
    f32s.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE, 1e-45, -1e-45, 65519.996, 1e-10, -0.0]);
    // bf16 ties and their neighbours in f64 (a plain f64 → f32 → bf16 would round twice).
    for e in -10i32..10 {
        let tie = 2f64.powi(e) * (1.0 + 2f64.powi(-8));
        f64s.extend([tie, tie + 2f64.powi(e - 40), tie - 2f64.powi(e - 40), -tie - 2f64.powi(e - 40)]);
    }
    f64s.extend([f64::NAN, f64::INFINITY, 1e300, -1e-300, 65519.99999999, 65520.0]);

    let le_f32: Vec<u8> = f32s.iter().flat_map(|f| f.to_le_bytes()).collect();
    let le_f64: Vec<u8> = f64s.iter().flat_map(|f| f.to_le_bytes()).collect();
    let le_f16: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
    let want_h: Vec<u32> = halves.iter().map(|h| half::f16::from_bits(*h).to_f32().to_bits()).collect();
    let want_f: Vec<u16> = f32s.iter().map(|f| half::f16::from_f32(*f).to_bits()).collect();
    let u16s = |b: Vec<u8>| -> Vec<u16> { b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect() };
    for dev in devices_per_compiler() {
        let what = dev.description().to_string();
        let got_h: Vec<u32> = cast_on(&dev, Scalar::F16, Scalar::F32, &le_f16)
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for (e, (g, w)) in got_h.iter().zip(&want_h).enumerate() {
            assert_eq!(g, w, "{what}: f16 {:#06x} as f32: got {g:#010x}, want {w:#010x}", halves[e]);
        }
        for (e, (g, w)) in u16s(cast_on(&dev, Scalar::F32, Scalar::F16, &le_f32)).iter().zip(&want_f).enumerate() {
            assert_eq!(g, w, "{what}: f32 {:#010x} ({:e}) as f16", f32s[e].to_bits(), f32s[e]);
        }
        for (to, name, inf) in [(Scalar::F16, "f16", 0x7c00), (Scalar::BF16, "bf16", 0x7f80)] {
            let got = u16s(cast_on(&dev, Scalar::F64, to, &le_f64));
            for (g, d) in got.iter().zip(&f64s) {
                let w = if to == Scalar::F16 { f16_bits(*d) } else { bf16_bits(*d) };
                let nan = d.is_nan() && (g & 0x7fff) > inf;
                assert!(*g == w || nan, "{what}: f64 {d:e} as {name}: got {g:#06x}, want {w:#06x}");
            }
        }
        // Arithmetic goes through the same conversions: the conformance suite's f16 ALU
        // check, scalar and on vectors, with this compiler.
        for width in [1, 4] {
            programs::alu_lanes(&dev, Scalar::F16, width).unwrap_or_else(|e| panic!("{}: {e}", dev.description()));
        }
    }
}

/// Vector kernels include no header (`<immintrin.h>` alone costs more compile time than a
/// kernel): FMA and MAX/MIN on 16-, 32- and 64-byte vectors are the x86 builtins.
#[test]
fn vector_kernels_include_no_header_and_use_the_x86_builtins() {
    for (s, w) in [(Scalar::F32, 16), (Scalar::F32, 8), (Scalar::F64, 8), (Scalar::F64, 4)] {
        let mut k = KernelBuilder::new();
        let ins: Vec<Val> = (0..3).map(|slot| k.param(slot, s, 64)).collect();
        let (out, mask) = (k.param(3, s, 64), k.param(4, Scalar::Bool, 64));
        let i = k.global(0, 64 / w as i64);
        let at = &i * w as i64;
        let [a, b, c] = [0, 1, 2].map(|j| ins[j].at_vec(&at, w).load());
        let lt = a.lt(&b);
        let r = lt.select(&a.mul_acc(&b, &c), a.max(&b).min(&c)).exp();
        k.store(&out.at_vec(&at, w), &r);
        k.store(&mask.at_vec(&at, w), &a.ne(&c));
        let src = cpu_renderer().render(&k.finish().unwrap(), Some("wide")).unwrap().src;
        assert!(!src.contains("#include"), "{s}x{w}:\n{src}");
        let pd = if s == Scalar::F32 { "ps" } else { "pd" };
        let suffix = match w as usize * s.size() {
            64 => "512",
            32 => "256",
            _ => "",
        };
        for builtin in [format!("__builtin_ia32_vfmadd{pd}{suffix}"), format!("__builtin_ia32_max{pd}{suffix}")] {
            assert!(src.contains(&builtin), "{s}x{w}: no `{builtin}`:\n{src}");
        }
    }
}

// ---------------------------------------------------------------- vector math

/// A float lane type for the vector math sweep.
trait SweepFloat: Copy + std::fmt::Debug + PartialEq {
    const S: Scalar;
    fn enc(v: &[Self]) -> Vec<u8>;
    fn dec(b: &[u8]) -> Vec<Self>;
    /// Rust's (libm's) EXP, EXP2, LOG or LOG2 of `x`.
    fn libm(op: Op, x: Self) -> Self;
    /// Exponent range edges where exp/exp2 overflow, go subnormal and underflow: windows
    /// `(lo, hi)` the sweep samples densely.
    const EDGES: [(f64, f64); 4];
    fn from_f64(v: f64) -> Self;
    /// A value from the low bits of `bits` (any pattern: NaN, inf, subnormal).
    fn from_raw(bits: u64) -> Self;
    fn is_nan(self) -> bool;
    /// Whether the value is an integer (0 included), infinite or NaN.
    fn integral(self) -> bool;
    /// Position on the line of floats where neighbours differ by one (+0 and -0 both at 0).
    fn ordered(self) -> i128;
}

impl SweepFloat for f32 {
    const S: Scalar = Scalar::F32;
    fn enc(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn dec(b: &[u8]) -> Vec<Self> {
        b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn libm(op: Op, x: Self) -> Self {
        match op {
            Op::Exp => x.exp(),
            Op::Exp2 => x.exp2(),
            Op::Log => x.ln(),
            _ => x.log2(),
        }
    }
    const EDGES: [(f64, f64); 4] = [(85.0, 90.0), (-110.0, -85.0), (125.0, 130.0), (-155.0, -120.0)];
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn from_raw(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn integral(self) -> bool {
        self.is_nan() || self == self.trunc()
    }
    fn ordered(self) -> i128 {
        let b = self.to_bits();
        if b >> 31 != 0 { -((b & 0x7fff_ffff) as i128) } else { b as i128 }
    }
}

impl SweepFloat for f64 {
    const S: Scalar = Scalar::F64;
    fn enc(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn dec(b: &[u8]) -> Vec<Self> {
        b.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn libm(op: Op, x: Self) -> Self {
        match op {
            Op::Exp => x.exp(),
            Op::Exp2 => x.exp2(),
            Op::Log => x.ln(),
            _ => x.log2(),
        }
    }
    const EDGES: [(f64, f64); 4] = [(705.0, 712.0), (-750.0, -700.0), (1020.0, 1026.0), (-1080.0, -1018.0)];
    fn from_f64(v: f64) -> Self {
        v
    }
    fn from_raw(bits: u64) -> Self {
        f64::from_bits(bits)
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn integral(self) -> bool {
        self.is_nan() || self == self.trunc()
    }
    fn ordered(self) -> i128 {
        let b = self.to_bits();
        if b >> 63 != 0 { -((b & !(1u64 << 63)) as i128) } else { b as i128 }
    }
}

/// Inputs with special results: signed zeros, infinities, NaN, exact powers of two, inputs far
/// past the overflow/underflow edges, a subnormal (f64) or zero (f32).
const VMATH_SPECIALS: [f64; 16] = [
    0.0,
    -0.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    1.0,
    -1.0,
    2.0,
    0.5,
    8.0,
    1e4,
    -1e4,
    3e38,
    -3e38,
    1e-310,
    -5.0,
];

/// `n` sweep inputs: the specials first, then a mix of a uniform sweep of [-200, 200], random
/// bit patterns (every exponent, subnormals, inf, NaN), values near 0 and near 1, and the
/// overflow/underflow edges of [`SweepFloat::EDGES`].
fn vmath_inputs<T: SweepFloat>(n: usize) -> Vec<T> {
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut v: Vec<T> = VMATH_SPECIALS.iter().map(|&x| T::from_f64(x)).collect();
    while v.len() < n {
        let r = next();
        let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
        let x = match r % 8 {
            0..=2 => T::from_f64(u * 400.0 - 200.0),
            3 => T::from_raw(next()),
            4 => T::from_f64((u - 0.5) * 2f64.powi(-(((r >> 8) % 40) as i32))),
            5 => T::from_f64(1.0 + (u - 0.5) * 2f64.powi(-(((r >> 8) % 30) as i32))),
            6 => {
                let (lo, hi) = T::EDGES[(r >> 8) as usize % 4];
                T::from_f64(lo + u * (hi - lo))
            }
            _ => T::from_raw(next() >> 1),
        };
        v.push(x);
    }
    v.truncate(n);
    v
}

/// EXP, EXP2, LOG and LOG2 on `width`-lane vectors of `T` over `n` sweep inputs, against
/// Rust's (libm's) scalar functions: NaN exactly where libm gives NaN; results of the specials
/// that are integers (0 and 1 included), infinite or NaN exactly libm's; everything else within
/// `max_ulps[op]` (in the order EXP, EXP2, LOG, LOG2).
fn sweep_vector_math<T: SweepFloat>(width: u8, n: usize, max_ulps: [u64; 4]) {
    let ops = [Op::Exp, Op::Exp2, Op::Log, Op::Log2];
    let mut k = KernelBuilder::new();
    let x = k.param(0, T::S, n as i64);
    let i = k.global(0, (n / width as usize) as i64);
    let idx = &i * width as i64;
    let v = x.at_vec(&idx, width).load();
    for (slot, op) in ops.iter().enumerate() {
        let out = k.param(1 + slot, T::S, n as i64);
        k.store(&out.at_vec(&idx, width), &node(*op, v.dtype(), &[&v]));
    }
    let kernel = compile(&k.finish().unwrap(), &format!("vmath_{}x{width}", T::S.name()));
    let xs = vmath_inputs::<T>(n);
    let mut bufs = vec![buffer_bytes(T::S, &T::enc(&xs))];
    for _ in ops {
        bufs.push(device().buffer(T::S, n).unwrap());
    }
    let refs: Vec<&Buffer> = bufs.iter().collect();
    kernel.launch(&refs, &[]).unwrap();
    for (slot, op) in ops.iter().enumerate() {
        let got = T::dec(&bytes_of(&bufs[1 + slot]));
        let mut worst = (0u64, xs[0]);
        for (e, (&x, &g)) in xs.iter().zip(&got).enumerate() {
            let want = T::libm(*op, x);
            let d = if g.is_nan() || want.is_nan() {
                assert!(g.is_nan() && want.is_nan(), "{op} {}x{width}: f({x:?}) = {g:?}, want {want:?}", T::S.name());
                0
            } else {
                (g.ordered() - want.ordered()).unsigned_abs() as u64
            };
            if e < VMATH_SPECIALS.len() && want.integral() {
                assert!(d == 0, "{op} {}x{width}: f({x:?}) = {g:?}, want exactly {want:?}", T::S.name());
            }
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(
            worst.0 <= max_ulps[slot],
            "{op} {}x{width}: {} ulps from libm at x = {:?} (bound {})",
            T::S.name(),
            worst.0,
            worst.1,
            max_ulps[slot]
        );
    }
}

/// The vector math functions of the CPU dialect stay within 2 ulps of libm (1 for the f32
/// logarithms), on the softmax bench width, a native width, a padded odd width and a width
/// wider than the registers. Their own error against correctly rounded results is at most
/// 1.23 ulp (f32, every input) and 1.21 ulp (f64, 20M samples); see the renderer's templates.
#[test]
fn vector_exp_and_log_match_libm_within_ulps() {
    sweep_vector_math::<f32>(8, 1 << 20, [2, 2, 1, 1]);
    sweep_vector_math::<f32>(4, 1 << 16, [2, 2, 1, 1]);
    sweep_vector_math::<f32>(3, 3 << 14, [2, 2, 1, 1]);
    sweep_vector_math::<f32>(16, 1 << 16, [2, 2, 1, 1]);
    sweep_vector_math::<f64>(4, 1 << 20, [2, 2, 2, 2]);
    sweep_vector_math::<f64>(2, 1 << 16, [2, 2, 2, 2]);
    sweep_vector_math::<f64>(3, 3 << 14, [2, 2, 2, 2]);
}

// ---------------------------------------------------------------- errors

#[test]
fn launch_rejects_wrong_buffers_and_values() {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 100);
    let (a, b) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
    let i = k.global(0, &n);
    k.store(&b.at(&i), &a.at(&i).load());
    let kernel = compile(&k.finish().unwrap(), "copy");
    let (x, y) = (device().buffer(Scalar::F32, 10).unwrap(), device().buffer(Scalar::F32, 10).unwrap());
    let small = device().buffer(Scalar::F32, 5).unwrap();
    let ints = device().buffer(Scalar::I32, 10).unwrap();
    assert!(matches!(kernel.launch(&[&x], &[10]), Err(Error::Launch(m)) if m.contains("2 buffer")));
    assert!(matches!(kernel.launch(&[&x, &small], &[10]), Err(Error::Launch(m)) if m.contains("5 elements")));
    assert!(matches!(kernel.launch(&[&x, &ints], &[10]), Err(Error::Launch(m)) if m.contains("i32")));
    assert!(matches!(kernel.launch(&[&x, &y], &[101]), Err(Error::Ir(_))));
    assert!(matches!(kernel.launch(&[&x, &y], &[]), Err(Error::Launch(_))));
    kernel.launch(&[&x, &y], &[10]).unwrap();
}

#[test]
fn missing_symbol_and_bad_source_are_typed_errors() {
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, 4);
    let i = k.global(0, 4);
    k.store(&a.at(&i), &Val::f32(1.0));
    let sink = k.finish().unwrap();
    let spec = cpu_renderer().render(&sink, Some("real_name")).unwrap();
    let cc = CCompiler::detect().unwrap();
    let compiled = cc.compile(&spec).unwrap();
    let renamed =
        CompiledSpec { spec: Arc::new(ProgramSpec { name: "other_name".into(), ..spec.clone() }), ..compiled.clone() };
    match CpuProgram::load(&renamed) {
        Err(Error::Load(m)) => assert!(m.contains("other_name"), "{m}"),
        other => panic!("expected a load error, got {other:?}"),
    }
    let garbage = CompiledSpec { bytes: b"not a library".to_vec(), ..compiled };
    assert!(matches!(CpuProgram::load(&garbage), Err(Error::Load(_))));

    let bad = ProgramSpec { src: spec.src.replace("1.0f", "1.0f +* 2"), ..spec };
    match cc.compile(&bad) {
        Err(Error::Compile { log, line: Some(line), .. }) => {
            assert!(line.contains("+* 2"), "{line}");
            assert!(!log.is_empty());
        }
        other => panic!("expected a compile error with a line, got {other:?}"),
    }
    assert!(matches!(CCompiler::with_path("/nonexistent/cc"), Err(Error::CompilerMissing(_))));
}

#[test]
fn program_stages_inside_a_kernel_cannot_be_rendered() {
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, 4);
    let i = k.global(0, 4);
    k.store(&a.at(&i), &Val::f32(1.0));
    let sink = k.finish().unwrap();
    let spec = ProgramSpec::from_sink("p", String::new(), kiln_cpu::CPU.clone(), &sink).unwrap();
    let program = spec.to_uop(None).unwrap();
    let weird = UOp::new(Op::Sink, DType::Void, Arg::None, vec![sink.src()[0].clone(), program]);
    assert!(cpu_renderer().render(&weird, None).is_err());
    assert!(matches!(cpu_renderer().render(&sink.src()[0], None), Err(Error::Render(_))));
}

#[test]
fn bind_after_and_a_two_phase_kernel() {
    // Phase 1 fills tmp[r] = x[r] * 2 in a loop; phase 2 reads tmp only after that loop
    // (AFTER), reversed, plus a bound variable (BIND evaluates to its bound value).
    let n = 6i64;
    let mut k = KernelBuilder::new();
    let m = k.var("m", 0, 100);
    let (x, tmp, out) = (k.param(0, Scalar::I32, n), k.param(1, Scalar::I32, n), k.param(2, Scalar::I32, n));
    let r = k.range(n);
    let st = k.store(&tmp.at(&r), &(x.at(&r).load() * 2));
    let filled = k.end(&r, &[&st]);
    let tmp_ready = tmp.after(&[&filled]);
    let bound = Val(UOp::new(Op::Bind, DType::INDEX, Arg::None, vec![m.0.clone(), UOp::index_const(7)]));
    let s = k.range(n);
    let v = tmp_ready.at(&(Val::int(n - 1) - &s)).load() + &bound;
    let st2 = k.store(&out.at(&s), &v);
    k.end(&s, &[&st2]);
    let kernel = compile(&k.finish().unwrap(), "two_phase");
    let xs: Vec<i32> = (1..=n as i32).collect();
    let (bt, bo) =
        (device().buffer(Scalar::I32, n as usize).unwrap(), device().buffer(Scalar::I32, n as usize).unwrap());
    kernel.launch(&[&Buffer::from_slice(device().allocator(), &xs).unwrap(), &bt, &bo], &[7]).unwrap();
    let want: Vec<i32> = xs.iter().rev().map(|v| v * 2 + 7).collect();
    assert_eq!(bo.to_vec::<i32>().unwrap(), want);
}

#[test]
fn vector_where_with_a_scalar_condition_and_gated_vector_loads() {
    let n = 4usize;
    let mut k = KernelBuilder::new();
    let (x, out) = (k.param(0, Scalar::F32, (4 * n) as i64), k.param(1, Scalar::F32, (4 * n) as i64));
    let i = k.global(0, n as i64);
    let in_range = i.lt(2);
    let v = x.at_vec(&(&i * 4), 4).load_gated(&in_range, Val::f32(-1.0).broadcast(4));
    let odd = (&i % 2).eq(1);
    let r = odd.select(&(&v * &v), &v);
    k.store(&out.at_vec(&(&i * 4), 4), &r);
    let kernel = compile(&k.finish().unwrap(), "vwhere");
    let data = randf(4 * n, 10);
    let bo = device().buffer(Scalar::F32, 4 * n).unwrap();
    kernel.launch(&[&from_f32s(&data), &bo], &[]).unwrap();
    let want: Vec<f32> = (0..4 * n)
        .map(|e| {
            let i = e / 4;
            let v = if i < 2 { data[e] } else { -1.0 };
            if i % 2 == 1 { v * v } else { v }
        })
        .collect();
    assert_eq!(f32s(&bo), want);
}

#[test]
fn a_carried_end_value_of_a_loop_that_never_runs_is_zero() {
    let mut k = KernelBuilder::new();
    let m = k.var("m", 0, 10);
    let (x, out) = (k.param(0, Scalar::F32, 10), k.param(1, Scalar::F32, 1));
    let r = k.range(&m);
    let last = Val(UOp::new(Op::End, DType::F32, Arg::None, vec![r.0.clone(), x.at(&r).load().0.clone()]));
    k.store(&out.at(&Val::int(0)), &last);
    let kernel = compile(&k.finish().unwrap(), "zero_trip");
    let bx = from_f32s(&(0..10).map(|v| v as f32 + 0.5).collect::<Vec<_>>());
    let bo = from_f32s(&[99.0]);
    kernel.launch(&[&bx, &bo], &[0]).unwrap();
    assert_eq!(f32s(&bo), vec![0.0]);
    kernel.launch(&[&bx, &bo], &[4]).unwrap();
    assert_eq!(f32s(&bo), vec![3.5]);
}

/// `a[i] = 1` for `i < n` into a declared 4: under the default policy a launch past 4 runs
/// guarded and fails with the fault; a device set to refuse compiles kernels without a
/// guarded form, and refuses the launch before anything runs.
#[test]
fn the_bounds_policy_picks_guard_or_refuse() {
    let dev = kiln_cpu::open(&kiln_cpu::CPU).unwrap();
    let store4 = || {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 64);
        let a = k.param(0, Scalar::F32, 4);
        let i = k.global(0, &n);
        k.store(&a.at(&i), &Val::f32(1.0));
        k.finish().unwrap()
    };
    let buf = Buffer::from_slice(dev.allocator(), &[0f32; 64]).unwrap();
    assert_eq!(dev.bounds_policy(), kiln_device::BoundsPolicy::Guard);
    let guarded = dev.compile(&store4(), Some("policy_store4")).unwrap();
    assert!(guarded.has_fallback());
    let e = guarded.launch(&[&buf], &[8]).unwrap_err();
    assert!(matches!(&e, Error::OutOfBounds { access, .. } if access.guarded), "{e}");
    assert_eq!(buf.to_vec::<f32>().unwrap()[..5], [1.0, 1.0, 1.0, 1.0, 0.0]);

    dev.set_bounds_policy(kiln_device::BoundsPolicy::Refuse);
    let strict = dev.compile(&store4(), Some("policy_store4")).unwrap();
    assert!(!strict.has_fallback());
    buf.copy_from_slice(&[0f32; 64]).unwrap();
    let e = strict.launch(&[&buf], &[8]).unwrap_err();
    assert!(matches!(&e, Error::OutOfBounds { access, .. } if !access.guarded && access.last == 7), "{e}");
    assert_eq!(buf.to_vec::<f32>().unwrap(), [0.0; 64], "a refused launch ran");
    strict.launch(&[&buf], &[4]).unwrap();
}

/// The WMMA micro-tiles with every compiler on `PATH`, at the native instruction set (with
/// AVX512-BF16's and AVX512-FP16's instructions where this CPU has them) and at SSE2 (the
/// portable body), against the conformance suite's reference.
#[test]
fn wmma_tiles_match_the_reference_with_every_compiler_and_isa() {
    use Scalar::{BF16, F16, F32};
    for dev in devices_per_compiler() {
        for (input, acc) in [(F32, F32), (F16, F32), (BF16, F32), (F16, F16), (BF16, BF16)] {
            if let Err(e) = kiln_conformance::suite::matrix::tile(&dev, input, acc) {
                panic!("{input}→{acc} on {}: {e}", dev.description());
            }
        }
    }
}
