//! [`LocalChannel`]: the ranks are devices of one process (several CPU devices, a CPU and a
//! GPU, several GPUs), and meet in memory.
//!
//! Each collective is one round: every rank posts its buffers (as host memory, staged when
//! its device is not the host's) and waits, up to the timeout, for the others; once all are
//! there, each rank computes its own share straight from its peers' memory, and no rank
//! leaves before every share is done (so no memory a peer reads is freed under it):
//! - all_reduce: rank `r` reduces block `r` of the elements over every rank's `send`, in rank
//!   order (so every rank gets the same bits), and writes it into every rank's `recv`;
//! - reduce_scatter: rank `r` reduces block `r` into its own `recv`;
//! - all_gather: rank `r` writes its `send` into every rank's `recv`;
//! - broadcast: each rank copies the root's buffer.
//!
//! Every byte is read and written once, as in a ring, but without the ring's `count - 1`
//! steps and their waits: in one memory every rank reaches every other directly.
//! A send and its receive meet in a mailbox of the pair; the receiver copies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use kiln_ir::Scalar;

use super::reduce::reduce_into;
use super::stage::{Region, Staged};
use super::{Channel, Collective, Deadline, Signature};
use crate::buffer::Buffer;
use crate::error::{Error, Result};

/// How long a collective waits for its peers unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The most ranks one local channel joins.
pub const MAX_RANKS: usize = 4096;

/// Bytes reduced at a time: a block and its partial sum stay in the core's cache.
const BLOCK_BYTES: usize = 64 << 10;

/// One rank's end of an in-process channel (see the module docs).
pub struct LocalChannel {
    rank: usize,
    world: Arc<World>,
}

impl std::fmt::Debug for LocalChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalChannel(#{}, rank {} of {})", self.world.id, self.rank, self.world.count)
    }
}

impl LocalChannel {
    /// The `count` ends of a new channel, rank 0 first (as `ncclCommInitAll`): give each to
    /// the plans of one device. Collectives wait [`DEFAULT_TIMEOUT`] for their peers.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a count of 0 or above [`MAX_RANKS`].
    pub fn world(count: usize) -> Result<Vec<Arc<LocalChannel>>> {
        Self::world_with_timeout(count, DEFAULT_TIMEOUT)
    }

    /// [`LocalChannel::world`] whose collectives wait at most `timeout` for their peers.
    ///
    /// # Errors
    /// As [`LocalChannel::world`], and [`Error::Invalid`] for a zero timeout.
    pub fn world_with_timeout(count: usize, timeout: Duration) -> Result<Vec<Arc<LocalChannel>>> {
        if count == 0 || count > MAX_RANKS {
            return Err(Error::Invalid(format!("a local channel joins 1 to {MAX_RANKS} ranks, not {count}")));
        }
        let timeout = super::check_timeout(timeout)?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let world = Arc::new(World {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            count,
            timeout,
            state: Mutex::new(State {
                broken: None,
                round: 0,
                posts: vec![None; count],
                started: false,
                finished: 0,
                mail: HashMap::new(),
            }),
            changed: Condvar::new(),
        });
        Ok((0..count).map(|rank| Arc::new(LocalChannel { rank, world: world.clone() })).collect())
    }

    /// Breaks the channel because this rank will not take part in its next collective (its
    /// plan failed before it): the peers waiting for it fail at once instead of at their timeout.
    fn depart(&self, why: &Error) {
        let mut st = self.world.lock();
        self.world.fail(&mut st, format!("rank {} left: {why}", self.rank));
    }

    fn collective(&self, sig: Signature, staged: &Staged<'_>, deadline: Deadline) -> Result<()> {
        let w = &*self.world;
        let r = self.rank;
        let mut st = w.lock();
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        if st.posts[r].is_some() {
            return Err(Error::Invalid(format!(
                "rank {r} issued {} while its previous collective on this channel is still running; a rank \
                 issues one collective at a time",
                sig.op.name()
            )));
        }
        st.posts[r] = Some(Post { sig, send: staged.send, recv: staged.recv });
        let round = st.round;
        if st.posts.iter().all(Option::is_some) {
            if let Some(why) = mismatch(&st.posts) {
                return Err(w.fail(&mut st, why));
            }
            st.started = true;
            w.changed.notify_all();
        }
        while !st.started {
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            let Some(left) = deadline.left() else {
                let missing: Vec<String> =
                    st.posts.iter().enumerate().filter(|(_, p)| p.is_none()).map(|(i, _)| i.to_string()).collect();
                let why = format!(
                    "rank {r} waited {} ms in {} (collective {round}) for rank(s) {}, which had not arrived by then",
                    deadline.limit().as_millis(),
                    sig.op.name(),
                    missing.join(", ")
                );
                return Err(w.fail(&mut st, why));
            };
            st = w.wait(st, Some(left));
        }
        let posts: Vec<Post> = st.posts.iter().flatten().copied().collect();
        drop(st);
        compute(r, sig, &posts);
        let mut st = w.lock();
        st.finished += 1;
        if st.finished == w.count {
            st.round += 1;
            st.posts.iter_mut().for_each(|p| *p = None);
            st.started = false;
            st.finished = 0;
            w.changed.notify_all();
        }
        // Peers still computing read and write this rank's memory: wait for them, without a
        // deadline (every share is a bounded amount of memory work).
        while st.round == round {
            st = w.wait(st, None);
        }
        Ok(())
    }

    fn send(&self, peer: usize, sig: Signature, data: Region, deadline: Deadline) -> Result<()> {
        let w = &*self.world;
        let key = (self.rank, peer);
        let mut st = w.lock();
        if let Some(e) = &st.broken {
            return Err(e.clone());
        }
        if st.mail.contains_key(&key) {
            return Err(Error::Invalid(format!(
                "rank {} sent to rank {peer} while its previous send to it is still running",
                self.rank
            )));
        }
        st.mail.insert(key, Mail { sig, data, state: MailState::Posted });
        w.changed.notify_all();
        loop {
            match st.mail.get(&key).map(|m| m.state) {
                Some(MailState::Done) | None => {
                    st.mail.remove(&key);
                    return Ok(());
                }
                // The receiver reads this rank's memory: wait for it without a deadline.
                Some(MailState::Copying) => st = w.wait(st, None),
                Some(MailState::Posted) => {
                    if let Some(e) = st.broken.clone() {
                        st.mail.remove(&key);
                        return Err(e);
                    }
                    let Some(left) = deadline.left() else {
                        st.mail.remove(&key);
                        let why = format!(
                            "rank {} waited {} ms to send {sig} to rank {peer}, which had not received by then",
                            self.rank,
                            deadline.limit().as_millis(),
                        );
                        return Err(w.fail(&mut st, why));
                    };
                    st = w.wait(st, Some(left));
                }
            }
        }
    }

    fn recv(&self, peer: usize, sig: Signature, into: Region, deadline: Deadline) -> Result<()> {
        let w = &*self.world;
        let key = (peer, self.rank);
        let mut st = w.lock();
        loop {
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            if let Some(mail) = st.mail.get_mut(&key)
                && mail.state == MailState::Posted
            {
                let from = mail.data;
                if mail.sig.dtype != sig.dtype || mail.sig.send_len != sig.send_len {
                    let why = format!(
                        "rank {peer} sent {} {}, rank {} receives {} {}",
                        mail.sig.send_len, mail.sig.dtype, self.rank, sig.send_len, sig.dtype
                    );
                    return Err(w.fail(&mut st, why));
                }
                if from.overlaps(&into) {
                    let why = format!("rank {peer} sends from the memory rank {} receives into", self.rank);
                    return Err(w.fail(&mut st, why));
                }
                mail.state = MailState::Copying;
                drop(st);
                // SAFETY: `from` and `into` are live regions of `len` bytes (the sender blocks in
                // `send` until the state is Done; this rank's region is its own), and they do
                // not overlap (checked above).
                unsafe { std::ptr::copy_nonoverlapping(from.ptr, into.ptr, into.len) };
                let mut st = w.lock();
                if let Some(mail) = st.mail.get_mut(&key) {
                    mail.state = MailState::Done;
                }
                w.changed.notify_all();
                return Ok(());
            }
            let Some(left) = deadline.left() else {
                let why = format!(
                    "rank {} waited {} ms to receive {sig} from rank {peer}, which had not sent by then",
                    self.rank,
                    deadline.limit().as_millis(),
                );
                return Err(w.fail(&mut st, why));
            };
            st = w.wait(st, Some(left));
        }
    }
}

impl Channel for LocalChannel {
    fn rank(&self) -> usize {
        self.rank
    }

    fn count(&self) -> usize {
        self.world.count
    }

    fn provider(&self) -> &'static str {
        "local"
    }

    fn timeout(&self) -> Duration {
        self.world.timeout
    }

    fn run(&self, op: Collective, send: &Buffer, recv: &Buffer, timeout: Duration) -> Result<()> {
        let deadline = Deadline::after(timeout.min(self.world.timeout));
        let sig = Signature { op, dtype: send.dtype(), send_len: send.len() };
        let staged = match Staged::new(op, self.rank, send, recv) {
            Ok(staged) => staged,
            Err(e) => {
                // This rank cannot meet its peers (its buffer could not be staged): they fail now.
                self.depart(&e);
                return Err(e);
            }
        };
        match op {
            Collective::Send { peer } => self.send(peer, sig, staged.send, deadline)?,
            Collective::Recv { peer } => self.recv(peer, sig, staged.recv, deadline)?,
            _ => self.collective(sig, &staged, deadline)?,
        }
        staged.finish()
    }

    fn broken(&self) -> Option<Error> {
        self.world.lock().broken.clone()
    }

    fn leave(&self, next: Collective, why: &Error) {
        let _ = next;
        self.depart(why);
    }

    fn abort(&self, why: &Error) {
        self.depart(why);
    }
}

/// What every end of one channel shares.
struct World {
    id: u64,
    count: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    /// The error that broke the channel: every later collective fails with it.
    broken: Option<Error>,
    /// Collectives completed.
    round: u64,
    /// Each rank's buffers for the current collective, once it arrived.
    posts: Vec<Option<Post>>,
    /// Whether every rank arrived and the shares are being computed.
    started: bool,
    /// Ranks whose share is done.
    finished: usize,
    /// Sends waiting for (or being copied by) their receiver, by (from, to).
    mail: HashMap<(usize, usize), Mail>,
}

#[derive(Clone, Copy)]
struct Post {
    sig: Signature,
    send: Region,
    recv: Region,
}

struct Mail {
    sig: Signature,
    data: Region,
    state: MailState,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum MailState {
    Posted,
    Copying,
    Done,
}

impl World {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Only plain assignments run under the lock; a poisoned lock still holds valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>, timeout: Option<Duration>) -> MutexGuard<'a, State> {
        match timeout {
            Some(t) => self.changed.wait_timeout(st, t).map_or_else(|p| p.into_inner().0, |r| r.0),
            None => self.changed.wait(st).unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Breaks the channel (once: the first reason stays) and wakes every waiting rank.
    fn fail(&self, st: &mut State, why: String) -> Error {
        let e = st
            .broken
            .get_or_insert_with(|| Error::Channel {
                channel: format!("local #{} of {} ranks", self.id, self.count),
                message: why,
            })
            .clone();
        self.changed.notify_all();
        e
    }
}

/// Why the ranks' posts cannot make one collective: different collectives or buffers, or
/// memory two ranks share.
fn mismatch(posts: &[Option<Post>]) -> Option<String> {
    let posts: Vec<&Post> = posts.iter().flatten().collect();
    let first = posts.first()?.sig;
    if let Some((r, p)) = posts.iter().enumerate().find(|(_, p)| p.sig != first) {
        return Some(format!("rank 0 issued {first}, rank {r} {}", p.sig));
    }
    for (i, a) in posts.iter().enumerate() {
        for (j, b) in posts.iter().enumerate().skip(i + 1) {
            if [a.send, a.recv].iter().any(|x| [b.send, b.recv].iter().any(|y| x.overlaps(y))) {
                return Some(format!("ranks {i} and {j} pass buffers that share memory; give each rank its own"));
            }
        }
    }
    None
}

/// Rank `rank`'s share of the collective over every rank's `posts` (see the module docs).
fn compute(rank: usize, sig: Signature, posts: &[Post]) {
    let count = posts.len();
    let es = sig.dtype.size();
    let n = sig.send_len;
    match sig.op {
        Collective::AllReduce(op) => {
            let (lo, hi) = (n * rank / count, n * (rank + 1) / count);
            reduce_blocks(op, sig.dtype, posts, lo * es, hi * es, |from, bytes| {
                for p in posts {
                    write(p.recv, from, bytes);
                }
            });
        }
        Collective::ReduceScatter(op) => {
            let m = n / count;
            let base = rank * m * es;
            let recv = posts[rank].recv;
            reduce_blocks(op, sig.dtype, posts, base, base + m * es, |from, bytes| write(recv, from - base, bytes));
        }
        Collective::AllGather => {
            let own = read(&posts[rank].send, 0, n * es).to_vec();
            for p in posts {
                write(p.recv, rank * n * es, &own);
            }
        }
        Collective::Broadcast { root } if root != rank => {
            let from = posts[root].send;
            let to = posts[rank].recv;
            // SAFETY: both regions are live for the round (their owners wait for it), of
            // `n * es` bytes, and belong to different ranks, which share no memory (checked).
            unsafe { std::ptr::copy_nonoverlapping(from.ptr, to.ptr, to.len) };
        }
        Collective::Broadcast { .. } | Collective::Send { .. } | Collective::Recv { .. } => {}
    }
}

/// Reduces bytes `start..end` of every rank's `send`, a block at a time in rank order, and
/// hands each reduced block to `put(offset, bytes)`.
fn reduce_blocks(
    op: super::ReduceOp,
    dtype: Scalar,
    posts: &[Post],
    start: usize,
    end: usize,
    mut put: impl FnMut(usize, &[u8]),
) {
    let block = (BLOCK_BYTES / dtype.size()).max(1) * dtype.size();
    let mut acc = Vec::with_capacity(block.min(end - start));
    let mut at = start;
    while at < end {
        let len = block.min(end - at);
        acc.clear();
        acc.extend_from_slice(read(&posts[0].send, at, len));
        for p in &posts[1..] {
            // Same dtype and lengths on every rank (checked when they met): cannot fail.
            let _ = reduce_into(op, dtype, &mut acc, read(&p.send, at, len));
        }
        put(at, &acc);
        at += len;
    }
}

/// `len` bytes of `region` from `offset`.
fn read(region: &Region, offset: usize, len: usize) -> &[u8] {
    debug_assert!(offset + len <= region.len);
    // SAFETY: the region is live while its owner waits in the round (the slice is dropped
    // before this rank finishes its share); `offset + len <= region.len` as every caller
    // computes it from the lengths the ranks agreed on; no rank writes these bytes during
    // the round (each writes only its own block of each `recv`, and `send` and `recv`
    // blocks of one index belong to the same rank).
    unsafe { std::slice::from_raw_parts(region.ptr.add(offset), len) }
}

/// Writes `bytes` into `region` at `offset`.
fn write(region: Region, offset: usize, bytes: &[u8]) {
    debug_assert!(offset + bytes.len() <= region.len);
    // SAFETY: as in `read`: a live region, in range, and these bytes are this rank's block,
    // which no other rank touches during the round; `bytes` is this rank's own memory.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), region.ptr.add(offset), bytes.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_of_zero_is_refused() {
        let e = LocalChannel::world_with_timeout(2, Duration::ZERO).expect_err("a zero timeout");
        assert!(matches!(&e, Error::Invalid(m) if m.contains("more than 0")), "{e}");
        let ends = LocalChannel::world_with_timeout(2, Duration::from_nanos(1)).expect("the shortest timeout");
        assert_eq!(ends[1].timeout(), Duration::from_nanos(1));
    }
}
