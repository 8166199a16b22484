//! The safe path never runs a kernel that could touch memory outside its buffers:
//! `Kernel::launch`, a queue's `exec` and an execution plan (when recording, and when a run
//! binds new values) either prove every access in bounds or run the kernel's guarded form,
//! and never touch memory outside. On the strict path (`Kernel::refusing`, or
//! `KILN_BOUNDS=refuse`) a launch that cannot be proven is refused with `Error::OutOfBounds`
//! naming the access; under the default guard it runs guarded, an access that really leaves
//! its buffer is skipped (a load reads its alternative) and the launch, the queue's signal or
//! the plan run fails with a guarded `Error::OutOfBounds`. A correct kernel that no proof
//! reaches runs with the right result either way but refused.
//!
//! The two overrunning kernels are issue 9's. Every buffer really holds `CAP` elements, more than the
//! kernels declare, so that without the check an overrun would stay inside the allocation
//! and the test fails on its assertion instead of corrupting memory.

use std::sync::Arc;
use std::time::Duration;

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
    let store4 = store_past_a_four_element_param(dev)?.refusing();
    let b = buffers(dev, 2)?;
    let e = expect_err("storing 8 elements into 4", store4.launch(&[&b[0]], &[8]), is_oob(0, 7, 4))?;
    ensure!(e.to_string().contains("STORE may access elements 0..=7 of buffer 0"), "message: {e}");
    ensure!(b[0].to_vec::<f32>()? == [0.0; CAP], "a refused launch wrote to its buffer");
    store4.launch(&[&b[0]], &[4])?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..4] == [1.0; 4] && got[4..] == [0.0; CAP - 4], "n = 4 stored {got:?}");

    let copy8 = vector_copy_over_n(dev)?.refusing();
    let src: Vec<f32> = (0..CAP).map(|v| v as f32).collect();
    b[0].copy_from_slice(&src)?;
    expect_err("an 8-wide copy over n = 16", copy8.launch(&[&b[0], &b[1]], &[16]), is_oob(0, 22, 16))?;
    ensure!(b[1].to_vec::<f32>()? == [0.0; CAP], "a refused launch wrote to its buffer");
    Ok(())
}

/// A queue's exec refuses the batch at submit: nothing runs, the signal stays put.
pub fn queue_exec_refuses_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let (store4, copy8) = (store_past_a_four_element_param(dev)?.refusing(), vector_copy_over_n(dev)?.refusing());
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
    let (store4, copy8) = (store_past_a_four_element_param(dev)?.refusing(), vector_copy_over_n(dev)?.refusing());
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

/// A guarded `Error::OutOfBounds` for `slot` of `len` elements, naming an element the access
/// tried to touch in `tried`.
fn is_fault(slot: usize, len: i128, tried: std::ops::Range<i128>) -> impl Fn(&Error) -> bool {
    move |e| {
        matches!(e.root_cause(), Error::OutOfBounds { access, .. }
            if access.guarded && access.slot == Some(slot) && access.len == len && tried.contains(&access.first))
    }
}

/// Under the guard the overrunning launches run: every store inside the declared size lands,
/// none outside does, and the launch fails naming the access and an element it tried.
pub fn launch_guards_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    let store4 = store_past_a_four_element_param(dev)?;
    ensure!(store4.has_fallback(), "a kernel left to the launch check has no guarded form");
    let b = buffers(dev, 2)?;
    let e = expect_err("storing 8 elements into 4", store4.launch(&[&b[0]], &[8]), is_fault(0, 4, 4..8))?;
    ensure!(e.to_string().contains("ran guarded and faulted") && e.to_string().contains("STORE tried"), "message: {e}");
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..4] == [1.0; 4] && got[4..] == [0.0; CAP - 4], "a guarded n = 8 stored {got:?}");

    let copy8 = vector_copy_over_n(dev)?;
    let src: Vec<f32> = (0..CAP).map(|v| v as f32).collect();
    b[0].copy_from_slice(&src)?;
    expect_err(
        "an 8-wide copy over n = 16",
        copy8.launch(&[&b[0], &b[1]], &[16]),
        |e| matches!(e, Error::OutOfBounds { access, .. } if access.guarded && access.len == 16 && (9..16).contains(&access.first)),
    )?;
    let got = b[1].to_vec::<f32>()?;
    ensure!(got[..16] == src[..16] && got[16..] == [0.0; CAP - 16], "a guarded 8-wide copy over 16 stored {got:?}");
    // A launch the proof settles runs the kernel as compiled, and succeeds.
    b[0].copy_from_slice(&[0f32; CAP])?;
    store4.launch(&[&b[0]], &[3])?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..3] == [1.0; 3] && got[3..] == [0.0; CAP - 3], "n = 3 stored {got:?}");
    Ok(())
}

/// A queue runs the guarded launch and fails its signal with the fault; nothing lands
/// outside the declared size.
pub fn queue_guards_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let store4 = store_past_a_four_element_param(dev)?;
    let b = buffers(dev, 1)?;
    let s = f.create_dyn_signal()?;
    let mut q = f.create_dyn_compute_queue()?;
    q.exec(&store4, &[&b[0]], &[6]).signal(&s, 1);
    let _q = submit(q, "a guarded store of 6 elements into 4")?;
    expect_err("the signal after a guarded overrun", s.wait(1, Duration::from_secs(60)), is_fault(0, 4, 4..6))?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..4] == [1.0; 4] && got[4..] == [0.0; CAP - 4], "a guarded n = 6 stored {got:?}");
    Ok(())
}

/// A plan records a launch its proof cannot settle, and a run whose values overrun fails
/// with the fault; runs in bounds work before and after, replayed without the guard.
pub fn plan_guards_out_of_bounds(dev: &Arc<Device>) -> Outcome {
    queues(dev)?;
    let store4 = store_past_a_four_element_param(dev)?;
    let b = buffers(dev, 1)?;
    let mut plan = ExecutionPlan::new(dev)?;
    plan.exec(&store4, &[&b[0]], &[("n", 6)])?;
    expect_err("a run with n = 6", plan.run(&[]), is_fault(0, 4, 4..6))?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..4] == [1.0; 4] && got[4..] == [0.0; CAP - 4], "a guarded plan run stored {got:?}");
    b[0].copy_from_slice(&[0f32; CAP])?;
    plan.run(&[("n", 3)])?;
    let got = b[0].to_vec::<f32>()?;
    ensure!(got[..3] == [1.0; 3] && got[3..] == [0.0; CAP - 3], "n = 3 stored {got:?}");
    expect_err("a run with n = 9", plan.run(&[("n", 9)]), is_fault(0, 4, 4..9))?;
    expect_err("the same run again", plan.run(&[("n", 9)]), is_fault(0, 4, 4..9))?;
    plan.run(&[("n", 4)])?;
    Ok(())
}

/// `out[i] = table[ids[i]]`: where the table load reads depends on the data in `ids`, which
/// no proof sees.
const GATHER: &str = include_str!("../../../../examples/kernels/gather.kiln");

/// A correct kernel that no proof reaches is never refused: it runs guarded, with the right
/// result, through `Kernel::launch`, a queue and a plan; an id outside the table faults; the
/// strict path refuses the launch.
pub fn unprovable_correct_kernel_runs(dev: &Arc<Device>) -> Outcome {
    let kernel = compile(dev, &kiln_device::kiln_ir::parse_kernel(GATHER)?, "conf_bounds_gather")?;
    ensure!(
        kernel.spec.bounds.pending() == 1,
        "the table load should be left open (pending {})",
        kernel.spec.bounds.pending()
    );
    let table: Vec<f32> = (1..=8).map(|v| v as f32 * 10.0).collect();
    let ids = [7i32, 0, 3, 3, 6, 1, 2, 5];
    let (t, id) =
        (Buffer::from_slice(dev.allocator().clone(), &table)?, Buffer::from_slice(dev.allocator().clone(), &ids)?);
    let want: Vec<f32> = ids.iter().map(|&i| table[i as usize]).collect();
    let fresh = || Buffer::from_slice(dev.allocator().clone(), &[-1f32; 8]);

    let out = fresh()?;
    kernel.launch(&[&t, &id, &out], &[])?;
    ensure!(out.to_vec::<f32>()? == want, "launch: {:?}", out.to_vec::<f32>()?);

    let f = queues(dev)?;
    let (out, s) = (fresh()?, f.create_dyn_signal()?);
    let mut q = f.create_dyn_compute_queue()?;
    q.exec(&kernel, &[&t, &id, &out], &[]).signal(&s, 1);
    let _q = submit(q, "the gather")?;
    host_wait(&s, 1, "the gather")?;
    ensure!(out.to_vec::<f32>()? == want, "queue: {:?}", out.to_vec::<f32>()?);

    let out = fresh()?;
    let mut plan = ExecutionPlan::new(dev)?;
    plan.exec(&kernel, &[&t, &id, &out], &[])?;
    plan.run(&[])?;
    plan.run(&[])?;
    ensure!(out.to_vec::<f32>()? == want, "plan: {:?}", out.to_vec::<f32>()?);

    // An id past the table: that load reads 0, the others land, and the launch says which.
    id.copy_from_slice(&[7i32, 0, 3, 8, 6, 1, 2, 5])?;
    let out = fresh()?;
    expect_err("an id past the table", kernel.launch(&[&t, &id, &out], &[]), is_fault(0, 8, 8..9))?;
    let got = out.to_vec::<f32>()?;
    ensure!(got[3] == 0.0 && got[4] == table[6], "a faulting gather stored {got:?}");

    expect_err("the strict path", kernel.refusing().launch(&[&t, &id, &out], &[]), is_oob(0, i32::MAX as i128, 8))?;
    Ok(())
}

/// Issue 19's kernel: tinygrad's `cumsum(axis=0)` of a 45×20 i32 tensor, whose gate bounds
/// the sum of two loop indices and whose index is 20 × that sum plus a column. It runs with
/// the right result on every backend, proven in bounds when it was built (no guard).
pub fn tinygrad_cumsum_runs(dev: &Arc<Device>) -> Outcome {
    let text = include_str!("../../../../examples/kernels/cumsum.kiln");
    let kernel = compile(dev, &kiln_device::kiln_ir::parse_kernel(text)?, "conf_cumsum")?;
    ensure!(kernel.spec.bounds.pending() == 0 && !kernel.has_fallback(), "cumsum is not proven when built");
    let a: Vec<i32> = (0..900).map(|v| (v * 37 % 101) - 50).collect();
    let want: Vec<i32> = (0..900).map(|o| (0..=o % 45).map(|row| a[20 * row + o / 45]).sum()).collect();
    let (input, out) =
        (Buffer::from_slice(dev.allocator().clone(), &a)?, Buffer::from_slice(dev.allocator().clone(), &[0i32; 900])?);
    kernel.launch(&[&out, &input], &[])?;
    ensure!(out.to_vec::<i32>()? == want, "cumsum: {:?}", &out.to_vec::<i32>()?[..12]);
    Ok(())
}
