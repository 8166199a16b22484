//! The MPI collective suite, run by `mpirun` (CI runs it with 4 ranks):
//!
//! ```sh
//! cargo build --release -p kiln-mpi --features mpi --examples
//! mpirun --oversubscribe -np 4 target/release/examples/mpi_suite            # the collectives
//! mpirun --oversubscribe -np 4 target/release/examples/mpi_suite hang       # a rank stops answering
//! mpirun --oversubscribe --enable-recovery -np 4 target/release/examples/mpi_suite kill   # a rank dies
//! mpirun --oversubscribe --enable-recovery -np 4 target/release/examples/mpi_suite kill-split 5
//! ```
//!
//! Every rank checks its own results against the host reference and exits non-zero on the
//! first difference. The collectives: all_reduce (sum, max, min) of f32, f64, f16, bf16, i32
//! and i64, in place and not; all_gather (rank order); reduce_scatter; broadcast from each
//! root; send/receive pairs around the ring; ranks passing different lengths to an all_reduce,
//! and a send and its receive of different dtypes (equal byte counts), which must fail on
//! both sides with a channel error and leave a new channel working; a zero timeout, refused
//! with an invalid-argument error; and a rank whose run is
//! refused before anything is queued, whose peers (waiting with a 30 s timeout) must fail at
//! once, naming it.
//!
//! The faults: the last rank stops answering (`hang`: it sleeps for two minutes, alive, and
//! never finalizes MPI in that time) or dies (`kill…`: SIGKILL) before the others' next wait,
//! and every other rank must get a channel error within its timeout (the second argument, in
//! seconds; 1 by default) and then exit, without waiting for the last rank in MPI_Finalize. Where they wait:
//! `kill` and `hang` a plan's all_reduce, `kill-barrier` a barrier, `kill-split` a split of
//! the channel (`MpiChannel::first`), `kill-baseline` the bench's blocking `MPI_Allreduce`,
//! `kill-new` a new channel (`MpiChannel::world`). Each survivor prints when its wait started
//! (`fault wait started at <ms since the epoch>`), so that CI can bound when it exits.
//! `KILN_MPI_DEVICE=OPENCL` runs the suite on another device (its buffers are staged through
//! the host).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Channel, Device, Error, ReduceOp};
use kiln_mpi::MpiChannel;
use kiln_runtime::ExecutionPlan;

/// This rank and how many checks passed, or what failed.
type Outcome = Result<(usize, usize), String>;

fn value(r: usize, i: usize, salt: usize) -> f64 {
    ((r * 7 + i * 3 + salt) % 11) as f64 - 4.0
}

/// A buffer of `dtype` on `dev` holding `values`.
fn upload(dev: &Device, dtype: Scalar, values: &[f64]) -> Result<Buffer, Error> {
    let b = dev.buffer(dtype, values.len())?;
    let mut bytes = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            Scalar::F32 => bytes.extend((v as f32).to_ne_bytes()),
            Scalar::F64 => bytes.extend(v.to_ne_bytes()),
            Scalar::F16 => bytes.extend(half::f16::from_f64(v).to_ne_bytes()),
            Scalar::BF16 => bytes.extend(half::bf16::from_f64(v).to_ne_bytes()),
            Scalar::I32 => bytes.extend((v as i32).to_ne_bytes()),
            _ => bytes.extend((v as i64).to_ne_bytes()),
        }
    }
    b.copyin(&bytes)?;
    Ok(b)
}

fn download(b: &Buffer) -> Result<Vec<f64>, Error> {
    let mut bytes = vec![0u8; b.nbytes()];
    b.copyout(&mut bytes)?;
    let es = b.dtype().size();
    Ok(bytes
        .chunks_exact(es)
        .map(|c| match b.dtype() {
            Scalar::F32 => f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64,
            Scalar::F16 => half::f16::from_ne_bytes([c[0], c[1]]).to_f64(),
            Scalar::BF16 => half::bf16::from_ne_bytes([c[0], c[1]]).to_f64(),
            Scalar::I32 => i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64,
            Scalar::F64 => f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])),
            _ => i64::from_ne_bytes(c.try_into().unwrap_or([0; 8])) as f64,
        })
        .collect())
}

fn reduce(op: ReduceOp, xs: impl Iterator<Item = f64>) -> f64 {
    xs.reduce(|a, b| match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
    })
    .unwrap_or(0.0)
}

fn suite(dev: &Arc<Device>) -> Outcome {
    let e = |e: Error| e.to_string();
    let chan: Arc<dyn Channel> = MpiChannel::world().map_err(e)?;
    let (rank, count) = (chan.rank(), chan.count());
    const N: usize = 1000;
    let mut plan = ExecutionPlan::new(dev).map_err(e)?;
    let mut expect: Vec<(String, Buffer, Vec<f64>)> = Vec::new();
    let dtypes = [Scalar::F32, Scalar::F64, Scalar::F16, Scalar::BF16, Scalar::I32, Scalar::I64];
    let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    for (salt, (dtype, op)) in dtypes.iter().flat_map(|d| ops.iter().map(move |o| (*d, *o))).enumerate() {
        for in_place in [false, true] {
            let send = upload(dev, dtype, &(0..N).map(|i| value(rank, i, salt)).collect::<Vec<_>>()).map_err(e)?;
            let recv = if in_place { send.clone() } else { dev.buffer(dtype, N).map_err(e)? };
            plan.all_reduce(&chan, &send, &recv, op).map_err(e)?;
            let want = (0..N).map(|i| reduce(op, (0..count).map(|r| value(r, i, salt)))).collect();
            expect.push((format!("all_reduce({}) of {dtype} (in place: {in_place})", op.name()), recv, want));
        }
    }
    let send = upload(dev, Scalar::I32, &(0..N).map(|i| value(rank, i, 1)).collect::<Vec<_>>()).map_err(e)?;
    let all = dev.buffer(Scalar::I32, N * count).map_err(e)?;
    plan.all_gather(&chan, &send, &all).map_err(e)?;
    expect.push(("all_gather".into(), all, (0..count).flat_map(|q| (0..N).map(move |i| value(q, i, 1))).collect()));

    let wide = upload(dev, Scalar::I64, &(0..N * count).map(|i| value(rank, i, 2)).collect::<Vec<_>>()).map_err(e)?;
    let part = dev.buffer(Scalar::I64, N).map_err(e)?;
    plan.reduce_scatter(&chan, &wide, &part, ReduceOp::Sum).map_err(e)?;
    expect.push((
        "reduce_scatter".into(),
        part,
        (0..N).map(|i| (0..count).map(|q| value(q, rank * N + i, 2)).sum()).collect(),
    ));

    for root in 0..count {
        let b = upload(dev, Scalar::BF16, &(0..N).map(|i| value(rank, i, 10 + root)).collect::<Vec<_>>()).map_err(e)?;
        plan.broadcast(&chan, &b, root).map_err(e)?;
        expect.push((format!("broadcast from {root}"), b, (0..N).map(|i| value(root, i, 10 + root)).collect()));
    }
    if count > 1 {
        let mine = upload(dev, Scalar::F16, &(0..N).map(|i| value(rank, i, 3)).collect::<Vec<_>>()).map_err(e)?;
        let theirs = dev.buffer(Scalar::F16, N).map_err(e)?;
        let (next, prev) = ((rank + 1) % count, (rank + count - 1) % count);
        if rank % 2 == 0 {
            plan.send(&chan, &mine, next).map_err(e)?;
            plan.recv(&chan, &theirs, prev).map_err(e)?;
        } else {
            plan.recv(&chan, &theirs, prev).map_err(e)?;
            plan.send(&chan, &mine, next).map_err(e)?;
        }
        expect.push((format!("recv from {prev}"), theirs, (0..N).map(|i| value(prev, i, 3)).collect()));
    }
    plan.run(&[]).map_err(|err| format!("the plan failed: {err}"))?;
    for (what, buf, want) in &expect {
        let got = download(buf).map_err(e)?;
        if got != *want {
            let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("{what}: element {at} is {}, want {}", got[at], want[at]));
        }
    }
    let mut checks = expect.len();

    // Ranks that disagree: every rank fails, and a new channel works.
    let mismatch: Arc<dyn Channel> = MpiChannel::world().map_err(e)?;
    let len = if rank == 0 { 8 } else { 16 };
    let b = upload(dev, Scalar::F32, &vec![1.0; len]).map_err(e)?;
    let mut plan = ExecutionPlan::new(dev).map_err(e)?;
    plan.all_reduce(&mismatch, &b, &b, ReduceOp::Sum).map_err(e)?;
    match plan.run(&[]) {
        Err(err) if matches!(err.root_cause(), Error::Channel { .. }) => {}
        other if count == 1 => other.map_err(e)?,
        other => return Err(format!("ranks passing 8 and 16 elements: {other:?}, want a channel error")),
    }
    match MpiChannel::world_with_timeout(Duration::ZERO) {
        Err(Error::Invalid(m)) if m.contains("more than 0") => checks += 1,
        other => return Err(format!("a channel with a zero timeout: {other:?}, want an invalid-argument error")),
    }
    checks += send_recv_mismatch(dev, rank, count)?;
    checks += refused_rank_leaves(dev, rank, count)?;

    let fresh: Arc<dyn Channel> = MpiChannel::world().map_err(e)?;
    let b = upload(dev, Scalar::F32, &[1.0; 8]).map_err(e)?;
    let mut plan = ExecutionPlan::new(dev).map_err(e)?;
    plan.all_reduce(&fresh, &b, &b, ReduceOp::Sum).map_err(e)?;
    plan.run(&[]).map_err(|err| format!("all_reduce on a new channel after a broken one: {err}"))?;
    let got = download(&b).map_err(e)?;
    if got != vec![count as f64; 8] {
        return Err(format!("all_reduce on a new channel gave {got:?}"));
    }
    checks += 2;
    Ok((rank, checks))
}

/// Rank 0 sends 8 f32 to rank 1, which receives 8 i32 (as many bytes): both fail with a
/// channel error naming the two signatures (MPI alone would hand over the bits); the other
/// ranks take no part.
fn send_recv_mismatch(dev: &Arc<Device>, rank: usize, count: usize) -> Result<usize, String> {
    let e = |e: Error| e.to_string();
    let chan: Arc<dyn Channel> = MpiChannel::world().map_err(e)?;
    if count < 2 || rank > 1 {
        return Ok(0);
    }
    let mut plan = ExecutionPlan::new(dev).map_err(e)?;
    let (dtype, what) = if rank == 0 { (Scalar::F32, "the send") } else { (Scalar::I32, "the receive") };
    let b = upload(dev, dtype, &[7.0; 8]).map_err(e)?;
    if rank == 0 {
        plan.send(&chan, &b, 1).map_err(e)?;
    } else {
        plan.recv(&chan, &b, 0).map_err(e)?;
    }
    match plan.run(&[]) {
        Err(err)
            if matches!(err.root_cause(), Error::Channel { message, .. }
            if message.contains("8 f32") && message.contains("8 i32")) => {}
        other => return Err(format!("{what} of 8 f32 against 8 i32: {other:?}, want a channel error naming both")),
    }
    if rank == 1 && download(&b).map_err(e)? != vec![7.0; 8] {
        return Err("the refused receive changed its buffer".into());
    }
    Ok(1)
}

/// The last rank's run is refused before anything is queued (a name that is no plan
/// variable); its peers, in an all_reduce with a 30 s timeout, and rank 0, receiving from it,
/// must fail at once with a channel error naming it.
fn refused_rank_leaves(dev: &Arc<Device>, rank: usize, count: usize) -> Result<usize, String> {
    let e = |e: Error| e.to_string();
    if count < 2 {
        return Ok(0);
    }
    let last = count - 1;
    let mut checks = 0;
    for p2p in [false, true] {
        let chan: Arc<dyn Channel> = MpiChannel::world_with_timeout(Duration::from_secs(30)).map_err(e)?;
        if p2p && rank != 0 && rank != last {
            continue;
        }
        let b = upload(dev, Scalar::F32, &[1.0; 16]).map_err(e)?;
        let mut plan = ExecutionPlan::new(dev).map_err(e)?;
        match (p2p, rank == last) {
            (false, _) => plan.all_reduce(&chan, &b, &b, ReduceOp::Sum).map(|_| ()),
            (true, true) => plan.send(&chan, &b, 0).map(|_| ()),
            (true, false) => plan.recv(&chan, &b, last).map(|_| ()),
        }
        .map_err(e)?;
        let what = if p2p { "a receive" } else { "an all_reduce" };
        let start = Instant::now();
        if rank == last {
            match plan.run(&[("no_such_variable", 1)]) {
                Err(Error::Launch(_)) => {}
                other => return Err(format!("a run with an unknown variable: {other:?}, want a launch error")),
            }
        } else {
            let result = plan.run(&[]);
            let waited = start.elapsed();
            match result {
                Err(err)
                    if matches!(err.root_cause(), Error::Channel { message, .. }
                    if message.contains(&format!("rank {last} left")))
                        && waited < Duration::from_secs(10) => {}
                other => {
                    return Err(format!(
                        "{what} whose peer's run was refused: after {waited:.2?}, {other:?}; want a channel error \
                         naming rank {last} well within the 30 s timeout"
                    ));
                }
            }
        }
        checks += 1;
    }
    Ok(checks)
}

/// Where the survivors of a fault wait when the last rank fails them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultAt {
    AllReduce,
    Barrier,
    Split,
    Baseline,
    NewChannel,
}

/// The last rank stops answering (`kill`: dies) before the others' wait at `at`; they must
/// fail with a channel error within `timeout` (and then exit: CI bounds that).
fn fault(dev: &Arc<Device>, kill: bool, at: FaultAt, timeout: Duration) -> Outcome {
    let e = |e: Error| e.to_string();
    let world = MpiChannel::world_with_timeout(timeout).map_err(e)?;
    let chan: Arc<dyn Channel> = world.clone();
    let (rank, count) = (chan.rank(), chan.count());
    if count < 2 {
        return Err("the fault modes need 2 ranks or more".into());
    }
    // Every rank gets here, so the fault strikes the waits below, not the channel's creation.
    world.barrier().map_err(e)?;
    if rank == count - 1 {
        if kill {
            // SAFETY: raising a signal at ourselves; SIGKILL ends the process here.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        // Longer than CI waits for the job: a survivor that waited for this rank to finalize
        // would not exit in time (mpirun ends this rank once a survivor exits without it).
        std::thread::sleep(Duration::from_secs(120));
        return Ok((rank, 0));
    }
    let b = upload(dev, Scalar::F32, &[1.0; 64]).map_err(e)?;
    let mut plan = ExecutionPlan::new(dev).map_err(e)?;
    plan.all_reduce(&chan, &b, &b, ReduceOp::Sum).map_err(e)?;
    let epoch_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    println!("rank {rank}: fault wait started at {epoch_ms}");
    let start = Instant::now();
    let result = match at {
        FaultAt::AllReduce => plan.run(&[]),
        FaultAt::Barrier => world.barrier(),
        FaultAt::Split => world.first(count - 1).map(|_| ()),
        FaultAt::Baseline => world.baseline_all_reduce_f32(vec![1.0; 1 << 16], vec![0.0; 1 << 16]).map(|_| ()),
        FaultAt::NewChannel => MpiChannel::world_with_timeout(timeout).map(|_| ()),
    };
    let waited = start.elapsed();
    match result {
        Err(err) if matches!(err.root_cause(), Error::Channel { .. }) && waited < timeout + Duration::from_secs(5) => {
            println!("rank {rank}: the peer's fault gave a channel error after {waited:.2?}: {err}");
            Ok((rank, 1))
        }
        other => Err(format!("after {waited:?}: {other:?}, want a channel error within about {timeout:?}")),
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let timeout = std::env::args().nth(2).map_or(Ok(1.0), |t| t.parse::<f64>());
    let timeout = match timeout.ok().and_then(|t| Duration::try_from_secs_f64(t).ok()) {
        Some(t) if !t.is_zero() => t,
        _ => {
            eprintln!("mpi suite: the second argument is the fault's timeout in seconds (more than 0)");
            return ExitCode::FAILURE;
        }
    };
    let device = std::env::var("KILN_MPI_DEVICE").unwrap_or_else(|_| "CPU".into());
    kiln_cpu::register();
    kiln_opencl::register();
    let outcome = kiln_device::open_device(&device).map_err(|e| e.to_string()).and_then(|dev| match mode.as_str() {
        "" => suite(&dev),
        "hang" => fault(&dev, false, FaultAt::AllReduce, timeout),
        "kill" => fault(&dev, true, FaultAt::AllReduce, timeout),
        "kill-barrier" => fault(&dev, true, FaultAt::Barrier, timeout),
        "kill-split" => fault(&dev, true, FaultAt::Split, timeout),
        "kill-baseline" => fault(&dev, true, FaultAt::Baseline, timeout),
        "kill-new" => fault(&dev, true, FaultAt::NewChannel, timeout),
        other => Err(format!(
            "unknown mode `{other}`: use none, hang, kill, kill-barrier, kill-split, kill-baseline or kill-new"
        )),
    });
    match outcome {
        Ok((rank, checks)) => {
            println!(
                "mpi suite ({}): rank {rank}: passed {checks} checks",
                if mode.is_empty() { "collectives" } else { &mode }
            );
            ExitCode::SUCCESS
        }
        Err(m) => {
            eprintln!("mpi suite: FAILED: {m}");
            ExitCode::FAILURE
        }
    }
}
