//! The disk store: one verified file per compiled kernel in a private directory, written
//! whole by rename, evicted least recently used (see the [`super`] module docs).

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::toolchain::Toolchain;
use super::{CACHE_DIR_ENV, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::program::{CompiledSpec, ProgramSpec};

/// Entry file layout, all integers little-endian:
/// `MAGIC (8) | FORMAT_VERSION u32 | key (32) | payload length u64 | SHA-256 of payload (32) | payload`,
/// payload = `spec name | compiled name | source` (each a u32 length + UTF-8) `| bytes` (the
/// rest; empty for JIT backends, which load the source). The version is the cache's
/// ([`super::FORMAT_VERSION`]).
pub(super) const MAGIC: [u8; 8] = *b"KILNKRNL";
pub(super) const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 32;
/// Entries are `<64 lowercase hex digits>.<ENTRY_EXT>`: a name no user file plausibly has.
pub(super) const ENTRY_EXT: &str = "kiln-bin";
/// Temporary files (entries being written) are `<TEMP_PREFIX><random><TEMP_SUFFIX>`.
pub(super) const TEMP_PREFIX: &str = ".kiln-bin-";
pub(super) const TEMP_SUFFIX: &str = ".tmp";
/// No compiled kernel is this large; a bigger file is refused rather than read.
pub(super) const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// Temporary files older than this are leftovers of crashed writers.
pub(super) const STALE_TEMP: Duration = Duration::from_secs(3600);
/// Rescan the directory at least this often (in stores) to see other processes' writes.
pub(super) const RESCAN_EVERY: u32 = 64;

/// What a disk entry holds.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) spec_name: String,
    pub(super) compiled_name: String,
    /// The rendered source: a hit keyed by the renderer's identity has not rendered it.
    pub(super) src: String,
    /// The compiled bytes; empty for JIT backends.
    pub(super) bytes: Vec<u8>,
}

impl Entry {
    pub(super) fn from_compiled(c: &CompiledSpec) -> Entry {
        Entry {
            spec_name: c.spec.name.clone(),
            compiled_name: c.name.clone(),
            src: c.spec.src.clone(),
            bytes: c.bytes.clone(),
        }
    }

    pub(super) fn encode(&self, key: &[u8; 32]) -> Vec<u8> {
        let strings = [&self.spec_name, &self.compiled_name, &self.src];
        let mut payload = Vec::with_capacity(12 + strings.iter().map(|s| s.len()).sum::<usize>() + self.bytes.len());
        for s in strings {
            payload.extend_from_slice(&(s.len() as u32).to_le_bytes());
            payload.extend_from_slice(s.as_bytes());
        }
        payload.extend_from_slice(&self.bytes);
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
    pub(super) fn decode(file: &[u8], key: &[u8; 32]) -> std::result::Result<Entry, &'static str> {
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
        let mut rest = payload;
        let mut take_str = |what: &'static str| -> std::result::Result<String, &'static str> {
            let (len, tail) = rest.split_first_chunk::<4>().ok_or(what)?;
            let len = u32::from_le_bytes(*len) as usize;
            if tail.len() < len {
                return Err(what);
            }
            let (s, tail) = tail.split_at(len);
            rest = tail;
            String::from_utf8(s.to_vec()).map_err(|_| "a name or the source is not UTF-8")
        };
        let spec_name = take_str("truncated name")?;
        let compiled_name = take_str("truncated name")?;
        let src = take_str("truncated source")?;
        Ok(Entry { spec_name, compiled_name, src, bytes: rest.to_vec() })
    }

    /// Loads the stored code for `spec`, the kernel's metadata (rendered, or described without
    /// its source when the key is the renderer's identity), with the toolchain's loader.
    pub(super) fn instantiate(self, mut spec: ProgramSpec, tc: &Toolchain) -> Result<Kernel> {
        spec.name = self.spec_name;
        spec.src = self.src;
        let spec = Arc::new(spec);
        let compiled = CompiledSpec { name: self.compiled_name, bytes: self.bytes, spec: spec.clone() };
        tc.loader.load(spec, &compiled)
    }
}
pub(super) enum Lookup {
    Hit(Entry),
    Miss,
    /// An entry was there and was refused (and deleted if possible).
    Rejected,
}

pub(super) struct ScannedEntry {
    path: PathBuf,
    pub(super) len: u64,
    mtime: SystemTime,
}

/// The verified on-disk directory.
pub(super) struct DiskDir {
    pub(super) dir: PathBuf,
    /// The effective uid of this process (learned from a file it created).
    uid: u32,
    limit: u64,
    /// Entry bytes on disk as of the last scan plus this process's writes since; `None`
    /// before the first scan.
    estimate: Mutex<(Option<u64>, u32)>,
}

pub(super) fn cache_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Cache(format!("{what} {}: {e}", path.display()))
}

/// A new private (0600) temporary file in `dir` that no other process can have opened,
/// deleted on drop unless persisted.
pub(super) fn temp_file(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new().prefix(TEMP_PREFIX).suffix(TEMP_SUFFIX).tempfile_in(dir)
}

/// Whether `name` is a cache entry's: exactly 64 lowercase hex digits and the entry extension.
pub(super) fn is_entry_name(name: &str) -> bool {
    name.strip_suffix(ENTRY_EXT)
        .and_then(|n| n.strip_suffix('.'))
        .is_some_and(|stem| stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

pub(super) fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

impl DiskDir {
    /// Creates `dir` (0700) if needed and checks it is ours and private.
    pub(super) fn open(dir: &Path, limit: u64) -> Result<DiskDir> {
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

    pub(super) fn entry_path(&self, key: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.{ENTRY_EXT}", hex(key)))
    }

    pub(super) fn remove(&self, key: &[u8; 32]) {
        // Failing to delete (another process did first, or we may not) only leaves a file
        // that the next lookup refuses again.
        let _ = fs::remove_file(self.entry_path(key));
    }

    /// Reads and verifies the entry of `key`.
    pub(super) fn load(&self, key: &[u8; 32]) -> Result<Lookup> {
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
    pub(super) fn store(&self, key: &[u8; 32], compiled: &CompiledSpec) -> Result<()> {
        let entry = Entry::from_compiled(compiled);
        let bytes = entry.encode(key);
        // On failure the temporary file is deleted when dropped.
        temp_file(&self.dir)
            .and_then(|mut f| f.write_all(&bytes).map(|()| f))
            .and_then(|f| f.persist(self.entry_path(key)).map_err(|e| e.error))
            .map_err(|e| cache_err("cannot write entry in", &self.dir, e))?;
        self.enforce_limit(bytes.len() as u64)
    }

    pub(super) fn enforce_limit(&self, written: u64) -> Result<()> {
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
    pub(super) fn scan(&self) -> Result<Vec<ScannedEntry>> {
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

    pub(super) fn clear(&self) -> Result<()> {
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
