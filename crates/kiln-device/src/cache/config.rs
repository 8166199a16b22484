//! Where the disk cache lives and how big it may grow ([`CacheConfig`], from the
//! environment), and the counters a cache reports ([`CacheStats`]).

use std::path::{Path, PathBuf};

use crate::allocator::parse_byte_size;
use crate::error::{Error, Result};

/// The environment variable that turns the disk cache on (`1`, default) or off (`0`).
pub const CACHE_ENV: &str = "KILN_CACHE";
/// The environment variable that sets the disk cache's directory.
pub const CACHE_DIR_ENV: &str = "KILN_CACHE_DIR";
/// The environment variable that sets the disk cache's size limit (a byte size, `512M`).
pub const CACHE_LIMIT_ENV: &str = "KILN_CACHE_LIMIT";
/// The default size limit of the disk cache.
pub const DEFAULT_DISK_LIMIT: u64 = 512 << 20;

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

    pub(super) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<CacheConfig> {
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
