//! Execution plans (`kiln-runtime`) on the device's queues: the result of a run is the
//! result of running the recorded nodes one after another (hazards are honoured across
//! queues), independent nodes all complete, and replays take new variable values.

use std::sync::Arc;

use kiln_device::kiln_ir::IrError;
use kiln_device::{Buffer, Device, Error};
use kiln_runtime::{ExecutionPlan, Hazard, PlanOptions};

use crate::kernels::{affine, affine_in_place, compile};
use crate::{Failure, Outcome, ensure, expect_err, queues};

const N: usize = 32;

/// A plan spread over at least two compute queues, so hazards really cross queues.
fn plan_on(dev: &Device) -> Result<ExecutionPlan, Failure> {
    queues(dev)?;
    let options = PlanOptions { compute_queues: 2, ..PlanOptions::default() };
    Ok(ExecutionPlan::with_options(dev, options)?)
}

/// One recorded node for the host simulation: `dst[i] = src[i] * mul + add` over buffer ids.
struct Step {
    src: usize,
    dst: usize,
    mul: f32,
    add: f32,
}

fn simulate(state: &mut [Vec<f32>], steps: &[Step]) {
    for s in steps {
        let out: Vec<f32> = state[s.src].iter().map(|v| v * s.mul + s.add).collect();
        state[s.dst] = out;
    }
}

/// Read-after-write chains, write-after-read and write-after-write on shared buffers, and
/// an independent node, run twice: each run equals the serial execution of the nodes.
pub fn hazards(dev: &Arc<Device>) -> Outcome {
    let add1 = compile(dev, &affine(1.0, 1.0)?, "conf_add1")?;
    let mul2 = compile(dev, &affine(2.0, 0.0)?, "conf_mul2")?;
    let init: Vec<Vec<f32>> = (0..7).map(|b| (0..N).map(|i| (b * 100 + i) as f32 * 0.25).collect()).collect();
    let bufs: Vec<Buffer> = init.iter().map(|d| Buffer::from_slice(dev.allocator(), d)).collect::<Result<_, _>>()?;
    let (a, b, c, d, e, f, g) = (0, 1, 2, 3, 4, 5, 6);
    let steps = [
        Step { src: a, dst: b, mul: 1.0, add: 1.0 }, // 0: b = a + 1
        Step { src: b, dst: c, mul: 2.0, add: 0.0 }, // 1: c = 2b          (RAW on b)
        Step { src: c, dst: d, mul: 1.0, add: 1.0 }, // 2: d = c + 1       (RAW on c)
        Step { src: e, dst: f, mul: 2.0, add: 0.0 }, // 3: f = 2e          (independent)
        Step { src: d, dst: a, mul: 2.0, add: 0.0 }, // 4: a = 2d          (WAR on a with 0)
        Step { src: g, dst: b, mul: 1.0, add: 1.0 }, // 5: b = g + 1       (WAW with 0, WAR with 1)
    ];
    let mut plan = plan_on(dev)?;
    for s in &steps {
        let k = if s.mul == 2.0 { &mul2 } else { &add1 };
        plan.exec(k, &[&bufs[s.src], &bufs[s.dst]], &[("n", N as i64)])?;
    }
    let has = |node: usize, on: usize, h: Hazard| plan.dependencies(node).iter().any(|d| d.node == on && d.hazard == h);
    ensure!(has(1, 0, Hazard::ReadAfterWrite), "node 1 reads what node 0 writes: deps {:?}", plan.dependencies(1));
    ensure!(plan.dependencies(3).is_empty(), "node 3 is independent: deps {:?}", plan.dependencies(3));
    ensure!(!plan.dependencies(4).is_empty(), "node 4 overwrites node 0's input: no dependency recorded");
    ensure!(!plan.dependencies(5).is_empty(), "node 5 overwrites node 0's output read by node 1: no dependency");

    let mut state = init.clone();
    for run in 1..=2 {
        plan.run(&[])?;
        simulate(&mut state, &steps);
        for (id, (buf, want)) in bufs.iter().zip(&state).enumerate() {
            let got = buf.to_vec::<f32>()?;
            ensure!(got == *want, "run {run}: buffer {id} is {got:?}, want {want:?} (the serial result)");
        }
    }
    Ok(())
}

/// Many nodes on disjoint buffers all run and complete, whatever queues they land on.
pub fn independent_nodes(dev: &Arc<Device>) -> Outcome {
    let add1 = compile(dev, &affine(1.0, 1.0)?, "conf_add1")?;
    let mut plan = plan_on(dev)?;
    let pairs: Vec<(Buffer, Buffer)> = (0..6)
        .map(|p| {
            let x: Vec<f32> = (0..N).map(|i| (p * N + i) as f32).collect();
            Ok((Buffer::from_slice(dev.allocator(), &x)?, Buffer::from_slice(dev.allocator(), &[0f32; N])?))
        })
        .collect::<Result<_, Failure>>()?;
    for (x, y) in &pairs {
        plan.exec(&add1, &[x, y], &[("n", N as i64)])?;
    }
    for i in 0..pairs.len() {
        ensure!(plan.dependencies(i).is_empty(), "node {i} on disjoint buffers has deps {:?}", plan.dependencies(i));
    }
    let assignment = plan.queue_assignment()?;
    ensure!(assignment.len() == pairs.len(), "queue assignment {assignment:?} for {} nodes", pairs.len());
    plan.run(&[])?;
    let check = |run: &str| -> Outcome {
        for (p, (x, y)) in pairs.iter().enumerate() {
            let want: Vec<f32> = x.to_vec::<f32>()?.iter().map(|v| v + 1.0).collect();
            ensure!(y.to_vec::<f32>()? == want, "{run}: independent node {p} computed {:?}", y.to_vec::<f32>()?);
        }
        Ok(())
    };
    check("run")?;
    for (_, y) in &pairs {
        y.copy_from_slice(&[0f32; N])?;
    }
    // A profiled run computes the same and reports every node once, each on its queue: timed
    // on the host where the queue runs the program, by the device where it enqueues natively.
    let profile = plan.run_profiled(&[])?;
    check("profiled run")?;
    let mut nodes: Vec<usize> = profile.events.iter().map(|e| e.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    ensure!(nodes.len() == profile.events.len(), "a node appears twice in the profile: {:?}", profile.events);
    let all: Vec<usize> = (0..pairs.len()).collect();
    ensure!(nodes == all, "profiled events for nodes {nodes:?}, want {all:?}");
    for e in &profile.events {
        ensure!(e.start <= e.end, "profile event {e:?} ends before it starts");
        ensure!(e.queue == assignment[e.node], "profile event {e:?} is not on its assigned queue");
    }
    Ok(())
}

/// Copy nodes between devices in a plan: `dev` pulls data from `peer`, computes on it and
/// pushes the result back; a replay sees new input written between runs.
pub fn cross_device_copies(dev: &Arc<Device>, peer: &Arc<Device>) -> Outcome {
    let mul2 = compile(dev, &affine(2.0, 0.0)?, "conf_mul2")?;
    let src: Vec<f32> = (0..N).map(|i| i as f32 - 3.0).collect();
    let remote_in = Buffer::from_slice(peer.allocator(), &src)?;
    let remote_out = Buffer::from_slice(peer.allocator(), &[0f32; N])?;
    let (local_in, local_out) =
        (Buffer::from_slice(dev.allocator(), &[0f32; N])?, Buffer::from_slice(dev.allocator(), &[0f32; N])?);
    let mut plan = plan_on(dev)?;
    plan.copy(&local_in, &remote_in)?;
    plan.exec(&mul2, &[&local_in, &local_out], &[("n", N as i64)])?;
    plan.copy(&remote_out, &local_out)?;
    ensure!(!plan.dependencies(1).is_empty() && !plan.dependencies(2).is_empty(), "copy/exec chain has no deps");
    for run in 0..2 {
        let input: Vec<f32> = src.iter().map(|v| v + run as f32 * 10.0).collect();
        remote_in.copy_from_slice(&input)?;
        plan.run(&[])?;
        let want: Vec<f32> = input.iter().map(|v| v * 2.0).collect();
        let got = remote_out.to_vec::<f32>()?;
        ensure!(got == want, "run {run}: {} -> {} -> {} gave {got:?}", peer.spec(), dev.spec(), peer.spec());
    }
    Ok(())
}

/// Replays with new variable values change what runs without re-recording; bad values are
/// refused before anything is submitted and the plan stays usable.
pub fn replay_with_new_values(dev: &Arc<Device>) -> Outcome {
    let add1 = compile(dev, &affine(1.0, 1.0)?, "conf_add1")?;
    let inc = compile(dev, &affine_in_place(1.0, 1.0)?, "conf_inc")?;
    let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let xb = Buffer::from_slice(dev.allocator(), &x)?;
    let yb = Buffer::from_slice(dev.allocator(), &[-1f32; N])?;
    let counter = Buffer::from_slice(dev.allocator(), &[0f32; N])?;
    let mut plan = plan_on(dev)?;
    expect_err(
        "recording without binding `n`",
        plan.exec(&add1, &[&xb, &yb], &[]),
        |e| matches!(e, Error::Ir(IrError::MissingVar(n)) if n == "n"),
    )?;
    expect_err("recording with an unknown variable", plan.exec(&add1, &[&xb, &yb], &[("n", 4), ("m", 1)]), |e| {
        matches!(e, Error::Launch(_))
    })?;
    ensure!(plan.is_empty(), "refused recordings left {} node(s)", plan.len());
    plan.exec(&add1, &[&xb, &yb], &[("n", 4)])?;
    plan.exec(&inc, &[&counter], &[("n", 4)])?;
    ensure!(plan.var_names() == ["n"], "plan variables {:?}, want [n]", plan.var_names());

    let expect = |n: usize, runs: f32| -> Outcome {
        let want: Vec<f32> = (0..N).map(|i| if i < n { x[i] + 1.0 } else { -1.0 }).collect();
        ensure!(yb.to_vec::<f32>()? == want, "after n = {n}: y = {:?}", yb.to_vec::<f32>()?);
        let c = counter.to_vec::<f32>()?;
        ensure!(c[0] == runs, "counter[0] = {} after {runs} runs", c[0]);
        Ok(())
    };
    plan.run(&[])?;
    expect(4, 1.0)?;
    plan.run(&[("n", 16)])?;
    expect(16, 2.0)?;
    let too_big = plan.run(&[("n", N as i64 + 1)]);
    expect_err("a replay with n larger than the buffers", too_big, |e| matches!(e, Error::Launch(_)))?;
    let out_of_range = plan.run(&[("n", 0)]);
    expect_err("a replay with n = 0 below its min", out_of_range, |e| {
        matches!(e, Error::Ir(IrError::VarOutOfRange { .. }) | Error::Launch(_))
    })?;
    expect(16, 2.0)?;
    plan.run_vals(&[N as i64])?;
    expect(N, 3.0)?;
    let c = counter.to_vec::<f32>()?;
    // Runs with n = 4, 16 and 32: the first 4 elements ran 3 times, the next 12 twice.
    ensure!(c[3] == 3.0 && c[15] == 2.0 && c[N - 1] == 1.0, "counter {c:?} after runs with n = 4, 16, 32");
    Ok(())
}
