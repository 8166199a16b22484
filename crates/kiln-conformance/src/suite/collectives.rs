//! Collectives in execution plans over in-process channels ([`LocalChannel`]): 1 to 4 ranks,
//! each a device of the backend (`CPU:0..3` on the CPU; ranks share a device where the
//! backend has fewer), each running its own plan. Every collective's result equals the host
//! reference for every dtype and reduction; kernels around a collective see its inputs and
//! outputs in plan order; mismatched buffers are refused before anything runs; a rank that
//! passes other buffers than its peers, or never arrives, breaks the channel with a typed
//! error on every rank that came, instead of a hang.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Channel, Device, Error, LocalChannel, ReduceOp};
use kiln_runtime::{ExecutionPlan, PlanRun};

use crate::host::{Value, download, upload};
use crate::kernels::{affine, compile};
use crate::{Failure, Outcome, ensure, expect_err};

/// The dtypes every collective is checked in.
const DTYPES: [Scalar; 5] = [Scalar::F32, Scalar::F16, Scalar::BF16, Scalar::I32, Scalar::I64];
const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
/// Elements a rank contributes: not a multiple of 4, so all_reduce's blocks are uneven.
const N: usize = 30;

/// Rank `r`'s device: device `r` of the backend where it has one, else `dev` itself.
fn rank_devices(dev: &Arc<Device>, count: usize) -> Vec<Arc<Device>> {
    (0..count)
        .map(|r| match r {
            0 => dev.clone(),
            r => kiln_device::open_device(&format!("{}:{r}", dev.spec().base_type())).unwrap_or_else(|_| dev.clone()),
        })
        .collect()
}

/// Element `i` of rank `r`'s data: small integers, exact in every dtype and in their sums.
fn value(r: usize, i: usize, salt: usize) -> f64 {
    ((r * 7 + i * 3 + salt) % 11) as f64 - 4.0
}

fn values(r: usize, n: usize, salt: usize) -> Vec<Value> {
    (0..n).map(|i| Value::F(value(r, i, salt))).collect()
}

fn reduce(op: ReduceOp, xs: impl Iterator<Item = f64>) -> f64 {
    xs.reduce(|a, b| match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
    })
    .unwrap_or(0.0)
}

fn floats(buf: &Buffer) -> Result<Vec<f64>, Failure> {
    Ok(download(buf)?.into_iter().map(|v| v.as_f64()).collect())
}

/// Submits every rank's plan, then waits for each: the ranks run at once.
fn run_all(plans: &mut [ExecutionPlan]) -> Vec<Result<(), Error>> {
    let runs: Vec<Result<PlanRun<'_>, Error>> = plans.iter_mut().map(|p| p.submit(&[])).collect();
    runs.into_iter().map(|r| r.and_then(PlanRun::wait)).collect()
}

fn channels(count: usize) -> Result<Vec<Arc<dyn Channel>>, Failure> {
    Ok(LocalChannel::world(count)?.into_iter().map(|c| c as Arc<dyn Channel>).collect())
}

/// all_reduce of every dtype and reduction on 1 to 4 ranks, in place and into another
/// buffer; for f32 a kernel writes the input before the collective and another reads its
/// result after it, in the same plan.
pub fn all_reduce(dev: &Arc<Device>) -> Outcome {
    for count in 1..=4 {
        let devices = rank_devices(dev, count);
        let chans = channels(count)?;
        let mut plans = devices.iter().map(|d| ExecutionPlan::new(d)).collect::<Result<Vec<_>, _>>()?;
        // (dtype, op, in place, each rank's recv)
        let mut checks: Vec<(Scalar, ReduceOp, bool, Vec<Buffer>)> = Vec::new();
        for (salt, (dtype, op)) in DTYPES.iter().flat_map(|d| OPS.iter().map(move |o| (*d, *o))).enumerate() {
            for in_place in [false, true] {
                let mut recvs = Vec::new();
                for r in 0..count {
                    let send = upload(&devices[r], dtype, &values(r, N, salt))?;
                    let recv = if in_place { send.clone() } else { devices[r].buffer(dtype, N)? };
                    plans[r].all_reduce(&chans[r], &send, &recv, op)?;
                    recvs.push(recv);
                }
                checks.push((dtype, op, in_place, recvs));
            }
        }
        // Kernels on both sides: x = 2·input + r before, out = recv + 1 after.
        let twice = affine(2.0, 0.0)?;
        let plus_one = affine(1.0, 1.0)?;
        let mut outs = Vec::new();
        for r in 0..count {
            let (double, inc) =
                (compile(&devices[r], &twice, "coll_twice")?, compile(&devices[r], &plus_one, "coll_inc")?);
            let input = upload(&devices[r], Scalar::F32, &values(r, N, 99))?;
            let x = devices[r].buffer(Scalar::F32, N)?;
            let sum = devices[r].buffer(Scalar::F32, N)?;
            let out = devices[r].buffer(Scalar::F32, N)?;
            let n = [("n", N as i64)];
            plans[r].exec(&double, &[&input, &x], &n)?;
            plans[r].all_reduce(&chans[r], &x, &sum, ReduceOp::Sum)?;
            plans[r].exec(&inc, &[&sum, &out], &n)?;
            outs.push(out);
        }
        for (r, result) in run_all(&mut plans).into_iter().enumerate() {
            result.map_err(|e| Failure::Violation(format!("{count} ranks: rank {r}'s plan failed: {e}")))?;
        }
        for (dtype, op, in_place, recvs) in &checks {
            let salt = DTYPES.iter().position(|d| d == dtype).unwrap_or(0) * OPS.len()
                + OPS.iter().position(|o| o == op).unwrap_or(0);
            let want: Vec<f64> = (0..N).map(|i| reduce(*op, (0..count).map(|r| value(r, i, salt)))).collect();
            for (r, recv) in recvs.iter().enumerate() {
                let got = floats(recv)?;
                ensure!(
                    got == want,
                    "all_reduce({}) of {dtype} on {count} ranks (in place: {in_place}): rank {r} got {got:?}, want {want:?}",
                    op.name()
                );
            }
        }
        let want: Vec<f64> = (0..N).map(|i| (0..count).map(|r| 2.0 * value(r, i, 99)).sum::<f64>() + 1.0).collect();
        for (r, out) in outs.iter().enumerate() {
            let got = floats(out)?;
            ensure!(got == want, "kernel → all_reduce → kernel on {count} ranks: rank {r} got {got:?}, want {want:?}");
        }
    }
    Ok(())
}

/// all_gather, reduce_scatter, broadcast from each root, and send/receive pairs (a ring
/// shift: each rank sends to the next and receives from the previous), on 1 to 4 ranks.
pub fn gather_scatter_broadcast_send(dev: &Arc<Device>) -> Outcome {
    for count in 1..=4 {
        let devices = rank_devices(dev, count);
        let chans = channels(count)?;
        let mut plans = devices.iter().map(|d| ExecutionPlan::new(d)).collect::<Result<Vec<_>, _>>()?;
        let mut gathered = Vec::new();
        let mut scattered = Vec::new();
        let mut broadcast = Vec::new();
        let mut received = Vec::new();
        for r in 0..count {
            let d = &devices[r];
            let dtype = Scalar::I32;
            let send = upload(d, dtype, &values(r, N, 1))?;
            let all = d.buffer(dtype, N * count)?;
            plans[r].all_gather(&chans[r], &send, &all)?;
            gathered.push(all);

            let wide = upload(d, Scalar::I64, &values(r, N * count, 2))?;
            let part = d.buffer(Scalar::I64, N)?;
            plans[r].reduce_scatter(&chans[r], &wide, &part, ReduceOp::Sum)?;
            scattered.push(part);

            let mut per_root = Vec::new();
            for root in 0..count {
                let b = upload(d, Scalar::BF16, &values(r, N, 10 + root))?;
                plans[r].broadcast(&chans[r], &b, root)?;
                per_root.push(b);
            }
            broadcast.push(per_root);

            let mine = upload(d, Scalar::F16, &values(r, N, 3))?;
            let theirs = d.buffer(Scalar::F16, N)?;
            if count > 1 {
                let (next, prev) = ((r + 1) % count, (r + count - 1) % count);
                // Even ranks send first, odd ranks receive first: no cycle of waiting sends.
                if r % 2 == 0 {
                    plans[r].send(&chans[r], &mine, next)?;
                    plans[r].recv(&chans[r], &theirs, prev)?;
                } else {
                    plans[r].recv(&chans[r], &theirs, prev)?;
                    plans[r].send(&chans[r], &mine, next)?;
                }
            }
            received.push(theirs);
        }
        for (r, result) in run_all(&mut plans).into_iter().enumerate() {
            result.map_err(|e| Failure::Violation(format!("{count} ranks: rank {r}'s plan failed: {e}")))?;
        }
        let want: Vec<f64> = (0..count).flat_map(|q| (0..N).map(move |i| value(q, i, 1))).collect();
        for r in 0..count {
            let got = floats(&gathered[r])?;
            ensure!(got == want, "all_gather on {count} ranks: rank {r} got {got:?}, want {want:?}");
            let want: Vec<f64> = (0..N).map(|i| (0..count).map(|q| value(q, r * N + i, 2)).sum()).collect();
            let got = floats(&scattered[r])?;
            ensure!(got == want, "reduce_scatter on {count} ranks: rank {r} got {got:?}, want {want:?}");
            for (root, b) in broadcast[r].iter().enumerate() {
                let want: Vec<f64> = (0..N).map(|i| value(root, i, 10 + root)).collect();
                let got = floats(b)?;
                ensure!(got == want, "broadcast from {root} on {count} ranks: rank {r} got {got:?}, want {want:?}");
            }
            if count > 1 {
                let prev = (r + count - 1) % count;
                let want: Vec<f64> = (0..N).map(|i| value(prev, i, 3)).collect();
                let got = floats(&received[r])?;
                ensure!(got == want, "recv from {prev} on {count} ranks: rank {r} got {got:?}, want {want:?}");
            }
        }
    }
    Ok(())
}

/// Buffers that do not fit a collective are refused when it is recorded: another dtype,
/// another length, a root or peer out of range, oneself as peer, a buffer of another device,
/// overlapping windows, bool reductions.
pub fn checks(dev: &Arc<Device>) -> Outcome {
    let chans = channels(2)?;
    let c = &chans[0];
    let mut plan = ExecutionPlan::new(dev)?;
    let f8 = dev.buffer(Scalar::F32, 8)?;
    let f16x8 = dev.buffer(Scalar::F16, 8)?;
    let f9 = dev.buffer(Scalar::F32, 9)?;
    let f4 = dev.buffer(Scalar::F32, 4)?;
    let b8 = dev.buffer(Scalar::Bool, 8)?;
    let is_buffer = |e: &Error| matches!(e, Error::Buffer(_));
    let is_invalid = |e: &Error| matches!(e, Error::Invalid(_));
    expect_err("all_reduce f32 into f16", plan.all_reduce(c, &f8, &f16x8, ReduceOp::Sum), is_buffer)?;
    expect_err("all_reduce 8 into 9", plan.all_reduce(c, &f8, &f9, ReduceOp::Max), is_buffer)?;
    expect_err("all_gather 8 into 8 on 2 ranks", plan.all_gather(c, &f8, &f9), is_buffer)?;
    expect_err("reduce_scatter 9 on 2 ranks", plan.reduce_scatter(c, &f9, &f4, ReduceOp::Sum), is_buffer)?;
    expect_err("all_reduce of bool", plan.all_reduce(c, &b8, &b8, ReduceOp::Sum), is_buffer)?;
    expect_err("broadcast from rank 2 of 2", plan.broadcast(c, &f8, 2), is_invalid)?;
    expect_err("send to itself", plan.send(c, &f8, 0), is_invalid)?;
    expect_err("recv from rank 5", plan.recv(c, &f8, 5), is_invalid)?;
    let halves = (f8.view(0, 6)?, f8.view(2, 6)?);
    expect_err(
        "all_reduce between overlapping windows",
        plan.all_reduce(c, &halves.0, &halves.1, ReduceOp::Sum),
        is_buffer,
    )?;
    let host = kiln_device::open_device("CPU")?;
    if host.spec() != dev.spec() {
        let elsewhere = host.buffer(Scalar::F32, 8)?;
        expect_err(
            "all_reduce of a buffer of another device",
            plan.all_reduce(c, &elsewhere, &f8, ReduceOp::Sum),
            is_buffer,
        )?;
    }
    ensure!(plan.is_empty(), "refused collectives were recorded: the plan has {} node(s)", plan.len());
    // The same shapes that fit are accepted.
    plan.all_gather(c, &f4, &f8)?;
    plan.reduce_scatter(c, &f8, &f4, ReduceOp::Min)?;
    Ok(())
}

/// A rank whose buffers disagree with its peer's, and a peer that never comes: every rank
/// that came gets [`Error::Channel`] within the timeout, the broken channel refuses new
/// collectives, and the device and a new channel keep working.
pub fn failures(dev: &Arc<Device>) -> Outcome {
    let devices = rank_devices(dev, 2);
    let chans = channels(2)?;
    let mut plans = devices.iter().map(|d| ExecutionPlan::new(d)).collect::<Result<Vec<_>, _>>()?;
    let a = devices[0].buffer(Scalar::F32, 8)?;
    let b = devices[1].buffer(Scalar::F32, 16)?;
    plans[0].all_reduce(&chans[0], &a, &a, ReduceOp::Sum)?;
    plans[1].all_reduce(&chans[1], &b, &b, ReduceOp::Sum)?;
    for (r, result) in run_all(&mut plans).into_iter().enumerate() {
        expect_err(&format!("rank {r} of mismatched all_reduce"), result, |e| {
            matches!(e.root_cause(), Error::Channel { .. })
        })?;
    }
    let mut late = ExecutionPlan::new(&devices[0])?;
    expect_err("a collective on a broken channel", late.all_reduce(&chans[0], &a, &a, ReduceOp::Sum), |e| {
        matches!(e, Error::Channel { .. })
    })?;

    let lonely = LocalChannel::world_with_timeout(2, Duration::from_millis(200))?;
    let lonely: Arc<dyn Channel> = lonely[0].clone();
    let mut plan = ExecutionPlan::new(&devices[0])?;
    plan.all_reduce(&lonely, &a, &a, ReduceOp::Sum)?;
    let start = Instant::now();
    let result = plan.run(&[]);
    let waited = start.elapsed();
    expect_err("an all_reduce whose peer never comes", result, |e| matches!(e.root_cause(), Error::Channel { .. }))?;
    ensure!(waited < Duration::from_secs(30), "the lonely rank gave up after {waited:?}, not about its 200 ms timeout");

    // The plans and devices still work on a new channel.
    let fresh = channels(2)?;
    for (r, plan) in plans.iter_mut().enumerate() {
        *plan = ExecutionPlan::new(&devices[r])?;
        let buf = if r == 0 { &a } else { &b };
        let one = upload(&devices[r], Scalar::F32, &vec![Value::F(1.0); 8])?;
        buf.view(0, 8)?.copy_from(&one)?;
        plan.all_reduce(&fresh[r], &buf.view(0, 8)?, &buf.view(0, 8)?, ReduceOp::Sum)?;
    }
    for (r, result) in run_all(&mut plans).into_iter().enumerate() {
        result.map_err(|e| Failure::Violation(format!("rank {r} on a new channel: {e}")))?;
    }
    let got = floats(&a)?;
    ensure!(got == vec![2.0; 8], "all_reduce on a new channel gave {got:?}, want eight 2s");
    Ok(())
}
