//! NCCL channels (feature `nccl`): collectives between CUDA devices, through cudarc's NCCL
//! bindings, loaded at run time like the driver (libnccl ships in the `nvidia-nccl-cu12`
//! wheel; put its `lib` folder on `LD_LIBRARY_PATH`).
//!
//! An [`NcclChannel`] is one rank on one CUDA device: its collectives take buffers of that
//! device only ([`Channel::accepts`]) and run on a stream of the channel, as a host step of
//! the plan's queue: enqueued once the plan's earlier work finished, then polled until the
//! stream completes, NCCL reports an error, or the timeout passes, when the communicator is
//! aborted (`ncclCommAbort`) and the channel is broken. Ranks meet through an id one rank
//! makes ([`NcclChannel::unique_id`]) and hands to the others by its own means (an MPI
//! broadcast, a file); [`NcclChannel::single`] is a world of one. NCCL refuses two ranks on
//! one GPU, so several ranks need as many GPUs (one process or thread per rank, each calling
//! [`NcclChannel::new`] with its rank); with one GPU, only the world of one runs.
//!
//! Dtypes: NCCL's (f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64); i16 and u16 are refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::result::stream::StreamKind;
use cudarc::driver::result::{self as cu};
use cudarc::driver::sys;
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as nsys;
use kiln_device::collective::{self, Deadline};
use kiln_device::kiln_ir::{DeviceSpec, Scalar};
use kiln_device::{Buffer, Channel, Collective, Error, ReduceOp, Result};

use crate::allocator::address;
use crate::{CudaDevice, cuda_device, driver};

fn nccl_err(what: &str, e: nccl::NcclError) -> Error {
    Error::Driver { backend: "NCCL", code: Some(e.0 as i64), fatal: false, message: format!("{what} failed: {e:?}") }
}

/// Checks that libnccl loads (cudarc panics on a call into a library it cannot load).
fn nccl_present() -> Result<()> {
    // SAFETY: only tries to dlopen the candidate names of libnccl.
    if unsafe { nsys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::Unavailable(
        "libnccl was not found on the loader's path: `pip install nvidia-nccl-cu12` and add its \
         nvidia/nccl/lib folder to LD_LIBRARY_PATH"
            .into(),
    ))
}

/// NCCL's handles, used under the channel's lock only.
struct Handles {
    comm: nsys::ncclComm_t,
    stream: sys::CUstream,
}

// SAFETY: the communicator and stream are used by one thread at a time (the channel's `busy`
// lock) and belong to no thread.
unsafe impl Send for Handles {}

/// One rank's end of an NCCL channel (see the module docs).
pub struct NcclChannel {
    cu: Arc<CudaDevice>,
    spec: DeviceSpec,
    rank: usize,
    count: usize,
    timeout: Duration,
    /// Taken for each collective: one at a time, in order.
    handles: Mutex<Handles>,
    broken: Mutex<Option<Error>>,
}

impl std::fmt::Debug for NcclChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclChannel({}, rank {} of {})", self.spec, self.rank, self.count)
    }
}

impl NcclChannel {
    /// A new id for the ranks of one channel to meet by: made by one rank, handed to every
    /// other (an MPI broadcast, a file) before they call [`NcclChannel::new`].
    ///
    /// # Errors
    /// [`Error::Unavailable`] without libnccl; NCCL's error.
    pub fn unique_id() -> Result<[u8; 128]> {
        nccl_present()?;
        let id = nccl::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Rank `rank` of `count` on the CUDA device `spec`, meeting the other ranks through `id`
    /// (every rank passes the same). Blocks until every rank joined (NCCL's own wait).
    /// Collectives wait at most `timeout` for the peers.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a rank not below `count` or a zero timeout; [`Error::Unavailable`]
    /// without CUDA or libnccl; the driver's and NCCL's errors.
    pub fn new(
        spec: &DeviceSpec,
        id: [u8; 128],
        rank: usize,
        count: usize,
        timeout: Duration,
    ) -> Result<Arc<NcclChannel>> {
        if rank >= count || i32::try_from(count).is_err() {
            return Err(Error::Invalid(format!("NCCL rank {rank} of {count}: a rank is below the count")));
        }
        let timeout = collective::check_timeout(timeout)?;
        let cu = cuda_device(spec)?;
        nccl_present()?;
        cu.bind()?;
        let stream = cu::stream::create(StreamKind::NonBlocking).map_err(|e| driver("cuStreamCreate", e))?;
        let id = nsys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
        let mut comm: nsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is written by the call; the device's context is current (bind).
        let joined = unsafe { nccl::comm_init_rank(&mut comm, count as i32, id, rank as i32) };
        if let Err(e) = joined {
            // SAFETY: the stream was created above and is used by nothing else.
            let _ = unsafe { cu::stream::destroy(stream) };
            return Err(nccl_err("ncclCommInitRank", e));
        }
        Ok(Arc::new(NcclChannel {
            cu,
            spec: spec.clone(),
            rank,
            count,
            timeout,
            handles: Mutex::new(Handles { comm, stream }),
            broken: Mutex::new(None),
        }))
    }

    /// A channel of one rank on `spec` (what one GPU can run).
    ///
    /// # Errors
    /// As [`NcclChannel::new`].
    pub fn single(spec: &DeviceSpec) -> Result<Arc<NcclChannel>> {
        Self::new(spec, Self::unique_id()?, 0, 1, collective::DEFAULT_TIMEOUT)
    }

    fn fail(&self, message: String) -> Error {
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        broken
            .get_or_insert_with(|| Error::Channel {
                channel: format!("nccl on {} ({} ranks)", self.spec, self.count),
                message,
            })
            .clone()
    }

    /// Polls the stream until the collective finished, NCCL failed, or `deadline` passed (the
    /// communicator is then aborted).
    fn wait(&self, h: &mut Handles, what: &str, deadline: Deadline) -> Result<()> {
        loop {
            // SAFETY: a live stream of this channel.
            match unsafe { sys::cuStreamQuery(h.stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(driver(&format!("{what}: cuStreamQuery"), cu::DriverError(other))),
            }
            let mut state = nsys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator; `state` is written.
            let _ = unsafe { nsys::ncclCommGetAsyncError(h.comm, &mut state) };
            let failed = state != nsys::ncclResult_t::ncclSuccess && state != nsys::ncclResult_t::ncclInProgress;
            if failed || deadline.passed() {
                // SAFETY: aborting stops the communicator's kernels; it is not used afterwards.
                let _ = unsafe { nccl::comm_abort(h.comm) };
                let why =
                    if failed { format!("NCCL reported {state:?}") } else { "its peers did not all answer".into() };
                return Err(self.fail(format!("rank {} in {what}: {why}", self.rank)));
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for NcclChannel {
    fn drop(&mut self) {
        let h = self.handles.get_mut().unwrap_or_else(|p| p.into_inner());
        if self.cu.bind().is_ok() {
            // SAFETY: the communicator and stream are this channel's; nothing uses them now.
            unsafe {
                if self.broken.get_mut().map_or(true, |b| b.is_none()) {
                    let _ = nccl::comm_destroy(h.comm);
                }
                let _ = cu::stream::destroy(h.stream);
            }
        }
    }
}

/// NCCL's type for `dtype`.
fn datatype(dtype: Scalar) -> Result<nsys::ncclDataType_t> {
    use nsys::ncclDataType_t as T;
    Ok(match dtype {
        Scalar::Bool | Scalar::U8 => T::ncclUint8,
        Scalar::I8 => T::ncclInt8,
        Scalar::I32 => T::ncclInt32,
        Scalar::U32 => T::ncclUint32,
        Scalar::I64 => T::ncclInt64,
        Scalar::U64 => T::ncclUint64,
        Scalar::F16 => T::ncclFloat16,
        Scalar::BF16 => T::ncclBfloat16,
        Scalar::F32 => T::ncclFloat32,
        Scalar::F64 => T::ncclFloat64,
        Scalar::I16 | Scalar::U16 => {
            return Err(Error::Buffer(format!("NCCL has no {dtype}; use a channel of another provider or i32")));
        }
    })
}

fn reduction(op: ReduceOp) -> nsys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => nsys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => nsys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => nsys::ncclRedOp_t::ncclMin,
    }
}

impl Channel for NcclChannel {
    fn rank(&self) -> usize {
        self.rank
    }

    fn count(&self) -> usize {
        self.count
    }

    fn provider(&self) -> &'static str {
        "nccl"
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn accepts(&self, buffer: &Buffer) -> Result<()> {
        if buffer.device() != &self.spec {
            return Err(Error::Buffer(format!(
                "an NCCL channel on {} takes buffers of that device, not of {}; use an MPI or local channel",
                self.spec,
                buffer.device()
            )));
        }
        datatype(buffer.dtype()).map(|_| ())
    }

    fn run(&self, op: Collective, send: &Buffer, recv: &Buffer, timeout: Duration) -> Result<()> {
        let mut h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.broken() {
            return Err(e);
        }
        self.accepts(send)?;
        let dt = datatype(send.dtype())?;
        self.cu.bind()?;
        let (s, r) = (address(&send.raw()?), address(&recv.raw()?));
        let (sp, rp) = (s as *const std::ffi::c_void, r as *mut std::ffi::c_void);
        let n = send.len();
        let stream = h.stream as nsys::cudaStream_t;
        let comm = h.comm;
        // SAFETY: `send` and `recv` are live buffers of this channel's device holding the
        // element counts `collective::check` verified for `op`; the plan keeps them alive and
        // untouched until this returns, and this waits for the stream (or aborts the
        // communicator, which stops its kernels) before returning.
        let enqueued = unsafe {
            match op {
                Collective::AllReduce(o) => nccl::all_reduce(sp, rp, n, dt, reduction(o), comm, stream),
                Collective::AllGather => nccl::all_gather(sp, rp, n, dt, comm, stream),
                Collective::ReduceScatter(o) => {
                    nccl::reduce_scatter(sp, rp, n / self.count, dt, reduction(o), comm, stream)
                }
                Collective::Broadcast { root } => nccl::broadcast(sp, rp, n, dt, root as i32, comm, stream),
                Collective::Send { peer } => nccl::send(sp, n, dt, peer as i32, comm, stream),
                Collective::Recv { peer } => nccl::recv(rp, n, dt, peer as i32, comm, stream),
            }
        };
        enqueued.map_err(|e| self.fail(nccl_err(&op.name(), e).to_string()))?;
        self.wait(&mut h, &op.name(), Deadline::after(timeout.min(self.timeout)))
    }

    fn broken(&self) -> Option<Error> {
        self.broken.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::testing::or_skip;

    /// A world of one on the first GPU: an all_reduce and a broadcast leave the data as it
    /// is, and a dtype NCCL lacks is refused. Runs where CUDA and libnccl are present (a lent GPU).
    #[test]
    fn a_world_of_one_all_reduces_on_the_gpu() {
        let spec = DeviceSpec::new("CUDA", 0);
        crate::register();
        let Some(device) = or_skip("nccl", "a_world_of_one_all_reduces_on_the_gpu", kiln_device::open_device("CUDA"))
        else {
            return;
        };
        let Some(chan) = or_skip("nccl", "a_world_of_one_all_reduces_on_the_gpu", NcclChannel::single(&spec)) else {
            return;
        };
        let chan: Arc<dyn Channel> = chan;
        let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let send = Buffer::from_slice(device.allocator(), &data).unwrap();
        let recv = device.buffer(Scalar::F32, 1000).unwrap();
        collective::check(chan.as_ref(), Collective::AllReduce(ReduceOp::Sum), &send, &recv).unwrap();
        chan.run(Collective::AllReduce(ReduceOp::Sum), &send, &recv, Duration::from_secs(30)).unwrap();
        assert_eq!(recv.to_vec::<f32>().unwrap(), data);
        chan.run(Collective::Broadcast { root: 0 }, &send, &send, Duration::from_secs(30)).unwrap();
        assert_eq!(send.to_vec::<f32>().unwrap(), data);
        let i16s = device.buffer(Scalar::I16, 4).unwrap();
        assert!(matches!(chan.accepts(&i16s), Err(Error::Buffer(_))));
    }

    /// A zero timeout is refused before CUDA or NCCL is touched (so on any machine).
    #[test]
    fn a_zero_timeout_is_refused() {
        let spec = DeviceSpec::new("CUDA", 0);
        let e = NcclChannel::new(&spec, [0; 128], 0, 1, Duration::ZERO).expect_err("a zero timeout");
        assert!(matches!(&e, Error::Invalid(m) if m.contains("more than 0")), "{e}");
    }
}
