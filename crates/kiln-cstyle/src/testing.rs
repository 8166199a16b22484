//! Kernels and checks the backends' renderer tests share (feature `testing`), so each
//! backend's tests state only its own spellings.

use std::sync::Arc;

use kiln_ir::{KernelBuilder, Scalar, UOp, parse_kernel};

/// `examples/kernels/matmul_tiled.kiln`: work-group local memory, two barriers and an IF
/// block.
pub fn tiled_matmul() -> Arc<UOp> {
    match parse_kernel(include_str!("../../../examples/kernels/matmul_tiled.kiln")) {
        Ok(k) => k,
        Err(e) => panic!("examples/kernels/matmul_tiled.kiln does not parse: {e}"),
    }
}

/// `data1[i] = data0[i] < 1` (f32 in, bool out) for `i = gidx0 * 4 + lidx0`, with the
/// variable `n` and `gidx0 < n / 4`: a grouped launch, a variable and a bool buffer.
pub fn grouped_compare() -> Arc<UOp> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 20);
    let (a, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::Bool, &n));
    let i = k.special("gidx0", &n / 4) * 4 + k.special("lidx0", 4);
    k.store(&c.at(&i), &a.at(&i).load().lt(1.0));
    match k.finish() {
        Ok(k) => k,
        Err(e) => panic!("the grouped compare kernel is invalid: {e}"),
    }
}

/// Checks the source of [`tiled_matmul`]: the local memory is declared as `declaration`
/// before the first launch index (`launch_index`), and both barriers are `barrier`.
pub fn assert_work_groups(src: &str, declaration: &str, launch_index: &str, barrier: &str) {
    let decl = src.find(declaration).unwrap_or_else(|| panic!("no `{declaration}` in\n{src}"));
    assert!(decl < src.find(launch_index).unwrap_or(0), "declared before the launch indices:\n{src}");
    assert_eq!(src.matches(barrier).count(), 2, "{src}");
    assert!(src.contains("if (alu") && src.contains("(lmem1)["), "{src}");
}
