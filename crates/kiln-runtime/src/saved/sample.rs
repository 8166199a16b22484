//! A small model recorded as a plan, to save and load in tests, examples and benchmarks of
//! saved plans, with a host reference of what it computes: a two-layer perceptron
//! `y = relu(x·W1 + b1)·W2 + b2` over a batch of rows, the batch a plan variable.

use kiln_device::kiln_ir::{KernelBuilder, Scalar, UOp, Val};
use kiln_device::{Buffer, Device, Result};
use std::sync::Arc;

use super::format::Dim;
use super::save::{PlanInterface, PlanTensor};
use crate::plan::ExecutionPlan;

/// The sizes of a [`SampleMlp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// The largest batch (the plan variable `batch` ranges over 1..=this).
    pub max_batch: usize,
    /// Features per input row.
    pub inputs: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Features per output row.
    pub outputs: usize,
}

impl Default for MlpShape {
    fn default() -> Self {
        MlpShape { max_batch: 8, inputs: 16, hidden: 32, outputs: 8 }
    }
}

impl MlpShape {
    /// The model's weights, the same for every model of this shape: W1 (`inputs × hidden`),
    /// b1, W2 (`hidden × outputs`), b2, row-major.
    pub fn weights(&self) -> [Vec<f32>; 4] {
        let MlpShape { inputs, hidden, outputs, .. } = *self;
        [weights(inputs * hidden, 1), weights(hidden, 2), weights(hidden * outputs, 3), weights(outputs, 4)]
    }

    /// The model on the host, for `x` of `x.len() / inputs` rows: each dot product summed in
    /// order with one rounding per fused multiply-add, as the kernels do where the target has
    /// FMA (others round twice: compare within a tolerance).
    pub fn reference(&self, x: &[f32]) -> Vec<f32> {
        let MlpShape { inputs, hidden, outputs, .. } = *self;
        let w = self.weights();
        let rows = x.len() / inputs.max(1);
        let layer = |a: &[f32], w: &[f32], b: &[f32], k: usize, n: usize, relu: bool| -> Vec<f32> {
            (0..rows * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    let dot = (0..k).fold(0.0f32, |acc, r| a[i * k + r].mul_add(w[r * n + j], acc));
                    let v = dot + b[j];
                    if relu { v.max(0.0) } else { v }
                })
                .collect()
        };
        let h = layer(x, &w[0], &w[1], inputs, hidden, true);
        layer(&h, &w[2], &w[3], hidden, outputs, false)
    }
}

/// A two-layer perceptron recorded as an [`ExecutionPlan`]: four launches (a matmul, a bias with
/// relu, a matmul, a bias) over constant weights, input `x` of shape `[batch, inputs]`, output
/// `y` of shape `[batch, outputs]`.
pub struct SampleMlp {
    /// The recorded plan.
    pub plan: ExecutionPlan,
    /// Its input `x` and output `y`, for [`SavedPlan::from_plan`](super::SavedPlan::from_plan).
    pub interface: PlanInterface,
    /// The sizes (and through them the weights, [`MlpShape::weights`]).
    pub shape: MlpShape,
}

/// Deterministic weights: small multiples of 1/64 in [-0.25, 0.25].
fn weights(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 + seed * 11) % 33) as f32 / 64.0 - 0.25).collect()
}

/// `C[m, n] = A[m, k] · B[k, n]` with `m` the variable `batch`.
fn matmul(k: usize, n: usize, max_batch: usize) -> std::result::Result<Arc<UOp>, kiln_device::kiln_ir::IrError> {
    let mut b = KernelBuilder::new();
    let m = b.var("batch", 1, max_batch as i64);
    let (pa, pb, pc) =
        (b.param(0, Scalar::F32, &m * k), b.param(1, Scalar::F32, k * n), b.param(2, Scalar::F32, &m * n));
    let (i, j) = (b.global(0, &m), b.global(1, n));
    let r = b.range(k);
    let acc = b.acc(&Val::f32(0.0), &[&r]);
    let prod = pa.at(&(&i * k + &r)).load().mul_acc(&pb.at(&(&r * n + &j)).load(), &acc.get());
    let total = acc.update(&prod);
    b.store(&pc.at(&(&i * n + &j)), &total);
    b.finish()
}

/// `Y[m, n] = X[m, n] + bias[n]`, then `max(·, 0)` when `relu`.
fn bias(n: usize, relu: bool, max_batch: usize) -> std::result::Result<Arc<UOp>, kiln_device::kiln_ir::IrError> {
    let mut b = KernelBuilder::new();
    let m = b.var("batch", 1, max_batch as i64);
    let (px, pb, py) = (b.param(0, Scalar::F32, &m * n), b.param(1, Scalar::F32, n), b.param(2, Scalar::F32, &m * n));
    let (i, j) = (b.global(0, &m), b.global(1, n));
    let mut v = px.at(&(&i * n + &j)).load() + pb.at(&j).load();
    if relu {
        v = v.max(0.0f32);
    }
    b.store(&py.at(&(&i * n + &j)), &v);
    b.finish()
}

impl SampleMlp {
    /// Records the model on `device` with its buffers for `shape.max_batch` rows, the plan
    /// variable `batch` recorded as `batch`.
    ///
    /// # Errors
    /// The device's errors (compiling, allocating, recording).
    pub fn record(device: &Device, shape: MlpShape, batch: usize) -> Result<SampleMlp> {
        let MlpShape { max_batch, inputs, hidden, outputs } = shape;
        let sinks = [
            (matmul(inputs, hidden, max_batch)?, "mlp_matmul1"),
            (bias(hidden, true, max_batch)?, "mlp_bias_relu"),
            (matmul(hidden, outputs, max_batch)?, "mlp_matmul2"),
            (bias(outputs, false, max_batch)?, "mlp_bias"),
        ];
        let batch_list: Vec<_> = sinks.iter().map(|(s, n)| (s.clone(), Some(*n))).collect();
        let kernels = device.compile_many(&batch_list).into_iter().collect::<Result<Vec<_>>>()?;
        let w = shape.weights();
        let constant = |data: &[f32]| -> Result<Buffer> {
            let b = device.buffer(Scalar::F32, data.len())?;
            b.copy_from_slice(data)?;
            Ok(b)
        };
        let (w1, b1, w2, b2) = (constant(&w[0])?, constant(&w[1])?, constant(&w[2])?, constant(&w[3])?);
        let x = device.buffer(Scalar::F32, max_batch * inputs)?;
        let (h, a) = (device.buffer(Scalar::F32, max_batch * hidden)?, device.buffer(Scalar::F32, max_batch * hidden)?);
        let (o, y) =
            (device.buffer(Scalar::F32, max_batch * outputs)?, device.buffer(Scalar::F32, max_batch * outputs)?);
        let mut plan = ExecutionPlan::new(device)?;
        let vars = [("batch", batch as i64)];
        plan.exec(&kernels[0], &[&x, &w1, &h], &vars)?;
        plan.exec(&kernels[1], &[&h, &b1, &a], &vars)?;
        plan.exec(&kernels[2], &[&a, &w2, &o], &vars)?;
        plan.exec(&kernels[3], &[&o, &b2, &y], &vars)?;
        let interface = PlanInterface {
            inputs: vec![PlanTensor::new("x", &x).with_shape([Dim::from("batch"), Dim::Fixed(inputs as u64)])],
            outputs: vec![PlanTensor::new("y", &y).with_shape([Dim::from("batch"), Dim::Fixed(outputs as u64)])],
        };
        Ok(SampleMlp { plan, interface, shape })
    }
}
