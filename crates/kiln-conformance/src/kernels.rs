//! Small kernels the queue, plan and error checks share. They are hash-consed graphs, so
//! every check that builds one gets the same kernel out of the device's cache.

use std::sync::Arc;

use kiln_device::kiln_ir::{KernelBuilder, Scalar, UOp};
use kiln_device::{Device, Error, Kernel};

use crate::Failure;

/// The largest `n` the shared kernels accept.
pub const MAX_N: i64 = 1024;

/// `out[i] = x[i] * mul + add` over f32 for `i < n` (variable `n` in `[1, MAX_N]`).
/// Slots: 0 = `x` (n elements), 1 = `out` (n elements).
pub fn affine(mul: f32, add: f32) -> Result<Arc<UOp>, Failure> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, MAX_N);
    let x = k.param(0, Scalar::F32, &n);
    let out = k.param(1, Scalar::F32, &n);
    let i = k.global(0, &n);
    let v = x.at(&i).load() * mul + add;
    k.store(&out.at(&i), &v);
    Ok(k.finish()?)
}

/// `x[i] = x[i] * mul + add` in place over f32 for `i < n`. Slot 0 = `x` (n elements).
pub fn affine_in_place(mul: f32, add: f32) -> Result<Arc<UOp>, Failure> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, MAX_N);
    let x = k.param(0, Scalar::F32, &n);
    let i = k.global(0, &n);
    let v = x.at(&i).load() * mul + add;
    k.store(&x.at(&i), &v);
    Ok(k.finish()?)
}

/// Compiles `sink` on `dev` (through the device's kernel cache).
pub fn compile(dev: &Device, sink: &Arc<UOp>, name: &str) -> Result<Kernel, Failure> {
    Ok(dev.compile(sink, Some(name))?)
}

/// Compiles a kernel that uses an optional dtype (`f64`, `f16`, `bf16`): a renderer that
/// says it cannot express the kernel ([`Error::Render`]) means "not supported here" and
/// gives `None` after printing a note; any other error is a failure.
pub fn compile_optional(dev: &Device, sink: &Arc<UOp>, name: &str, dtype: Scalar) -> Result<Option<Kernel>, Failure> {
    match dev.compile(sink, Some(name)) {
        Ok(k) => Ok(Some(k)),
        Err(Error::Render(m)) => {
            println!("note: {} does not support {dtype} kernels ({name}): {m}", dev.spec());
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}
