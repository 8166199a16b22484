//! [`KernelCache`]: loaded kernels in memory, compiled kernels on disk.
//!
//! Compiling a kernel costs tens of milliseconds; a process that starts again, or a model
//! that re-realizes its kernels, must not pay twice. Lookups go memory → disk → compile.
//!
//! **Memory.** Loaded [`Kernel`]s keyed by (kernel content hash, requested name, device,
//! toolchain). Concurrent requests for one key compile once: the first caller compiles, the
//! others wait for its result. A failure is handed to every waiter and is not cached, so the
//! next request tries again. The memory layer holds loaded programs, which belong to one
//! device: give each device its own `KernelCache` (the default) or share one only between
//! devices whose programs are interchangeable.
//!
//! **Disk.** One file per compiled kernel, `<64 hex digits>.kiln-bin`, named by a SHA-256 over
//! the kernel's content hash, its requested name, the device family, the compiler's
//! `cache_key()` and `fingerprint()` (version or identity of the compiler binary, flags,
//! target), and what decides the renderer's output: for a renderer that names its
//! [`Renderer::identity`](crate::program::Renderer::identity) (the CPU's pairs), that identity
//! and a hash of kiln's own rendering source taken at build time, so a lookup renders nothing;
//! for any other, the rendered source itself. Either way a renderer change or a toolchain change
//! changes the name, so a stale binary is never found. The cache reads, counts, evicts and clears only files named exactly so (and
//! its own `.kiln-bin-*.tmp` files): anything else in the folder, such as a user's `.kiln`
//! kernel sources, is never touched. An entry stores the compiled `bytes` (none for JIT
//! backends), the source and the entry-point names; on a hit the [`ProgramSpec`] is derived
//! from the graph without rendering (`Renderer::describe`, or the render the key needed) and
//! the toolchain's loader loads the bytes.
//!
//! The cache holds native code that this process will execute, so it trusts nothing it did
//! not verify: the directory must belong to the current user and not be writable by group or
//! others (it is created 0700); an entry that is not a regular file owned by the current user,
//! is writable by group or others, or whose header (magic, format version, full key, payload
//! length, SHA-256 of the payload) does not check out is removed (or skipped if it cannot be)
//! and the kernel recompiled. Entries are written to a temporary file in the same directory
//! and renamed into place, so readers in other processes see a whole entry or none, and
//! concurrent writers of one key both succeed (the last rename wins; both contents are
//! valid). Entries are not fsynced: a crash can leave a truncated entry, which the checksum
//! catches. A size limit is enforced by deleting the least recently used entries (the mtime
//! is refreshed on every hit); it is checked on this process's writes, so concurrent writers
//! may exceed it briefly.
//!
//! A disk-cache failure never fails a compile: the kernel is compiled without it and the
//! first such failure of each cache is reported once on stderr.
//!
//! Environment ([`CacheConfig::from_env`]): `KILN_CACHE=0` turns the disk cache off;
//! `KILN_CACHE_DIR` sets its directory (default `$XDG_CACHE_HOME/kiln`, else
//! `~/.cache/kiln`); `KILN_CACHE_LIMIT` its size (default 512M; K/M/G suffixes).

mod config;
mod disk;
#[cfg(test)]
mod tests;
mod toolchain;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use kiln_ir::{ContentHash, DeviceSpec, UOp};

pub use config::{CACHE_DIR_ENV, CACHE_ENV, CACHE_LIMIT_ENV, CacheConfig, CacheStats, DEFAULT_DISK_LIMIT};
use disk::{DiskDir, Lookup};
pub use toolchain::Toolchain;

/// The version of the disk entries' layout (`disk`), also hashed into every toolchain's
/// identity (`toolchain`): a new layout is a new key, never a misread entry.
const FORMAT_VERSION: u32 = 2;

use crate::error::{Error, Result};
use crate::kernel::Kernel;

#[derive(Clone, PartialEq, Eq, Hash)]
struct MemKey {
    hash: ContentHash,
    name: Option<String>,
    device: DeviceSpec,
    toolchain: [u8; 32],
}

/// One compile in progress: its waiters block on `done` until `result` is set.
#[derive(Default)]
struct Flight {
    result: Mutex<Option<Result<Kernel>>>,
    done: Condvar,
}

impl Flight {
    fn wait(&self) -> Result<Kernel> {
        let mut r = self.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(res) = r.as_ref() {
                return res.clone();
            }
            r = self.done.wait(r).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn set(&self, result: Result<Kernel>) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        self.done.notify_all();
    }
}

enum Slot {
    Ready(Kernel),
    Pending(Arc<Flight>),
}

/// Publishes the leader's result to its waiters, also when the leader unwinds.
struct Leader<'a> {
    cache: &'a KernelCache,
    key: Option<MemKey>,
    flight: Arc<Flight>,
}

impl Leader<'_> {
    fn finish(mut self, result: &Result<Kernel>) {
        if let Some(key) = self.key.take() {
            self.cache.publish(key, &self.flight, result.clone());
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let err = Error::Compile {
                message: "the thread compiling this kernel panicked; request it again".into(),
                log: String::new(),
                line: None,
            };
            self.cache.publish(key, &self.flight, Err(err));
        }
    }
}

/// Loaded kernels in memory over compiled kernels on disk (see the module docs).
pub struct KernelCache {
    config: CacheConfig,
    memory: Mutex<HashMap<MemKey, Slot>>,
    disk: OnceLock<Option<DiskDir>>,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
    warned: AtomicBool,
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KernelCache({:?})", self.config)
    }
}

impl KernelCache {
    /// A cache with `config`. Nothing touches the disk until the first lookup.
    pub fn new(config: CacheConfig) -> KernelCache {
        KernelCache {
            config,
            memory: Mutex::new(HashMap::new()),
            disk: OnceLock::new(),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// A cache configured from the environment ([`CacheConfig::from_env`]).
    ///
    /// # Errors
    /// The [`Error::Config`] errors of [`CacheConfig::from_env`]. A directory that cannot be
    /// opened is not an error: it is reported once and the cache runs in memory.
    pub fn from_env() -> Result<KernelCache> {
        Ok(KernelCache::new(CacheConfig::from_env()?))
    }

    /// The configuration the cache was made with (the directory may still have failed to open:
    /// see [`KernelCache::disk_dir`]).
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The disk directory in use, `None` when the disk cache is off or could not be opened.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk().map(|d| d.dir.as_path())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<MemKey, Slot>> {
        // Slots are replaced whole under the lock; a panic elsewhere cannot leave one torn.
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn disk(&self) -> Option<&DiskDir> {
        self.disk
            .get_or_init(|| {
                let dir = self.config.dir.as_ref()?;
                DiskDir::open(dir, self.config.limit).map_err(|e| self.warn(&e)).ok()
            })
            .as_ref()
    }

    fn warn(&self, e: &Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!("kiln: {e}; compiling without the disk cache where it fails");
        }
    }

    /// The loaded kernel for `sink` on `device`: from memory, else from disk, else rendered
    /// and compiled with `toolchain` (and stored in both). `name` is the requested entry point
    /// (the renderer's default when `None`). Disk-cache failures only cost the compile.
    /// Concurrent calls for one kernel compile once; the others block until it is done.
    ///
    /// # Errors
    /// The render, compile and load errors of `toolchain` ([`Error::Render`],
    /// [`Error::CompilerMissing`], [`Error::Compile`], [`Error::Load`], and the kernel's
    /// [`Error::Ir`]), handed to every concurrent caller of the same kernel and not cached.
    pub fn get_or_compile(
        &self,
        sink: &Arc<UOp>,
        name: Option<&str>,
        device: &DeviceSpec,
        toolchain: &Toolchain,
    ) -> Result<Kernel> {
        let key = MemKey {
            hash: sink.content_hash(),
            name: name.map(str::to_owned),
            device: device.clone(),
            toolchain: toolchain.id,
        };
        let flight = {
            let mut memory = self.lock();
            match memory.get(&key) {
                Some(Slot::Ready(k)) if k.check_current().is_ok() => {
                    self.memory_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(k.clone());
                }
                // Loaded under an older device generation: reload it (below) from its
                // compiled form, without compiling.
                Some(Slot::Ready(k)) => {
                    let stale = k.clone();
                    let f = Arc::new(Flight::default());
                    memory.insert(key.clone(), Slot::Pending(f.clone()));
                    drop(memory);
                    let leader = Leader { cache: self, key: Some(key), flight: f };
                    let result = match stale.compiled() {
                        Some(c) => toolchain.loader.load(stale.spec.clone(), c),
                        None => self.load_or_compile(sink, name, device, toolchain),
                    };
                    leader.finish(&result);
                    return result;
                }
                Some(Slot::Pending(f)) => {
                    let f = f.clone();
                    drop(memory);
                    self.memory_hits.fetch_add(1, Ordering::Relaxed);
                    return f.wait();
                }
                None => {
                    let f = Arc::new(Flight::default());
                    memory.insert(key.clone(), Slot::Pending(f.clone()));
                    f
                }
            }
        };
        let leader = Leader { cache: self, key: Some(key), flight };
        let result = self.load_or_compile(sink, name, device, toolchain);
        leader.finish(&result);
        result
    }

    fn publish(&self, key: MemKey, flight: &Arc<Flight>, result: Result<Kernel>) {
        {
            let mut memory = self.lock();
            let ours = matches!(memory.get(&key), Some(Slot::Pending(f)) if Arc::ptr_eq(f, flight));
            match &result {
                Ok(k) => {
                    memory.insert(key, Slot::Ready(k.clone()));
                }
                Err(_) if ours => {
                    memory.remove(&key);
                }
                Err(_) => {}
            }
        }
        flight.set(result);
    }

    fn load_or_compile(
        &self,
        sink: &Arc<UOp>,
        name: Option<&str>,
        device: &DeviceSpec,
        tc: &Toolchain,
    ) -> Result<Kernel> {
        let disk = self.disk();
        let family = device.base_type();
        // A renderer that names its identity keys the disk by it, so a hit renders nothing;
        // any other is keyed by its output (rendering is cheap next to compiling).
        let mut rendered = None;
        let key = match (disk, tc.renderer.identity()) {
            (None, _) => None,
            (Some(_), Some(identity)) => Some(tc.kernel_key(sink, name, family, &identity)),
            (Some(_), None) => {
                let spec = tc.renderer.render(sink, name)?;
                let key = tc.disk_key(sink, name, family, &spec.src);
                rendered = Some(spec);
                Some(key)
            }
        };
        if let (Some(d), Some(key)) = (disk, &key) {
            match d.load(key) {
                Ok(Lookup::Hit(entry)) => {
                    let spec = match &rendered {
                        Some(spec) => spec.clone(),
                        None => tc.renderer.describe(sink, name)?,
                    };
                    match entry.instantiate(spec, tc) {
                        Ok(k) => {
                            self.disk_hits.fetch_add(1, Ordering::Relaxed);
                            return Ok(k);
                        }
                        Err(_) => {
                            // Checked bytes that do not load (e.g. a library this machine lacks):
                            // replace them with a fresh compile.
                            self.rejected.fetch_add(1, Ordering::Relaxed);
                            d.remove(key);
                        }
                    }
                }
                Ok(Lookup::Rejected) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Lookup::Miss) => {}
                Err(e) => self.warn(&e),
            }
        }
        // Too deep a kernel is refused before any backend compiler sees it (a disk hit was
        // compiled, so it passed this check then).
        kiln_ir::check_chain_depth(sink)?;
        let spec = match rendered {
            Some(spec) => spec,
            None => tc.renderer.render(sink, name)?,
        };
        self.misses.fetch_add(1, Ordering::Relaxed);
        let compiled = tc.compiler.compile(&spec)?;
        let kernel = tc.loader.load(compiled.spec.clone(), &compiled)?;
        if let (Some(d), Some(key)) = (disk, &key)
            && let Err(e) = d.store(key, &compiled)
        {
            self.warn(&e);
        }
        Ok(kernel)
    }

    /// Drops the loaded kernels (the disk entries stay). Compiles in flight finish normally.
    pub fn clear_memory(&self) {
        self.lock().retain(|_, s| matches!(s, Slot::Pending(_)));
    }

    /// Drops the loaded kernels and deletes every disk entry (of all processes).
    ///
    /// # Errors
    /// [`Error::Cache`] when the directory cannot be read or an entry cannot be deleted; the
    /// memory layer is cleared regardless.
    pub fn clear(&self) -> Result<()> {
        self.clear_memory();
        match self.disk() {
            Some(d) => d.clear(),
            None => Ok(()),
        }
    }

    /// Hit/miss counters and the current memory and disk sizes (the disk figures come from a
    /// directory scan).
    pub fn stats(&self) -> CacheStats {
        let memory_entries = self.lock().values().filter(|s| matches!(s, Slot::Ready(_))).count();
        let (disk_entries, disk_bytes) = self
            .disk()
            .and_then(|d| d.scan().ok())
            .map(|es| (es.len(), es.iter().map(|e| e.len).sum()))
            .unwrap_or((0, 0));
        CacheStats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            disk_rejected: self.rejected.load(Ordering::Relaxed),
            memory_entries,
            disk_entries,
            disk_bytes,
        }
    }
}
