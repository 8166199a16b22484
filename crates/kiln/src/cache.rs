//! `kiln cache stats|clear`: the on-disk kernel cache shared by every kiln process of this
//! user (configured by `KILN_CACHE`, `KILN_CACHE_DIR`, `KILN_CACHE_LIMIT`).

use std::fmt::Write;

use kiln_device::{CacheStats, KernelCache};

use crate::error::{CliError, Context};
use crate::show::bytes;

/// `kiln cache stats|clear`.
#[derive(Debug, clap::Args)]
#[command(
    subcommand_required = true,
    arg_required_else_help = false,
    after_help = "The cache directory is $KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln); \
KILN_CACHE=0 turns the disk cache off; KILN_CACHE_LIMIT caps its size (e.g. 256M)."
)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Subcommand)]
pub enum CacheAction {
    /// Show where the kernel cache lives and how much it holds
    Stats,
    /// Delete every compiled kernel in it
    Clear,
}

fn open() -> Result<KernelCache, CliError> {
    KernelCache::from_env().context(|| "cannot configure the kernel cache".into())
}

pub fn run(args: &CacheArgs) -> Result<String, CliError> {
    let cache = open()?;
    match args.action {
        CacheAction::Stats => Ok(stats_text_of(&cache)),
        CacheAction::Clear => {
            let before = cache.stats();
            cache.clear().context(|| "cannot clear the kernel cache".into())?;
            Ok(match cache.disk_dir() {
                Some(dir) => format!(
                    "cleared {} kernel(s), {} from {}\n",
                    before.disk_entries,
                    bytes(before.disk_bytes as usize),
                    dir.display()
                ),
                None => "the disk cache is off (KILN_CACHE=0): nothing to clear\n".into(),
            })
        }
    }
}

/// The disk cache as configured from the environment, for `kiln cache stats` and
/// `kiln devices --verbose`.
pub fn stats_text() -> Result<String, CliError> {
    Ok(stats_text_of(&open()?))
}

fn stats_text_of(cache: &KernelCache) -> String {
    let s = cache.stats();
    let mut out = String::new();
    match (cache.disk_dir(), &cache.config().dir) {
        (Some(dir), _) => {
            let _ = writeln!(out, "kernel cache: {}", dir.display());
            let _ = writeln!(
                out,
                "  {} kernel(s), {} on disk (limit {})",
                s.disk_entries,
                bytes(s.disk_bytes as usize),
                bytes(cache.config().limit as usize)
            );
        }
        (None, Some(dir)) => {
            let _ = writeln!(out, "kernel cache: {} cannot be used (see the note above); memory only", dir.display());
        }
        (None, None) => {
            let _ = writeln!(out, "kernel cache: memory only (KILN_CACHE=0)");
        }
    }
    out
}

/// One line of a device's in-process cache counters (for `kiln devices --verbose`).
pub fn counters(s: &CacheStats) -> String {
    format!(
        "kernels loaded {}, memory hits {}, disk hits {}, misses {}, rejected disk entries {}",
        s.memory_entries, s.memory_hits, s.disk_hits, s.misses, s.disk_rejected
    )
}
