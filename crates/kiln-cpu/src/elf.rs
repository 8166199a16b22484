//! A loader for the kernels' relocatable objects (64-bit little-endian x86-64 ELF, `ET_REL`).
//!
//! On x86-64 the compiler stops before the link (`-c`, see [`crate::compiler`]): linking a
//! kernel into a shared library cost a cold compile 4-7 ms (the driver's `collect2`, `ld` and
//! its plugin) for nothing a kernel needs. This module does the little that is left: it lays the
//! object's allocated sections out in one private anonymous mapping, applies the relocations,
//! binds the undefined symbols (libm's `expf`, libgcc's `__extendhfsf2`, ...) to what the process
//! has loaded globally, and protects the mapping write-xor-execute.
//!
//! **Layout.** One mapping of three page-aligned parts: code (the `SHF_EXECINSTR` sections and
//! one 8-byte stub per external function, `jmp *slot(%rip)`), read-only (the other sections
//! without `SHF_WRITE`, and the GOT: one 8-byte slot per symbol a `GOTPCREL*` or stub reaches
//! through) and writable (`.data`, `.bss`). Everything is within ±2 GiB of everything else, so
//! every PC-relative reference inside the object fits; calls outside go through the stubs.
//! The mapping is written while it is read-write only, then made read-execute, read-only and
//! read-write part by part: never writable and executable at once. Dropping the [`Image`]
//! unmaps it.
//!
//! **Unwind tables are not loaded.** Kernels are compiled with `-fno-asynchronous-unwind-tables`
//! and any `.eh_frame` that is there anyway (another compiler) is skipped with its relocations:
//! a kernel is C called from Rust and is never unwound through (a panic does not cross it, and a
//! fault in it ends the process by signal).
//!
//! **Untrusted bytes.** The object comes from the on-disk kernel cache, so everything is checked:
//! the header, every section's bounds and alignment, string tables, symbol indices, the section
//! each relocation section patches, each relocation's type, offset and width, every 32-bit
//! result, that code has bytes (an executable `SHT_NOBITS` would map as zero pages) and that
//! each global function starts and ends inside its section. Whatever is wrong or
//! unsupported is an [`Error::Load`] that says what, never a panic.

use std::ffi::{CStr, CString, c_void};
use std::ptr::NonNull;

use kiln_device::{Error, Result};

const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_RELA: u32 = 4;
const SHT_NOTE: u32 = 7;
const SHT_NOBITS: u32 = 8;
const SHT_REL: u32 = 9;
const SHT_PROGBITS: u32 = 1;
const SHT_X86_64_UNWIND: u32 = 0x7000_0001;
const SHF_WRITE: u64 = 1;
const SHF_ALLOC: u64 = 2;
const SHF_EXECINSTR: u64 = 4;
const SHF_TLS: u64 = 0x400;
const SHN_UNDEF: u16 = 0;
const SHN_LORESERVE: u16 = 0xff00;
const SHN_ABS: u16 = 0xfff1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;

/// The relocation types applied, by number (`R_X86_64_*`).
const RELOCS: &[(u32, &str)] = &[
    (R_NONE, "NONE"),
    (R_64, "64"),
    (R_PC32, "PC32"),
    (R_PLT32, "PLT32"),
    (R_GOTPCREL, "GOTPCREL"),
    (R_32, "32"),
    (R_32S, "32S"),
    (R_PC64, "PC64"),
    (R_GOTPCRELX, "GOTPCRELX"),
    (R_REX_GOTPCRELX, "REX_GOTPCRELX"),
];
const R_NONE: u32 = 0;
const R_64: u32 = 1;
const R_PC32: u32 = 2;
const R_PLT32: u32 = 4;
const R_GOTPCREL: u32 = 9;
const R_32: u32 = 10;
const R_32S: u32 = 11;
const R_PC64: u32 = 24;
const R_GOTPCRELX: u32 = 41;
const R_REX_GOTPCRELX: u32 = 42;

/// The largest image loaded (sizes in a hostile header are checked against it before mapping).
const MAX_IMAGE: u64 = 1 << 30;
/// A PLT-like stub: `jmp *rel32(%rip)` and two `int3` of padding.
const STUB: usize = 8;
const CODE: i32 = libc::PROT_READ | libc::PROT_EXEC;

/// A loaded object: its mapping and the global functions it defines.
pub struct Image {
    base: NonNull<u8>,
    len: usize,
    /// Name and address of every global function defined in a code section.
    functions: Vec<(Vec<u8>, usize)>,
}

// SAFETY: `Image` owns its mapping, which no method writes after `load` returns (the pointer is
// only used to compute addresses and to unmap on drop), so it may move to and be shared with
// other threads.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Image({} bytes at {:p})", self.len, self.base)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is the mapping this image made and owns; nothing points
        // into it any more (the program holding a function pointer owns the image).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

impl Image {
    /// The address of the global function `name` the object defines. The code stays mapped as
    /// long as the image lives.
    pub fn function(&self, name: &str) -> Result<NonNull<c_void>> {
        self.functions
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .and_then(|&(_, addr)| NonNull::new(addr as *mut c_void))
            .ok_or_else(|| Error::Load(format!("the kernel object defines no global function `{name}`")))
    }

    /// Loads `bytes`, a relocatable object, binding its undefined symbols with `resolve`
    /// (a name → its address, `None` when nothing defines it).
    pub fn load(bytes: &[u8], resolve: impl Fn(&CStr) -> Option<usize>) -> Result<Image> {
        let obj = Object::parse(bytes)?;
        let page = page_size()?;
        let plan = Plan::new(&obj, page)?;
        // SAFETY: a fresh private anonymous mapping: it aliases nothing; failure is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                plan.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let base = NonNull::new(ptr.cast::<u8>())
            .filter(|_| ptr != libc::MAP_FAILED)
            .ok_or_else(|| Error::Load(format!("cannot map {} bytes for a kernel", plan.len)))?;
        let mut image = Image { base, len: plan.len, functions: Vec::new() };
        {
            // SAFETY: the mapping is `len` bytes, readable and writable, owned by `image` and
            // referenced nowhere else; the slice ends before the mapping is protected.
            let mem = unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), plan.len) };
            image.functions = plan.fill(&obj, mem, base.as_ptr() as u64, &resolve)?;
        }
        for (range, prot) in plan.parts {
            if range.is_empty() {
                continue;
            }
            // SAFETY: `range` is page-aligned and inside the mapping owned by `image`; no
            // reference into the mapping is alive.
            let rc = unsafe { libc::mprotect(base.as_ptr().add(range.start).cast(), range.len(), prot) };
            if rc != 0 {
                return Err(Error::Load(format!(
                    "cannot protect a kernel's pages: {}",
                    std::io::Error::last_os_error()
                )));
            }
        }
        Ok(image)
    }
}

fn page_size() -> Result<usize> {
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|p| p.is_power_of_two())
        .ok_or_else(|| Error::Load(format!("the system page size is unknown (sysconf gave {page})")))
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Load(format!("not a loadable kernel object: {what}"))
}

/// `N` bytes of `b` at `at`, or an error when they are not all there.
fn get<const N: usize>(b: &[u8], at: u64) -> Result<[u8; N]> {
    usize::try_from(at)
        .ok()
        .and_then(|at| b.get(at..at.checked_add(N)?))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| bad(format!("{N} bytes at offset {at} are past the end ({} bytes)", b.len())))
}
fn u16_at(b: &[u8], at: u64) -> Result<u16> {
    get(b, at).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], at: u64) -> Result<u32> {
    get(b, at).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], at: u64) -> Result<u64> {
    get(b, at).map(u64::from_le_bytes)
}

/// `len` bytes of `b` at `at` (`what` names them in the error).
fn span<'a>(b: &'a [u8], at: u64, len: u64, what: &dyn std::fmt::Display) -> Result<&'a [u8]> {
    at.checked_add(len)
        .and_then(|end| b.get(usize::try_from(at).ok()?..usize::try_from(end).ok()?))
        .ok_or_else(|| bad(format!("{what} (bytes {at}..{at}+{len}) lies outside the {}-byte object", b.len())))
}

/// The NUL-terminated string at `off` of string table `table`.
fn string(table: &[u8], off: u32) -> Result<&[u8]> {
    let rest = table.get(off as usize..).ok_or_else(|| bad(format!("string offset {off} is past its table")))?;
    let end = rest.iter().position(|&c| c == 0).ok_or_else(|| bad(format!("string at {off} is not terminated")))?;
    Ok(&rest[..end])
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

struct Section<'a> {
    name: &'a [u8],
    kind: u32,
    flags: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
    /// The file bytes (empty for `SHT_NOBITS`).
    data: &'a [u8],
}

struct Symbol<'a> {
    name: &'a [u8],
    info: u8,
    shndx: u16,
    value: u64,
    /// `st_size`: for a function, the bytes of its code from `value` on.
    size: u64,
}

struct Reloc {
    /// The section patched, its offset and the relocation type.
    target: usize,
    offset: u64,
    kind: u32,
    sym: usize,
    addend: i64,
}

/// A parsed and checked object.
struct Object<'a> {
    sections: Vec<Section<'a>>,
    /// Which sections are loaded, with their protection (`None`: skipped).
    loaded: Vec<Option<i32>>,
    symbols: Vec<Symbol<'a>>,
    relocs: Vec<Reloc>,
}

impl<'a> Object<'a> {
    fn parse(b: &'a [u8]) -> Result<Object<'a>> {
        if get::<4>(b, 0)? != *b"\x7fELF" {
            return Err(bad("no ELF magic"));
        }
        if get::<3>(b, 4)? != [2, 1, 1] {
            return Err(bad("not a 64-bit little-endian ELF version 1 file"));
        }
        match u16_at(b, 16)? {
            1 => {}
            3 => {
                return Err(bad(
                    "a shared library (ET_DYN), not a relocatable object: a cache entry from an older kiln? clear the kernel cache",
                ));
            }
            t => return Err(bad(format!("ELF type {t}, not a relocatable object (ET_REL = 1)"))),
        }
        match u16_at(b, 18)? {
            62 => {}
            m => return Err(bad(format!("machine {m}, not x86-64 (62)"))),
        }
        let (shoff, shentsize, shnum, shstrndx) = (u64_at(b, 40)?, u16_at(b, 58)?, u16_at(b, 60)?, u16_at(b, 62)?);
        if shentsize != 64 || shnum == 0 || shstrndx >= shnum {
            return Err(bad(format!(
                "section table entry size {shentsize} (not 64), {shnum} sections, names in section {shstrndx}"
            )));
        }
        let header = |i: u16| span(b, shoff.saturating_add(u64::from(i) * 64), 64, &format_args!("section header {i}"));
        let h = header(shstrndx)?;
        let names = span(b, u64_at(h, 24)?, u64_at(h, 32)?, &"the section names")?;
        let mut sections = Vec::with_capacity(shnum.into());
        for i in 0..shnum {
            let h = header(i)?;
            let (kind, offset, size, align) = (u32_at(h, 4)?, u64_at(h, 24)?, u64_at(h, 32)?, u64_at(h, 48)?);
            if align > 1 && !align.is_power_of_two() {
                return Err(bad(format!("section {i} has alignment {align}, not a power of two")));
            }
            sections.push(Section {
                name: string(names, u32_at(h, 0)?)?,
                kind,
                flags: u64_at(h, 8)?,
                size,
                link: u32_at(h, 40)?,
                info: u32_at(h, 44)?,
                align: align.max(1),
                entsize: u64_at(h, 56)?,
                data: if matches!(kind, 0 | SHT_NOBITS) {
                    &[]
                } else {
                    span(b, offset, size, &format_args!("section {i}"))?
                },
            });
        }
        let loaded = sections.iter().map(protection).collect::<Result<Vec<_>>>()?;

        let mut symtabs = sections.iter().enumerate().filter(|(_, s)| s.kind == SHT_SYMTAB);
        let (symtab_index, symtab) = match (symtabs.next(), symtabs.next()) {
            (Some(s), None) => s,
            _ => return Err(bad("not exactly one symbol table")),
        };
        let strtab = sections
            .get(symtab.link as usize)
            .filter(|s| s.kind == SHT_STRTAB)
            .ok_or_else(|| bad("the symbol table's string table is not a string table"))?;
        let symbols = table(symtab, "symbol table")?
            .map(|e| {
                Ok(Symbol {
                    name: string(strtab.data, u32_at(e, 0)?)?,
                    info: e[4],
                    shndx: u16_at(e, 6)?,
                    value: u64_at(e, 8)?,
                    size: u64_at(e, 16)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;

        let mut relocs = Vec::new();
        for s in &sections {
            if !matches!(s.kind, SHT_RELA | SHT_REL) {
                continue;
            }
            // A relocation section that patches no section would be skipped, and the code it
            // was meant for would run unrelocated: refuse it rather than guess.
            let target = s.info as usize;
            if target == 0 || target >= sections.len() {
                return Err(bad(format!(
                    "relocation section `{}` applies to section {target}, which does not exist (sections 1..{})",
                    show(s.name),
                    sections.len()
                )));
            }
            // Relocations of sections that are not loaded (`.eh_frame`, debug info) are skipped
            // with them.
            if loaded[target].is_none() {
                continue;
            }
            if s.kind == SHT_REL || s.link as usize != symtab_index {
                return Err(bad(format!("relocation section `{}` is not RELA against the symbol table", show(s.name))));
            }
            let into = &sections[target];
            for e in table(s, "relocation section")? {
                let (offset, info, addend) = (u64_at(e, 0)?, u64_at(e, 8)?, u64_at(e, 16)? as i64);
                let (sym, kind) = ((info >> 32) as usize, info as u32);
                let width = match kind {
                    R_NONE => 0,
                    R_64 | R_PC64 => 8,
                    _ if RELOCS.iter().any(|&(k, _)| k == kind) => 4,
                    _ => return Err(bad(format!("unsupported relocation type {kind} in `{}`", show(s.name)))),
                };
                if into.kind == SHT_NOBITS || offset.checked_add(width).is_none_or(|end| end > into.size) {
                    return Err(bad(format!("relocation at {offset:#x} is outside section `{}`", show(into.name))));
                }
                if sym >= symbols.len() {
                    return Err(bad(format!("relocation at {offset:#x} names symbol {sym} of {}", symbols.len())));
                }
                relocs.push(Reloc { target, offset, kind, sym, addend });
            }
        }
        Ok(Object { sections, loaded, symbols, relocs })
    }
}

/// The protection a section is loaded with, or `None` when it is not loaded.
fn protection(s: &Section) -> Result<Option<i32>> {
    if s.flags & SHF_ALLOC == 0 || s.kind == SHT_NOTE || s.kind == SHT_X86_64_UNWIND || s.name == b".eh_frame" {
        return Ok(None);
    }
    if s.flags & SHF_TLS != 0 || !matches!(s.kind, SHT_PROGBITS | SHT_NOBITS) {
        return Err(bad(format!(
            "section `{}` (type {:#x}, flags {:#x}) is not supported: kernels have no thread-locals or initialisers",
            show(s.name),
            s.kind,
            s.flags
        )));
    }
    if s.kind == SHT_NOBITS && s.flags & SHF_EXECINSTR != 0 {
        // It would be mapped as zero pages and jumped to.
        return Err(bad(format!(
            "section `{}` is executable but has no bytes in the file (SHT_NOBITS): there is no code to run",
            show(s.name)
        )));
    }
    Ok(Some(if s.flags & SHF_EXECINSTR != 0 {
        libc::PROT_READ | libc::PROT_EXEC
    } else if s.flags & SHF_WRITE != 0 {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    }))
}

/// The 24-byte entries of a symbol or relocation table.
fn table<'a>(s: &Section<'a>, what: &str) -> Result<impl Iterator<Item = &'a [u8]>> {
    if s.entsize != 24 || !s.data.len().is_multiple_of(24) {
        return Err(bad(format!("{what} `{}`: entry size {}, {} bytes", show(s.name), s.entsize, s.data.len())));
    }
    Ok(s.data.chunks_exact(24))
}

/// Where everything goes in the mapping.
struct Plan {
    len: usize,
    /// Offset of each loaded section.
    place: Vec<Option<u64>>,
    /// The symbols with a GOT slot, and those with a stub (external functions called), in
    /// slot order; and by symbol index, its slot and its stub.
    got: Vec<usize>,
    stubs: Vec<usize>,
    got_of: Vec<Option<usize>>,
    stub_of: Vec<Option<usize>>,
    got_at: u64,
    stubs_at: u64,
    /// The code, read-only and writable parts with their protection.
    parts: [(std::ops::Range<usize>, i32); 3],
}

impl Plan {
    fn new(obj: &Object, page: usize) -> Result<Plan> {
        let is_external = |sym: usize| sym != 0 && obj.symbols[sym].shndx == SHN_UNDEF;
        let (mut got, mut stubs) = (Vec::new(), Vec::new());
        let (mut got_of, mut stub_of) = (vec![None; obj.symbols.len()], vec![None; obj.symbols.len()]);
        for r in &obj.relocs {
            let stub = r.kind == R_PLT32 && is_external(r.sym);
            if stub && stub_of[r.sym].is_none() {
                stub_of[r.sym] = Some(stubs.len());
                stubs.push(r.sym);
            }
            let through_got = matches!(r.kind, R_GOTPCREL | R_GOTPCRELX | R_REX_GOTPCRELX) || stub;
            if through_got && got_of[r.sym].is_none() {
                got_of[r.sym] = Some(got.len());
                got.push(r.sym);
            }
        }
        let too_big = || bad(format!("its sections need more than {MAX_IMAGE} bytes"));
        let align = |at: u64, to: u64| at.checked_next_multiple_of(to).filter(|&a| a <= MAX_IMAGE).ok_or_else(too_big);
        let page = page as u64;
        let (mut at, mut place, mut parts) = (0, vec![None; obj.sections.len()], Vec::new());
        let (mut got_at, mut stubs_at) = (0, 0);
        for prot in [CODE, libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE] {
            let start = at;
            for (i, s) in obj.sections.iter().enumerate().filter(|(i, _)| obj.loaded[*i] == Some(prot)) {
                if s.align > page {
                    return Err(bad(format!("section `{}` asks for {}-byte alignment", show(s.name), s.align)));
                }
                let placed = align(at, s.align)?;
                place[i] = Some(placed);
                at = placed.checked_add(s.size).filter(|&end| end <= MAX_IMAGE).ok_or_else(too_big)?;
            }
            // The stubs end the code part, the GOT the read-only part.
            let tail = align(at, 8)?;
            let extra = match prot {
                CODE => (stubs.len() * STUB) as u64,
                libc::PROT_READ => (got.len() * 8) as u64,
                _ => 0,
            };
            match prot {
                CODE => stubs_at = tail,
                libc::PROT_READ => got_at = tail,
                _ => {}
            }
            at = align(tail + extra, page)?;
            parts.push((start as usize..at as usize, prot));
        }
        let parts: [_; 3] = parts.try_into().map_err(|_| bad("internal: three parts"))?;
        if at == 0 {
            return Err(bad("it has no code"));
        }
        Ok(Plan { len: at as usize, place, got, stubs, got_of, stub_of, got_at, stubs_at, parts })
    }

    /// Copies the sections into `mem` (the mapping, at address `base`), fills the GOT and the
    /// stubs and applies the relocations. Returns the global functions defined.
    fn fill(
        &self,
        obj: &Object,
        mem: &mut [u8],
        base: u64,
        resolve: &dyn Fn(&CStr) -> Option<usize>,
    ) -> Result<Vec<(Vec<u8>, usize)>> {
        for (s, place) in obj.sections.iter().zip(&self.place) {
            if let (Some(at), SHT_PROGBITS) = (place, s.kind) {
                span_mut(mem, *at, s.data.len())?.copy_from_slice(s.data);
            }
        }
        let address = |sym: usize| -> Result<u64> {
            let s = &obj.symbols[sym];
            match s.shndx {
                _ if sym == 0 => Ok(0),
                SHN_UNDEF => {
                    let name = CString::new(s.name).map_err(|_| bad("a symbol name holds a NUL"))?;
                    resolve(&name).map(|a| a as u64).ok_or_else(|| {
                        Error::Load(format!(
                            "the kernel needs `{}`, which no loaded library defines (libm and libgcc_s are searched)",
                            show(s.name)
                        ))
                    })
                }
                SHN_ABS => Ok(s.value),
                n if n >= SHN_LORESERVE => Err(bad(format!(
                    "symbol `{}` is in reserved section {n:#x} (e.g. common: use -fno-common)",
                    show(s.name)
                ))),
                n => match (self.place.get(usize::from(n)).copied().flatten(), obj.sections.get(usize::from(n))) {
                    (Some(at), Some(sec)) if s.value <= sec.size => Ok(base + at + s.value),
                    _ => Err(bad(format!("symbol `{}` lies outside any loaded section", show(s.name)))),
                },
            }
        };
        for (i, &sym) in self.got.iter().enumerate() {
            span_mut(mem, self.got_at + 8 * i as u64, 8)?.copy_from_slice(&address(sym)?.to_le_bytes());
        }
        let got_slot = |sym: usize| -> Result<u64> {
            let i = self.got_of.get(sym).copied().flatten();
            i.map(|i| base + self.got_at + 8 * i as u64).ok_or_else(|| bad("internal: a symbol without a GOT slot"))
        };
        for (i, &sym) in self.stubs.iter().enumerate() {
            let at = self.stubs_at + (STUB * i) as u64;
            let rel = fit32(got_slot(sym)? as i128 - (base + at + 6) as i128, true, "a stub's jump")?;
            let stub = span_mut(mem, at, STUB)?;
            stub[..2].copy_from_slice(&[0xff, 0x25]);
            stub[2..6].copy_from_slice(&rel.to_le_bytes());
            stub[6..].fill(0xcc);
        }
        for r in &obj.relocs {
            let at = self.place[r.target].unwrap_or(0) + r.offset;
            let (p, a) = ((base + at) as i128, r.addend as i128);
            let s = match r.kind {
                R_PLT32 if let Some(i) = self.stub_of[r.sym] => (base + self.stubs_at + (STUB * i) as u64) as i128,
                R_GOTPCREL | R_GOTPCRELX | R_REX_GOTPCRELX => got_slot(r.sym)? as i128,
                _ => address(r.sym)? as i128,
            };
            let name = RELOCS.iter().find(|&&(k, _)| k == r.kind).map_or("?", |&(_, n)| n);
            let what = format!(
                "R_X86_64_{name} at `{}`+{:#x} against `{}`",
                show(obj.sections[r.target].name),
                r.offset,
                show(obj.symbols[r.sym].name)
            );
            match r.kind {
                R_NONE => {}
                R_64 => span_mut(mem, at, 8)?.copy_from_slice(&((s + a) as u64).to_le_bytes()),
                R_PC64 => span_mut(mem, at, 8)?.copy_from_slice(&((s + a - p) as u64).to_le_bytes()),
                R_32 => span_mut(mem, at, 4)?.copy_from_slice(&fit32(s + a, false, &what)?.to_le_bytes()),
                R_32S => span_mut(mem, at, 4)?.copy_from_slice(&fit32(s + a, true, &what)?.to_le_bytes()),
                // PC32, PLT32 and the GOTPCREL family: `s` is the target, its stub or its slot.
                _ => span_mut(mem, at, 4)?.copy_from_slice(&fit32(s + a - p, true, &what)?.to_le_bytes()),
            }
        }
        let mut functions = Vec::new();
        for (i, s) in obj.symbols.iter().enumerate() {
            let code =
                obj.loaded.get(usize::from(s.shndx)).copied().flatten().is_some_and(|p| p & libc::PROT_EXEC != 0);
            if s.info >> 4 == STB_GLOBAL && s.info & 0xf == STT_FUNC && s.shndx != SHN_UNDEF && code {
                // An entry point is jumped to: its first byte and all of its code must lie in
                // its section (`address` allows `value == size`, the end label of a section).
                let sec = &obj.sections[usize::from(s.shndx)];
                let inside = s.value < sec.size && s.value.checked_add(s.size).is_some_and(|end| end <= sec.size);
                if !inside {
                    return Err(bad(format!(
                        "function `{}` (offset {:#x}, {:#x} bytes) does not lie inside its section `{}` ({:#x} bytes)",
                        show(s.name),
                        s.value,
                        s.size,
                        show(sec.name),
                        sec.size
                    )));
                }
                functions.push((s.name.to_vec(), address(i)? as usize));
            }
        }
        Ok(functions)
    }
}

/// `len` bytes of the mapping at `at` (inside by construction; checked all the same).
fn span_mut(mem: &mut [u8], at: u64, len: usize) -> Result<&mut [u8]> {
    let start = usize::try_from(at).map_err(|_| bad("internal: offset"))?;
    start
        .checked_add(len)
        .and_then(|end| mem.get_mut(start..end))
        .ok_or_else(|| bad("internal: a write past the image"))
}

/// `v` as the 32-bit field of a relocation (`signed`: as `i32`, else as `u32`), or an error
/// naming the relocation.
fn fit32(v: i128, signed: bool, what: &str) -> Result<u32> {
    let fits = if signed { i32::try_from(v).is_ok() } else { u32::try_from(v).is_ok() };
    if fits { Ok(v as u32) } else { Err(Error::Load(format!("{what}: the value {v:#x} does not fit in 32 bits"))) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CCompiler;
    use crate::program::global_symbol;

    /// A kernel-like object with every relocation kind gcc emits for kiln's kernels, and the
    /// rest through top-level assembly: vector constants in `.rodata.cst32` and a static table
    /// (PC32), libm calls (PLT32 through stubs), a static counter in `.bss` the code writes
    /// (PC32), a global read through the GOT (REX_GOTPCRELX), a pointer table in `.data.rel.ro`
    /// (64, from gcc), and a plain GOTPCREL, a PC64 and a 64 in hand-written code (the same with
    /// every compiler).
    const RICH: &str = r#"
typedef float f8 __attribute__((vector_size(32)));
float expf(float); float sinf(float); float powf(float, float);
void *memcpy(void *, const void *, __SIZE_TYPE__);
static const float table[7] = {1, 2, 3, 4, 5, 6, 7};
static int counter;
long kiln_g = 42;
static const char *strs[2] = {"ab", "cd"};
void k(void **bufs, const long *vals, long core, long n) {
  float *a = bufs[0];
  f8 v; memcpy(&v, a, 32);
  v = v * (f8){1, 2, 3, 4, 5, 6, 7, 8} + (f8){0.5f, 1, 1, 1, 1, 1, 1, 1};
  memcpy(a, &v, 32);
  a[8] = expf(a[8]) + sinf(a[9]) + powf(a[10], 2.5f) + table[vals[0] % 7];
  a[9] = ++counter;
  a[10] = strs[vals[0] & 1][1] + kiln_g;
}
long *kiln_g_address(void) { return &kiln_g; }
__asm__(".text\n.globl asm_relocs\n.type asm_relocs,@function\nasm_relocs:\n"
        " leaq 1f(%rip), %rcx\n movslq (%rcx), %rax\n addq %rcx, %rax\n movq (%rax), %rax\n movq %rax, (%rdi)\n"
        " leaq 2f(%rip), %rcx\n movq (%rcx), %rax\n addq %rcx, %rax\n movq %rax, 8(%rdi)\n"
        " movq 3f(%rip), %rax\n movq %rax, 16(%rdi)\n ret\n"
        "1: .long kiln_g@GOTPCREL\n2: .quad kiln_g - .\n3: .quad kiln_g\n.size asm_relocs, .-asm_relocs\n");
"#;

    fn compile(src: &str) -> Vec<u8> {
        CCompiler::detect().unwrap().compile_source("k", src).unwrap()
    }

    fn load(bytes: &[u8]) -> Result<Image> {
        Image::load(bytes, global_symbol)
    }

    /// The relocation types in `bytes`, by name.
    fn reloc_names(bytes: &[u8]) -> Vec<&'static str> {
        let obj = Object::parse(bytes).unwrap();
        let mut names: Vec<_> =
            obj.relocs.iter().map(|r| RELOCS.iter().find(|&&(k, _)| k == r.kind).unwrap().1).collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn every_relocation_kind_is_applied() {
        let bytes = compile(RICH);
        for kind in ["PC32", "PLT32", "64", "REX_GOTPCRELX", "GOTPCREL", "PC64"] {
            assert!(reloc_names(&bytes).contains(&kind), "{kind} is not in {:?}", reloc_names(&bytes));
        }
        let image = load(&bytes).unwrap();
        // SAFETY: the three functions have these signatures in `RICH`; `image` outlives the calls.
        let (k, address, asm) = unsafe {
            (
                std::mem::transmute::<*mut c_void, crate::program::KernelFn>(image.function("k").unwrap().as_ptr()),
                std::mem::transmute::<*mut c_void, extern "C" fn() -> *mut i64>(
                    image.function("kiln_g_address").unwrap().as_ptr(),
                ),
                std::mem::transmute::<*mut c_void, extern "C" fn(*mut [usize; 3])>(
                    image.function("asm_relocs").unwrap().as_ptr(),
                ),
            )
        };
        let mut a: Vec<f32> = (1..=11).map(|x| x as f32 / 4.0).collect();
        let expected: Vec<f32> = (0..8).map(|i| a[i] * (i + 1) as f32 + if i == 0 { 0.5 } else { 1.0 }).collect();
        let tail = a[8].exp() + a[9].sin() + a[10].powf(2.5) + 4.0;
        let mut bufs = [a.as_mut_ptr().cast::<c_void>()];
        for call in 1..=2 {
            let vals = [3i64];
            // SAFETY: `a` holds the 11 floats `k` reads and writes.
            unsafe { k(bufs.as_mut_ptr(), vals.as_ptr(), 0, 1) };
            if call == 1 {
                assert_eq!(&a[..8], &expected[..]);
                assert_eq!(a[8], tail);
            }
            assert_eq!(a[9], call as f32, "the static counter counts calls");
            assert_eq!(a[10], f32::from(b'd') + 42.0);
            bufs = [a.as_mut_ptr().cast()];
        }
        let g = address();
        // SAFETY: `g` points at `kiln_g`, a `long` in the image's writable part.
        unsafe { *g = 7 };
        let mut seen = [0usize; 3];
        asm(&mut seen);
        assert_eq!(seen, [g as usize; 3], "GOTPCREL, PC64 and 64 reach kiln_g");
        // SAFETY: as above.
        unsafe { k(bufs.as_mut_ptr(), [3i64].as_ptr(), 0, 1) };
        assert_eq!(a[10], f32::from(b'd') + 7.0, "the kernel reads the global through its GOT slot");
    }

    #[test]
    fn absolute_32_bit_relocations_that_do_not_fit_are_errors() {
        for (asm, kind) in [(".long kiln_g", "R_X86_64_32 "), ("movl kiln_g, %eax", "R_X86_64_32S")] {
            let src = format!("long kiln_g;\n__asm__(\".text\\n\\tnop\\n\\t{asm}\\n\");\nvoid k(void) {{}}\n");
            let bytes = compile(&src);
            match load(&bytes) {
                Err(Error::Load(m)) => assert!(m.contains(kind.trim()) && m.contains("does not fit in 32 bits"), "{m}"),
                other => panic!("expected an overflow error for `{asm}`, got {other:?}"),
            }
        }
    }

    /// A helper the compiler calls instead of inlining (128-bit division is `__divti3` in gcc
    /// and clang alike) is left undefined in the object and bound to libgcc_s at load.
    #[test]
    fn libgcc_helpers_bind_to_libgcc_s() {
        let src = "__int128 k(__int128 a, __int128 b) { return a / b; }\n";
        let bytes = compile(src);
        assert!(Object::parse(&bytes).unwrap().symbols.iter().any(|s| s.name == b"__divti3"));
        let image = load(&bytes).unwrap();
        // SAFETY: `k` is `__int128 k(__int128, __int128)`, which is Rust's `i128` in the C ABI
        // on x86-64; `image` outlives the call.
        let k = unsafe {
            std::mem::transmute::<*mut c_void, extern "C" fn(i128, i128) -> i128>(image.function("k").unwrap().as_ptr())
        };
        let a = -(1i128 << 100) - 12345;
        assert_eq!(k(a, 7), a / 7);
    }

    #[test]
    fn an_unresolved_symbol_and_a_missing_entry_are_named() {
        let bytes = compile("float kiln_nowhere(float);\nfloat k(float x) { return kiln_nowhere(x); }\n");
        assert!(matches!(load(&bytes), Err(Error::Load(m)) if m.contains("`kiln_nowhere`")));
        let image = load(&compile("int k(void) { return 1; }\nstatic int h(void) { return 2; }\n")).unwrap();
        assert!(matches!(image.function("nope"), Err(Error::Load(m)) if m.contains("`nope`")));
    }

    /// The offset of section `name`'s header in `bytes`.
    fn header_of(bytes: &[u8], name: &[u8]) -> usize {
        let obj = Object::parse(bytes).unwrap();
        let i = obj.sections.iter().position(|s| s.name == name).unwrap();
        u64_at(bytes, 40).unwrap() as usize + 64 * i
    }

    fn set(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        b[at..at + value.len()].copy_from_slice(value);
        b
    }

    fn load_error(bytes: &[u8]) -> String {
        match load(bytes) {
            Err(Error::Load(m)) => m,
            other => panic!("expected a load error, got {other:?}"),
        }
    }

    #[test]
    fn malformed_objects_are_load_errors_that_say_what() {
        let good = compile(RICH);
        let rela = header_of(&good, b".rela.text");
        let rela_at = u64_at(&good, rela as u64 + 24).unwrap() as usize;
        let text = header_of(&good, b".text");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..3].to_vec(), "past the end"),
            (b"not an object".to_vec(), "magic"),
            (set(&good, 4, &[1]), "64-bit"),
            (set(&good, 16, &3u16.to_le_bytes()), "shared library"),
            (set(&good, 18, &183u16.to_le_bytes()), "machine 183"),
            (set(&good, 40, &u64::MAX.to_le_bytes()), "section header"),
            (set(&good, 58, &40u16.to_le_bytes()), "entry size 40"),
            (set(&good, text + 32, &(1u64 << 62).to_le_bytes()), "outside"),
            (set(&good, text + 48, &3u64.to_le_bytes()), "alignment 3"),
            (set(&good, text + 48, &(1u64 << 20).to_le_bytes()), "alignment"),
            (set(&good, header_of(&good, b".bss") + 32, &(1u64 << 40).to_le_bytes()), "more than"),
            (set(&good, text + 4, &14u32.to_le_bytes()), "not supported"),
            (set(&good, rela_at, &u64::MAX.to_le_bytes()), "outside section `.text`"),
            (set(&good, rela_at + 8, &37u32.to_le_bytes()), "unsupported relocation type 37"),
            (set(&good, rela_at + 12, &u32::MAX.to_le_bytes()), "names symbol"),
            (set(&good, text, &u32::MAX.to_le_bytes()), "string offset"),
        ];
        for (bytes, says) in cases {
            let m = load_error(&bytes);
            assert!(m.contains(says), "expected `{says}` in: {m}");
        }
        assert!(load(&good).is_ok());
    }

    /// The offset of symbol `name`'s entry in `bytes`.
    fn symbol_of(bytes: &[u8], name: &[u8]) -> usize {
        let obj = Object::parse(bytes).unwrap();
        let i = obj.symbols.iter().position(|s| s.name == name).unwrap();
        u64_at(bytes, header_of(bytes, b".symtab") as u64 + 24).unwrap() as usize + 24 * i
    }

    /// Objects that parse and lay out but would run the wrong bytes: relocations for a section
    /// that does not exist (the code would run unrelocated), code that has no bytes (zero
    /// pages) and an entry at or past the end of its code. Each is refused; nothing is run.
    #[test]
    fn objects_that_would_run_the_wrong_bytes_are_refused() {
        let rich = compile(RICH);
        let rela = header_of(&rich, b".rela.text");
        for missing in [9999u32, 0, u32::MAX] {
            let m = load_error(&set(&rich, rela + 44, &missing.to_le_bytes()));
            assert!(m.contains(&format!("`.rela.text` applies to section {missing}, which does not exist")), "{m}");
        }
        // No relocations, so nothing else in it objects to `.text` having no bytes.
        let plain = compile("int k(void) { return 1; }\n");
        assert!(Object::parse(&plain).unwrap().relocs.is_empty());
        let text = header_of(&plain, b".text");
        let m = load_error(&set(&plain, text + 4, &SHT_NOBITS.to_le_bytes()));
        assert!(m.contains("`.text` is executable but has no bytes in the file (SHT_NOBITS)"), "{m}");
        let text_size = u64_at(&plain, text as u64 + 32).unwrap();
        let k = symbol_of(&plain, b"k");
        let k_size = u64_at(&plain, k as u64 + 16).unwrap();
        assert!(k_size > 0 && k_size <= text_size, "`k` is {k_size} of {text_size} bytes");
        let past_its_code = [
            (text_size, 0),            // the first byte after the section, with no size
            (text_size, k_size),       // the same, with its size
            (1, k_size + text_size),   // starts inside, ends past the end
            (0, text_size + 1),        // one byte too long
            (text_size - 1, u64::MAX), // its end overflows
        ];
        for (value, size) in past_its_code {
            let bytes = set(&set(&plain, k + 8, &value.to_le_bytes()), k + 16, &size.to_le_bytes());
            let m = load_error(&bytes);
            assert!(m.contains("function `k`") && m.contains("does not lie inside its section `.text`"), "{m}");
        }
        let last_byte = set(&set(&plain, k + 8, &(text_size - 1).to_le_bytes()), k + 16, &1u64.to_le_bytes());
        assert!(load(&last_byte).is_ok(), "a one-byte function in the section's last byte is inside it");
        assert!(load(&plain).is_ok() && load(&rich).is_ok());
    }

    /// An object that an older, laxer loader ran and cached is refused by this one when it comes
    /// back from the disk cache: the cache deletes the entry and compiles the kernel again.
    #[test]
    fn a_cached_object_the_loader_refuses_is_deleted_and_compiled_again() {
        use kiln_device::{
            CacheConfig, CompiledSpec, Compiler, KernelCache, LaunchDims, Program, ProgramSpec, RawView, Renderer,
            RuntimeFactory, Toolchain,
        };
        use std::sync::Arc;
        /// The real compiler, with the entry point moved to the end of its section.
        struct EntryPastItsCode(CCompiler);
        impl Compiler for EntryPastItsCode {
            fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
                let mut c = self.0.compile(spec)?;
                let obj = Object::parse(&c.bytes)?;
                let sym = obj.symbols.iter().find(|s| s.name == spec.name.as_bytes()).unwrap();
                let end = obj.sections[usize::from(sym.shndx)].size;
                let at = symbol_of(&c.bytes, spec.name.as_bytes());
                c.bytes = set(&c.bytes, at + 8, &end.to_le_bytes());
                Ok(c)
            }
            fn cache_key(&self) -> &'static str {
                self.0.cache_key()
            }
            fn fingerprint(&self) -> String {
                self.0.fingerprint()
            }
        }
        /// What the older loader gave back: a program that is never run here.
        struct NeverRun;
        impl Program for NeverRun {
            unsafe fn execute(&self, _: &[RawView], _: &[i64], _: &LaunchDims) -> Result<()> {
                Err(Error::Load("the test runs no kernel".into()))
            }
            fn name(&self) -> &str {
                "never run"
            }
        }
        let sink = crate::testing::double_in_place();
        let dir = tempfile::Builder::new().prefix("kiln-elf-cache-").tempdir().unwrap();
        let cc = CCompiler::detect().unwrap();
        let renderer: Arc<dyn Renderer> = Arc::new(crate::cpu_renderer());
        let lax: RuntimeFactory = Arc::new(|_| Ok(Arc::new(NeverRun) as Arc<dyn Program>));
        let real: RuntimeFactory = Arc::new(|c| Ok(Arc::new(crate::CpuProgram::load(c)?) as Arc<dyn Program>));
        let cached = |compiler: Arc<dyn Compiler>, runtime: &RuntimeFactory| {
            let cache = KernelCache::new(CacheConfig::at(dir.path()));
            let toolchain = Toolchain::new(renderer.clone(), compiler, runtime.clone().into());
            let kernel =
                cache.get_or_compile(&sink, None, &crate::CPU, &toolchain).map(|k| k.program().name().to_owned());
            (kernel, cache.stats())
        };
        let (older, stats) = cached(Arc::new(EntryPastItsCode(cc.clone())), &lax);
        assert_eq!((older.unwrap().as_str(), stats.misses), ("never run", 1), "the bad object is cached");
        let (kernel, stats) = cached(Arc::new(cc.clone()), &real);
        assert!(kernel.is_ok(), "{kernel:?}");
        assert_eq!((stats.disk_hits, stats.disk_rejected, stats.misses), (0, 1, 1), "refused, compiled again");
        let (kernel, stats) = cached(Arc::new(cc), &real);
        assert!(kernel.is_ok(), "{kernel:?}");
        assert_eq!((stats.disk_hits, stats.disk_rejected, stats.misses), (1, 0, 0), "the good object replaced it");
    }

    /// Truncations at every length and a few hundred byte mutations of a real object, aimed
    /// at the header, the section table, the relocations, the symbols and anywhere: each loads or is an error, and
    /// nothing panics. (A mutant that loads is dropped, never run.)
    #[test]
    fn mutated_objects_never_panic() {
        let good = compile(RICH);
        for len in (0..good.len()).step_by(7) {
            assert!(load(&good[..len]).is_err(), "a {len}-byte prefix loaded");
        }
        let shoff = u64_at(&good, 40).unwrap() as usize;
        let rela = u64_at(&good, header_of(&good, b".rela.text") as u64 + 24).unwrap() as usize;
        let symtab = u64_at(&good, header_of(&good, b".symtab") as u64 + 24).unwrap() as usize;
        let regions = [(0, 64), (shoff, good.len() - shoff), (rela, 24 * 8), (symtab, 24 * 8), (0, good.len())];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut errors = 0;
        for case in 0..600 {
            let (start, len) = regions[case % regions.len()];
            let mut bytes = good.clone();
            for _ in 0..1 + next() % 3 {
                let at = start + (next() as usize % len).min(good.len() - 1 - start);
                bytes[at] = match next() % 4 {
                    0 => 0xff,
                    1 => 0,
                    _ => bytes[at] ^ (1 << (next() % 8)),
                };
            }
            errors += usize::from(load(&bytes).is_err());
        }
        assert!(errors > 100, "most mutants are rejected ({errors} of 600)");
    }
}
