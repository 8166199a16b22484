//! [`MpiChannel`] over the MPI library (see the crate docs).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kiln_device::collective::{self, Deadline, Region, Staged};
use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Channel, Collective, Error, ReduceOp, Result};
use mpi::ffi;

/// The tag of kiln's sends and receives on its communicators.
const TAG: c_int = 0x6b69;

/// Serializes every MPI call kiln makes (MPI_THREAD_SERIALIZED).
fn mpi_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // The lock guards no data; a panic while holding it leaves nothing inconsistent.
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// MPI's handles are pointers (OpenMPI) to objects the library owns and keeps for the life of
/// the communicator or the process; kiln uses them only under [`mpi_lock`].
#[derive(Clone, Copy)]
struct Handle<T>(T);
// SAFETY: see the type's docs: every use is serialized by `mpi_lock`.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

/// What kiln sets up once per process: MPI itself and the reductions MPI lacks.
struct Runtime {
    /// f16 and bf16 sum, max, min (MPI has no 16-bit floats): by [`ReduceOp`] index.
    f16_ops: [Handle<ffi::MPI_Op>; 3],
    bf16_ops: [Handle<ffi::MPI_Op>; 3],
}

fn runtime() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<std::result::Result<Runtime, Error>> = OnceLock::new();
    RUNTIME.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// `Ok` for MPI_SUCCESS, else an error naming the call and MPI's message.
fn check(code: c_int, call: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let mut text = [0 as std::ffi::c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: MPI writes at most MPI_MAX_ERROR_STRING (256 in OpenMPI) bytes into `text`.
    let known = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &mut len) } == 0;
    let message = if known {
        let bytes: Vec<u8> = text[..len.clamp(0, 1023) as usize].iter().map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        "unknown error".into()
    };
    Err(Error::Driver { backend: "MPI", code: Some(code.into()), fatal: false, message: format!("{call}: {message}") })
}

fn init() -> Result<Runtime> {
    let _lock = mpi_lock();
    let (mut initialized, mut provided) = (0, 0);
    // SAFETY: plain queries writing into the locals.
    check(unsafe { ffi::MPI_Initialized(&mut initialized) }, "MPI_Initialized")?;
    // SAFETY: reads an integer constant of the library.
    let serialized = unsafe { ffi::RSMPI_THREAD_SERIALIZED };
    if initialized == 0 {
        // SAFETY: MPI-2 allows null argc/argv; `provided` is written by the call.
        let code =
            unsafe { ffi::MPI_Init_thread(std::ptr::null_mut(), std::ptr::null_mut(), serialized, &mut provided) };
        check(code, "MPI_Init_thread")?;
        // SAFETY: registers a plain `extern "C"` function; its failure only means MPI is not
        // finalized at exit.
        unsafe { libc::atexit(finalize_at_exit) };
    } else {
        // SAFETY: a query writing into the local.
        check(unsafe { ffi::MPI_Query_thread(&mut provided) }, "MPI_Query_thread")?;
    }
    if provided < serialized {
        return Err(Error::Unavailable(format!(
            "MPI runs at thread level {provided}; kiln calls it from its queues' threads and needs \
             MPI_THREAD_SERIALIZED ({serialized}) or more: initialize MPI with that level, or let kiln do it"
        )));
    }
    choose_ring_all_reduce();
    let create = |f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype)| {
        // SAFETY: a plain (uninitialised) handle for MPI to write.
        let mut op: ffi::MPI_Op = unsafe { std::mem::zeroed() };
        // SAFETY: `f` has MPI_User_function's signature; 1 = commutative.
        check(unsafe { ffi::MPI_Op_create(Some(f), 1, &mut op) }, "MPI_Op_create").map(|()| Handle(op))
    };
    Ok(Runtime {
        f16_ops: [create(half_op::<0, false>)?, create(half_op::<1, false>)?, create(half_op::<2, false>)?],
        bf16_ops: [create(half_op::<0, true>)?, create(half_op::<1, true>)?, create(half_op::<2, true>)?],
    })
}

/// OpenMPI's setting of the algorithm of its non-blocking all_reduce (libnbc's), and the value
/// of its ring: the bandwidth-optimal one, which the library's automatic choice does not pick
/// for large buffers (on a 2-core machine it was 1.4 to 2 times as fast as the default for 1 to
/// 256 MiB; issue 33's note). kiln sets it through MPI's tool interface when the user did not
/// set it (`OMPI_MCA_coll_libnbc_iallreduce_algorithm`); where the setting does not exist (not
/// OpenMPI) or cannot be written, the library's choice stays.
const RING_SETTING: (&std::ffi::CStr, c_int) = (c"coll_libnbc_iallreduce_algorithm", 1);

fn choose_ring_all_reduce() {
    let (name, ring) = RING_SETTING;
    if std::env::var_os("OMPI_MCA_coll_libnbc_iallreduce_algorithm").is_some() {
        return;
    }
    let (mut provided, mut index, mut count) = (0, 0, 0);
    // SAFETY: MPI is initialized and kiln holds `mpi_lock`; every pointer is a live local or the
    // setting's name (NUL-terminated); the handle is freed before returning.
    unsafe {
        if ffi::MPI_T_init_thread(ffi::RSMPI_THREAD_SERIALIZED, &mut provided) != 0 {
            return;
        }
        if ffi::MPI_T_cvar_get_index(name.as_ptr(), &mut index) == 0 {
            let mut handle: ffi::MPI_T_cvar_handle = std::ptr::null_mut();
            if ffi::MPI_T_cvar_handle_alloc(index, std::ptr::null_mut(), &mut handle, &mut count) == 0 {
                if count == 1 {
                    ffi::MPI_T_cvar_write(handle, &ring as *const c_int as *const c_void);
                }
                ffi::MPI_T_cvar_handle_free(&mut handle);
            }
        }
        ffi::MPI_T_finalize();
    }
}

extern "C" fn finalize_at_exit() {
    let _lock = mpi_lock();
    let mut finalized = 0;
    // SAFETY: at exit, after kiln's collectives returned; MPI_Finalize once, if not done.
    unsafe {
        if ffi::MPI_Finalized(&mut finalized) == 0 && finalized == 0 {
            ffi::MPI_Finalize();
        }
    }
}

const REDUCE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

/// The MPI reduction `inout = op(inout, in)` over f16 (`BF` false) or bf16 elements, by
/// kiln's own [`collective::reduce_into`].
unsafe extern "C" fn half_op<const OP: usize, const BF: bool>(
    input: *mut c_void,
    inout: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // SAFETY: MPI passes `*len` elements of the 2-byte carrier type in both vectors, which
    // do not overlap (MPI's contract for user functions).
    unsafe {
        let n = (*len).max(0) as usize * 2;
        let acc = std::slice::from_raw_parts_mut(inout as *mut u8, n);
        let x = std::slice::from_raw_parts(input as *const u8, n);
        // Equal lengths of whole elements: cannot fail.
        let _ = collective::reduce_into(REDUCE_OPS[OP], if BF { Scalar::BF16 } else { Scalar::F16 }, acc, x);
    }
}

/// MPI's type for `dtype` (f16 and bf16 travel as 16-bit integers).
fn datatype(dtype: Scalar) -> ffi::MPI_Datatype {
    // SAFETY: reads the library's constant handles.
    unsafe {
        match dtype {
            Scalar::Bool | Scalar::U8 => ffi::RSMPI_UINT8_T,
            Scalar::I8 => ffi::RSMPI_INT8_T,
            Scalar::I16 => ffi::RSMPI_INT16_T,
            Scalar::I32 => ffi::RSMPI_INT32_T,
            Scalar::I64 => ffi::RSMPI_INT64_T,
            Scalar::U16 | Scalar::F16 | Scalar::BF16 => ffi::RSMPI_UINT16_T,
            Scalar::U32 => ffi::RSMPI_UINT32_T,
            Scalar::U64 => ffi::RSMPI_UINT64_T,
            Scalar::F32 => ffi::RSMPI_FLOAT,
            Scalar::F64 => ffi::RSMPI_DOUBLE,
        }
    }
}

/// The MPI operation applying `op` to `dtype`.
fn reduction(rt: &Runtime, op: ReduceOp, dtype: Scalar) -> ffi::MPI_Op {
    let at = REDUCE_OPS.iter().position(|o| *o == op).unwrap_or(0);
    match dtype {
        Scalar::F16 => rt.f16_ops[at].0,
        Scalar::BF16 => rt.bf16_ops[at].0,
        // SAFETY: reads the library's constant handles.
        _ => unsafe {
            match op {
                ReduceOp::Sum => ffi::RSMPI_SUM,
                ReduceOp::Max => ffi::RSMPI_MAX,
                ReduceOp::Min => ffi::RSMPI_MIN,
            }
        },
    }
}

/// This process's end of an MPI channel (see the crate docs).
pub struct MpiChannel {
    comm: Handle<ffi::MPI_Comm>,
    rank: usize,
    count: usize,
    timeout: Duration,
    id: u64,
    broken: Mutex<Option<Error>>,
    /// One collective at a time on this end, in the order they are issued.
    busy: Mutex<()>,
}

impl std::fmt::Debug for MpiChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiChannel(#{}, rank {} of {})", self.id, self.rank, self.count)
    }
}

impl MpiChannel {
    /// This process's end of a new channel over every process of the MPI job (a duplicate of
    /// `MPI_COMM_WORLD`: every process makes its channels in the same order). Initializes MPI
    /// on first use. Collectives wait [`kiln_device::collective::DEFAULT_TIMEOUT`] for their
    /// peers.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when MPI runs at a thread level below `MPI_THREAD_SERIALIZED`;
    /// [`Error::Driver`] when MPI fails (not started by `mpirun`, for one, it runs alone).
    pub fn world() -> Result<Arc<MpiChannel>> {
        Self::world_with_timeout(collective::DEFAULT_TIMEOUT)
    }

    /// [`MpiChannel::world`] whose collectives wait at most `timeout` for their peers.
    ///
    /// # Errors
    /// As [`MpiChannel::world`].
    pub fn world_with_timeout(timeout: Duration) -> Result<Arc<MpiChannel>> {
        runtime()?;
        let _lock = mpi_lock();
        // SAFETY: a handle for MPI to write.
        let mut comm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        let (mut rank, mut size) = (0, 0);
        // SAFETY: MPI is initialized (runtime); each call writes into the locals.
        unsafe {
            check(ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm), "MPI_Comm_dup")?;
            check(ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")?;
            check(ffi::MPI_Comm_rank(comm, &mut rank), "MPI_Comm_rank")?;
            check(ffi::MPI_Comm_size(comm, &mut size), "MPI_Comm_size")?;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Ok(Arc::new(MpiChannel {
            comm: Handle(comm),
            rank: rank.max(0) as usize,
            count: size.max(1) as usize,
            timeout,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            broken: Mutex::new(None),
            busy: Mutex::new(()),
        }))
    }

    /// The first `n` ranks of this channel as a channel of their own (`MPI_Comm_split`),
    /// `None` on the others. Every rank of this channel calls it (it blocks until they do).
    ///
    /// # Errors
    /// [`Error::Invalid`] for `n` of 0 or above the count; MPI's errors.
    pub fn first(&self, n: usize) -> Result<Option<Arc<MpiChannel>>> {
        if n == 0 || n > self.count {
            return Err(Error::Invalid(format!("the first {n} of {} ranks", self.count)));
        }
        let _lock = mpi_lock();
        // SAFETY: reads the library's constant.
        let color = if self.rank < n { 0 } else { unsafe { ffi::RSMPI_UNDEFINED } };
        // SAFETY: a handle for MPI to write.
        let mut comm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        // SAFETY: a live communicator; `comm` is written.
        let code = unsafe { ffi::MPI_Comm_split(self.comm.0, color, self.rank as c_int, &mut comm) };
        check(code, "MPI_Comm_split")?;
        if self.rank >= n {
            return Ok(None);
        }
        // SAFETY: `comm` is the new communicator of this rank.
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
        static NEXT: AtomicU64 = AtomicU64::new(1 << 32);
        Ok(Some(Arc::new(MpiChannel {
            comm: Handle(comm),
            rank: self.rank,
            count: n,
            timeout: self.timeout,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            broken: Mutex::new(None),
            busy: Mutex::new(()),
        })))
    }

    /// Waits until every rank of the channel called it (`MPI_Ibarrier`), sleeping between
    /// polls: ranks that sit out a measurement wait here without taking cores from it.
    ///
    /// # Errors
    /// [`Error::Channel`] when a peer does not arrive within the channel's timeout; MPI's errors.
    pub fn barrier(&self) -> Result<()> {
        let mut req = null_request();
        {
            let _lock = mpi_lock();
            // SAFETY: a live communicator; `req` is written.
            check(unsafe { ffi::MPI_Ibarrier(self.comm.0, &mut req) }, "MPI_Ibarrier")?;
        }
        // SAFETY: a status for MPI to write.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        self.poll(&mut req, &mut status, "a barrier", Deadline::after(self.timeout), true)
    }

    /// Whether every rank's `ok` holds: each rank learns whether all of its peers' checks
    /// passed, so that they stop together (within the channel's timeout).
    ///
    /// # Errors
    /// [`Error::Channel`] when a peer does not answer; MPI's errors.
    pub fn agree_ok(&self, ok: bool) -> Result<bool> {
        // On the heap: leaked if the request is abandoned.
        let mine = Box::new([i32::from(ok)]);
        let mut all = Box::new([0i32]);
        let mut req = null_request();
        {
            let _lock = mpi_lock();
            // SAFETY: one i32 each way, both outliving the request (waited below, or leaked).
            let code = unsafe {
                ffi::MPI_Iallreduce(
                    mine.as_ptr() as *const c_void,
                    all.as_mut_ptr() as *mut c_void,
                    1,
                    ffi::RSMPI_INT32_T,
                    ffi::RSMPI_MIN,
                    self.comm.0,
                    &mut req,
                )
            };
            check(code, "MPI_Iallreduce")?;
        }
        // SAFETY: a status for MPI to write.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        if let Err(e) = self.wait(&mut req, &mut status, "agreeing on a check", Deadline::after(self.timeout)) {
            std::mem::forget((mine, all));
            return Err(e);
        }
        Ok(all[0] == 1)
    }

    /// `MPI_Allreduce` (sum) of `send` into `recv` over this channel's ranks, blocking: the
    /// baseline `kiln bench` measures MPI channels against, on the same memory.
    ///
    /// # Errors
    /// [`Error::Buffer`] for slices of different lengths or more than MPI counts; MPI's errors.
    pub fn baseline_all_reduce_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::Buffer(format!("all_reduce of {} elements into {}", send.len(), recv.len())));
        }
        let n = c_int::try_from(send.len()).map_err(|_| Error::Buffer("too many elements for MPI".into()))?;
        let _lock = mpi_lock();
        // SAFETY: two distinct live slices of `n` f32 each, on a live communicator.
        let code = unsafe {
            ffi::MPI_Allreduce(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                self.comm.0,
            )
        };
        check(code, "MPI_Allreduce")
    }

    fn name(&self) -> String {
        format!("mpi #{} of {} ranks", self.id, self.count)
    }

    /// Breaks the channel (the first reason stays) and returns its error.
    fn fail(&self, message: String) -> Error {
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        broken.get_or_insert_with(|| Error::Channel { channel: self.name(), message }).clone()
    }

    /// Polls `req` until it completes, fails or `deadline` passes; fills `status` on success.
    fn wait(
        &self,
        req: &mut ffi::MPI_Request,
        status: &mut ffi::MPI_Status,
        what: &str,
        deadline: Deadline,
    ) -> Result<()> {
        self.poll(req, status, what, deadline, false)
    }

    /// [`MpiChannel::wait`]; `patient` sleeps between polls once the first spins found nothing,
    /// leaving the cores to the processes doing the work (for a wait expected to be long).
    fn poll(
        &self,
        req: &mut ffi::MPI_Request,
        status: &mut ffi::MPI_Status,
        what: &str,
        deadline: Deadline,
        patient: bool,
    ) -> Result<()> {
        let mut polls = 0u32;
        loop {
            let mut done = 0;
            let code = {
                let _lock = mpi_lock();
                // SAFETY: `req` is a live request of this process; `status` is written.
                unsafe { ffi::MPI_Test(req, &mut done, status) }
            };
            if let Err(e) = check(code, "MPI_Test") {
                return Err(self.fail(format!("rank {} in {what}: {e}", self.rank)));
            }
            if done != 0 {
                return Ok(());
            }
            if deadline.passed() {
                return Err(self.fail(format!(
                    "rank {} waited {} ms in {what} for its peers, which did not all answer",
                    self.rank,
                    deadline.limit().as_millis()
                )));
            }
            polls += 1;
            // Spin first (shared-memory transfers complete in microseconds), then yield.
            if polls < 2000 {
                std::hint::spin_loop();
            } else if patient {
                std::thread::sleep(Duration::from_millis(5));
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Exchanges what each rank is about to run and fails every rank if they differ.
    fn agree(&self, op: Collective, dtype: Scalar, len: usize, deadline: Deadline) -> Result<()> {
        let mine = signature(op, dtype, len).to_vec();
        let mut all = vec![[0i64; 4]; self.count];
        let mut req = null_request();
        {
            let _lock = mpi_lock();
            // SAFETY: `mine` is 4 i64, `all` 4 × count; both outlive the request (waited below,
            // or leaked on failure).
            let code = unsafe {
                ffi::MPI_Iallgather(
                    mine.as_ptr() as *const c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    all.as_mut_ptr() as *mut c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    self.comm.0,
                    &mut req,
                )
            };
            check(code, "MPI_Iallgather")?;
        }
        // SAFETY: a status for MPI to write.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        if let Err(e) = self.wait(&mut req, &mut status, &op.name(), deadline) {
            // MPI may still read or write these for as long as the process lives.
            std::mem::forget((mine, all));
            return Err(e);
        }
        if let Some((r, other)) = all.iter().enumerate().find(|(_, s)| s[..] != mine[..]) {
            return Err(self.fail(format!(
                "rank {} issued {}, rank {r} {}",
                self.rank,
                describe(&mine),
                describe(other)
            )));
        }
        Ok(())
    }

    /// Starts `op` over the staged memory and returns its request.
    fn start(&self, op: Collective, dtype: Scalar, send: Region, recv: Region, n: c_int) -> Result<ffi::MPI_Request> {
        let rt = runtime()?;
        let dt = datatype(dtype);
        let comm = self.comm.0;
        let (sp, rp) = (send.ptr as *const c_void, recv.ptr as *mut c_void);
        let mut req = null_request();
        let _lock = mpi_lock();
        // SAFETY: `send` and `recv` are live host regions of at least the element counts given
        // (checked against the collective's lengths by `collective::check` and `agree`), kept
        // alive until the request completes (or for ever, if it is abandoned).
        let code = unsafe {
            match op {
                Collective::AllReduce(r) => ffi::MPI_Iallreduce(sp, rp, n, dt, reduction(rt, r, dtype), comm, &mut req),
                Collective::AllGather => ffi::MPI_Iallgather(sp, n, dt, rp, n, dt, comm, &mut req),
                Collective::ReduceScatter(r) => ffi::MPI_Ireduce_scatter_block(
                    sp,
                    rp,
                    n / self.count as c_int,
                    dt,
                    reduction(rt, r, dtype),
                    comm,
                    &mut req,
                ),
                Collective::Broadcast { root } => ffi::MPI_Ibcast(rp, n, dt, root as c_int, comm, &mut req),
                Collective::Send { peer } => ffi::MPI_Isend(sp, n, dt, peer as c_int, TAG, comm, &mut req),
                Collective::Recv { peer } => ffi::MPI_Irecv(rp, n, dt, peer as c_int, TAG, comm, &mut req),
            }
        };
        check(code, &op.name()).map(|()| req)
    }
}

impl Drop for MpiChannel {
    fn drop(&mut self) {
        let _lock = mpi_lock();
        let mut finalized = 0;
        // SAFETY: frees this channel's communicator unless MPI is already finalized (MPI
        // frees it once pending operations complete).
        unsafe {
            if ffi::MPI_Finalized(&mut finalized) == 0 && finalized == 0 {
                ffi::MPI_Comm_free(&mut self.comm.0);
            }
        }
    }
}

impl Channel for MpiChannel {
    fn rank(&self) -> usize {
        self.rank
    }

    fn count(&self) -> usize {
        self.count
    }

    fn provider(&self) -> &'static str {
        "mpi"
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn run(&self, op: Collective, send: &Buffer, recv: &Buffer, timeout: Duration) -> Result<()> {
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let deadline = Deadline::after(timeout.min(self.timeout));
        let dtype = send.dtype();
        let n = c_int::try_from(send.len()).map_err(|_| {
            Error::Buffer(format!(
                "{}: {} elements is more than MPI counts ({}); split it",
                op.name(),
                send.len(),
                c_int::MAX
            ))
        })?;
        if !matches!(op, Collective::Send { .. } | Collective::Recv { .. }) {
            self.agree(op, dtype, send.len(), deadline)?;
        }
        let staged = Staged::new(op, self.rank, send, recv)?;
        // MPI takes no aliased send and receive memory (MPI_IN_PLACE's value is the library's
        // own): an in-place reduction or gather sends from a copy.
        let copy: Option<Vec<u8>> = (staged.send.ptr == staged.recv.ptr
            && matches!(op, Collective::AllReduce(_) | Collective::AllGather | Collective::ReduceScatter(_)))
        .then(|| {
            // SAFETY: the send region is `len` live bytes.
            unsafe { std::slice::from_raw_parts(staged.send.ptr, staged.send.len) }.to_vec()
        });
        let send_region = match &copy {
            Some(c) => Region { ptr: c.as_ptr() as *mut u8, len: c.len(), range: None },
            None => staged.send,
        };
        let mut req = self.start(op, dtype, send_region, staged.recv, n).map_err(|e| self.fail(e.to_string()))?;
        // SAFETY: a status for MPI to write.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        if let Err(e) = self.wait(&mut req, &mut status, &op.name(), deadline) {
            // MPI may still write into these for as long as the process lives.
            std::mem::forget((staged, copy, send.clone(), recv.clone()));
            return Err(e);
        }
        if let Collective::Recv { peer } = op {
            let mut got: c_int = 0;
            let code = {
                let _lock = mpi_lock();
                // SAFETY: `status` was filled by the completed receive.
                unsafe { ffi::MPI_Get_count(&status, datatype(dtype), &mut got) }
            };
            check(code, "MPI_Get_count")?;
            if got != n {
                return Err(self.fail(format!("rank {peer} sent {got} {dtype}, rank {} receives {n}", self.rank)));
            }
        }
        staged.finish()
    }

    fn broken(&self) -> Option<Error> {
        self.broken.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reads the library's constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// What a rank tells its peers before a collective: kind, argument, dtype, length.
fn signature(op: Collective, dtype: Scalar, len: usize) -> [i64; 4] {
    let reduce = |r: ReduceOp| REDUCE_OPS.iter().position(|o| *o == r).unwrap_or(0) as i64;
    let (kind, arg) = match op {
        Collective::AllReduce(r) => (1, reduce(r)),
        Collective::AllGather => (2, 0),
        Collective::ReduceScatter(r) => (3, reduce(r)),
        Collective::Broadcast { root } => (4, root as i64),
        Collective::Send { peer } => (5, peer as i64),
        Collective::Recv { peer } => (6, peer as i64),
    };
    let dtype = Scalar::ALL.iter().position(|s| *s == dtype).unwrap_or(0) as i64;
    [kind, arg, dtype, len as i64]
}

/// A signature in words.
fn describe(sig: &[i64]) -> String {
    let [kind, arg, dtype, len] = [0, 1, 2, 3].map(|i| sig.get(i).copied().unwrap_or(-1));
    let reduce = |a: i64| REDUCE_OPS.get(a as usize).map_or("?", |r| r.name());
    let op = match kind {
        1 => format!("all_reduce({})", reduce(arg)),
        2 => "all_gather".into(),
        3 => format!("reduce_scatter({})", reduce(arg)),
        4 => format!("broadcast(root {arg})"),
        other => format!("collective {other}"),
    };
    let dtype = Scalar::ALL.get(dtype as usize).map_or("?".into(), |s| s.to_string());
    format!("{op} of {len} {dtype}")
}

/// This process's rank in the MPI job (`MPI_COMM_WORLD`), initializing MPI if needed.
///
/// # Errors
/// As [`MpiChannel::world`].
pub fn world_rank() -> Result<usize> {
    runtime()?;
    let _lock = mpi_lock();
    let mut rank = 0;
    // SAFETY: MPI is initialized; `rank` is written.
    check(unsafe { ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank) }, "MPI_Comm_rank")?;
    Ok(rank.max(0) as usize)
}
