//! Hardware queues through the type-erased [`DynQueue`]: nothing runs before `submit`,
//! `submit` never waits, commands of one queue run in order, queues are ordered by
//! timeline signals (also across devices, bridged on the host when signal types differ),
//! copies, memory barriers, recording errors and failure propagation.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Device, DynQueue, Error, Kernel, TimelineSignal};

use crate::kernels::{affine, affine_in_place, compile};
use crate::suite::signals::HANG_GUARD;
use crate::{Failure, Outcome, ensure, expect_err, queues};

/// Submits `q` on a helper thread so that a `submit` that blocks (it must not) is reported
/// instead of hanging the suite. Returns the queue for reuse.
pub fn submit(mut q: DynQueue, what: &str) -> Result<DynQueue, Failure> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = q.submit();
        let _ = tx.send((q, r));
    });
    match rx.recv_timeout(HANG_GUARD) {
        Ok((q, r)) => {
            r.map_err(|e| Failure::Violation(format!("{what}: submit failed: {e}")))?;
            Ok(q)
        }
        Err(_) => Err(Failure::Violation(format!(
            "{what}: submit did not return within {HANG_GUARD:?}; submit must hand the batch over without waiting"
        ))),
    }
}

/// Waits on the host for `signal` to reach `value`, as a violation when it fails or hangs.
pub fn host_wait(signal: &Arc<dyn TimelineSignal>, value: u64, what: &str) -> Outcome {
    signal.wait(value, HANG_GUARD).map_err(|e| Failure::Violation(format!("{what}: waiting for {value}: {e}")))
}

fn f32s(dev: &Device, data: &[f32]) -> Result<Buffer, Failure> {
    Ok(Buffer::from_slice(dev.allocator(), data)?)
}

struct Kernels {
    add1: Kernel,
    mul2: Kernel,
    inc: Kernel,
    dbl: Kernel,
}

fn kernels(dev: &Device) -> Result<Kernels, Failure> {
    Ok(Kernels {
        add1: compile(dev, &affine(1.0, 1.0)?, "conf_add1")?,
        mul2: compile(dev, &affine(2.0, 0.0)?, "conf_mul2")?,
        inc: compile(dev, &affine_in_place(1.0, 1.0)?, "conf_inc")?,
        dbl: compile(dev, &affine_in_place(2.0, 0.0)?, "conf_dbl")?,
    })
}

const N: usize = 32;

fn input() -> Vec<f32> {
    (0..N).map(|i| i as f32 - 7.5).collect()
}

/// Recorded commands do not run before `submit`; after it, they all run in order.
pub fn nothing_runs_before_submit(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let (x, y) = (f32s(dev, &input())?, f32s(dev, &[0.0; N])?);
    let s = f.create_dyn_signal()?;
    let mut q = f.create_dyn_compute_queue()?;
    q.exec(&k.add1, &[&x, &y], &[N as i64]).exec(&k.dbl, &[&y], &[N as i64]).signal(&s, 1);
    ensure!(s.value() == 0, "the signal moved to {} before submit", s.value());
    ensure!(y.to_vec::<f32>()? == [0.0; N], "a kernel ran before submit");
    submit(q, "add1; dbl; signal")?;
    host_wait(&s, 1, "add1; dbl; signal")?;
    let want: Vec<f32> = input().iter().map(|v| (v + 1.0) * 2.0).collect();
    ensure!(y.to_vec::<f32>()? == want, "in-order execution gave {:?}", y.to_vec::<f32>()?);
    Ok(())
}

/// Two queues of one device ordered only by signals: the consumer is submitted first and
/// must wait; then several rounds of ping-pong, each queue waiting on the other's signal.
pub fn two_queue_chain(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let n = [N as i64];
    let (a, b, c) = (f32s(dev, &input())?, f32s(dev, &[0.0; N])?, f32s(dev, &[0.0; N])?);
    let (s1, s2) = (f.create_dyn_signal()?, f.create_dyn_signal()?);
    let (mut q1, mut q2) = (f.create_dyn_compute_queue()?, f.create_dyn_compute_queue()?);

    let rounds = 3u64;
    q2.wait(&s1, 1).exec(&k.mul2, &[&b, &c], &n).signal(&s2, 1);
    for r in 1..=rounds {
        q2.wait(&s1, r + 1).exec(&k.dbl, &[&c], &n).signal(&s2, r + 1);
    }
    q1.exec(&k.add1, &[&a, &b], &n).signal(&s1, 1);
    for r in 1..=rounds {
        q1.wait(&s2, r).exec(&k.inc, &[&c], &n).signal(&s1, r + 1);
    }
    let _q2 = submit(q2, "consumer queue (submitted first)")?;
    let _q1 = submit(q1, "producer queue")?;
    host_wait(&s2, rounds + 1, "the last round")?;
    ensure!(s1.value() == rounds + 1, "producer signal at {}, want {}", s1.value(), rounds + 1);

    let want: Vec<f32> = input().iter().map(|v| (0..rounds).fold((v + 1.0) * 2.0, |c, _| (c + 1.0) * 2.0)).collect();
    let got = c.to_vec::<f32>()?;
    ensure!(got == want, "ping-pong across two queues gave {got:?}, want {want:?}");
    Ok(())
}

/// Queue copies on one device (whole buffers and views), ordered after a kernel.
pub fn copies(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let (a, b) = (f32s(dev, &input())?, f32s(dev, &[0.0; N])?);
    let (c, d) = (f32s(dev, &[-1.0; N])?, f32s(dev, &[-1.0; N])?);
    let s = f.create_dyn_signal()?;
    let mut q = f.create_dyn_compute_queue()?;
    q.exec(&k.add1, &[&a, &b], &[N as i64]).copy(&c, &b).copy(&d.view(4, 8)?, &c.view(20, 8)?).signal(&s, 1);
    submit(q, "exec; copy; copy view")?;
    host_wait(&s, 1, "exec; copy; copy view")?;
    let want: Vec<f32> = input().iter().map(|v| v + 1.0).collect();
    ensure!(c.to_vec::<f32>()? == want, "queue copy after exec gave {:?}", c.to_vec::<f32>()?);
    let mut want_d = vec![-1.0f32; N];
    want_d[4..12].copy_from_slice(&want[20..28]);
    ensure!(d.to_vec::<f32>()? == want_d, "queue copy between views gave {:?}", d.to_vec::<f32>()?);

    // Zero-byte copies (empty buffers, empty views at a buffer's end) are no-ops, in a queue
    // and in a plan, on every backend (OpenCL's driver refuses them).
    let (e0, e1) = (dev.buffer(Scalar::F32, 0)?, dev.buffer(Scalar::F32, 0)?);
    let mut q = f.create_dyn_compute_queue()?;
    q.copy(&e0, &e1).copy(&d.view(N, 0)?, &c.view(N, 0)?).signal(&s, 2);
    submit(q, "zero-byte copies")?;
    host_wait(&s, 2, "zero-byte copies")?;
    let mut plan = kiln_runtime::ExecutionPlan::new(dev)?;
    plan.copy(&e0, &e1)?;
    plan.copy(&d.view(N, 0)?, &c.view(N, 0)?)?;
    plan.run(&[])?;
    plan.run(&[])?;
    ensure!(d.to_vec::<f32>()? == want_d, "zero-byte copies changed {:?}", d.to_vec::<f32>()?);

    // A copy queue, when the device has one, is ordered by signals like any other queue.
    if let Some(mut cq) = f.create_dyn_copy_queue()? {
        let e = f32s(dev, &[0.0; N])?;
        cq.wait(&s, 2).copy(&e, &c).signal(&s, 3);
        submit(cq, "copy queue")?;
        host_wait(&s, 3, "copy queue")?;
        ensure!(e.to_vec::<f32>()? == want, "the copy queue copied {:?}", e.to_vec::<f32>()?);
    }
    Ok(())
}

/// A memory barrier before a signal makes the producer's writes visible to a consumer on
/// another queue that waits on that signal.
pub fn memory_barrier(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let (a, b, c) = (f32s(dev, &input())?, f32s(dev, &[0.0; N])?, f32s(dev, &[0.0; N])?);
    let (s, done) = (f.create_dyn_signal()?, f.create_dyn_signal()?);
    let (mut producer, mut consumer) = (f.create_dyn_compute_queue()?, f.create_dyn_compute_queue()?);
    consumer.wait(&s, 1).exec(&k.mul2, &[&b, &c], &[N as i64]).memory_barrier().signal(&done, 1);
    producer.exec(&k.add1, &[&a, &b], &[N as i64]).memory_barrier().signal(&s, 1);
    let _c = submit(consumer, "consumer")?;
    let _p = submit(producer, "producer")?;
    host_wait(&done, 1, "consumer after barrier")?;
    let want: Vec<f32> = input().iter().map(|v| (v + 1.0) * 2.0).collect();
    ensure!(c.to_vec::<f32>()? == want, "the consumer read stale data: {:?}", c.to_vec::<f32>()?);
    Ok(())
}

/// A command with bad arguments makes `submit` fail and submit nothing from that batch;
/// the queue records and runs the next batch normally.
pub fn recording_error_submits_nothing(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let (a, b) = (f32s(dev, &input())?, f32s(dev, &[0.0; N])?);
    let s = f.create_dyn_signal()?;
    let mut q = f.create_dyn_compute_queue()?;
    q.exec(&k.add1, &[&a, &b], &[N as i64]).exec(&k.add1, &[&a], &[N as i64]).signal(&s, 1);
    expect_err("a batch with an exec of one buffer for two", q.submit(), |e| matches!(e, Error::Launch(_)))?;
    ensure!(s.value() == 0, "a refused batch set its signal to {}", s.value());
    ensure!(b.to_vec::<f32>()? == [0.0; N], "a refused batch ran its first (valid) command");

    q.exec(&k.add1, &[&a, &b], &[(N + 1) as i64]).signal(&s, 1);
    expect_err("a batch with n larger than the buffers", q.submit(), |e| matches!(e, Error::Launch(_)))?;
    ensure!(s.value() == 0, "a refused batch set its signal to {}", s.value());

    q.exec(&k.add1, &[&a, &b], &[0]).signal(&s, 1);
    expect_err("a batch with n = 0 below its min", q.submit(), |e| {
        matches!(e, Error::Ir(kiln_device::kiln_ir::IrError::VarOutOfRange { .. }) | Error::Launch(_))
    })?;
    ensure!(s.value() == 0, "a refused batch set its signal to {}", s.value());

    q.copy(&a.view(0, 8)?, &a.view(4, 8)?).signal(&s, 1);
    expect_err("a batch with a copy between overlapping windows", q.submit(), |e| matches!(e, Error::Buffer(_)))?;
    ensure!(s.value() == 0, "a refused batch set its signal to {}", s.value());

    q.copy(&b, &a).copy(&b.view(0, N - 1)?, &a).signal(&s, 1);
    expect_err("a batch with a copy of N elements into N - 1", q.submit(), |e| matches!(e, Error::Buffer(_)))?;
    ensure!(s.value() == 0, "a refused batch set its signal to {}", s.value());
    ensure!(b.to_vec::<f32>()? == [0.0; N], "a refused batch ran its first (valid) copy");

    q.exec(&k.add1, &[&a, &b], &[N as i64]).signal(&s, 1);
    submit(q, "a valid batch after refused ones")?;
    host_wait(&s, 1, "a valid batch after refused ones")?;
    let want: Vec<f32> = input().iter().map(|v| v + 1.0).collect();
    ensure!(b.to_vec::<f32>()? == want, "the valid batch computed {:?}", b.to_vec::<f32>()?);
    Ok(())
}

/// A queue's `signal` never lowers a signal: signalling a value below the current one leaves
/// the value where it is (or is refused with an error), and the queue keeps working.
pub fn signal_never_lowers(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let s = f.create_dyn_signal()?;
    let mut q = f.create_dyn_compute_queue()?;
    q.signal(&s, 5);
    q = submit(q, "signal 5")?;
    host_wait(&s, 5, "signal 5")?;
    q.signal(&s, 3);
    let lowered = q.submit();
    let done = f.create_dyn_signal()?;
    q.signal(&done, 1);
    let q = submit(q, "a batch after signalling a lower value")?;
    host_wait(&done, 1, "a batch after signalling a lower value")?;
    ensure!(s.value() >= 5, "signal(3) after signal(5) lowered the value to {} (submit: {lowered:?})", s.value());
    drop(q);
    Ok(())
}

/// A queue owns what its commands use: the caller may drop its buffer handles right after
/// recording. The memory must not be reused (here: by new buffers of the same size filled
/// with garbage) before the commands ran.
pub fn buffers_outlive_handles(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let (gate, done) = (f.create_dyn_signal()?, f.create_dyn_signal()?);
    let out = f32s(dev, &[0.0; N])?;
    let mut q = f.create_dyn_compute_queue()?;
    {
        let a = f32s(dev, &input())?;
        let staged = f32s(dev, &[0.0; N])?;
        q.wait(&gate, 1).copy(&staged, &a).exec(&k.add1, &[&staged, &out], &[N as i64]).signal(&done, 1);
    }
    let q = submit(q, "commands whose buffers the caller dropped")?;
    // Allocations of the same size would get the dropped blocks if they had been freed.
    let garbage: Vec<Buffer> = (0..8).map(|_| f32s(dev, &[1e30; N])).collect::<Result<_, _>>()?;
    gate.set(1);
    host_wait(&done, 1, "commands whose buffers the caller dropped")?;
    let want: Vec<f32> = input().iter().map(|v| v + 1.0).collect();
    ensure!(out.to_vec::<f32>()? == want, "the queue used freed memory: {:?}", out.to_vec::<f32>()?);
    drop((q, garbage));
    Ok(())
}

/// A queue waiting on a signal that fails does not run what follows the wait, and the
/// signals it would set are failed with the original error (nothing hangs).
pub fn failure_propagates(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let k = kernels(dev)?;
    let (a, b) = (f32s(dev, &input())?, f32s(dev, &[0.0; N])?);
    let (upstream, downstream) = (f.create_dyn_signal()?, f.create_dyn_signal()?);
    let mut q = f.create_dyn_compute_queue()?;
    q.wait(&upstream, 1).exec(&k.add1, &[&a, &b], &[N as i64]).signal(&downstream, 1);
    let _q = submit(q, "a batch behind a signal that will fail")?;
    upstream.fail(Error::Invalid("upstream producer broke".into()));
    let r = downstream.wait(1, HANG_GUARD);
    expect_err(
        "waiting for a signal set after a failed wait",
        r,
        |e| matches!(e, Error::SignalFailed(c) if matches!(&**c, Error::Invalid(m) if m == "upstream producer broke")),
    )?;
    ensure!(b.to_vec::<f32>()? == [0.0; N], "the kernel after a failed wait ran");
    Ok(())
}

/// A queue of `dev` and a queue of `peer` ordered across devices. When the queue accepts the
/// peer's signal type it waits on it directly; otherwise the wait must be refused with
/// [`Error::Invalid`], and the dependency is bridged on the host (wait on the peer's
/// signal, then set the device's own). The data moves with a cross-device queue copy.
pub fn cross_device(dev: &Arc<Device>, peer: &Arc<Device>) -> Outcome {
    let (f, pf) = (queues(dev)?, queues(peer)?);
    let (k, pk) = (kernels(dev)?, kernels(peer)?);
    let n = [N as i64];
    let (pa, pb) = (f32s(peer, &input())?, f32s(peer, &[0.0; N])?);
    let (b, c) = (f32s(dev, &[0.0; N])?, f32s(dev, &[0.0; N])?);
    let (own, foreign) = (f.create_dyn_signal()?, pf.create_dyn_signal()?);
    let mut q = f.create_dyn_compute_queue()?;
    let mut pq = pf.create_dyn_compute_queue()?;

    let direct = q.accepts(&*foreign);
    if !direct {
        q.signal(&own, 5).wait(&foreign, 1).signal(&own, 6);
        let e = expect_err(&format!("a {} queue waiting on a {} signal", dev.spec(), peer.spec()), q.submit(), |e| {
            matches!(e, Error::Invalid(_))
        })?;
        ensure!(e.to_string().contains("signal"), "the refusal does not say what was wrong: {e}");
        ensure!(own.value() == 0, "a refused batch set the queue's own signal to {}", own.value());
    }

    if direct {
        q.wait(&foreign, 1);
    } else {
        q.wait(&own, 1);
    }
    q.copy(&b, &pb).exec(&k.mul2, &[&b, &c], &n).signal(&own, 2);
    let q = submit(q, &format!("{} consumer", dev.spec()))?;
    pq.exec(&pk.add1, &[&pa, &pb], &n).signal(&foreign, 1);
    let pq = submit(pq, &format!("{} producer", peer.spec()))?;
    if !direct {
        host_wait(&foreign, 1, &format!("{} producer", peer.spec()))?;
        own.set(1);
    }
    host_wait(&own, 2, &format!("{} consumer", dev.spec()))?;
    let want: Vec<f32> = input().iter().map(|v| (v + 1.0) * 2.0).collect();
    ensure!(c.to_vec::<f32>()? == want, "cross-device chain gave {:?}", c.to_vec::<f32>()?);
    drop((q, pq));

    // Queue copies in both directions between the devices.
    let (back, s) = (f32s(peer, &[0.0; N])?, pf.create_dyn_signal()?);
    let mut pq = pf.create_dyn_compute_queue()?;
    pq.copy(&back.view(0, 16)?, &c.view(16, 16)?).copy(&back.view(16, 16)?, &c.view(0, 16)?).signal(&s, 1);
    submit(pq, &format!("{} queue copying from {}", peer.spec(), dev.spec()))?;
    host_wait(&s, 1, "cross-device copies")?;
    let got = back.to_vec::<f32>()?;
    ensure!(got[..16] == want[16..] && got[16..] == want[..16], "cross-device queue copies gave {got:?}");
    Ok(())
}
