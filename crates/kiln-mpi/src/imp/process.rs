//! What kiln's MPI keeps for the whole process: the lock every MPI call holds, the record of
//! waits it abandoned, a worker thread for MPI's blocking calls, and MPI's end at exit.
//!
//! Every wait is bounded. Non-blocking calls are polled to their deadline; a call MPI only has
//! in a blocking form (`MPI_Comm_split`, the bench's `MPI_Allreduce` baseline) runs on the
//! worker thread while its caller waits at most to its deadline. A blocking call whose peers
//! never come keeps the worker, and the lock, for ever: every later call then fails at its own
//! deadline with [`kiln_device::Error::Channel`] instead of waiting for the lock.
//!
//! At exit (when kiln initialized MPI): if no wait was abandoned, `MPI_Finalize`, which waits
//! for every process of the job to finalize too. After an abandoned wait, a peer may be dead
//! or stuck, and `MPI_Finalize` may never return: kiln then gives it at most the longest
//! timeout of the failed waits (at most [`EXIT_GRACE`]), and ends the process with its own
//! exit status (`_exit`, after flushing C's streams) if it has not returned by then. Where the
//! C library cannot tell kiln the exit status (not glibc), or a blocking call still holds MPI,
//! kiln skips `MPI_Finalize` after a failure instead. `MPI_Abort` is never called: it would end
//! the other survivors too.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError, mpsc};
use std::time::Duration;

use kiln_device::collective::Deadline;
use mpi::ffi;

/// The longest MPI_Finalize may take at exit after a failed wait.
pub const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Serializes every MPI call kiln makes (MPI_THREAD_SERIALIZED). It guards no data: a panic
/// while holding it leaves nothing inconsistent.
static LOCK: Mutex<()> = Mutex::new(());

/// Set (under [`LOCK`]) just before kiln calls `MPI_Finalize`: no MPI call may follow.
static FINALIZED: AtomicBool = AtomicBool::new(false);

/// The longest timeout (ms) of a wait kiln abandoned, 0 while none was.
static FAILED_WAIT_MS: AtomicU64 = AtomicU64::new(0);

/// Set when a blocking call on the worker thread outlived its caller's deadline: it may keep
/// the lock for ever, and exit does not wait for it.
static STRANDED: AtomicBool = AtomicBool::new(false);

/// The right to call MPI, until dropped.
pub(super) struct MpiGuard {
    _held: MutexGuard<'static, ()>,
}

/// Takes the MPI lock, waiting at most until `deadline` (`None`: as long as it takes, for
/// calls made where no wait can have failed yet).
///
/// # Errors
/// What kept it: MPI was finalized, or another call held it past the deadline.
pub(super) fn lock(deadline: Option<&Deadline>) -> Result<MpiGuard, String> {
    let held = match deadline {
        None => LOCK.lock().unwrap_or_else(|p| p.into_inner()),
        Some(deadline) => {
            let mut tries = 0u32;
            loop {
                match LOCK.try_lock() {
                    Ok(g) => break g,
                    Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                    Err(TryLockError::WouldBlock) => {}
                }
                if deadline.passed() {
                    return Err(format!(
                        "another MPI call of kiln held MPI for all of {} ms (a blocking call whose peers did not \
                         come)",
                        deadline.limit().as_millis()
                    ));
                }
                tries += 1;
                // Most holders poll one request and let go within microseconds.
                if tries < 64 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50u64 << (tries / 64).min(4)));
                }
            }
        }
    };
    if FINALIZED.load(Ordering::Acquire) {
        return Err("MPI was finalized: the process is exiting".into());
    }
    Ok(MpiGuard { _held: held })
}

/// Records that a wait of `timeout` was abandoned (a request left in flight, a blocking call
/// that did not return, an MPI error): exit then bounds `MPI_Finalize`.
pub(super) fn record_failure(timeout: Duration) {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
    FAILED_WAIT_MS.fetch_max(ms, Ordering::AcqRel);
}

/// How long exit gives `MPI_Finalize`: `None` (without limit) unless a wait was abandoned.
fn exit_grace() -> Option<Duration> {
    let ms = FAILED_WAIT_MS.load(Ordering::Acquire);
    (ms > 0).then(|| Duration::from_millis(ms).min(EXIT_GRACE))
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `call` (a blocking MPI call, which takes the lock itself) on the worker thread and
/// waits for its result at most until `deadline`.
///
/// # Errors
/// Why no result came: the deadline passed (the call may still be running, and keeps what it
/// owns), or the worker could not be started.
pub(super) fn blocking<T: Send + 'static>(
    deadline: &Deadline,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    static WORKER: OnceLock<Result<mpsc::Sender<Job>, String>> = OnceLock::new();
    let worker = WORKER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("kiln-mpi-blocking".into())
            .spawn(move || {
                for job in queue {
                    job();
                }
            })
            .map(|_| jobs)
            .map_err(|e| format!("cannot start kiln's thread for blocking MPI calls: {e}"))
    });
    let jobs = worker.as_ref().map_err(Clone::clone)?;
    let (done, result) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        // The caller may have stopped waiting: then the result is dropped.
        let _ = done.send(call());
    });
    jobs.send(job).map_err(|_| "kiln's thread for blocking MPI calls has ended".to_string())?;
    result.recv_timeout(deadline.left().unwrap_or(Duration::ZERO)).map_err(|_| {
        STRANDED.store(true, Ordering::Release);
        format!("the call did not return within {} ms", deadline.limit().as_millis())
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// glibc's `on_exit`: like `atexit`, and the handler gets the exit status.
    fn on_exit(handler: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
}

/// Registers MPI's end at exit (see the module docs). A registration that fails only means
/// MPI is not finalized at exit.
pub(super) fn finalize_at_exit() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" fn handler(status: c_int, _: *mut c_void) {
            finalize(Some(status));
        }
        // SAFETY: registers a plain `extern "C"` function with no argument to keep alive.
        unsafe { on_exit(handler, std::ptr::null_mut()) };
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        extern "C" fn handler() {
            finalize(None);
        }
        // SAFETY: registers a plain `extern "C"` function.
        unsafe { libc::atexit(handler) };
    }
}

/// `MPI_Finalize` at exit with `status` (when known), bounded after a failed wait.
fn finalize(status: Option<c_int>) {
    let guard = match exit_grace() {
        None => lock(None),
        // A blocking call that never returned holds the lock: MPI cannot be finalized.
        Some(_) if STRANDED.load(Ordering::Acquire) => return,
        Some(grace) => {
            // A peer may be dead: MPI_Finalize's wait for every process may never end.
            let Some(status) = status else { return };
            let watchdog = std::thread::Builder::new().name("kiln-mpi-exit".into()).spawn(move || {
                std::thread::sleep(grace);
                // SAFETY: flushes C's output streams, then ends the process at once with the
                // status it was exiting with (the exit handlers already ran or are stuck).
                unsafe {
                    libc::fflush(std::ptr::null_mut());
                    libc::_exit(status)
                }
            });
            if watchdog.is_err() {
                return;
            }
            lock(Some(&Deadline::after(grace)))
        }
    };
    let Ok(_guard) = guard else { return };
    let mut finalized = 0;
    // SAFETY: at exit, holding the lock: no MPI call of kiln runs or follows (FINALIZED);
    // MPI_Finalize once, if not done.
    unsafe {
        if ffi::MPI_Finalized(&mut finalized) == 0 && finalized == 0 {
            FINALIZED.store(true, Ordering::Release);
            ffi::MPI_Finalize();
        }
    }
}
