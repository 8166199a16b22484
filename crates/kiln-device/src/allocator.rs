//! [`LruAllocator`]: a caching layer over a backend's raw [`Allocator`].
//!
//! Device allocation (`cudaMalloc`, `clCreateBuffer`, even large `malloc`s) is slow and often
//! synchronizing, while an ML runtime frees and re-allocates buffers of the same few sizes all
//! the time. The `LruAllocator` keeps freed blocks and hands them out again.
//!
//! **Size classes.** A request is rounded up to its size class and the block is allocated at
//! the class size, so any block of a class serves any request of that class:
//! - up to 512 B: multiples of 64 B (64, 128, …, 512);
//! - above: eight classes per power of two (e.g. 576, 640, …, 1024, 1152, …), so at most
//!   12.5 % of a block is slack.
//!
//! All byte counters ([`AllocatorStats`]) and the budget are in class bytes, i.e. the memory
//! really taken from the device.
//!
//! **Budget.** `in_use + cached` never exceeds the budget (if one is set): a request that
//! would exceed it first evicts cached blocks, least recently freed first; if live memory
//! alone would exceed it, the whole cache is released and [`Error::OutOfMemory`] is returned.
//! When the backend itself fails an allocation with `Error::OutOfMemory`, the whole cache is
//! released and the allocation retried once before the error is passed on (with this
//! allocator's numbers). Backends must report exhaustion as `Error::OutOfMemory`; any other
//! backend error is returned unchanged after the retry.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln_ir::DeviceSpec;

use crate::buffer::{Allocator, AllocatorStats, RawPtr, RawView};
use crate::error::{Error, Result};

/// The environment variable that sets the default budget of [`LruAllocator::from_env`].
pub const MEMORY_BUDGET_ENV: &str = "KILN_MEMORY_BUDGET";

/// Parses a byte size: plain bytes (`1048576`) or an integer with a binary suffix
/// `K`/`M`/`G`/`T` (optionally followed by `B` or `iB`, any case): `512M` = 512 × 2²⁰.
/// `what` names the setting in the error message.
///
/// # Errors
/// [`Error::Config`] naming `what` when `text` is not such a size or overflows `usize`.
pub fn parse_byte_size(text: &str, what: &str) -> Result<usize> {
    let bad = |why: &str| {
        Error::Config(format!(
            "{what}=`{text}` is not a byte size ({why}): use plain bytes or an integer with a K/M/G/T suffix, e.g. 512M"
        ))
    };
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(bad("no number"));
    }
    let n: usize = digits.parse().map_err(|_| bad("number too large"))?;
    let suffix = suffix.trim().to_ascii_lowercase();
    let unit = suffix.strip_suffix("ib").or_else(|| suffix.strip_suffix('b')).unwrap_or(&suffix);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(bad("unknown suffix")),
    };
    if suffix == "ib" {
        return Err(bad("unknown suffix"));
    }
    n.checked_mul(1usize << shift).ok_or_else(|| bad("too large for this machine"))
}

/// The class a request of `bytes` is served from (see the module docs), `None` on overflow.
pub fn size_class(bytes: usize) -> Option<usize> {
    let step = if bytes <= 512 {
        64
    } else {
        // Eight classes per power of two: the step is 1/8 of the octave's lower bound.
        let octave = usize::BITS - 1 - (bytes - 1).leading_zeros();
        1usize << (octave - 3)
    };
    bytes.max(1).checked_next_multiple_of(step)
}

/// A fast hasher for size-class keys (plain integers; SipHash would dominate a cached alloc).
#[derive(Default)]
struct ClassHasher(u64);

impl Hasher for ClassHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Default)]
struct State {
    /// Free blocks per class, oldest first; each carries its LRU sequence number.
    free: HashMap<usize, VecDeque<(u64, RawPtr)>, BuildHasherDefault<ClassHasher>>,
    /// Free order over all blocks as (sequence number, class), oldest first. A block taken
    /// back by a hit leaves its entry behind (removing it from the middle would cost more
    /// than the hit): an entry is live exactly when it is the front of its class's queue
    /// when it reaches the front here. Stale entries are compacted away in bulk.
    lru: VecDeque<(u64, usize)>,
    /// Blocks in the cache (live entries of `lru`).
    blocks: usize,
    seq: u64,
    in_use: usize,
    cached: usize,
    high_water: usize,
    hits: u64,
    misses: u64,
    budget: Option<usize>,
}

impl State {
    fn note_high_water(&mut self) {
        self.high_water = self.high_water.max(self.in_use + self.cached);
    }

    /// Removes the least recently freed block from the cache.
    fn pop_lru(&mut self) -> Option<(RawPtr, usize)> {
        // Every live block of a class is newer than the stale entries before it (they were
        // freed earlier), so the first entry whose class queue starts with it is the oldest
        // block.
        while let Some((seq, class)) = self.lru.pop_front() {
            let Some(queue) = self.free.get_mut(&class) else { continue };
            if queue.front().is_some_and(|(s, _)| *s == seq) {
                let (_, ptr) = queue.pop_front()?;
                self.cached -= class;
                self.blocks -= 1;
                return Some((ptr, class));
            }
        }
        None
    }

    /// Takes the most recently freed block of `class`, if any.
    fn pop_class(&mut self, class: usize) -> Option<RawPtr> {
        let (_, ptr) = self.free.get_mut(&class)?.pop_back()?;
        self.cached -= class;
        self.blocks -= 1;
        Some(ptr)
    }

    fn push(&mut self, class: usize, ptr: RawPtr) {
        self.seq += 1;
        let seq = self.seq;
        self.free.entry(class).or_default().push_back((seq, ptr));
        self.lru.push_back((seq, class));
        self.cached += class;
        self.blocks += 1;
        if self.lru.len() > 2 * self.blocks + 64 {
            self.compact();
        }
    }

    /// Drops the stale entries of `lru`. It runs only when stale entries outnumber cached
    /// blocks by 64, so its O(n log n) cost is spread over at least n hits.
    fn compact(&mut self) {
        let free = &self.free;
        self.lru
            .retain(|(seq, class)| free.get(class).is_some_and(|q| q.binary_search_by_key(seq, |(s, _)| *s).is_ok()));
    }

    /// Evicts LRU blocks until `in_use + cached + extra` fits the budget (or the cache is empty).
    fn evict_to_fit(&mut self, extra: usize, out: &mut Vec<(RawPtr, usize)>) {
        let Some(budget) = self.budget else { return };
        while self.in_use.saturating_add(self.cached).saturating_add(extra) > budget {
            match self.pop_lru() {
                Some(b) => out.push(b),
                None => break,
            }
        }
    }

    fn drain(&mut self, out: &mut Vec<(RawPtr, usize)>) {
        for (class, queue) in self.free.drain() {
            out.extend(queue.into_iter().map(|(_, p)| (p, class)));
        }
        self.lru.clear();
        self.cached = 0;
        self.blocks = 0;
    }
}

/// A caching, budgeted allocator over a backend's raw allocator (see the module docs).
///
/// Thread-safe: one mutex guards the bookkeeping; the backend's `alloc`/`free` are called
/// outside it, so a slow driver call does not serialize cache hits of other threads.
pub struct LruAllocator {
    inner: Arc<dyn Allocator>,
    state: Mutex<State>,
}

impl LruAllocator {
    /// Wraps `inner` with an optional byte budget.
    pub fn new(inner: Arc<dyn Allocator>, budget: Option<usize>) -> LruAllocator {
        LruAllocator { inner, state: Mutex::new(State { budget, ..State::default() }) }
    }

    /// Wraps `inner` with the budget from `KILN_MEMORY_BUDGET` (unset or empty: no budget).
    /// An unparsable value is an `Error::Config` naming the variable.
    ///
    /// # Errors
    /// [`Error::Config`] when `KILN_MEMORY_BUDGET` is set but not a byte size.
    pub fn from_env(inner: Arc<dyn Allocator>) -> Result<LruAllocator> {
        let value = std::env::var(MEMORY_BUDGET_ENV).ok();
        Ok(LruAllocator::new(inner, budget_from(value.as_deref())?))
    }

    /// The raw allocator underneath.
    pub fn inner(&self) -> &Arc<dyn Allocator> {
        &self.inner
    }

    /// The byte budget over `in_use + cached`, if any.
    pub fn budget(&self) -> Option<usize> {
        self.lock().budget
    }

    /// Sets the budget. Lowering it evicts cached blocks to fit; live memory above a lowered
    /// budget stays live, and further allocations fail until enough of it is freed.
    pub fn set_budget(&self, budget: Option<usize>) {
        let mut evicted = Vec::new();
        {
            let mut s = self.lock();
            s.budget = budget;
            s.evict_to_fit(0, &mut evicted);
        }
        self.release(evicted);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent at every unlock (no user code runs under the lock).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns evicted blocks to the backend (outside the lock).
    fn release(&self, blocks: Vec<(RawPtr, usize)>) -> usize {
        let mut bytes = 0;
        for (ptr, class) in blocks {
            bytes += class;
            // SAFETY: every cached block came from `inner.alloc(class)` and was freed by its
            // user; it has just been removed from the cache, so nothing else can hand it out.
            unsafe { self.inner.free(ptr, class) };
        }
        bytes
    }

    fn out_of_memory(&self, requested: usize, s: &State) -> Error {
        Error::OutOfMemory {
            device: self.inner.device().to_string(),
            requested,
            in_use: s.in_use,
            cached: s.cached,
            budget: s.budget,
        }
    }

    /// Reserves `class` bytes under the budget, evicting cached blocks as needed. On failure
    /// the whole cache is released and the out-of-memory error returned.
    fn reserve(&self, requested: usize, class: usize) -> Result<()> {
        let mut evicted = Vec::new();
        let result = {
            let mut s = self.lock();
            if s.budget.is_some_and(|b| s.in_use.saturating_add(class) > b) {
                s.drain(&mut evicted);
                Err(self.out_of_memory(requested, &s))
            } else {
                s.evict_to_fit(class, &mut evicted);
                s.in_use += class;
                Ok(())
            }
        };
        self.release(evicted);
        result
    }

    /// `ptr`, a block the backend just allocated under a reservation: the high-water mark
    /// counts it now (a reservation the backend then refuses never counts).
    fn allocated(&self, ptr: RawPtr) -> RawPtr {
        self.lock().note_high_water();
        ptr
    }

    fn unreserve(&self, class: usize) {
        let mut s = self.lock();
        s.in_use = s.in_use.saturating_sub(class);
    }
}

/// The budget a `KILN_MEMORY_BUDGET` value sets.
fn budget_from(value: Option<&str>) -> Result<Option<usize>> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => {
            let b = parse_byte_size(v, MEMORY_BUDGET_ENV)?;
            if b == 0 {
                return Err(Error::Config(format!(
                    "{MEMORY_BUDGET_ENV}=0 would forbid every allocation; unset it for no budget"
                )));
            }
            Ok(Some(b))
        }
    }
}

impl Drop for LruAllocator {
    fn drop(&mut self) {
        let mut blocks = Vec::new();
        self.lock().drain(&mut blocks);
        self.release(blocks);
    }
}

impl Allocator for LruAllocator {
    fn device(&self) -> &DeviceSpec {
        self.inner.device()
    }

    /// Serves `bytes` from the cache when a block of its class is free, else from the backend
    /// (see the module docs for the budget and the out-of-memory ladder).
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        if bytes == 0 {
            return Err(Error::Buffer("allocation of 0 bytes: allocate at least 1 byte".into()));
        }
        let class = size_class(bytes).ok_or_else(|| {
            let s = self.lock();
            self.out_of_memory(bytes, &s)
        })?;
        {
            let mut s = self.lock();
            if let Some(ptr) = s.pop_class(class) {
                s.in_use += class;
                s.hits += 1;
                return Ok(ptr);
            }
            s.misses += 1;
        }
        self.reserve(bytes, class)?;
        let first = match self.inner.alloc(class) {
            Ok(p) => return Ok(self.allocated(p)),
            Err(e) => e,
        };
        self.unreserve(class);
        if !matches!(first, Error::OutOfMemory { .. }) {
            return Err(first);
        }
        // The backend is out of memory: give it everything we hold and try once more.
        self.trim();
        self.reserve(bytes, class)?;
        match self.inner.alloc(class) {
            Ok(p) => Ok(self.allocated(p)),
            Err(e) => {
                self.unreserve(class);
                match e {
                    Error::OutOfMemory { .. } => {
                        let s = self.lock();
                        Err(self.out_of_memory(bytes, &s))
                    }
                    other => Err(other),
                }
            }
        }
    }

    /// Keeps the block for reuse (evicting older blocks if the budget was lowered meanwhile).
    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        let Some(class) = size_class(bytes) else {
            // Unreachable for blocks this allocator handed out; forward rather than leak.
            // SAFETY: forwarded from this function's contract.
            unsafe { self.inner.free(ptr, bytes) };
            return;
        };
        let mut evicted = Vec::new();
        {
            let mut s = self.lock();
            s.in_use = s.in_use.saturating_sub(class);
            s.push(class, ptr);
            s.evict_to_fit(0, &mut evicted);
        }
        if !evicted.is_empty() {
            self.release(evicted);
        }
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded; our blocks are the inner allocator's blocks.
        unsafe { self.inner.copyin(dst, src) }
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        // SAFETY: forwarded; our blocks are the inner allocator's blocks.
        unsafe { self.inner.copyout(dst, src) }
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        // SAFETY: forwarded; our blocks are the inner allocator's blocks.
        unsafe { self.inner.copy(dst, src) }
    }

    fn is_host(&self) -> bool {
        self.inner.is_host()
    }

    fn dlpack_device_type(&self) -> Option<i32> {
        self.inner.dlpack_device_type()
    }

    fn stats(&self) -> AllocatorStats {
        let s = self.lock();
        AllocatorStats {
            in_use: s.in_use,
            cached: s.cached,
            high_water: s.high_water,
            hits: s.hits,
            misses: s.misses,
            budget: s.budget,
        }
    }

    /// Returns every cached block to the backend.
    fn trim(&self) -> usize {
        let mut blocks = Vec::new();
        self.lock().drain(&mut blocks);
        self.release(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doubles::MockAllocator;
    use std::sync::atomic::Ordering;

    fn free(a: &LruAllocator, p: RawPtr, bytes: usize) {
        // SAFETY: test blocks are fake addresses that are never dereferenced; each is freed
        // once with its allocation size.
        unsafe { a.free(p, bytes) }
    }

    #[test]
    fn size_classes_bound_the_slack() {
        assert_eq!(size_class(1), Some(64));
        assert_eq!(size_class(64), Some(64));
        assert_eq!(size_class(65), Some(128));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(576));
        assert_eq!(size_class(1024), Some(1024));
        assert_eq!(size_class(1025), Some(1152));
        assert_eq!(size_class(usize::MAX), None);
        for b in (1..200_000).step_by(97) {
            let c = size_class(b).unwrap();
            assert!(c >= b && (c - b) * 8 <= b.max(512), "class {c} for {b}");
            assert_eq!(size_class(c), Some(c), "a class is its own class");
        }
    }

    #[test]
    fn byte_sizes_parse_with_suffixes_and_reject_garbage() {
        assert_eq!(parse_byte_size("1048576", "X").unwrap(), 1 << 20);
        assert_eq!(parse_byte_size("512K", "X").unwrap(), 512 << 10);
        assert_eq!(parse_byte_size(" 64m ", "X").unwrap(), 64 << 20);
        assert_eq!(parse_byte_size("2GiB", "X").unwrap(), 2 << 30);
        assert_eq!(parse_byte_size("3gb", "X").unwrap(), 3 << 30);
        for bad in ["", "G", "1.5G", "12Q", "-1", "iB", "99999999999999999999", "16777216T"] {
            let e = parse_byte_size(bad, "KILN_MEMORY_BUDGET").unwrap_err();
            assert!(e.to_string().contains("KILN_MEMORY_BUDGET"), "{bad}: {e}");
        }
        assert_eq!(budget_from(None).unwrap(), None);
        assert_eq!(budget_from(Some("")).unwrap(), None);
        assert_eq!(budget_from(Some("1M")).unwrap(), Some(1 << 20));
        assert!(matches!(budget_from(Some("0")), Err(Error::Config(_))));
        assert!(matches!(budget_from(Some("lots")), Err(Error::Config(_))));
    }

    #[test]
    fn freed_blocks_are_reused_by_class() {
        let raw = MockAllocator::new(usize::MAX);
        let a = LruAllocator::new(raw.clone(), None);
        let p = a.alloc(1000).unwrap();
        free(&a, p, 1000);
        // 1000 and 1020 share the class 1024: the block comes back without a backend call.
        let q = a.alloc(1020).unwrap();
        assert_eq!(p, q);
        assert_eq!(raw.allocs.load(Ordering::SeqCst), 1);
        let s = a.stats();
        assert_eq!((s.hits, s.misses, s.in_use, s.cached, s.high_water), (1, 1, 1024, 0, 1024));
        free(&a, q, 1020);
        assert_eq!(a.stats().cached, 1024);
        assert_eq!(a.trim(), 1024);
        assert_eq!(raw.live.load(Ordering::SeqCst), 0);
    }

    /// An allocation the backend refuses leaves the high-water mark where it was.
    #[test]
    fn a_refused_allocation_does_not_raise_the_high_water_mark() {
        let a = LruAllocator::new(MockAllocator::new(1 << 20), None);
        assert!(matches!(a.alloc(1 << 40), Err(Error::OutOfMemory { .. })));
        assert_eq!((a.stats().in_use, a.stats().high_water), (0, 0));
        let p = a.alloc(4096).unwrap();
        assert_eq!(a.stats().high_water, 4096);
        assert!(a.alloc(1 << 30).is_err());
        assert_eq!(a.stats().high_water, 4096);
        free(&a, p, 4096);
    }

    #[test]
    fn budget_evicts_least_recently_freed_first() {
        let raw = MockAllocator::new(usize::MAX);
        let a = LruAllocator::new(raw.clone(), Some(4096));
        let x = a.alloc(1024).unwrap();
        let y = a.alloc(2048).unwrap();
        free(&a, x, 1024); // older
        free(&a, y, 2048); // newer
        assert_eq!(a.stats().cached, 3072);
        // 1536 needs room: evicting the older 1024 block suffices (1536 + 2048 ≤ 4096).
        let z = a.alloc(1536).unwrap();
        let s = a.stats();
        assert_eq!((s.in_use, s.cached), (1536, 2048));
        assert!(!raw.blocks.lock().unwrap().contains_key(&(x.0 as usize)), "the LRU block went back");
        assert!(raw.blocks.lock().unwrap().contains_key(&(y.0 as usize)), "the newer block stayed");
        assert!(s.in_use + s.cached <= 4096);
        free(&a, z, 1536);
        a.set_budget(Some(2048));
        let s = a.stats();
        assert!(s.in_use + s.cached <= 2048, "{s:?}");
        assert_eq!(a.budget(), Some(2048));
    }

    #[test]
    fn out_of_memory_ladder_trims_the_cache_then_reports() {
        // The backend holds 8 KiB; the budget is larger, so the backend fails first.
        let raw = MockAllocator::new(8192);
        let a = LruAllocator::new(raw.clone(), Some(1 << 20));
        let live = a.alloc(4096).unwrap();
        let c1 = a.alloc(2048).unwrap();
        let c2 = a.alloc(2048).unwrap();
        free(&a, c1, 2048);
        free(&a, c2, 2048);
        assert_eq!(a.stats().cached, 4096);
        // 3 KiB does not fit next to 4 KiB live + 4 KiB cached: the cache is released and the
        // retry succeeds.
        let big = a.alloc(3072).unwrap();
        let s = a.stats();
        assert_eq!((s.in_use, s.cached), (4096 + 3072, 0));
        assert_eq!(raw.live.load(Ordering::SeqCst), 4096 + 3072);
        // Nothing left to release: a typed error with this allocator's numbers.
        match a.alloc(4096) {
            Err(Error::OutOfMemory { requested, in_use, cached, budget, .. }) => {
                assert_eq!((requested, in_use, cached, budget), (4096, 7168, 0, Some(1 << 20)));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        free(&a, big, 3072);
        free(&a, live, 4096);
        assert_eq!(a.stats().in_use, 0);
    }

    #[test]
    fn over_budget_request_releases_the_cache_and_fails_with_all_numbers() {
        let raw = MockAllocator::new(usize::MAX);
        let a = LruAllocator::new(raw.clone(), Some(8192));
        let live = a.alloc(4096).unwrap();
        let c = a.alloc(2048).unwrap();
        free(&a, c, 2048);
        assert_eq!(a.stats().cached, 2048);
        let e = a.alloc(6000).unwrap_err();
        match &e {
            Error::OutOfMemory { requested, in_use, cached, budget, device } => {
                assert_eq!((*requested, *in_use, *cached, *budget), (6000, 4096, 0, Some(8192)));
                assert_eq!(device, "CPU");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("6000") && msg.contains("4096") && msg.contains("8192"), "{msg}");
        assert_eq!(raw.live.load(Ordering::SeqCst), 4096, "the cache went back to the backend");
        free(&a, live, 4096);
    }

    #[test]
    fn zero_and_unrepresentable_sizes_are_typed_errors() {
        let a = LruAllocator::new(MockAllocator::new(usize::MAX), None);
        assert!(matches!(a.alloc(0), Err(Error::Buffer(_))));
        assert!(matches!(a.alloc(usize::MAX), Err(Error::OutOfMemory { .. })));
    }

    #[test]
    fn lru_bookkeeping_matches_a_reference_model() {
        // The lazy LRU queue against the obvious model: a list in free order.
        let mut s = State::default();
        let mut model: Vec<(usize, usize)> = Vec::new(); // (class, ptr), oldest first
        let mut most = 0;
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for i in 0..20_000usize {
            let class = 64 * (1 + (next() % 5) as usize);
            match next() % 8 {
                0..=3 => {
                    s.push(class, RawPtr(i as *mut std::ffi::c_void));
                    model.push((class, i));
                }
                4..=6 => {
                    let got = s.pop_class(class).map(|p| p.0 as usize);
                    let want = model.iter().rposition(|(c, _)| *c == class).map(|j| model.remove(j).1);
                    assert_eq!(got, want, "hit at step {i}");
                }
                _ => {
                    let got = s.pop_lru().map(|(p, c)| (c, p.0 as usize));
                    let want = (!model.is_empty()).then(|| model.remove(0));
                    assert_eq!(got, want, "eviction at step {i}");
                }
            }
            assert_eq!(s.cached, model.iter().map(|(c, _)| c).sum::<usize>());
            most = most.max(s.blocks);
            assert!(s.lru.len() <= 2 * most + 65, "stale entries are compacted");
        }
    }

    #[test]
    fn concurrent_alloc_free_keeps_counts_exact() {
        let raw = MockAllocator::new(usize::MAX);
        let a = Arc::new(LruAllocator::new(raw.clone(), Some(64 << 10)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let bytes = 64 + ((i * 37 + t * 101) % 4000);
                        let p = a.alloc(bytes).unwrap();
                        free(&a, p, bytes);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = a.stats();
        assert_eq!(s.in_use, 0);
        assert_eq!(s.hits + s.misses, 8000);
        assert!(s.high_water <= 64 << 10);
        assert_eq!(raw.live.load(Ordering::SeqCst), s.cached);
        drop(a);
        assert_eq!(raw.live.load(Ordering::SeqCst), 0, "dropping the allocator returns the cache");
    }
}
