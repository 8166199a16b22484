//! Channels and collectives: how the devices of several ranks (several devices of one process,
//! several processes, several machines) combine their buffers, modelled on IREE's
//! `iree_hal_channel_t` (the counterpart of an `MPI_Comm` or a `ncclComm_t`).
//!
//! A [`Channel`] is one rank's end of a group of `count` ranks: its `rank`, and how the ranks
//! meet (its provider: [`LocalChannel`] for devices of one process, MPI across processes and
//! machines, NCCL on CUDA). A collective ([`Collective`]) runs on every rank of the channel,
//! each with its own buffers; ranks issue the collectives of a channel in the same order, as
//! with MPI and NCCL.
//!
//! Collectives are nodes of an execution plan (kiln-runtime), ordered by timeline signals
//! like kernels and copies: the plan hands [`Channel::run`] to its queue as a host step
//! ([`crate::HardwareQueue::host`]), so it starts once the kernels writing its inputs
//! finished, and the kernels reading its outputs start once it returned.
//!
//! # Buffers
//! Every rank passes buffers of one dtype, with these lengths (`n` elements a rank):
//! - [`Collective::AllReduce`]: `send` and `recv` of `n` (`recv` = the reduction over ranks);
//! - [`Collective::AllGather`]: `send` of `n`, `recv` of `n × count` (rank `r`'s at `r × n`);
//! - [`Collective::ReduceScatter`]: `send` of `n × count`, `recv` of `n` (block `rank` of the
//!   reduction);
//! - [`Collective::Broadcast`]: one buffer, the root's contents land in every rank's;
//! - [`Collective::Send`] / [`Collective::Recv`]: one buffer each, of equal length on the two
//!   ranks.
//!
//! `send` and `recv` may be the same buffer (in place) where the lengths allow. Reductions
//! take every numeric dtype (not `bool`); f16 and bf16 combine two values at a time in f32,
//! rounding each partial result to the dtype.
//! [`check`] refuses mismatched buffers (dtype, length, device, a peer out of range) before
//! anything runs; a rank whose buffers disagree with its peers' fails the collective on every
//! rank with [`Error::Channel`].
//!
//! # Failure
//! A collective waits at most its timeout for its peers. A peer that does not arrive in time,
//! that failed before it arrived, or that passed other buffers, breaks the channel: every rank
//! gets [`Error::Channel`] (nothing hangs), and every later collective on it fails at once
//! with the same error. The devices and plans stay usable; create a new channel.
//!
//! [`Error::Channel`] is the one error of a missing peer, whichever wait noticed it: a plan
//! whose own timeout is shorter than its channel's gives its collective that timeout, and
//! reports [`Error::Channel`] (not [`Error::Timeout`]) when a peer did not come in time. A rank
//! whose run fails before a collective (a kernel fault, launch arguments refused for the run's
//! values) leaves the channel ([`Channel::leave`]), so that its peers fail at once.

use std::fmt;
use std::time::{Duration, Instant};

use kiln_ir::Scalar;

use crate::buffer::Buffer;
use crate::error::{Error, Result};

mod local;
mod reduce;
mod stage;

pub use local::{DEFAULT_TIMEOUT, LocalChannel, MAX_RANKS};
pub use reduce::reduce_into;
pub use stage::{Region, Staged};

/// How a reduction combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum (integers wrap).
    Sum,
    /// The largest value (a NaN is propagated).
    Max,
    /// The smallest value (a NaN is propagated).
    Min,
}

impl ReduceOp {
    /// `sum`, `max`, `min`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

impl std::str::FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<ReduceOp> {
        match s {
            "sum" => Ok(ReduceOp::Sum),
            "max" => Ok(ReduceOp::Max),
            "min" => Ok(ReduceOp::Min),
            other => Err(Error::Invalid(format!("no reduction `{other}`: use sum, max or min"))),
        }
    }
}

/// One collective, as each rank issues it (see the module docs for its buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the reduction of every rank's `send`.
    AllReduce(ReduceOp),
    /// Every rank gets every rank's `send`, in rank order.
    AllGather,
    /// Rank `r` gets block `r` of the reduction of every rank's `send`.
    ReduceScatter(ReduceOp),
    /// Every rank's buffer gets the root's.
    Broadcast {
        /// The rank whose buffer is sent.
        root: usize,
    },
    /// This rank's buffer goes to `peer`, which issues the matching [`Collective::Recv`].
    Send {
        /// The receiving rank.
        peer: usize,
    },
    /// This rank's buffer gets `peer`'s, which issues the matching [`Collective::Send`].
    Recv {
        /// The sending rank.
        peer: usize,
    },
}

impl Collective {
    /// `all_reduce(sum)`, `broadcast(root 1)`, ..., for messages and profiles.
    pub fn name(&self) -> String {
        match self {
            Collective::AllReduce(op) => format!("all_reduce({})", op.name()),
            Collective::AllGather => "all_gather".into(),
            Collective::ReduceScatter(op) => format!("reduce_scatter({})", op.name()),
            Collective::Broadcast { root } => format!("broadcast(root {root})"),
            Collective::Send { peer } => format!("send(to {peer})"),
            Collective::Recv { peer } => format!("recv(from {peer})"),
        }
    }

    /// The reduction it applies, if any.
    pub fn reduction(&self) -> Option<ReduceOp> {
        match self {
            Collective::AllReduce(op) | Collective::ReduceScatter(op) => Some(*op),
            _ => None,
        }
    }

    /// Whether it reads `send` (the others only write `recv`; a broadcast reads on its root).
    pub fn reads(&self, rank: usize) -> bool {
        match self {
            Collective::Recv { .. } => false,
            Collective::Broadcast { root } => *root == rank,
            _ => true,
        }
    }

    /// Whether it writes `recv` (a send only reads; a broadcast writes everywhere but its root).
    pub fn writes(&self, rank: usize) -> bool {
        match self {
            Collective::Send { .. } => false,
            Collective::Broadcast { root } => *root != rank,
            _ => true,
        }
    }
}

/// One rank's end of a group of ranks (see the module docs).
///
/// Thread safety: a channel may be shared between threads, but a rank issues its collectives
/// one at a time and in the same order as its peers (a plan orders the collectives it
/// records); two collectives of one rank at once are an error of the caller that the
/// provider may report as a mismatch or not at all.
pub trait Channel: Send + Sync + fmt::Debug {
    /// This end's rank, `0 .. count`.
    fn rank(&self) -> usize;

    /// How many ranks the channel joins.
    fn count(&self) -> usize;

    /// How the ranks meet: `local`, `mpi`, `nccl`.
    fn provider(&self) -> &'static str;

    /// The longest a collective waits for its peers before it breaks the channel.
    fn timeout(&self) -> Duration;

    /// Refuses a buffer this provider cannot take (NCCL: one that is not on its GPU), with
    /// what to do instead. The default takes every buffer (host devices directly, others
    /// staged through host memory).
    ///
    /// # Errors
    /// [`Error::Buffer`] naming the buffer's device and the devices the channel takes.
    fn accepts(&self, buffer: &Buffer) -> Result<()> {
        let _ = buffer;
        Ok(())
    }

    /// Runs `op` on this rank over `send` and `recv` (the same buffer for a broadcast, a
    /// send or a receive), blocking until it completed on this rank, or failed, or
    /// `timeout` (at most [`Channel::timeout`]) passed without the peers. The buffers were
    /// checked with [`check`]; nothing else may touch them until this returns.
    ///
    /// # Errors
    /// [`Error::Channel`] when a peer did not arrive in time, failed, or passed other
    /// buffers, or the channel was broken earlier; the buffers' transfer errors.
    fn run(&self, op: Collective, send: &Buffer, recv: &Buffer, timeout: Duration) -> Result<()>;

    /// The error that broke the channel, if one did.
    fn broken(&self) -> Option<Error>;

    /// Tells the peers that this rank will not take part in `next`, the first collective of
    /// the channel it has not started (its plan failed before reaching it), so that they fail
    /// now rather than at their timeout, and breaks this end. The in-process channel breaks
    /// every end at once; MPI tells the peers meeting this rank in `next` (they fail with
    /// [`Error::Channel`] naming the rank that left); a provider that cannot tell them does
    /// nothing, and they time out. Called at most once per failed run and channel, by the
    /// plan, on the thread where the failure is seen; it does not wait for the peers to hear
    /// it.
    fn leave(&self, next: Collective, why: &Error) {
        let _ = (next, why);
    }

    /// Breaks this end of the channel at once: a collective of this process waiting on it
    /// returns [`Error::Channel`] with `why` instead of waiting for its timeout (kiln's Python
    /// package calls it at interpreter exit). Peers in other processes are not told; they
    /// time out. The default does nothing.
    fn abort(&self, why: &Error) {
        let _ = why;
    }
}

/// The longest a collective of a new channel may wait for its peers: `timeout` itself, which
/// must be more than zero (a channel that gives its peers no time at all fails every
/// collective of two ranks or more).
///
/// # Errors
/// [`Error::Invalid`] for a zero timeout.
pub fn check_timeout(timeout: Duration) -> Result<Duration> {
    if timeout.is_zero() {
        return Err(Error::Invalid(
            "a channel's timeout must be more than 0: it is how long a collective waits for its peers (60 s \
             by default)"
                .into(),
        ));
    }
    Ok(timeout)
}

/// The element count a rank's `recv` must have for `op` given `send`'s (see the module docs).
fn recv_len(op: Collective, send: usize, count: usize) -> Option<usize> {
    match op {
        Collective::AllGather => send.checked_mul(count),
        Collective::ReduceScatter(_) => send.is_multiple_of(count).then(|| send / count),
        _ => Some(send),
    }
}

/// Checks one rank's buffers for `op` on `channel`: one dtype (numeric for a reduction),
/// matching lengths, one device taken by the channel, a root or peer in range (and not this
/// rank for a send or receive), an unbroken channel. The checks a rank can make alone: what
/// its peers pass is compared when they meet.
///
/// # Errors
/// [`Error::Buffer`] for buffers that do not fit `op`; [`Error::Invalid`] for a root or peer
/// out of range; [`Error::Channel`] for a broken channel.
pub fn check(channel: &dyn Channel, op: Collective, send: &Buffer, recv: &Buffer) -> Result<()> {
    let (rank, count) = (channel.rank(), channel.count());
    let name = op.name();
    if let Some(e) = channel.broken() {
        return Err(e);
    }
    match op {
        Collective::Broadcast { root: peer } | Collective::Send { peer } | Collective::Recv { peer } => {
            if peer >= count {
                return Err(Error::Invalid(format!("{name}: rank {peer} is not in a channel of {count} ranks")));
            }
            if peer == rank && !matches!(op, Collective::Broadcast { .. }) {
                return Err(Error::Invalid(format!("{name}: rank {rank} cannot send to or receive from itself")));
            }
            if send.byte_range() != recv.byte_range() {
                return Err(Error::Buffer(format!("{name} takes one buffer: pass the same one as send and recv")));
            }
        }
        _ => {}
    }
    if send.dtype() != recv.dtype() {
        return Err(Error::Buffer(format!(
            "{name}: send holds {}, recv {}; use one dtype",
            send.dtype(),
            recv.dtype()
        )));
    }
    if op.reduction().is_some() && send.dtype() == Scalar::Bool {
        return Err(Error::Buffer(format!("{name}: bool buffers cannot be reduced; use u8")));
    }
    if send.device() != recv.device() {
        return Err(Error::Buffer(format!(
            "{name}: send is on {}, recv on {}; a rank's buffers are on one device",
            send.device(),
            recv.device()
        )));
    }
    match recv_len(op, send.len(), count) {
        Some(want) if want == recv.len() => {}
        Some(want) => {
            return Err(Error::Buffer(format!(
                "{name} on {count} ranks: send has {} elements, so recv needs {want}, not {}",
                send.len(),
                recv.len()
            )));
        }
        None => {
            return Err(Error::Buffer(format!(
                "{name} on {count} ranks: send has {} elements, not a multiple of {count}",
                send.len()
            )));
        }
    }
    if send.byte_range() != recv.byte_range() && send.overlaps(recv) {
        return Err(Error::Buffer(format!("{name}: send and recv overlap; pass one buffer (in place) or two apart")));
    }
    channel.accepts(send)?;
    Ok(())
}

/// What a rank tells its peers of one collective, compared when they meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    /// The collective.
    pub op: Collective,
    /// The buffers' dtype.
    pub dtype: Scalar,
    /// Elements in `send`.
    pub send_len: usize,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} {}", self.op.name(), self.send_len, self.dtype)
    }
}

/// When a collective's wait for its peers gives up: the providers' shared clock.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// `None`: never (a limit past the clock's range).
    at: Option<Instant>,
    limit: Duration,
}

impl Deadline {
    /// `limit` from now.
    pub fn after(limit: Duration) -> Deadline {
        Deadline { at: Instant::now().checked_add(limit), limit }
    }

    /// The time left, `None` once it passed (an hour at a time for a limit past the clock's range).
    pub fn left(&self) -> Option<Duration> {
        match self.at {
            None => Some(Duration::from_secs(3600)),
            Some(at) => at.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()),
        }
    }

    /// Whether it passed.
    pub fn passed(&self) -> bool {
        self.left().is_none()
    }

    /// The limit it was made with, for messages.
    pub fn limit(&self) -> Duration {
        self.limit
    }
}
