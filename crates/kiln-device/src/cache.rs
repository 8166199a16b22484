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
//! the kernel's content hash, its requested name, the device family, the rendered source, the
//! compiler's `cache_key()` and `fingerprint()` (version or identity of the compiler binary,
//! flags, target): a renderer change that changes the source, or a toolchain change, changes
//! the name, so a stale binary is never found. The cache reads, counts, evicts and clears only files named exactly so (and
//! its own `.kiln-bin-*.tmp` files): anything else in the folder, such as a user's `.kiln`
//! kernel sources, is never touched. An entry stores the compiled `bytes` (or the
//! source, for JIT backends whose bytes are empty) and the entry-point names; on a hit the
//! [`ProgramSpec`] is rebuilt from the graph with [`ProgramSpec::from_sink`] (no rendering)
//! and the toolchain's loader loads the bytes.
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

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use kiln_ir::{ContentHash, DeviceSpec, UOp};
use sha2::{Digest, Sha256};

use crate::allocator::parse_byte_size;
use crate::error::{Error, Result};
use crate::kernel::{Kernel, Loader};
use crate::parts::CompilerPair;
use crate::program::{CompiledSpec, Compiler, ProgramSpec, Renderer};

/// The environment variable that turns the disk cache on (`1`, default) or off (`0`).
pub const CACHE_ENV: &str = "KILN_CACHE";
/// The environment variable that sets the disk cache's directory.
pub const CACHE_DIR_ENV: &str = "KILN_CACHE_DIR";
/// The environment variable that sets the disk cache's size limit (a byte size, `512M`).
pub const CACHE_LIMIT_ENV: &str = "KILN_CACHE_LIMIT";
/// The default size limit of the disk cache.
pub const DEFAULT_DISK_LIMIT: u64 = 512 << 20;

/// Entry file layout, all integers little-endian:
/// `MAGIC (8) | FORMAT_VERSION u32 | key (32) | payload length u64 | SHA-256 of payload (32) | payload`,
/// payload = `kind u8 (0 bytes, 1 source) | spec name (u32 len + UTF-8) | compiled name (same) | data`.
const MAGIC: [u8; 8] = *b"KILNKRNL";
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 32;
/// Entries are `<64 lowercase hex digits>.<ENTRY_EXT>`: a name no user file plausibly has.
const ENTRY_EXT: &str = "kiln-bin";
/// Temporary files (entries being written) are `<TEMP_PREFIX><random><TEMP_SUFFIX>`.
const TEMP_PREFIX: &str = ".kiln-bin-";
const TEMP_SUFFIX: &str = ".tmp";
/// No compiled kernel is this large; a bigger file is refused rather than read.
const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// Temporary files older than this are leftovers of crashed writers.
const STALE_TEMP: Duration = Duration::from_secs(3600);
/// Rescan the directory at least this often (in stores) to see other processes' writes.
const RESCAN_EVERY: u32 = 64;

/// A renderer, compiler and loader, with the identity of everything besides the kernel that
/// decides the compiled bytes. Build it once per device: the fingerprint is taken here.
pub struct Toolchain {
    /// Turns kernels into source for the backend; the source is part of the disk key.
    pub renderer: Arc<dyn Renderer>,
    /// Turns source into binaries; its `cache_key()` and `fingerprint()` are part of the
    /// disk key, taken once in [`Toolchain::new`].
    pub compiler: Arc<dyn Compiler>,
    /// Loads compiled bytes into a kernel of the device.
    pub loader: Loader,
    fingerprint: String,
    id: [u8; 32],
}

impl std::fmt::Debug for Toolchain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Toolchain({} [{}])", self.compiler.cache_key(), self.fingerprint)
    }
}

fn put_str(h: &mut Sha256, s: &str) {
    h.update((s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

impl Toolchain {
    /// Bundles the three stages and takes the compiler's fingerprint now, once: a toolchain
    /// changed after this (a new compiler binary) is seen only by a new `Toolchain`. The
    /// renderer is not part of the identity: its output is (see [`Toolchain::disk_key`]), and
    /// a device renders every kernel with one renderer.
    pub fn new(renderer: Arc<dyn Renderer>, compiler: Arc<dyn Compiler>, loader: Loader) -> Toolchain {
        Toolchain::identified(renderer, compiler, loader, None)
    }

    /// The toolchain of a device's compiler pair: as [`Toolchain::new`], with the pair's name
    /// in its identity, so that two pairs of one device (which may share a compiler and differ
    /// in their renderers) never share a memory-cache entry.
    pub fn of_pair(pair: &CompilerPair, loader: Loader) -> Toolchain {
        Toolchain::identified(pair.renderer.clone(), pair.compiler.clone(), loader, Some(&pair.name))
    }

    fn identified(
        renderer: Arc<dyn Renderer>,
        compiler: Arc<dyn Compiler>,
        loader: Loader,
        pair: Option<&str>,
    ) -> Toolchain {
        let fingerprint = compiler.fingerprint();
        let mut h = Sha256::new();
        put_str(&mut h, compiler.cache_key());
        put_str(&mut h, &fingerprint);
        if let Some(pair) = pair {
            put_str(&mut h, pair);
        }
        Toolchain { renderer, compiler, loader, fingerprint, id: h.finalize().into() }
    }

    /// The disk key of `sink` compiled under `name` for the device family `family`.
    /// The disk key also covers the rendered source, so a renderer change can never load a
    /// binary built from older output (no version constant to forget to bump).
    pub fn disk_key(&self, sink: &UOp, name: Option<&str>, family: &str, src: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"kiln-kernel-cache\0");
        h.update(FORMAT_VERSION.to_le_bytes());
        h.update(sink.content_hash().0);
        match name {
            Some(n) => {
                h.update([1]);
                put_str(&mut h, n);
            }
            None => h.update([0]),
        }
        put_str(&mut h, family);
        put_str(&mut h, self.compiler.cache_key());
        put_str(&mut h, &self.fingerprint);
        put_str(&mut h, src);
        h.finalize().into()
    }
}

/// Where (and whether) the disk cache lives, and its size limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// `None`: memory only.
    pub dir: Option<PathBuf>,
    /// Bytes of entries kept on disk before the least recently used are deleted.
    pub limit: u64,
}

impl CacheConfig {
    /// No disk cache: kernels are compiled once per process and kept in memory only.
    pub fn memory_only() -> CacheConfig {
        CacheConfig { dir: None, limit: DEFAULT_DISK_LIMIT }
    }

    /// A disk cache in `dir` with the default limit.
    pub fn at(dir: impl Into<PathBuf>) -> CacheConfig {
        CacheConfig { dir: Some(dir.into()), limit: DEFAULT_DISK_LIMIT }
    }

    /// Reads `KILN_CACHE`, `KILN_CACHE_DIR`, `XDG_CACHE_HOME`, `HOME` and `KILN_CACHE_LIMIT`
    /// (see the module docs). A malformed value is an `Error::Config` naming the variable.
    ///
    /// # Errors
    /// [`Error::Config`] when `KILN_CACHE` is not a boolean, or `KILN_CACHE_LIMIT` is not a
    /// byte size or is 0.
    pub fn from_env() -> Result<CacheConfig> {
        CacheConfig::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<CacheConfig> {
        let get = |k: &str| get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let enabled = match get(CACHE_ENV).map(|v| v.to_ascii_lowercase()).as_deref() {
            None | Some("1" | "true" | "on" | "yes") => true,
            Some("0" | "false" | "off" | "no") => false,
            Some(other) => {
                return Err(Error::Config(format!(
                    "{CACHE_ENV}=`{other}`: use 0 to turn the disk cache off, 1 for on"
                )));
            }
        };
        let limit = match get(CACHE_LIMIT_ENV) {
            None => DEFAULT_DISK_LIMIT,
            Some(v) => match parse_byte_size(&v, CACHE_LIMIT_ENV)? {
                0 => {
                    return Err(Error::Config(format!(
                        "{CACHE_LIMIT_ENV}=0 keeps nothing: use {CACHE_ENV}=0 to turn the disk cache off"
                    )));
                }
                n => n as u64,
            },
        };
        let dir = if !enabled {
            None
        } else if let Some(d) = get(CACHE_DIR_ENV) {
            Some(PathBuf::from(d))
        } else if let Some(x) = get("XDG_CACHE_HOME").filter(|x| Path::new(x).is_absolute()) {
            Some(Path::new(&x).join("kiln"))
        } else {
            get("HOME").map(|h| Path::new(&h).join(".cache").join("kiln"))
        };
        Ok(CacheConfig { dir, limit })
    }
}

/// Counters of one [`KernelCache`]. Hit and miss counts are this instance's; the disk figures
/// are read from the directory (all processes' entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests served by a loaded kernel, including requests that waited for another
    /// thread's compile of the same kernel.
    pub memory_hits: u64,
    /// Requests served by loading a verified disk entry (no compile).
    pub disk_hits: u64,
    /// Requests that rendered and compiled.
    pub misses: u64,
    /// Disk entries refused (corrupt, truncated, foreign, unloadable) and deleted or skipped.
    pub disk_rejected: u64,
    /// Loaded kernels held in memory now.
    pub memory_entries: usize,
    /// Entry files in the disk directory now (0 when the disk cache is off).
    pub disk_entries: usize,
    /// Total size of those entry files.
    pub disk_bytes: u64,
}

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
        // Too deep a kernel is refused before any backend compiler sees it.
        kiln_ir::check_chain_depth(sink)?;
        // Rendering is cheap next to compiling (~0.1 ms) and its output is part of the key.
        let spec = tc.renderer.render(sink, name)?;
        let disk = self.disk();
        let key = disk.map(|_| tc.disk_key(sink, name, device.base_type(), &spec.src));
        if let (Some(d), Some(key)) = (disk, &key) {
            match d.load(key) {
                Ok(Lookup::Hit(entry)) => match entry.instantiate(&spec, tc) {
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
                },
                Ok(Lookup::Rejected) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Lookup::Miss) => {}
                Err(e) => self.warn(&e),
            }
        }
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

/// What a disk entry holds.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    spec_name: String,
    compiled_name: String,
    /// `true`: `data` is source (JIT backend), else compiled bytes.
    is_source: bool,
    data: Vec<u8>,
}

impl Entry {
    fn from_compiled(c: &CompiledSpec) -> Option<Entry> {
        let (is_source, data) =
            if !c.bytes.is_empty() { (false, c.bytes.clone()) } else { (true, c.src.as_ref()?.as_bytes().to_vec()) };
        Some(Entry { spec_name: c.spec.name.clone(), compiled_name: c.name.clone(), is_source, data })
    }

    fn encode(&self, key: &[u8; 32]) -> Vec<u8> {
        let mut payload = Vec::with_capacity(9 + self.spec_name.len() + self.compiled_name.len() + self.data.len());
        payload.push(u8::from(self.is_source));
        for s in [&self.spec_name, &self.compiled_name] {
            payload.extend_from_slice(&(s.len() as u32).to_le_bytes());
            payload.extend_from_slice(s.as_bytes());
        }
        payload.extend_from_slice(&self.data);
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&Sha256::digest(&payload));
        out.extend_from_slice(&payload);
        out
    }

    /// Parses and verifies an entry file; the error says what did not check out.
    fn decode(file: &[u8], key: &[u8; 32]) -> std::result::Result<Entry, &'static str> {
        if file.len() < HEADER_LEN {
            return Err("truncated header");
        }
        let (header, payload) = file.split_at(HEADER_LEN);
        if header[..8] != MAGIC {
            return Err("bad magic");
        }
        if header[8..12] != FORMAT_VERSION.to_le_bytes() {
            return Err("other format version");
        }
        if header[12..44] != key[..] {
            return Err("key mismatch");
        }
        if header[44..52] != (payload.len() as u64).to_le_bytes() {
            return Err("payload length mismatch");
        }
        if header[52..84] != Sha256::digest(payload)[..] {
            return Err("checksum mismatch");
        }
        let (&kind, mut rest) = payload.split_first().ok_or("empty payload")?;
        let mut take_str = || -> std::result::Result<String, &'static str> {
            let (len, tail) = rest.split_first_chunk::<4>().ok_or("truncated name")?;
            let len = u32::from_le_bytes(*len) as usize;
            if tail.len() < len {
                return Err("truncated name");
            }
            let (s, tail) = tail.split_at(len);
            rest = tail;
            String::from_utf8(s.to_vec()).map_err(|_| "name is not UTF-8")
        };
        let spec_name = take_str()?;
        let compiled_name = take_str()?;
        let is_source = match kind {
            0 => false,
            1 => true,
            _ => return Err("unknown payload kind"),
        };
        if is_source && std::str::from_utf8(rest).is_err() {
            return Err("source is not UTF-8");
        }
        Ok(Entry { spec_name, compiled_name, is_source, data: rest.to_vec() })
    }

    /// Rebuilds the spec from the graph and loads the stored code with the toolchain's runtime.
    /// Loads the entry for `spec`, the freshly rendered kernel whose source is in the key.
    fn instantiate(self, spec: &ProgramSpec, tc: &Toolchain) -> Result<Kernel> {
        let (src, bytes) = if self.is_source {
            (String::from_utf8(self.data).map_err(|_| Error::Cache("stored source is not UTF-8".into()))?, Vec::new())
        } else {
            (spec.src.clone(), self.data)
        };
        let mut spec = spec.clone();
        spec.name = self.spec_name;
        spec.src = src.clone();
        let spec = Arc::new(spec);
        let compiled =
            CompiledSpec { name: self.compiled_name, src: self.is_source.then_some(src), bytes, spec: spec.clone() };
        tc.loader.load(spec, &compiled)
    }
}

enum Lookup {
    Hit(Entry),
    Miss,
    /// An entry was there and was refused (and deleted if possible).
    Rejected,
}

struct ScannedEntry {
    path: PathBuf,
    len: u64,
    mtime: SystemTime,
}

/// The verified on-disk directory.
struct DiskDir {
    dir: PathBuf,
    /// The effective uid of this process (learned from a file it created).
    uid: u32,
    limit: u64,
    /// Entry bytes on disk as of the last scan plus this process's writes since; `None`
    /// before the first scan.
    estimate: Mutex<(Option<u64>, u32)>,
}

fn cache_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Cache(format!("{what} {}: {e}", path.display()))
}

/// A new private (0600) temporary file in `dir` that no other process can have opened,
/// deleted on drop unless persisted.
fn temp_file(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new().prefix(TEMP_PREFIX).suffix(TEMP_SUFFIX).tempfile_in(dir)
}

/// Whether `name` is a cache entry's: exactly 64 lowercase hex digits and the entry extension.
fn is_entry_name(name: &str) -> bool {
    name.strip_suffix(ENTRY_EXT)
        .and_then(|n| n.strip_suffix('.'))
        .is_some_and(|stem| stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

impl DiskDir {
    /// Creates `dir` (0700) if needed and checks it is ours and private.
    fn open(dir: &Path, limit: u64) -> Result<DiskDir> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| cache_err("cannot create cache directory", dir, e))?;
        // A leftover probe (after a crash) is harmless: stale temporary files are swept.
        let uid = temp_file(dir)
            .and_then(|f| f.as_file().metadata())
            .map_err(|e| cache_err("cannot write to cache directory", dir, e))?
            .uid();
        let meta = fs::metadata(dir).map_err(|e| cache_err("cannot stat cache directory", dir, e))?;
        if meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(Error::Cache(format!(
                "refusing cache directory {}: it holds native code, so it must be owned by you and not writable by \
                 group or others (chmod 700 it, or set {CACHE_DIR_ENV} elsewhere)",
                dir.display()
            )));
        }
        Ok(DiskDir { dir: dir.to_path_buf(), uid, limit, estimate: Mutex::new((None, 0)) })
    }

    fn entry_path(&self, key: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.{ENTRY_EXT}", hex(key)))
    }

    fn remove(&self, key: &[u8; 32]) {
        // Failing to delete (another process did first, or we may not) only leaves a file
        // that the next lookup refuses again.
        let _ = fs::remove_file(self.entry_path(key));
    }

    /// Reads and verifies the entry of `key`.
    fn load(&self, key: &[u8; 32]) -> Result<Lookup> {
        let path = self.entry_path(key);
        let reject = || {
            let _ = fs::remove_file(&path);
            Ok(Lookup::Rejected)
        };
        // lstat first: never open a symlink, FIFO or device planted under an entry name.
        let link = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Lookup::Miss),
            Err(e) => return Err(cache_err("cannot stat", &path, e)),
        };
        if !link.file_type().is_file() {
            return reject();
        }
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Lookup::Miss),
            Err(e) => return Err(cache_err("cannot open", &path, e)),
        };
        // Check the file actually opened, not the name: it may have been replaced meanwhile.
        let meta = file.metadata().map_err(|e| cache_err("cannot stat", &path, e))?;
        if !meta.is_file()
            || meta.uid() != self.uid
            || meta.mode() & 0o022 != 0
            || meta.len() > MAX_ENTRY_BYTES
            || (meta.dev(), meta.ino()) != (link.dev(), link.ino())
        {
            return reject();
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).map_err(|e| cache_err("cannot read", &path, e))?;
        match Entry::decode(&bytes, key) {
            Ok(entry) => {
                // Refresh the LRU age; failing to is harmless.
                let _ = file.set_modified(SystemTime::now());
                Ok(Lookup::Hit(entry))
            }
            Err(_) => reject(),
        }
    }

    /// Writes the entry of `key` atomically, then enforces the size limit.
    fn store(&self, key: &[u8; 32], compiled: &CompiledSpec) -> Result<()> {
        let Some(entry) = Entry::from_compiled(compiled) else { return Ok(()) };
        let bytes = entry.encode(key);
        // On failure the temporary file is deleted when dropped.
        temp_file(&self.dir)
            .and_then(|mut f| f.write_all(&bytes).map(|()| f))
            .and_then(|f| f.persist(self.entry_path(key)).map_err(|e| e.error))
            .map_err(|e| cache_err("cannot write entry in", &self.dir, e))?;
        self.enforce_limit(bytes.len() as u64)
    }

    fn enforce_limit(&self, written: u64) -> Result<()> {
        let mut est = self.estimate.lock().unwrap_or_else(|p| p.into_inner());
        let (known, stores) = *est;
        if let Some(total) = known.map(|t| t + written)
            && total <= self.limit
            && stores < RESCAN_EVERY
        {
            *est = (Some(total), stores + 1);
            return Ok(());
        }
        let mut entries = self.scan()?;
        let mut total: u64 = entries.iter().map(|e| e.len).sum();
        if total > self.limit {
            entries.sort_by_key(|e| e.mtime);
            for e in entries {
                if total <= self.limit {
                    break;
                }
                // Vanished (another process evicted it) or not: either way it is gone.
                match fs::remove_file(&e.path) {
                    Ok(()) => total = total.saturating_sub(e.len),
                    Err(err) if err.kind() == ErrorKind::NotFound => total = total.saturating_sub(e.len),
                    Err(_) => {}
                }
            }
        }
        *est = (Some(total), 0);
        Ok(())
    }

    /// Lists the entries (and deletes temporary files that crashed writers left behind). Only
    /// names the cache gives its files are considered.
    fn scan(&self) -> Result<Vec<ScannedEntry>> {
        let rd = fs::read_dir(&self.dir).map_err(|e| cache_err("cannot list", &self.dir, e))?;
        let now = SystemTime::now();
        let mut out = Vec::new();
        for item in rd.flatten() {
            let path = item.path();
            let Ok(meta) = fs::symlink_metadata(&path) else { continue };
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = item.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX) {
                if meta.is_file() && now.duration_since(mtime).is_ok_and(|age| age > STALE_TEMP) {
                    let _ = fs::remove_file(&path);
                }
            } else if is_entry_name(&name) {
                out.push(ScannedEntry { path, len: meta.len(), mtime });
            }
        }
        Ok(out)
    }

    fn clear(&self) -> Result<()> {
        for e in self.scan()? {
            match fs::remove_file(&e.path) {
                Err(err) if err.kind() != ErrorKind::NotFound => {
                    return Err(cache_err("cannot delete", &e.path, err));
                }
                _ => {}
            }
        }
        *self.estimate.lock().unwrap_or_else(|p| p.into_inner()) = (None, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::PermissionsExt;

    fn disk_cache(dir: &TempDir) -> KernelCache {
        KernelCache::new(CacheConfig::at(&dir.0))
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(is_entry_name))
            .collect();
        v.sort();
        v
    }

    fn only_entry(dir: &Path) -> PathBuf {
        let e = entries(dir);
        assert_eq!(e.len(), 1, "expected exactly one entry in {}: {e:?}", dir.display());
        e[0].clone()
    }

    #[test]
    fn memory_then_disk_then_compile() {
        let dir = TempDir::new("layers");
        let r = rig(MockCompiler::new("fp1"));
        let sink = kernel(2.0);
        let a = disk_cache(&dir);
        let k1 = a.get_or_compile(&sink, Some("scale"), &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        let k2 = a.get_or_compile(&sink, Some("scale"), &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert!(Arc::ptr_eq(k1.program(), k2.program()), "the second request is a memory hit");
        assert_eq!(r.compiles(), 1);
        let s = a.stats();
        assert_eq!((s.memory_hits, s.disk_hits, s.misses, s.memory_entries, s.disk_entries), (1, 0, 1, 1, 1));
        assert!(s.disk_bytes > HEADER_LEN as u64);
        let mode = fs::metadata(&dir.0).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "the cache directory is private");
        assert_eq!(fs::metadata(only_entry(&dir.0)).unwrap().mode() & 0o777, 0o600);

        // A new process (a fresh cache) loads from disk: no render, no compile, same metadata.
        let b = disk_cache(&dir);
        let k3 = b.get_or_compile(&sink, Some("scale"), &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(r.compiles(), 1);
        assert_eq!(b.stats().disk_hits, 1);
        assert_eq!(k3.spec.name, "scale");
        assert_eq!((k3.spec.ins.clone(), k3.spec.outs.clone()), (vec![0], vec![1]));
        assert_eq!(k3.spec.launch_dims(&[]).unwrap(), k1.spec.launch_dims(&[]).unwrap());
        let loaded = r.loaded.lock().unwrap();
        assert_eq!(loaded.len(), 2);
        assert_eq!(loaded[0], loaded[1], "the disk hit loaded the compiled bytes");

        // Another name is another kernel.
        drop(loaded);
        b.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(r.compiles(), 2);
        b.clear().unwrap();
        assert_eq!(entries(&dir.0).len(), 0);
        assert_eq!(b.stats().memory_entries, 0);
    }

    #[test]
    fn jit_source_is_stored_when_bytes_are_empty() {
        let dir = TempDir::new("jit");
        let mut c = MockCompiler::new("fp");
        c.jit = true;
        let r = rig(c);
        let sink = kernel(3.0);
        let k1 = disk_cache(&dir).get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        let k2 = disk_cache(&dir).get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(r.compiles(), 1);
        assert_eq!(k2.spec.src, k1.spec.src, "the source comes back with the spec");
        assert_eq!(k2.spec.name, "kernel", "the renderer's default name is kept");
    }

    /// Damages the single entry with `damage`, then checks a fresh cache refuses it, deletes
    /// it, recompiles and writes a good entry again.
    fn damaged_entry_is_replaced(tag: &str, damage: impl Fn(&Path)) {
        let dir = TempDir::new(tag);
        let r = rig(MockCompiler::new("fp"));
        let sink = kernel(4.0);
        disk_cache(&dir).get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        let path = only_entry(&dir.0);
        let good = fs::read(&path).unwrap();
        damage(&path);
        let c = disk_cache(&dir);
        c.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(r.compiles(), 2, "{tag}: the damaged entry was not loaded");
        let s = c.stats();
        assert_eq!((s.disk_hits, s.disk_rejected), (0, 1), "{tag}");
        assert_eq!(fs::read(only_entry(&dir.0)).unwrap(), good, "{tag}: a fresh entry was written");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600, "{tag}");
        assert!(r.loaded.lock().unwrap().iter().all(|b| b.starts_with(b"BIN[")), "{tag}");
    }

    #[test]
    fn corrupt_entry_is_removed_and_recompiled() {
        damaged_entry_is_replaced("corrupt", |p| {
            let mut b = fs::read(p).unwrap();
            let last = b.len() - 1;
            b[last] ^= 0x55;
            fs::write(p, b).unwrap();
        });
    }

    #[test]
    fn truncated_entry_is_removed_and_recompiled() {
        damaged_entry_is_replaced("truncated", |p| {
            let len = fs::metadata(p).unwrap().len();
            OpenOptions::new().write(true).open(p).unwrap().set_len(len / 2).unwrap();
        });
        damaged_entry_is_replaced("header", |p| {
            OpenOptions::new().write(true).open(p).unwrap().set_len(HEADER_LEN as u64 - 1).unwrap();
        });
    }

    #[test]
    fn entry_of_another_key_or_format_is_refused() {
        damaged_entry_is_replaced("version", |p| {
            let mut b = fs::read(p).unwrap();
            b[8] = 99;
            fs::write(p, b).unwrap();
        });
        damaged_entry_is_replaced("key", |p| {
            let mut b = fs::read(p).unwrap();
            b[20] ^= 1;
            fs::write(p, b).unwrap();
        });
    }

    #[test]
    fn group_writable_entry_is_refused() {
        damaged_entry_is_replaced("perm", |p| {
            fs::set_permissions(p, fs::Permissions::from_mode(0o620)).unwrap();
        });
        damaged_entry_is_replaced("symlink", |p| {
            let target = p.with_extension("target");
            fs::rename(p, &target).unwrap();
            std::os::unix::fs::symlink(&target, p).unwrap();
        });
    }

    #[test]
    fn entry_of_another_user_is_refused() {
        // Only possible to set up as root; elsewhere the ownership check is covered by the
        // same code path as the permission check.
        let probe = TempDir::new("chown-probe");
        fs::create_dir(&probe.0).unwrap();
        if std::os::unix::fs::chown(&probe.0, Some(4242), None).is_err() {
            eprintln!("skipping: cannot chown (not root)");
            return;
        }
        damaged_entry_is_replaced("owner", |p| std::os::unix::fs::chown(p, Some(4242), Some(4242)).unwrap());
    }

    #[test]
    fn private_directory_is_required() {
        let dir = TempDir::new("shared-dir");
        fs::create_dir(&dir.0).unwrap();
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o777)).unwrap();
        let r = rig(MockCompiler::new("fp"));
        let c = disk_cache(&dir);
        // The compile still succeeds, without the disk cache.
        c.get_or_compile(&kernel(5.0), None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert!(c.disk_dir().is_none());
        assert_eq!(entries(&dir.0).len(), 0);
        assert!(matches!(DiskDir::open(&dir.0, 1 << 20), Err(Error::Cache(m)) if m.contains("chmod 700")));
    }

    #[test]
    fn unusable_directory_never_fails_the_compile() {
        let dir = TempDir::new("unusable");
        fs::write(&dir.0, b"a file where the directory should be").unwrap();
        let r = rig(MockCompiler::new("fp"));
        let c = KernelCache::new(CacheConfig::at(dir.0.join("sub")));
        let k = c.get_or_compile(&kernel(6.0), None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(k.spec.name, "kernel");
        assert!(c.disk_dir().is_none());
        let _ = fs::remove_file(&dir.0);
    }

    #[test]
    fn key_changes_with_every_part() {
        let sink = kernel(1.0);
        let a = rig(MockCompiler::new("cc 12.2 -O2 x86-64-v3")).toolchain;
        let b = rig(MockCompiler::new("cc 13.1 -O2 x86-64-v3")).toolchain;
        let k = |t: &Toolchain, s: &Arc<UOp>, n: Option<&str>, f: &str| t.disk_key(s, n, f, "src");
        let base = k(&a, &sink, Some("k"), "CPU");
        assert_eq!(base, k(&a, &sink, Some("k"), "CPU"), "stable");
        assert_ne!(base, k(&b, &sink, Some("k"), "CPU"), "fingerprint");
        assert_ne!(base, k(&a, &kernel(1.5), Some("k"), "CPU"), "kernel");
        assert_ne!(base, k(&a, &sink, Some("j"), "CPU"), "name");
        assert_ne!(base, k(&a, &sink, None, "CPU"), "default name");
        assert_ne!(base, k(&a, &sink, Some("k"), "CUDA"), "family");
        assert_ne!(base, a.disk_key(&sink, Some("k"), "CPU", "other src"), "rendered source");
        assert_ne!(a.id, b.id);

        // Behaviour: a toolchain change misses and compiles next to the old entry.
        let dir = TempDir::new("fingerprint");
        let (ra, rb) = (rig(MockCompiler::new("v1")), rig(MockCompiler::new("v2")));
        disk_cache(&dir).get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &ra.toolchain).unwrap();
        disk_cache(&dir).get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &rb.toolchain).unwrap();
        assert_eq!((ra.compiles(), rb.compiles()), (1, 1));
        assert_eq!(entries(&dir.0).len(), 2);
        assert!(rb.loaded.lock().unwrap()[0].starts_with(b"BIN[v2]"));
    }

    #[test]
    fn eviction_deletes_least_recently_used_entries() {
        let dir = TempDir::new("evict");
        let r = rig(MockCompiler::new("fp"));
        let kernels: Vec<_> = (0..4).map(|i| kernel(10.0 + i as f64)).collect();
        let c = disk_cache(&dir);
        for k in &kernels[..3] {
            c.get_or_compile(k, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        }
        let paths: Vec<PathBuf> = kernels
            .iter()
            .map(|k| {
                c.disk().unwrap().entry_path(&r.toolchain.disk_key(
                    k,
                    None,
                    "CPU",
                    &r.toolchain.renderer.render(k, None).unwrap().src,
                ))
            })
            .collect();
        let size = fs::metadata(&paths[0]).unwrap().len();
        // Age the entries: 0 oldest, then 1, then 2.
        let t0 = SystemTime::now() - Duration::from_secs(1000);
        for (i, p) in paths[..3].iter().enumerate() {
            File::options().write(true).open(p).unwrap().set_modified(t0 + Duration::from_secs(i as u64)).unwrap();
        }
        // A hit on 0 makes it the most recently used.
        let limited = KernelCache::new(CacheConfig { dir: Some(dir.0.clone()), limit: 3 * size + size / 2 });
        limited.get_or_compile(&kernels[0], None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(limited.stats().disk_hits, 1);
        // Writing a fourth entry exceeds the limit: 1, now the least recently used, goes.
        limited.get_or_compile(&kernels[3], None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        let present: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
        assert_eq!(present, vec![true, false, true, true]);
        let s = limited.stats();
        assert_eq!((s.disk_entries, s.disk_bytes), (3, 3 * size));
    }

    #[test]
    fn user_files_in_the_cache_folder_survive_clear_and_eviction() {
        let dir = TempDir::new("user-files");
        let r = rig(MockCompiler::new("fp"));
        let c = disk_cache(&dir);
        c.get_or_compile(&kernel(12.0), None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        let entry_len = fs::metadata(only_entry(&dir.0)).unwrap().len();
        // Old and large files that an overly broad pattern would count, evict or clear.
        let user: Vec<PathBuf> =
            ["add.kiln", "notes.kiln-bin", &format!("{}.kiln", "ab".repeat(32)), ".backup.tmp", ".kiln-bin-x.tmp.keep"]
                .iter()
                .map(|name| {
                    let p = dir.0.join(name);
                    fs::write(&p, vec![b'k'; 4096]).unwrap();
                    File::options().write(true).open(&p).unwrap().set_modified(SystemTime::UNIX_EPOCH).unwrap();
                    p
                })
                .collect();
        let s = c.stats();
        assert_eq!((s.disk_entries, s.disk_bytes), (1, entry_len), "only entries are counted");
        // Eviction down to one entry's size: the new entry pushes out the old one, nothing else.
        let limited = KernelCache::new(CacheConfig { dir: Some(dir.0.clone()), limit: entry_len });
        limited.get_or_compile(&kernel(13.0), None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(entries(&dir.0).len(), 1);
        limited.clear().unwrap();
        assert_eq!(entries(&dir.0).len(), 0);
        for p in &user {
            assert_eq!(fs::read(p).unwrap().len(), 4096, "{} survives", p.display());
        }
    }

    #[test]
    fn entry_names_are_exactly_64_hex_digits_and_the_extension() {
        let key = [0xab; 32];
        assert!(is_entry_name(&format!("{}.{ENTRY_EXT}", hex(&key))));
        for name in [
            "add.kiln".to_string(),
            format!("{}.kiln", hex(&key)),
            format!("{}.{ENTRY_EXT}", &hex(&key)[1..]),
            format!("{}.{ENTRY_EXT}", hex(&key).to_uppercase()),
            format!("{}0.{ENTRY_EXT}", hex(&key)),
            format!("{}{ENTRY_EXT}", hex(&key)),
            format!("{}.{ENTRY_EXT}.tmp", hex(&key)),
        ] {
            assert!(!is_entry_name(&name), "{name}");
        }
    }

    #[test]
    fn stale_temporary_files_are_swept() {
        let dir = TempDir::new("stale");
        let r = rig(MockCompiler::new("fp"));
        let c = disk_cache(&dir);
        c.get_or_compile(&kernel(7.0), None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        let stale = dir.0.join(".kiln-bin-deadbe.tmp");
        let fresh = dir.0.join(".kiln-bin-cafe12.tmp");
        fs::write(&stale, b"partial").unwrap();
        fs::write(&fresh, b"in progress").unwrap();
        File::options().write(true).open(&stale).unwrap().set_modified(SystemTime::now() - STALE_TEMP * 2).unwrap();
        c.stats();
        assert!(!stale.exists(), "a crashed writer's leftover is deleted");
        assert!(fresh.exists(), "a write that may be in progress is left alone");
    }

    #[test]
    fn single_flight_compiles_once_per_key() {
        let mut mc = MockCompiler::new("fp");
        mc.delay = Duration::from_millis(50);
        let r = Arc::new(rig(mc));
        let cache = Arc::new(KernelCache::new(CacheConfig::memory_only()));
        let sink = kernel(8.0);
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (r, cache, sink, barrier) = (r.clone(), cache.clone(), sink.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    cache.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap()
                })
            })
            .collect();
        let kernels: Vec<Kernel> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(r.compiles(), 1);
        assert!(kernels.iter().all(|k| Arc::ptr_eq(k.program(), kernels[0].program())));
        let s = cache.stats();
        assert_eq!((s.misses, s.memory_hits), (1, 7));
    }

    #[test]
    fn a_failed_compile_reaches_every_waiter_and_is_not_cached() {
        let mut mc = MockCompiler::new("fp");
        mc.delay = Duration::from_millis(50);
        mc.fail.store(true, Ordering::SeqCst);
        let r = Arc::new(rig(mc));
        let cache = Arc::new(KernelCache::new(CacheConfig::memory_only()));
        let sink = kernel(9.0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (r, cache, sink) = (r.clone(), cache.clone(), sink.clone());
                std::thread::spawn(move || cache.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain))
            })
            .collect();
        for t in threads {
            assert!(matches!(t.join().unwrap(), Err(Error::Compile { .. })));
        }
        let failed = r.compiles();
        assert!((1..=4).contains(&failed));
        r.compiler.fail.store(false, Ordering::SeqCst);
        cache.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!(r.compiles(), failed + 1, "the error was not cached");
        assert_eq!(cache.stats().memory_entries, 1);
    }

    #[test]
    fn device_compile_goes_through_its_cache() {
        use crate::device::Device;
        use crate::testing::MockAllocator;
        let dir = TempDir::new("device");
        let r = rig(MockCompiler::new("fp"));
        let open = |cache: KernelCache| {
            let pair = CompilerPair::new("mock", Arc::new(MockRenderer), r.compiler.clone());
            let loaded = r.loaded.clone();
            Device::new(DeviceSpec::new("CPU", 0), "mock".into(), move |_| {
                Ok(crate::parts::DeviceParts::new(
                    MockAllocator::new(1 << 20),
                    vec![pair.clone()],
                    runtime(loaded.clone()),
                ))
            })
            .unwrap()
            .with_cache(Arc::new(cache))
        };
        let sink = kernel(11.0);
        let d1 = open(disk_cache(&dir));
        let k1 = d1.compile(&sink, Some("k")).unwrap();
        let k2 = d1.compile(&sink, Some("k")).unwrap();
        assert!(Arc::ptr_eq(k1.program(), k2.program()));
        // A second device (a new process, say) finds the compiled kernel on disk.
        let d2 = open(disk_cache(&dir));
        d2.compile(&sink, Some("k")).unwrap();
        assert_eq!(r.compiles(), 1);
        assert_eq!((d1.cache().stats().memory_hits, d2.cache().stats().disk_hits), (1, 1));
    }

    const CHILD_ENV: &str = "KILN_CACHE_TEST_CHILD_DIR";

    #[test]
    fn several_processes_share_one_entry() {
        if let Ok(dir) = std::env::var(CHILD_ENV) {
            // Child mode: compile into the shared directory (slowly, to overlap the writers).
            let mut mc = MockCompiler::new("fp");
            mc.delay = Duration::from_millis(100);
            let r = rig(mc);
            let c = KernelCache::new(CacheConfig::at(&dir));
            let k = c.get_or_compile(&kernel(42.0), Some("shared"), &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
            assert_eq!(k.spec.name, "shared");
            assert!(c.disk_dir().is_some());
            return;
        }
        let dir = TempDir::new("processes");
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..4)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args(["--exact", "cache::tests::several_processes_share_one_entry", "--test-threads=1"])
                    .env(CHILD_ENV, &dir.0)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
            assert!(stdout.contains("1 passed"), "the child ran the test: {stdout}");
        }
        only_entry(&dir.0);
        let leftovers: Vec<_> = fs::read_dir(&dir.0).unwrap().filter_map(|e| e.ok()).collect();
        assert_eq!(leftovers.len(), 1, "no temporary files remain: {leftovers:?}");
        // The entry is valid: a fresh cache loads it without compiling.
        let r = rig(MockCompiler::new("fp"));
        let c = disk_cache(&dir);
        c.get_or_compile(&kernel(42.0), Some("shared"), &DeviceSpec::new("CPU", 0), &r.toolchain).unwrap();
        assert_eq!((r.compiles(), c.stats().disk_hits), (0, 1));
    }

    #[test]
    fn config_from_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            CacheConfig::from_lookup(move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        assert_eq!(env(&[("HOME", "/h")]).unwrap(), CacheConfig::at("/h/.cache/kiln"));
        assert_eq!(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]).unwrap().dir, Some("/x/kiln".into()));
        assert_eq!(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "rel")]).unwrap().dir, Some("/h/.cache/kiln".into()));
        assert_eq!(env(&[("HOME", "/h"), ("KILN_CACHE_DIR", "/k")]).unwrap().dir, Some("/k".into()));
        assert_eq!(env(&[("HOME", "/h"), ("KILN_CACHE", "0")]).unwrap().dir, None);
        assert_eq!(env(&[]).unwrap().dir, None);
        assert_eq!(env(&[("KILN_CACHE_LIMIT", "64M")]).unwrap().limit, 64 << 20);
        assert!(matches!(env(&[("KILN_CACHE", "maybe")]), Err(Error::Config(m)) if m.contains("KILN_CACHE")));
        assert!(matches!(env(&[("KILN_CACHE_LIMIT", "lots")]), Err(Error::Config(m)) if m.contains("LIMIT")));
        assert!(matches!(env(&[("KILN_CACHE_LIMIT", "0")]), Err(Error::Config(_))));
    }

    #[test]
    fn entry_codec_round_trips_and_rejects_garbage() {
        let key = [7u8; 32];
        let e = Entry { spec_name: "k".into(), compiled_name: "k_sym".into(), is_source: false, data: vec![1, 2, 3] };
        let bytes = e.encode(&key);
        assert_eq!(Entry::decode(&bytes, &key).unwrap(), e);
        assert_eq!(Entry::decode(&bytes, &[8u8; 32]), Err("key mismatch"));
        assert_eq!(Entry::decode(&bytes[..bytes.len() - 1], &key), Err("payload length mismatch"));
        assert_eq!(Entry::decode(b"KILN", &key), Err("truncated header"));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(Entry::decode(&bad, &key), Err("bad magic"));
    }
}
