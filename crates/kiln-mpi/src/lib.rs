//! kiln channels over MPI: collectives across processes and machines, through OpenMPI and the
//! `mpi` crate (rsmpi), as IREE's HAL meets its ranks through an MPI channel provider.
//!
//! [`MpiChannel::world`] is this process's end of a channel joining every process `mpirun`
//! started (a duplicate of `MPI_COMM_WORLD`): rank and count come from MPI. It is a
//! [`kiln_device::Channel`], so its collectives are nodes of an execution plan like those of
//! [`kiln_device::LocalChannel`]:
//!
//! ```no_run
//! # fn main() -> kiln_device::Result<()> {
//! use std::sync::Arc;
//! use kiln_device::{Channel, ReduceOp, kiln_ir::Scalar};
//! let channel: Arc<dyn Channel> = kiln_mpi::MpiChannel::world()?;
//! let device = kiln_cpu::open(&kiln_cpu::CPU)?;
//! let grads = device.buffer(Scalar::F32, 1 << 20)?;
//! let mut plan = kiln_runtime::ExecutionPlan::new(&device)?;
//! plan.all_reduce(&channel, &grads, &grads, ReduceOp::Sum)?;
//! plan.run(&[])?; // every rank's `grads` now holds the sum over ranks
//! # Ok(()) }
//! ```
//!
//! Buffers: host buffers (the CPU's) go to MPI directly; buffers of other devices (GPUs) are
//! staged through host memory (copied out before, back in after), since kiln's MPI is not
//! assumed to be GPU-aware. Reductions of f32, f64 and the integers are MPI's own operations
//! (so NaN in a max or min follows the MPI library); f16 and bf16 are reduced by kiln's
//! operations, registered with MPI.
//!
//! Failure: before each collective the ranks exchange what they are about to run (a small
//! all-gather; the two ends of a send and its receive exchange theirs), so a rank that passes
//! other buffers (or receives another dtype) fails the collective on every rank concerned with
//! [`kiln_device::Error::Channel`] instead of corrupting memory or hanging. Every wait is
//! bounded by the channel's timeout: requests are polled to it, and the calls MPI only has in
//! blocking form run on a helper thread the caller stops waiting for. A rank that died or
//! stopped answering gives the others [`kiln_device::Error::Channel`] in time, and breaks the
//! channel (MPI cannot cancel a collective; the buffers of the abandoned request stay allocated
//! for the life of the process). A rank whose run fails before a collective tells the peers
//! meeting it there ([`kiln_device::Channel::leave`]). Note that `mpirun` ends the whole job
//! when one of its processes dies, unless it runs with `--enable-recovery`.
//!
//! Threads and exit: MPI is initialized with `MPI_THREAD_SERIALIZED` on first use (or taken as
//! it is if the program initialized it, when it allows that level), and every MPI call of kiln
//! holds one process-wide lock. If kiln initialized MPI, it finalizes it at exit: without a
//! bound while every wait succeeded, and after an abandoned wait (a peer may be dead) for at
//! most [`EXIT_GRACE`], after which the process ends with its exit status (`_exit`).
//!
//! Without the crate's `mpi` feature (the default, so the workspace builds where OpenMPI is
//! missing) [`MpiChannel::world`] is [`kiln_device::Error::Unavailable`] and says how to get it.

#[cfg(not(feature = "mpi"))]
mod absent;
#[cfg(feature = "mpi")]
mod imp;

#[cfg(not(feature = "mpi"))]
pub use absent::{EXIT_GRACE, MpiChannel, world_rank};
#[cfg(feature = "mpi")]
pub use imp::{EXIT_GRACE, MpiChannel, world_rank};

/// Whether this build links MPI (the `mpi` feature).
pub const LINKED: bool = cfg!(feature = "mpi");

/// Why a build without the `mpi` feature has no MPI channel.
pub const NOT_LINKED: &str = "this build of kiln has no MPI: build it with the `mpi` feature (the CLI: `cargo build \
     --release -p kiln --features mpi`; the Python package: `MATURIN_PEP517_ARGS=\"--features mpi\" pip install \
     ./crates/kiln-py`), which needs OpenMPI and libclang (Debian: apt-get install openmpi-bin libopenmpi-dev \
     libclang-dev)";
