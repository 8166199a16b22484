//! The safe path never runs a kernel that could touch memory outside its buffers:
//! `Kernel::launch`, a queue's `exec` and an execution plan (when recording, and when a run
//! binds new values) refuse such a launch with `Error::OutOfBounds` naming the access, and
//! run the same kernel when the values keep every access inside its buffer.
//!
//! The two kernels are issue 9's. Every buffer really holds `CAP` elements, more than the
//! kernels declare, so that without the check an overrun would stay inside the allocation
//! and the test fails on its assertion instead of corrupting memory.

use std::sync::Arc;

use kiln_device::kiln_ir::{DType, KernelBuilder, Scalar, Val};
use kiln_device::{Buffer, Device, Error, Kernel};
use kiln_runtime::ExecutionPlan;

use crate::kernels::compile;
use crate::suite::queues::{host_wait, submit};
use crate::{Failure, Outcome, ensure, expect_err, queues};

const CAP: usize = 64;

/// `a[i] = 1` for `i < n`, where `a` is declared as 4 elements.
fn store_past_a_four_element_param(dev: &Device) -> Result<Kernel, Failure> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, CAP as i64);
    let a = k.param(0, Scalar::F32, 4);
    let i = k.global(0, &n);
    k.store(&a.at(&i), &Val::f32(1.0));
    compile(dev, &k.finish()?, "conf_bounds_store4")
}

/// `b[i..i+8] = a[i..i+8]` for `i < n`, both declared as `n` elements: 7 past the end.
fn vector_copy_over_n(dev: &Device) -> Result<Kernel, Failure> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, CAP as i64);
    let (a, b) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
    let i = k.global(0, &n);
    let gate = i.lt(&n);
    let zero = Val::constant(DType::vec(Scalar::F32, 8), 0.0);
    let v = a.at_vec(&i, 8).load_gated(&gate, zero);
    k.store_gated(&b.at_vec(&i, 8), &v, &gate);
    compile(dev, &k.finish()?, "conf_bounds_copy8")
}

fn is_oob(slot: usize, last: i128, len: i128) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::OutOfBounds { access, .. } if access.slot == Some(slot) && access.last == last && access.len == len)
}

fn buffers(dev: &Device, count: usize) -> Result<Vec<Buffer>, Failure> {
    (0..count).map(|_| Ok(Buffer::from_slice(dev.allocator().clone(), &[0f32; CAP])?)).collect()
}

/// `Kernel::launch` refuses both kernels when n makes them overrun, and runs them otherwise.
pub fn launch_refuses_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    let store4 = store_past_a_four_element_param(dev)?;
    let b = buffers(dev, 2)?;
    let e = expect_err("storing 8 elements into 4", store4.launch(&[&b[0]], &[8]), is_oob(0, 7, 4))?;
    ensure!(e.to_string().contains("STORE may access elements 0..=7 of buffer 0"), "message: {e}");
    ensure!(b[0].to_vec::<f32>()? == [0.0; CAP], "a refused launch wrote to its buffer");
    store4.launch(&[&b[0]], &[4])?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..4] == [1.0; 4] && got[4..] == [0.0; CAP - 4], "n = 4 stored {got:?}");

    let copy8 = vector_copy_over_n(dev)?;
    let src: Vec<f32> = (0..CAP).map(|v| v as f32).collect();
    b[0].copy_from_slice(&src)?;
    expect_err("an 8-wide copy over n = 16", copy8.launch(&[&b[0], &b[1]], &[16]), is_oob(0, 22, 16))?;
    ensure!(b[1].to_vec::<f32>()? == [0.0; CAP], "a refused launch wrote to its buffer");
    Ok(())
}

/// A queue's exec refuses the batch at submit: nothing runs, the signal stays put.
pub fn queue_exec_refuses_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let (store4, copy8) = (store_past_a_four_element_param(dev)?, vector_copy_over_n(dev)?);
    let b = buffers(dev, 2)?;
    let s = f.create_dyn_signal()?;
    let mut q = f.create_dyn_compute_queue()?;
    q.exec(&store4, &[&b[0]], &[5]).signal(&s, 1);
    expect_err("a queued store of 5 elements into 4", q.submit(), is_oob(0, 4, 4))?;
    q.exec(&copy8, &[&b[0], &b[1]], &[3]).signal(&s, 1);
    expect_err("a queued 8-wide copy over n = 3", q.submit(), is_oob(0, 9, 3))?;
    ensure!(s.value() == 0, "a refused batch set its signal to {}", s.value());
    ensure!(b[0].to_vec::<f32>()? == [0.0; CAP], "a refused batch wrote to its buffer");
    q.exec(&store4, &[&b[0]], &[3]).signal(&s, 1);
    let _q = submit(q, "a store of 3 elements into 4")?;
    host_wait(&s, 1, "a store of 3 elements into 4")?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..3] == [1.0; 3] && got[3..] == [0.0; CAP - 3], "n = 3 stored {got:?}");
    Ok(())
}

/// A plan refuses the recording, and a run whose new values would overrun; a run with
/// values in bounds still works afterwards.
pub fn plan_refuses_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    queues(dev)?;
    let (store4, copy8) = (store_past_a_four_element_param(dev)?, vector_copy_over_n(dev)?);
    let b = buffers(dev, 3)?;
    let mut plan = ExecutionPlan::new(dev)?;
    expect_err("recording a store of 6 elements into 4", plan.exec(&store4, &[&b[0]], &[("n", 6)]), is_oob(0, 5, 4))?;
    expect_err("recording an 8-wide copy", plan.exec(&copy8, &[&b[1], &b[2]], &[("n", 6)]), is_oob(0, 12, 6))?;
    ensure!(plan.is_empty(), "refused recordings left {} node(s)", plan.len());

    plan.exec(&store4, &[&b[0]], &[("n", 2)])?;
    plan.run(&[])?;
    expect_err("a replay with n = 9", plan.run(&[("n", 9)]), is_oob(0, 8, 4))?;
    ensure!(b[0].to_vec::<f32>()?[2..] == [0.0; CAP - 2], "a refused replay wrote past n = 2");
    plan.run(&[("n", 4)])?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..4] == [1.0; 4] && got[4..] == [0.0; CAP - 4], "n = 4 stored {got:?}");
    Ok(())
}
