//! A rank's buffers as host memory for the span of one collective.

use crate::buffer::Buffer;
use crate::error::Result;

use super::Collective;

/// Host bytes of one buffer during a collective: its own memory on a host device, else a
/// staging copy.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// The first byte.
    pub ptr: *mut u8,
    /// How many bytes.
    pub len: usize,
    /// The allocation and byte range it views, to find buffers two ranks share (`None` when
    /// staged: a staging copy is private).
    pub range: Option<(usize, usize, usize)>,
}

// SAFETY: a Region is an address and a length; who may touch the memory when is the
// collective's protocol (see `local`), which hands regions between ranks only while their
// owners are blocked in the same collective.
unsafe impl Send for Region {}

impl Region {
    /// Whether the two regions share a byte of one allocation.
    pub fn overlaps(&self, other: &Region) -> bool {
        match (self.range, other.range) {
            (Some((a, s0, e0)), Some((b, s1, e1))) => a == b && s0 < e1 && s1 < e0,
            _ => false,
        }
    }
}

/// `send` and `recv` of one rank as host memory: taken as they are on host devices, copied
/// out (what the rank reads) into staging memory otherwise, and copied back by
/// [`Staged::finish`] (what it writes).
pub struct Staged<'b> {
    /// What the rank sends (staged in when it reads it).
    pub send: Region,
    /// What the rank receives into (the send region when in place).
    pub recv: Region,
    recv_buffer: &'b Buffer,
    /// Staging memory (u64 words: 8-byte aligned) of the send side, and of the recv side
    /// unless it is the send side's.
    _send_staging: Option<Vec<u64>>,
    _recv_staging: Option<Vec<u64>>,
    writes: bool,
}

impl<'b> Staged<'b> {
    /// Rank `rank`'s `send` and `recv` for `op` as host memory.
    ///
    /// # Errors
    /// The buffers' allocation and copy-out errors.
    pub fn new(op: Collective, rank: usize, send: &'b Buffer, recv: &'b Buffer) -> Result<Staged<'b>> {
        let in_place = send.byte_range() == recv.byte_range();
        let (send_region, send_staging) = region(send, op.reads(rank))?;
        let (recv_region, recv_staging) = if in_place { (send_region, None) } else { region(recv, false)? };
        Ok(Staged {
            send: send_region,
            recv: recv_region,
            recv_buffer: recv,
            _send_staging: send_staging,
            _recv_staging: recv_staging,
            writes: op.writes(rank) && recv_region.range.is_none(),
        })
    }

    /// Copies the received bytes back into a staged `recv`.
    ///
    /// # Errors
    /// The copy-in's errors.
    pub fn finish(self) -> Result<()> {
        if !self.writes {
            return Ok(());
        }
        // SAFETY: `recv.ptr` points at `recv.len` initialised bytes of a staging vector this
        // value owns (or of the send side's, when in place), alive until it drops.
        let bytes = unsafe { std::slice::from_raw_parts(self.recv.ptr, self.recv.len) };
        self.recv_buffer.copyin(bytes)
    }
}

/// `buffer` as host memory: its own on a host device; else a zeroed staging copy, filled
/// from the buffer when `read`.
fn region(buffer: &Buffer, read: bool) -> Result<(Region, Option<Vec<u64>>)> {
    let len = buffer.nbytes();
    if buffer.allocator().is_host() {
        let raw = buffer.raw()?;
        let (alloc, range) = buffer.byte_range();
        return Ok((Region { ptr: raw.host_ptr(), len, range: Some((alloc, range.start, range.end)) }, None));
    }
    let mut words = vec![0u64; len.div_ceil(8)];
    let ptr = words.as_mut_ptr() as *mut u8;
    if read {
        // SAFETY: `words` holds at least `len` bytes, initialised (zeroed), and nothing else
        // refers to it yet.
        buffer.copyout(unsafe { std::slice::from_raw_parts_mut(ptr, len) })?;
    }
    Ok((Region { ptr, len, range: None }, Some(words)))
}
