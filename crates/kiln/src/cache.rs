//! `kiln cache stats|clear`: the on-disk kernel cache shared by every kiln process of this
//! user (configured by `KILN_CACHE`, `KILN_CACHE_DIR`, `KILN_CACHE_LIMIT`).

use std::fmt::Write;

use kiln_device::{CacheStats, KernelCache};

use crate::args::{ArgParser, Token, unknown};
use crate::devices::bytes;
use crate::error::{CliError, Context};

pub const USAGE: &str = "\
kiln cache stats   show where the kernel cache lives and how much it holds
kiln cache clear   delete every compiled kernel in it

The cache directory is $KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln);
KILN_CACHE=0 turns the disk cache off; KILN_CACHE_LIMIT caps its size (e.g. 256M).";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheAction {
    Stats,
    Clear,
}

#[derive(Debug)]
pub struct CacheArgs {
    pub action: CacheAction,
}

impl CacheArgs {
    pub fn parse(p: &mut ArgParser) -> Result<CacheArgs, CliError> {
        let mut action = None;
        while let Some(tok) = p.next_token()? {
            match tok {
                Token::Positional(s) if action.is_none() && s == "stats" => action = Some(CacheAction::Stats),
                Token::Positional(s) if action.is_none() && s == "clear" => action = Some(CacheAction::Clear),
                Token::Positional(s) if action.is_none() => {
                    return Err(CliError::Usage(format!("`kiln cache {s}`: expected `stats` or `clear`")));
                }
                tok => return Err(unknown("cache", tok)),
            }
        }
        let action = action.ok_or_else(|| CliError::Usage("`kiln cache` needs `stats` or `clear`".into()))?;
        Ok(CacheArgs { action })
    }
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
