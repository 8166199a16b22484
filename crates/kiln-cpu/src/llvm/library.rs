//! Finding libLLVM and its version without opening it.
//!
//! Opening libLLVM maps about 120 MB and runs its static constructors: 40 ms and 47 MiB of
//! resident memory on this project's machine, which every process that opens the CPU device paid
//! before its first compile, also when every kernel it ran came from the kernel cache (issue 43).
//! So the CPU device decides whether it offers its LLVM pair, and the pair keys its kernels, from
//! this probe alone; the library is opened by the pair's first compile ([`super::api::Llvm::get`]).
//!
//! The probe does what the dynamic loader would do to find the library, and reads the ELF
//! headers of the file it finds (a few small reads):
//! - a name with a `/` is that file; a bare name is looked up as `dlopen` looks it up: in
//!   `LD_LIBRARY_PATH`, then the loader's cache (`/etc/ld.so.cache`), then the system's library
//!   folders;
//! - a file of another class or machine (a 32-bit library) is passed over, as the loader does;
//! - the major version comes from the library's `DT_SONAME` (`libLLVM-16.so.1`, `libLLVM-16git.so`,
//!   `libLLVM.so.18.1`), else from the file's own name. LLVM's builds always set it.
//!
//! A library of another major version is refused here, naming the version. One whose version
//! neither name tells is opened to ask it (`LLVMGetVersion`, see [`super::available`]). When
//! the library is opened, its `LLVMGetVersion` is checked again, so a file whose name lies
//! fails its first compile with a typed error rather than compiling with the wrong LLVM.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kiln_device::{Error, Result};

/// The environment variable naming the `libLLVM` to open (a path or a file name) instead of
/// [`LIBRARY_NAMES`].
pub const LIBLLVM_ENV: &str = "KILN_LIBLLVM";

/// The names tried, in order, when [`LIBLLVM_ENV`] is unset: Debian's and LLVM's own.
pub const LIBRARY_NAMES: &[&str] =
    &["libLLVM-16.so.1", "libLLVM-16.so", "libLLVM.so.16", "/usr/lib/llvm-16/lib/libLLVM-16.so.1"];

/// The LLVM major version the pair's IR and C API calls are written for.
pub const REQUIRED_MAJOR: u32 = 16;

/// A libLLVM file found by the probe (see the module docs); nothing of it is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The name it was found under: [`LIBLLVM_ENV`]'s value or one of [`LIBRARY_NAMES`].
    pub name: String,
    /// The file itself (links resolved): what [`super::api::Llvm::get`] opens.
    pub path: PathBuf,
    /// Its `DT_SONAME`, when it has one.
    pub soname: Option<String>,
    /// LLVM's major version from the soname or the file name; `None` when neither says.
    pub major: Option<u32>,
    /// The path with the file's size, mtime, device and inode: with the version, what keys the
    /// pair's kernels in the cache, so an upgraded library never loads an older one's objects.
    pub identity: String,
}

impl Library {
    /// The library this process's LLVM pair uses: [`LIBLLVM_ENV`]'s, else the first of
    /// [`LIBRARY_NAMES`] found, probed once per process.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (the same every call) when no name leads to a library of this
    /// machine, or the one found is of another LLVM than [`REQUIRED_MAJOR`]; the message names
    /// what was tried and what was found, and how to install or name the right one.
    pub fn find() -> Result<&'static Library> {
        static FOUND: OnceLock<std::result::Result<Library, Error>> = OnceLock::new();
        FOUND
            .get_or_init(|| {
                let configured = std::env::var(LIBLLVM_ENV).ok().filter(|v| !v.trim().is_empty());
                let names: Vec<&str> = match &configured {
                    Some(v) => vec![v.trim()],
                    None => LIBRARY_NAMES.to_vec(),
                };
                Library::locate(&names, &LoaderPath::from_env())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The first of `names` found along `search` that is LLVM [`REQUIRED_MAJOR`] (or of a
    /// version its names do not tell), as [`Library::find`].
    pub fn locate(names: &[&str], search: &LoaderPath) -> Result<Library> {
        let mut why = Vec::new();
        for name in names {
            let candidates = search.candidates(name);
            if candidates.is_empty() {
                why.push(format!("{name}: not found ({})", search.describe(name)));
                continue;
            }
            let mut found = None;
            for file in candidates {
                match Library::read(name, &file) {
                    Ok(library) => {
                        found = Some(library);
                        break;
                    }
                    Err(e) => why.push(format!("{}: {e}", file.display())),
                }
            }
            let Some(library) = found else { continue };
            match library.major {
                Some(REQUIRED_MAJOR) | None => return Ok(library),
                Some(other) => why.push(format!(
                    "{} is LLVM {other} ({}), not LLVM {REQUIRED_MAJOR}",
                    library.path.display(),
                    match &library.soname {
                        Some(soname) => format!("its soname is {soname}"),
                        None => "by its file name".to_string(),
                    }
                )),
            }
        }
        Err(Error::Unavailable(format!(
            "no usable libLLVM {REQUIRED_MAJOR} was found ({}); install it (Debian: apt-get install libllvm{REQUIRED_MAJOR}) \
             or name it with {LIBLLVM_ENV}=/path/to/libLLVM-{REQUIRED_MAJOR}.so.1",
            why.join("; ")
        )))
    }

    /// Probes the file `file` (found for `name`): a shared library of this machine, its soname
    /// and version. An error says why the loader would pass it over (or could not load it).
    fn read(name: &str, file: &Path) -> std::result::Result<Library, String> {
        let path = std::fs::canonicalize(file).map_err(|e| e.to_string())?;
        let f = File::open(&path).map_err(|e| e.to_string())?;
        let meta = f.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("not a file".into());
        }
        let soname = soname(&f)?;
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let major = soname.as_deref().and_then(major_version).or_else(|| major_version(&file_name));
        let identity = crate::compiler::file_identity(&path, &meta);
        Ok(Library { name: name.to_string(), path, soname, major, identity })
    }
}

/// LLVM's major version in a library name: `libLLVM-16.so.1` and `libLLVM-16git.so` (LLVM ≤ 17),
/// `libLLVM.so.18.1` (LLVM ≥ 18); `None` for any other name.
pub fn major_version(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("libLLVM")?;
    let digits = rest.strip_prefix('-').or_else(|| rest.strip_prefix(".so."))?;
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// Where the dynamic loader looks for a bare library name, in its order.
#[derive(Debug, Clone, Default)]
pub struct LoaderPath {
    /// `LD_LIBRARY_PATH`'s folders.
    pub library_path: Vec<PathBuf>,
    /// The loader cache's entries (`/etc/ld.so.cache`): name and file, in the cache's order.
    pub cache: Vec<(String, PathBuf)>,
    /// The system folders the loader searches last.
    pub system: Vec<PathBuf>,
}

impl LoaderPath {
    /// This process's: `LD_LIBRARY_PATH`, `/etc/ld.so.cache` (none when it cannot be read) and
    /// the system folders of this architecture.
    pub fn from_env() -> LoaderPath {
        let library_path = std::env::var("LD_LIBRARY_PATH")
            .map(|v| v.split([':', ';']).filter(|d| !d.is_empty()).map(PathBuf::from).collect())
            .unwrap_or_default();
        let cache = std::fs::read("/etc/ld.so.cache").map(|bytes| parse_ld_cache(&bytes)).unwrap_or_default();
        let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
        let system = [
            format!("/lib/{multiarch}"),
            format!("/usr/lib/{multiarch}"),
            "/lib64".into(),
            "/usr/lib64".into(),
            "/lib".into(),
            "/usr/lib".into(),
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect();
        LoaderPath { library_path, cache, system }
    }

    /// The files `name` may be, in the loader's order: itself when it holds a `/`, else each
    /// existing `DIR/name` of `LD_LIBRARY_PATH`, the cache's files for `name`, then the system
    /// folders'.
    fn candidates(&self, name: &str) -> Vec<PathBuf> {
        if name.contains('/') {
            return if Path::new(name).exists() { vec![PathBuf::from(name)] } else { Vec::new() };
        }
        let in_dirs = |dirs: &[PathBuf]| dirs.iter().map(|d| d.join(name)).filter(|p| p.exists()).collect::<Vec<_>>();
        let mut found = in_dirs(&self.library_path);
        found.extend(self.cache.iter().filter(|(key, _)| key == name).map(|(_, file)| file.clone()));
        found.extend(in_dirs(&self.system));
        found
    }

    /// Where a name that is not found was looked for, for the error.
    fn describe(&self, name: &str) -> String {
        if name.contains('/') {
            return "no such file".into();
        }
        let dirs = |d: &[PathBuf]| d.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":");
        let mut places = Vec::new();
        if !self.library_path.is_empty() {
            places.push(format!("LD_LIBRARY_PATH {}", dirs(&self.library_path)));
        }
        places.push("the loader cache".into());
        if !self.system.is_empty() {
            places.push(dirs(&self.system));
        }
        format!("looked in {}", places.join(", "))
    }
}

/// The entries of a loader cache file in glibc's format (`glibc-ld.so.cache1.1`, alone or after
/// the old `ld.so-1.7.0` table): `(name, file)` pairs. Anything malformed ends the list there:
/// the cache only shortens the search, and what it misses the folders still find.
pub fn parse_ld_cache(bytes: &[u8]) -> Vec<(String, PathBuf)> {
    const OLD: &[u8] = b"ld.so-1.7.0";
    const NEW: &[u8] = b"glibc-ld.so.cache1.1";
    let u32_at = |at: usize| bytes.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let start = if bytes.starts_with(NEW) {
        0
    } else if bytes.starts_with(OLD) {
        // The old header (12 bytes of magic, a count) and its 12-byte entries, then the new
        // table aligned to 8 bytes.
        let Some(old) = u32_at(12) else { return Vec::new() };
        let end = 16 + old as usize * 12;
        let aligned = end.next_multiple_of(8);
        if bytes.get(aligned..).is_some_and(|b| b.starts_with(NEW)) { aligned } else { return Vec::new() }
    } else {
        return Vec::new();
    };
    // The header: magic and version (20 bytes), nlibs, len_strings, flags and padding,
    // extension offset, three unused words: 48 bytes; then 24-byte entries whose string
    // offsets count from the header's start.
    let Some(count) = u32_at(start + 20) else { return Vec::new() };
    let string = |offset: u32| -> Option<String> {
        let from = start.checked_add(offset as usize)?;
        let tail = bytes.get(from..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&tail[..end]).ok().map(str::to_string)
    };
    let mut entries = Vec::new();
    for i in 0..count as usize {
        let at = start + 48 + i * 24;
        let (Some(key), Some(value)) = (u32_at(at + 4), u32_at(at + 8)) else { break };
        let (Some(key), Some(value)) = (string(key), string(value)) else { break };
        entries.push((key, PathBuf::from(value)));
    }
    entries
}

/// ELF identification and machine of this process's libraries.
const ELF_CLASS_64: u8 = 2;
const ELF_DATA_LE: u8 = 1;
const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;
/// `EM_X86_64` and `EM_AARCH64`; 0 (matching no file) elsewhere.
const HOST_MACHINE: u16 = if cfg!(target_arch = "x86_64") {
    62
} else if cfg!(target_arch = "aarch64") {
    183
} else {
    0
};

/// The `DT_SONAME` of the shared library `f` (`None` when it has none), from its headers: the
/// program headers, the dynamic section and the one string. Errors say why the file is not a
/// library of this machine or cannot be read as one; nothing it holds makes this panic.
fn soname(f: &File) -> std::result::Result<Option<String>, String> {
    let read = |at: u64, len: usize| -> std::result::Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, at).map_err(|e| format!("cannot read its ELF headers ({e})"))?;
        Ok(buf)
    };
    let u16_of = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_of = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_of = |b: &[u8], at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let mut header = [0u8; 64];
    let mut got = 0;
    while got < header.len() {
        match f.read_at(&mut header[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("cannot read its ELF header ({e})")),
        }
    }
    if got < 4 || &header[..4] != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    if got < header.len() {
        return Err("a truncated ELF file".into());
    }
    if header[4] != ELF_CLASS_64 || header[5] != ELF_DATA_LE || u16_of(&header, 18) != HOST_MACHINE {
        return Err(format!("an ELF file of another machine than this {}", std::env::consts::ARCH));
    }
    if u16_of(&header, 16) != ET_DYN {
        return Err("an ELF file that is not a shared library".into());
    }
    let (phoff, phentsize, phnum) = (u64_of(&header, 32), u16_of(&header, 54) as usize, u16_of(&header, 56) as usize);
    if phentsize < 56 || phnum == 0 {
        return Err("a shared library without program headers".into());
    }
    let table = read(phoff, phentsize.checked_mul(phnum).ok_or("a malformed program header table")?)?;
    let (mut loads, mut dynamic) = (Vec::new(), None);
    for h in table.chunks_exact(phentsize) {
        let (kind, offset, vaddr, filesz) = (u32_of(h, 0), u64_of(h, 8), u64_of(h, 16), u64_of(h, 32));
        match kind {
            PT_LOAD => loads.push((offset, vaddr, filesz)),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    let Some((offset, size)) = dynamic else { return Ok(None) };
    // A dynamic section of more than a megabyte is no library's.
    let size = usize::try_from(size).ok().filter(|s| *s <= 1 << 20).ok_or("a malformed dynamic section")?;
    let entries = read(offset, size - size % 16)?;
    let (mut strtab, mut name) = (None, None);
    for e in entries.chunks_exact(16) {
        match u64_of(e, 0) {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(u64_of(e, 8)),
            DT_SONAME => name = Some(u64_of(e, 8)),
            _ => {}
        }
    }
    let (Some(strtab), Some(name)) = (strtab, name) else { return Ok(None) };
    // The string table is named by its address once loaded: the file offset is its load
    // segment's offset plus the distance into that segment.
    let at = strtab.checked_add(name).ok_or("a malformed soname")?;
    let file_at = loads
        .iter()
        .find(|(_, vaddr, filesz)| at >= *vaddr && at - vaddr < *filesz)
        .and_then(|(offset, vaddr, _)| offset.checked_add(at - vaddr))
        .ok_or("a soname outside the library's loaded segments")?;
    let mut text = Vec::new();
    let mut chunk = [0u8; 64];
    while text.len() < 4096 {
        let n = f.read_at(&mut chunk, file_at + text.len() as u64).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("a soname that runs past the end of the file".into());
        }
        match chunk[..n].iter().position(|&b| b == 0) {
            Some(end) => {
                text.extend_from_slice(&chunk[..end]);
                return Ok(Some(String::from_utf8_lossy(&text).into_owned()));
            }
            None => text.extend_from_slice(&chunk[..n]),
        }
    }
    Err("a soname longer than 4 KiB".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_llvm_library_names() {
        assert_eq!(major_version("libLLVM-16.so.1"), Some(16));
        assert_eq!(major_version("libLLVM-16.so"), Some(16));
        assert_eq!(major_version("libLLVM-16git.so"), Some(16));
        assert_eq!(major_version("libLLVM-14.so.1"), Some(14));
        assert_eq!(major_version("libLLVM.so.18.1"), Some(18));
        assert_eq!(major_version("libLLVM.so.16"), Some(16));
        for other in ["libLLVM.so", "libLLVM-.so", "libclang-16.so.1", "libfoo.so", "", "libLLVMSupport.a"] {
            assert_eq!(major_version(other), None, "{other}");
        }
    }

    /// A loader cache of glibc's format, alone and after the old table, gives its entries;
    /// truncated or corrupt, it gives what it can and never panics.
    #[test]
    fn the_loader_cache_is_parsed_and_corruption_is_harmless() {
        let strings = b"libLLVM-16.so.1\0/usr/lib/x/libLLVM-16.so.1\0libm.so.6\0/lib/libm.so.6\0";
        let entry = |key: u32, value: u32| {
            let mut e = vec![0u8; 24];
            e[0..4].copy_from_slice(&0x303i32.to_le_bytes());
            e[4..8].copy_from_slice(&key.to_le_bytes());
            e[8..12].copy_from_slice(&value.to_le_bytes());
            e
        };
        let mut new = b"glibc-ld.so.cache1.1".to_vec();
        new.extend_from_slice(&2u32.to_le_bytes());
        new.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        new.resize(48, 0);
        let base = 48 + 2 * 24;
        new.extend(entry(base, base + 16));
        new.extend(entry(base + 43, base + 53));
        new.extend_from_slice(strings);
        let want = vec![
            ("libLLVM-16.so.1".to_string(), PathBuf::from("/usr/lib/x/libLLVM-16.so.1")),
            ("libm.so.6".to_string(), PathBuf::from("/lib/libm.so.6")),
        ];
        assert_eq!(parse_ld_cache(&new), want);
        let mut old = b"ld.so-1.7.0\0".to_vec();
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&[0u8; 12]);
        old.resize(old.len().next_multiple_of(8), 0);
        old.extend_from_slice(&new);
        assert_eq!(parse_ld_cache(&old), want);
        for cut in 0..new.len() {
            let got = parse_ld_cache(&new[..cut]);
            assert!(got.len() <= 2 && got.iter().all(|e| want.contains(e)), "cut at {cut}: {got:?}");
        }
        let mut huge = new.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_ld_cache(&huge), want, "a count past the end stops at the end");
        assert!(parse_ld_cache(b"not a cache").is_empty());
    }

    /// A bare name is found in `LD_LIBRARY_PATH` before the cache and the system folders; a
    /// file of another version is refused naming it; a file that is not a library, and a name
    /// found nowhere, are reasons in the error.
    #[test]
    fn names_are_found_as_the_loader_finds_them_and_versions_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let this = std::env::current_exe().unwrap();
        let not_elf = dir.path().join("libLLVM-16.so.1");
        std::fs::write(&not_elf, b"#!/bin/sh\n").unwrap();
        let search = LoaderPath { library_path: vec![dir.path().into()], cache: vec![], system: vec![] };
        let e = Library::locate(&["libLLVM-16.so.1", "libnothing.so"], &search).unwrap_err().to_string();
        assert!(e.contains("not an ELF file") && e.contains("libnothing.so: not found"), "{e}");
        assert!(e.contains("KILN_LIBLLVM") && e.contains("apt-get install libllvm16"), "{e}");
        // A test executable is no shared library (it is ET_DYN when position-independent,
        // which every Rust test binary on Linux is), so it is probed as one without a soname:
        // its version comes from the file name.
        let named = dir.path().join("libLLVM-15.so.1");
        std::fs::copy(&this, &named).unwrap();
        let cache = LoaderPath { cache: vec![("libLLVM-15.so.1".into(), named.clone())], ..LoaderPath::default() };
        match Library::locate(&["libLLVM-15.so.1"], &cache) {
            Err(e) => assert!(e.to_string().contains("is LLVM 15") && e.to_string().contains("not LLVM 16"), "{e}"),
            Ok(l) => panic!("LLVM 15 accepted: {l:?}"),
        }
        let sixteen = dir.path().join("sub");
        std::fs::create_dir(&sixteen).unwrap();
        std::fs::copy(&this, sixteen.join("libLLVM-16.so.1")).unwrap();
        let search = LoaderPath { library_path: vec![dir.path().into(), sixteen.clone()], ..search };
        let found = Library::locate(&["libLLVM-16.so.1"], &search).unwrap();
        assert_eq!(found.path, std::fs::canonicalize(sixteen.join("libLLVM-16.so.1")).unwrap());
        assert_eq!((found.major, found.soname.as_deref(), found.name.as_str()), (Some(16), None, "libLLVM-16.so.1"));
        assert!(found.identity.contains("ino="), "{}", found.identity);
    }

    /// The libLLVM libraries of this machine, where installed, are probed without being opened:
    /// Debian's 16 is found with its soname, and its 14 and 15 are refused naming the version.
    #[test]
    fn installed_llvm_libraries_give_their_soname_and_version() {
        let search = LoaderPath::from_env();
        for major in [14, 15, 16] {
            let name = format!("libLLVM-{major}.so.1");
            if search.candidates(&name).is_empty() {
                continue;
            }
            match Library::locate(&[&name], &search) {
                Ok(found) => {
                    assert_eq!(major, 16, "{found:?}");
                    assert_eq!((found.soname.as_deref(), found.major), (Some(name.as_str()), Some(16)));
                }
                Err(e) => {
                    assert_ne!(major, 16, "{e}");
                    let e = e.to_string();
                    assert!(e.contains(&format!("is LLVM {major} (its soname is {name})")), "{e}");
                }
            }
        }
    }
}
