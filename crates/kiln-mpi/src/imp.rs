//! [`MpiChannel`] over the MPI library (see the crate docs).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kiln_device::collective::{self, Deadline, Region, Staged};
use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Channel, Collective, Error, ReduceOp, Result};
use mpi::ffi;

mod process;

pub use process::EXIT_GRACE;

/// The tag of kiln's sends and receives on its communicators.
const TAG: c_int = 0x6b69;

/// The tag of the signatures a send and its receive exchange before the data.
const SIGNATURE_TAG: c_int = 0x6b6a;

/// MPI's handles are pointers (OpenMPI) to objects the library owns and keeps for the life of
/// the communicator or the process; kiln uses them only holding the MPI lock.
#[derive(Clone, Copy)]
struct Handle<T>(T);
// SAFETY: see the type's docs: every use is serialized by the MPI lock.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

impl<T: Copy> Handle<T> {
    /// The handle (a closure calling this moves the whole `Handle`, which is `Send`).
    fn get(self) -> T {
        self.0
    }
}

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

/// The MPI lock for a call made before any wait can have failed (initialization, queries).
fn lock_now() -> Result<process::MpiGuard> {
    process::lock(None).map_err(Error::Unavailable)
}

fn init() -> Result<Runtime> {
    let _lock = lock_now()?;
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
        process::finalize_at_exit();
        // kiln owns this MPI: an error of a call on the world (a new channel whose peer died)
        // is returned to kiln, which reports it, instead of aborting the process.
        // SAFETY: MPI is initialized; the world and the handler are the library's constants.
        let code = unsafe { ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN) };
        check(code, "MPI_Comm_set_errhandler")?;
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
    // SAFETY: MPI is initialized and kiln holds the MPI lock; every pointer is a live local or the
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

/// Why a request was not waited for to its end.
enum Unfinished {
    /// MPI reported an error.
    Mpi(Error),
    /// The deadline passed.
    Late,
    /// The channel broke meanwhile (aborted by another thread).
    Broken,
    /// The MPI lock could not be had (the reason).
    Locked(String),
}

/// Polls `req` until it completes (filling `status`), fails, `deadline` passes, or `broken`
/// says to stop. `patient` sleeps between polls once the first spins found nothing, leaving
/// the cores to the processes doing the work (for a wait expected to be long). On any error
/// the request stays in flight: the memory it uses must stay allocated for the life of the
/// process.
fn wait_request(
    req: &mut ffi::MPI_Request,
    status: &mut ffi::MPI_Status,
    deadline: &Deadline,
    patient: bool,
    broken: Option<&AtomicBool>,
) -> std::result::Result<(), Unfinished> {
    let mut polls = 0u32;
    loop {
        let mut done = 0;
        let code = {
            let _lock = process::lock(Some(deadline)).map_err(Unfinished::Locked)?;
            // SAFETY: `req` is a live request of this process; `status` is written.
            unsafe { ffi::MPI_Test(req, &mut done, status) }
        };
        check(code, "MPI_Test").map_err(Unfinished::Mpi)?;
        if done != 0 {
            return Ok(());
        }
        if broken.is_some_and(|b| b.load(Ordering::Acquire)) {
            return Err(Unfinished::Broken);
        }
        if deadline.passed() {
            return Err(Unfinished::Late);
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

/// This process's end of an MPI channel (see the crate docs).
pub struct MpiChannel {
    comm: Handle<ffi::MPI_Comm>,
    rank: usize,
    count: usize,
    timeout: Duration,
    id: u64,
    broken: Mutex<Option<Error>>,
    /// Whether `broken` holds an error, for the polls to read without the lock.
    is_broken: AtomicBool,
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
    /// `MPI_COMM_WORLD`, `MPI_Comm_idup`: every process makes its channels in the same
    /// order). Initializes MPI on first use. Waits for the other processes, and later
    /// collectives for their peers, at most [`kiln_device::collective::DEFAULT_TIMEOUT`].
    /// After a failure, a new channel is how to go on: it fails in turn, at its timeout, when
    /// a process of the job is gone.
    ///
    /// # Errors
    /// [`Error::Channel`] when a process of the job does not make the channel in time;
    /// [`Error::Unavailable`] when MPI runs at a thread level below `MPI_THREAD_SERIALIZED`;
    /// [`Error::Driver`] when MPI fails (not started by `mpirun`, for one, it runs alone).
    pub fn world() -> Result<Arc<MpiChannel>> {
        Self::world_with_timeout(collective::DEFAULT_TIMEOUT)
    }

    /// [`MpiChannel::world`] waiting at most `timeout` for the other processes, now and in
    /// every collective.
    ///
    /// # Errors
    /// As [`MpiChannel::world`], and [`Error::Invalid`] for a zero timeout.
    pub fn world_with_timeout(timeout: Duration) -> Result<Arc<MpiChannel>> {
        let timeout = collective::check_timeout(timeout)?;
        runtime()?;
        let deadline = Deadline::after(timeout);
        let new_channel = |message: String| {
            process::record_failure(timeout);
            Error::Channel { channel: "a new mpi channel".into(), message }
        };
        // Written by MPI when the request completes: on the heap, leaked if it never does.
        // SAFETY: a handle for MPI to write.
        let mut comm: Box<ffi::MPI_Comm> = Box::new(unsafe { std::mem::zeroed() });
        let mut req = null_request();
        {
            let _lock = process::lock(Some(&deadline)).map_err(new_channel)?;
            // SAFETY: MPI is initialized (runtime); `comm` outlives the request (waited
            // below, or leaked).
            let code = unsafe { ffi::MPI_Comm_idup(ffi::RSMPI_COMM_WORLD, &mut *comm, &mut req) };
            check(code, "MPI_Comm_idup")?;
        }
        // SAFETY: a status for MPI to write.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        if let Err(why) = wait_request(&mut req, &mut status, &deadline, true, None) {
            std::mem::forget(comm);
            let why = match why {
                Unfinished::Mpi(e) => e.to_string(),
                Unfinished::Locked(m) => m,
                Unfinished::Late | Unfinished::Broken => format!(
                    "waited {} ms for every process of the MPI job to make the channel (MPI_Comm_idup); one did \
                     not come (it died, or makes its channels in another order)",
                    deadline.limit().as_millis()
                ),
            };
            return Err(new_channel(why));
        }
        let comm = *comm;
        let (mut rank, mut size) = (0, 0);
        {
            let _lock = process::lock(Some(&deadline)).map_err(new_channel)?;
            // SAFETY: `comm` is the new communicator; each call writes into the locals.
            unsafe {
                check(ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")?;
                check(ffi::MPI_Comm_rank(comm, &mut rank), "MPI_Comm_rank")?;
                check(ffi::MPI_Comm_size(comm, &mut size), "MPI_Comm_size")?;
            }
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Ok(Arc::new(MpiChannel::on(
            comm,
            rank.max(0) as usize,
            size.max(1) as usize,
            timeout,
            NEXT.fetch_add(1, Ordering::Relaxed),
        )))
    }

    fn on(comm: ffi::MPI_Comm, rank: usize, count: usize, timeout: Duration, id: u64) -> MpiChannel {
        MpiChannel {
            comm: Handle(comm),
            rank,
            count,
            timeout,
            id,
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            busy: Mutex::new(()),
        }
    }

    /// The first `n` ranks of this channel as a channel of their own (`MPI_Comm_split`),
    /// `None` on the others. Every rank of this channel calls it; it waits for them at most
    /// the channel's timeout (MPI has no non-blocking split: the call runs on a helper thread,
    /// which a peer that never comes keeps for the life of the process).
    ///
    /// # Errors
    /// [`Error::Invalid`] for `n` of 0 or above the count; [`Error::Channel`] when a peer does
    /// not come in time (the channel is broken), or the channel was broken before; MPI's errors.
    pub fn first(&self, n: usize) -> Result<Option<Arc<MpiChannel>>> {
        if n == 0 || n > self.count {
            return Err(Error::Invalid(format!("the first {n} of {} ranks", self.count)));
        }
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let deadline = Deadline::after(self.timeout);
        // SAFETY: reads the library's constant.
        let color = if self.rank < n { 0 } else { unsafe { ffi::RSMPI_UNDEFINED } };
        let (comm, key) = (self.comm, self.rank as c_int);
        let split = process::blocking(&deadline, move || -> std::result::Result<Handle<ffi::MPI_Comm>, String> {
            let _lock = process::lock(Some(&deadline))?;
            // SAFETY: a handle for MPI to write.
            let mut out: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
            // SAFETY: a live communicator (its channel is alive while its caller waits, and a
            // channel whose wait failed never frees it); `out` is written.
            let code = unsafe { ffi::MPI_Comm_split(comm.get(), color, key, &mut out) };
            check(code, "MPI_Comm_split").map(|()| Handle(out)).map_err(|e| e.to_string())
        });
        let comm = match split {
            Ok(Ok(comm)) => comm.0,
            Ok(Err(why)) => {
                process::record_failure(self.timeout);
                return Err(self.fail(format!("rank {} in MPI_Comm_split: {why}", self.rank)));
            }
            Err(why) => {
                process::record_failure(self.timeout);
                return Err(self.fail(format!(
                    "rank {} waited {} ms in MPI_Comm_split (the first {n} ranks) for its peers, which did not all \
                     come: {why}",
                    self.rank,
                    deadline.limit().as_millis()
                )));
            }
        };
        if self.rank >= n {
            return Ok(None);
        }
        {
            let _lock = self.lock("MPI_Comm_set_errhandler", &deadline)?;
            // SAFETY: `comm` is the new communicator of this rank.
            check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
        }
        static NEXT: AtomicU64 = AtomicU64::new(1 << 32);
        Ok(Some(Arc::new(MpiChannel::on(comm, self.rank, n, self.timeout, NEXT.fetch_add(1, Ordering::Relaxed)))))
    }

    /// Waits until every rank of the channel called it (`MPI_Ibarrier`), sleeping between
    /// polls: ranks that sit out a measurement wait here without taking cores from it.
    ///
    /// # Errors
    /// [`Error::Channel`] when a peer does not arrive within the channel's timeout; MPI's errors.
    pub fn barrier(&self) -> Result<()> {
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let deadline = Deadline::after(self.timeout);
        let mut req = null_request();
        {
            let _lock = self.lock("a barrier", &deadline)?;
            // SAFETY: a live communicator; `req` is written.
            check(unsafe { ffi::MPI_Ibarrier(self.comm.0, &mut req) }, "MPI_Ibarrier")?;
        }
        self.wait(&mut req, "a barrier", &deadline, true).map(|_| ())
    }

    /// Whether every rank's `ok` holds: each rank learns whether all of its peers' checks
    /// passed, so that they stop together (within the channel's timeout).
    ///
    /// # Errors
    /// [`Error::Channel`] when a peer does not answer; MPI's errors.
    pub fn agree_ok(&self, ok: bool) -> Result<bool> {
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let deadline = Deadline::after(self.timeout);
        // On the heap: leaked if the request is abandoned.
        let mine = Box::new([i32::from(ok)]);
        let mut all = Box::new([0i32]);
        let mut req = null_request();
        {
            let _lock = self.lock("agreeing on a check", &deadline)?;
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
        if let Err(e) = self.wait(&mut req, "agreeing on a check", &deadline, false) {
            std::mem::forget((mine, all));
            return Err(e);
        }
        Ok(all[0] == 1)
    }

    /// `MPI_Allreduce` (sum) of `send` into `recv` over this channel's ranks: the baseline
    /// `kiln bench` measures MPI channels against, on the same memory. MPI's blocking call
    /// (MPI's own choice of algorithm, unlike kiln's non-blocking one) runs on a helper thread
    /// while the caller waits at most the channel's timeout; the buffers go with the call and
    /// come back with its result (a call whose peers never come keeps them).
    ///
    /// # Errors
    /// [`Error::Buffer`] for buffers of different lengths or more than MPI counts;
    /// [`Error::Channel`] when a peer does not come in time (the channel is broken), or the
    /// channel was broken before; MPI's errors.
    pub fn baseline_all_reduce_f32(&self, send: Vec<f32>, mut recv: Vec<f32>) -> Result<(Vec<f32>, Vec<f32>)> {
        if send.len() != recv.len() {
            return Err(Error::Buffer(format!("all_reduce of {} elements into {}", send.len(), recv.len())));
        }
        let n = c_int::try_from(send.len()).map_err(|_| Error::Buffer("too many elements for MPI".into()))?;
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let deadline = Deadline::after(self.timeout);
        let comm = self.comm;
        let call = process::blocking(&deadline, move || {
            let code = match process::lock(Some(&deadline)) {
                // SAFETY: two distinct live vectors of `n` f32 each, owned by this call, on a
                // live communicator (a channel whose wait failed never frees it).
                Ok(_lock) => unsafe {
                    ffi::MPI_Allreduce(
                        send.as_ptr() as *const c_void,
                        recv.as_mut_ptr() as *mut c_void,
                        n,
                        ffi::RSMPI_FLOAT,
                        ffi::RSMPI_SUM,
                        comm.get(),
                    )
                },
                Err(why) => return Err(why),
            };
            Ok((code, send, recv))
        });
        match call {
            Ok(Ok((code, send, recv))) => {
                if let Err(e) = check(code, "MPI_Allreduce") {
                    process::record_failure(self.timeout);
                    return Err(self.fail(format!("rank {}: {e}", self.rank)));
                }
                Ok((send, recv))
            }
            Ok(Err(why)) | Err(why) => {
                process::record_failure(self.timeout);
                Err(self.fail(format!(
                    "rank {} waited {} ms in MPI_Allreduce for its peers, which did not all come: {why}",
                    self.rank,
                    deadline.limit().as_millis()
                )))
            }
        }
    }

    fn name(&self) -> String {
        format!("mpi #{} of {} ranks", self.id, self.count)
    }

    /// Breaks the channel (the first reason stays) and returns its error.
    fn fail(&self, message: String) -> Error {
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        let e = broken.get_or_insert_with(|| Error::Channel { channel: self.name(), message }).clone();
        self.is_broken.store(true, Ordering::Release);
        e
    }

    /// The MPI lock for `what`, waited for at most until `deadline`.
    ///
    /// # Errors
    /// [`Error::Channel`] (the channel breaks) when it is not had in time.
    fn lock(&self, what: &str, deadline: &Deadline) -> Result<process::MpiGuard> {
        process::lock(Some(deadline)).map_err(|why| {
            process::record_failure(self.timeout);
            self.fail(format!("rank {} in {what}: {why}", self.rank))
        })
    }

    /// Polls `req` to its end, `deadline`, or the channel breaking meanwhile (see
    /// [`wait_request`]), failing the channel otherwise; returns the request's status.
    fn wait(
        &self,
        req: &mut ffi::MPI_Request,
        what: &str,
        deadline: &Deadline,
        patient: bool,
    ) -> Result<ffi::MPI_Status> {
        // SAFETY: a status for MPI to write.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        match wait_request(req, &mut status, deadline, patient, Some(&self.is_broken)) {
            Ok(()) => Ok(status),
            Err(why) => {
                process::record_failure(self.timeout);
                Err(match why {
                    Unfinished::Mpi(e) => self.fail(format!("rank {} in {what}: {e}", self.rank)),
                    Unfinished::Locked(m) => self.fail(format!("rank {} in {what}: {m}", self.rank)),
                    Unfinished::Broken => self.broken().unwrap_or_else(|| self.fail("broken".into())),
                    Unfinished::Late => self.fail(format!(
                        "rank {} waited {} ms in {what} for its peers, which did not all answer",
                        self.rank,
                        deadline.limit().as_millis()
                    )),
                })
            }
        }
    }

    /// Every rank's `mine` (an all-gather, polled to `deadline`).
    fn exchange_all(&self, mine: [i64; 4], what: &str, deadline: &Deadline) -> Result<Vec<[i64; 4]>> {
        let mine = Box::new(mine);
        let mut all = vec![[0i64; 4]; self.count];
        let mut req = null_request();
        {
            let _lock = self.lock(what, deadline)?;
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
        if let Err(e) = self.wait(&mut req, what, deadline, false) {
            // MPI may still read or write these for as long as the process lives.
            std::mem::forget((mine, all));
            return Err(e);
        }
        Ok(all)
    }

    /// Sends `mine` to `peer` and gets `peer`'s (polled to `deadline`).
    fn exchange_pair(&self, peer: usize, mine: [i64; 4], what: &str, deadline: &Deadline) -> Result<[i64; 4]> {
        let mine = Box::new(mine);
        let mut theirs = Box::new([0i64; 4]);
        let (mut sent, mut received) = (null_request(), null_request());
        {
            let _lock = self.lock(what, deadline)?;
            // SAFETY: 4 i64 each way, both outliving the requests (waited below, or leaked);
            // `peer` is a rank of the communicator (checked when the collective was recorded).
            unsafe {
                let to = ffi::MPI_Isend(
                    mine.as_ptr() as *const c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    peer as c_int,
                    SIGNATURE_TAG,
                    self.comm.0,
                    &mut sent,
                );
                check(to, "MPI_Isend")?;
                let from = ffi::MPI_Irecv(
                    theirs.as_mut_ptr() as *mut c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    peer as c_int,
                    SIGNATURE_TAG,
                    self.comm.0,
                    &mut received,
                );
                check(from, "MPI_Irecv")?;
            }
        }
        if let Err(e) = self.wait(&mut received, what, deadline, false) {
            std::mem::forget((mine, theirs));
            return Err(e);
        }
        if theirs[0] == LEFT {
            // The peer will not receive this rank's signature: its send stays in flight.
            std::mem::forget(mine);
            return Ok(*theirs);
        }
        if let Err(e) = self.wait(&mut sent, what, deadline, false) {
            std::mem::forget((mine, theirs));
            return Err(e);
        }
        Ok(*theirs)
    }

    /// Meets the peers of `op` before it runs: every rank learns what the others are about to
    /// run (the ranks of a collective; the two ends of a send), and each fails if they differ
    /// or one left.
    fn meet(&self, op: Collective, dtype: Scalar, len: usize, deadline: &Deadline) -> Result<()> {
        let mine = signature(op, dtype, len);
        let what = op.name();
        let (peer, other) = match op {
            Collective::Send { peer } | Collective::Recv { peer } => {
                let theirs = self.exchange_pair(peer, mine, &what, deadline)?;
                (peer, theirs)
            }
            _ => {
                let all = self.exchange_all(mine, &what, deadline)?;
                let Some((r, other)) = all.iter().enumerate().find(|(_, s)| **s != mine) else { return Ok(()) };
                (r, *other)
            }
        };
        let expect = match op {
            Collective::Send { .. } => signature(Collective::Recv { peer: self.rank }, dtype, len),
            Collective::Recv { .. } => signature(Collective::Send { peer: self.rank }, dtype, len),
            _ => mine,
        };
        if other == expect {
            return Ok(());
        }
        Err(self.fail(if other[0] == LEFT {
            format!("rank {peer} left before {}: its run failed before it", describe(&expect))
        } else {
            format!("rank {} issued {}, rank {peer} {}", self.rank, describe(&mine), describe(&other))
        }))
    }

    /// Breaks this end because this rank will not run `next` (`why`), and tells the peers
    /// meeting it there, on a thread of its own (see [`depart`]), so that the caller does not
    /// wait for them.
    fn leave_now(&self, next: Collective, why: &str) {
        let _ = self.fail(format!("rank {} left: {why}", self.rank));
        // The exchange may stay in flight: exit must not wait for it without a bound.
        process::record_failure(self.timeout);
        let (comm, count, timeout) = (self.comm, self.count, self.timeout);
        let spawned =
            std::thread::Builder::new().name("kiln-mpi-leave".into()).spawn(move || depart(comm, count, next, timeout));
        if spawned.is_err() {
            depart(comm, count, next, timeout);
        }
    }

    /// Starts `op` over the staged memory and returns its request.
    fn start(
        &self,
        op: Collective,
        dtype: Scalar,
        send: Region,
        recv: Region,
        n: c_int,
        deadline: &Deadline,
    ) -> Result<ffi::MPI_Request> {
        let rt = runtime()?;
        let dt = datatype(dtype);
        let comm = self.comm.0;
        let (sp, rp) = (send.ptr as *const c_void, recv.ptr as *mut c_void);
        let mut req = null_request();
        let _lock = self.lock(&op.name(), deadline)?;
        // SAFETY: `send` and `recv` are live host regions of at least the element counts given
        // (checked against the collective's lengths by `collective::check` and `meet`), kept
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
    /// Frees the communicator (`MPI_Comm_free`, which OpenMPI does without waiting for the
    /// peers), unless a wait of this channel failed: an abandoned request may still use it,
    /// so it stays for the life of the process.
    fn drop(&mut self) {
        if self.broken().is_some() {
            return;
        }
        let Ok(_lock) = process::lock(Some(&Deadline::after(self.timeout))) else { return };
        let mut finalized = 0;
        // SAFETY: frees this channel's communicator, on which no request is in flight (every
        // wait completed), unless MPI is already finalized.
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
        // What this rank can fail alone, before it meets its peers: then it tells them.
        let prepared = c_int::try_from(send.len())
            .map_err(|_| {
                Error::Buffer(format!(
                    "{}: {} elements is more than MPI counts ({}); split it",
                    op.name(),
                    send.len(),
                    c_int::MAX
                ))
            })
            .and_then(|n| Ok((n, Staged::new(op, self.rank, send, recv)?)));
        let (n, staged) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                self.leave_now(op, &e.to_string());
                return Err(e);
            }
        };
        self.meet(op, dtype, send.len(), &deadline)?;
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
        let mut req =
            self.start(op, dtype, send_region, staged.recv, n, &deadline).map_err(|e| self.fail(e.to_string()))?;
        let status = match self.wait(&mut req, &op.name(), &deadline, false) {
            Ok(status) => status,
            Err(e) => {
                // MPI may still write into these for as long as the process lives.
                std::mem::forget((staged, copy, send.clone(), recv.clone()));
                return Err(e);
            }
        };
        if let Collective::Recv { peer } = op {
            let mut got: c_int = 0;
            let code = {
                let _lock = self.lock("MPI_Get_count", &deadline)?;
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

    /// Breaks this end and tells the peers meeting it in `next` (an all-gather or a send of
    /// "left" in place of its signature) without waiting for them.
    fn leave(&self, next: Collective, why: &Error) {
        let _busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if self.broken().is_none() {
            self.leave_now(next, &why.to_string());
        }
    }

    fn abort(&self, why: &Error) {
        let _ = self.fail(format!("rank {} stopped: {why}", self.rank));
    }
}

/// Tells the peers meeting a rank in `next` on `comm` (of `count` ranks) that it will not run
/// it: the rank's part of the exchange before `next` (the all-gather of signatures, or its
/// signature sent to the other end of a send), with "left" as its signature. Waits for them at
/// most `timeout` (sleeping between polls); what is still in flight then stays allocated.
fn depart(comm: Handle<ffi::MPI_Comm>, count: usize, next: Collective, timeout: Duration) {
    let deadline = Deadline::after(timeout);
    let left = Box::new([LEFT, 0, 0, 0]);
    let mut all = vec![[0i64; 4]; count];
    let mut req = null_request();
    let code = match process::lock(Some(&deadline)) {
        Err(_) => return,
        // SAFETY: a communicator never freed once its channel broke (and this one is broken);
        // `left` is 4 i64 and `all` 4 × count, both outliving the request (waited below, or
        // leaked); a peer is a rank of the communicator (checked when it was recorded).
        Ok(_lock) => unsafe {
            match next {
                Collective::Send { peer } | Collective::Recv { peer } => ffi::MPI_Isend(
                    left.as_ptr() as *const c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    peer as c_int,
                    SIGNATURE_TAG,
                    comm.get(),
                    &mut req,
                ),
                _ => ffi::MPI_Iallgather(
                    left.as_ptr() as *const c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    all.as_mut_ptr() as *mut c_void,
                    4,
                    ffi::RSMPI_INT64_T,
                    comm.get(),
                    &mut req,
                ),
            }
        },
    };
    if code != 0 {
        return;
    }
    // SAFETY: a status for MPI to write.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    if wait_request(&mut req, &mut status, &deadline, true, None).is_err() {
        // MPI may still read or write these for as long as the process lives.
        std::mem::forget((left, all));
    }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reads the library's constant handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// The signature of a rank that will not run the collective its peers meet it in.
const LEFT: i64 = 0;

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
    [kind, arg, dtype, i64::try_from(len).unwrap_or(i64::MAX)]
}

/// A signature in words.
fn describe(sig: &[i64]) -> String {
    let [kind, arg, dtype, len] = [0, 1, 2, 3].map(|i| sig.get(i).copied().unwrap_or(-1));
    let reduce = |a: i64| REDUCE_OPS.get(a as usize).map_or("?", |r| r.name());
    let op = match kind {
        LEFT => return "nothing (it left)".into(),
        1 => format!("all_reduce({})", reduce(arg)),
        2 => "all_gather".into(),
        3 => format!("reduce_scatter({})", reduce(arg)),
        4 => format!("broadcast(root {arg})"),
        5 => format!("send(to {arg})"),
        6 => format!("recv(from {arg})"),
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
    let _lock = process::lock(Some(&Deadline::after(collective::DEFAULT_TIMEOUT))).map_err(Error::Unavailable)?;
    let mut rank = 0;
    // SAFETY: MPI is initialized; `rank` is written.
    check(unsafe { ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank) }, "MPI_Comm_rank")?;
    Ok(rank.max(0) as usize)
}
