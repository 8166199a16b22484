//! The MPI collective suite, run by `mpirun` (CI runs it with 4 ranks):
//!
//! ```sh
//! cargo build --release -p kiln-mpi --features mpi --examples
//! mpirun --oversubscribe -np 4 target/release/examples/mpi_suite            # the collectives
//! mpirun --oversubscribe -np 4 target/release/examples/mpi_suite hang       # a rank stops answering
//! mpirun --oversubscribe --enable-recovery -np 4 target/release/examples/mpi_suite kill   # a rank dies
//! ```
//!
//! Every rank checks its own results against the host reference and exits non-zero on the
//! first difference. The collectives: all_reduce (sum, max, min) of f32, f64, f16, bf16, i32
//! and i64, in place and not; all_gather (rank order); reduce_scatter; broadcast from each
//! root; send/receive pairs around the ring; and ranks passing different lengths, which must
//! fail on every rank with a channel error and leave a new channel working. `hang` and `kill`:
//! the last rank stops answering (sleeps) or dies (SIGKILL) before an all_reduce; every other
//! rank must get a channel error within its 1 s timeout. `KILN_MPI_DEVICE=OPENCL` runs the
//! suite on another device (its buffers are staged through the host).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The last rank stops answering (`kill`: dies) before an all_reduce; the others must fail
/// with a channel error within their 1 s timeout.
fn fault(dev: &Arc<Device>, kill: bool) -> Outcome {
    let e = |e: Error| e.to_string();
    let chan: Arc<dyn Channel> = MpiChannel::world_with_timeout(Duration::from_secs(1)).map_err(e)?;
    let (rank, count) = (chan.rank(), chan.count());
    if count < 2 {
        return Err("the fault modes need 2 ranks or more".into());
    }
    if rank == count - 1 {
        if kill {
            // SAFETY: raising a signal at ourselves; SIGKILL ends the process here.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_secs(3));
        return Ok((rank, 0));
    }
    let b = upload(dev, Scalar::F32, &[1.0; 64]).map_err(e)?;
    let mut plan = ExecutionPlan::new(dev).map_err(e)?;
    plan.all_reduce(&chan, &b, &b, ReduceOp::Sum).map_err(e)?;
    let start = Instant::now();
    let result = plan.run(&[]);
    let waited = start.elapsed();
    match result {
        Err(err) if matches!(err.root_cause(), Error::Channel { .. }) && waited < Duration::from_secs(10) => {
            println!("rank {rank}: the peer's fault gave a channel error after {waited:.2?}: {err}");
            Ok((rank, 1))
        }
        other => Err(format!("after {waited:?}: {other:?}, want a channel error within about 1 s")),
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let device = std::env::var("KILN_MPI_DEVICE").unwrap_or_else(|_| "CPU".into());
    kiln_cpu::register();
    kiln_opencl::register();
    let outcome = kiln_device::open_device(&device).map_err(|e| e.to_string()).and_then(|dev| match mode.as_str() {
        "" => suite(&dev),
        "hang" => fault(&dev, false),
        "kill" => fault(&dev, true),
        other => Err(format!("unknown mode `{other}`: use none, hang or kill")),
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
