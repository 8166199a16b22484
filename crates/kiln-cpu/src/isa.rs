//! What the CPU offers kernels: the instruction set they are compiled for (which sets the
//! widest vector) and the cache sizes, as [`DeviceProperties`] for kernel generators.
//!
//! **Forcing an older instruction set.** `KILN_CPU_ISA` ([`CPU_ISA_ENV`]) picks what kernels
//! are compiled for: `native` (the default: `-march=native`, reported as the widest set the
//! CPU has), or one of `avx512` (`-march=x86-64-v4`), `avx2` (`-march=x86-64-v3`: no AVX-512
//! instruction is emitted), `sse2` (`-march=x86-64`) on x86-64 and `neon` (`-march=armv8-a`)
//! on AArch64, each with `-mtune=native` on x86-64. The device then reports that set and its
//! vector width, so code tuned for an AVX2-only machine can be built and checked on a newer
//! one. A set this CPU lacks is refused with [`Error::Config`] when the device opens (never
//! a SIGILL at the first launch); the flags are part of the compiler fingerprint, so binaries
//! for different sets never share a cache entry.

use std::fmt;
use std::path::Path;

use kiln_device::{DeviceProperties, Error, Result};

/// The environment variable that forces the instruction set kernels are compiled for.
pub const CPU_ISA_ENV: &str = "KILN_CPU_ISA";

/// Where the OS describes CPU 0's caches (`index*/{level,type,size}`).
const CACHE_DIR: &str = "/sys/devices/system/cpu/cpu0/cache";

/// An instruction set level kernels can be compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// x86-64-v4: AVX-512 F, BW, CD, DQ and VL on top of AVX2; 64-byte vectors.
    Avx512,
    /// x86-64-v3: AVX2, FMA, BMI1/2, F16C, MOVBE, LZCNT; 32-byte vectors.
    Avx2,
    /// The x86-64 baseline (SSE2); 16-byte vectors.
    Sse2,
    /// AArch64 Advanced SIMD; 16-byte vectors.
    Neon,
    /// Another architecture: compiled with `-march=native`, vector width unknown.
    Generic,
}

/// The CPU features (as `is_x86_feature_detected!` and `/proc/cpuinfo` name them) each x86
/// level needs beyond the previous one.
const X86_V3: &[&str] = &["avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "lzcnt"];
const X86_V4: &[&str] = &["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"];

impl Isa {
    /// The values [`CPU_ISA_ENV`] takes besides `native`.
    pub const FORCEABLE: &'static [Isa] = &[Isa::Avx512, Isa::Avx2, Isa::Sse2, Isa::Neon];

    /// The name [`CPU_ISA_ENV`] spells it with.
    pub fn env_name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Sse2 => "sse2",
            Isa::Neon => "neon",
            Isa::Generic => "generic",
        }
    }

    /// The widest vector register, in bytes (`None` for [`Isa::Generic`]).
    pub fn vector_bytes(self) -> Option<usize> {
        match self {
            Isa::Avx512 => Some(64),
            Isa::Avx2 => Some(32),
            Isa::Sse2 | Isa::Neon => Some(16),
            Isa::Generic => None,
        }
    }

    /// The architecture this set belongs to (`std::env::consts::ARCH` spelling).
    fn arch(self) -> Option<&'static str> {
        match self {
            Isa::Avx512 | Isa::Avx2 | Isa::Sse2 => Some("x86_64"),
            Isa::Neon => Some("aarch64"),
            Isa::Generic => None,
        }
    }

    /// The features this set needs that `has` says the CPU lacks (empty: it can run it).
    fn missing(self, has: impl Fn(&str) -> bool) -> Vec<&'static str> {
        let needed: Vec<&'static str> = match self {
            Isa::Avx512 => X86_V3.iter().chain(X86_V4).copied().collect(),
            Isa::Avx2 => X86_V3.to_vec(),
            Isa::Sse2 | Isa::Neon | Isa::Generic => Vec::new(),
        };
        needed.into_iter().filter(|f| !has(f)).collect()
    }

    /// The widest set of this process's CPU.
    pub fn host() -> Isa {
        match std::env::consts::ARCH {
            "x86_64" if Isa::Avx512.missing(host_has).is_empty() => Isa::Avx512,
            "x86_64" if Isa::Avx2.missing(host_has).is_empty() => Isa::Avx2,
            "x86_64" => Isa::Sse2,
            "aarch64" => Isa::Neon,
            _ => Isa::Generic,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Isa::Avx512 => "AVX-512",
            Isa::Avx2 => "AVX2",
            Isa::Sse2 => "SSE2",
            Isa::Neon => "NEON",
            Isa::Generic => "generic",
        })
    }
}

/// The matrix arithmetic a target has beyond its vector width, which the CPU's WMMA
/// micro-tiles use where present (see `renderer::CpuDialect::native_wmma`). A forced
/// instruction set has none: `-march=x86-64-v4` enables neither extension.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MatrixUnits {
    /// AVX512-BF16: `vdpbf16ps`, pairs of bf16 products added into f32.
    pub avx512_bf16: bool,
    /// AVX512-FP16: f16 arithmetic, `vfmadd231ph` among it.
    pub avx512_fp16: bool,
}

impl MatrixUnits {
    /// What `target` has: this CPU's units when it compiles for the host (`-march=native`),
    /// none for a forced set.
    pub fn of(target: IsaTarget) -> MatrixUnits {
        if target.forced { MatrixUnits::default() } else { MatrixUnits::host() }
    }

    #[cfg(target_arch = "x86_64")]
    fn host() -> MatrixUnits {
        MatrixUnits {
            avx512_bf16: is_x86_feature_detected!("avx512bf16"),
            avx512_fp16: is_x86_feature_detected!("avx512fp16"),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn host() -> MatrixUnits {
        MatrixUnits::default()
    }

    /// `, AVX512-BF16, AVX512-FP16` for the device description (empty without either).
    fn describe(self) -> String {
        [(self.avx512_bf16, "AVX512-BF16"), (self.avx512_fp16, "AVX512-FP16")]
            .iter()
            .filter(|(has, _)| *has)
            .map(|(_, name)| format!(", {name}"))
            .collect()
    }
}

/// Whether this process's CPU (and OS: AVX state saved on context switch) has x86 `feature`.
#[cfg(target_arch = "x86_64")]
fn host_has(feature: &str) -> bool {
    match feature {
        "avx2" => is_x86_feature_detected!("avx2"),
        "fma" => is_x86_feature_detected!("fma"),
        "bmi1" => is_x86_feature_detected!("bmi1"),
        "bmi2" => is_x86_feature_detected!("bmi2"),
        "f16c" => is_x86_feature_detected!("f16c"),
        "movbe" => is_x86_feature_detected!("movbe"),
        "lzcnt" => is_x86_feature_detected!("lzcnt"),
        "avx512f" => is_x86_feature_detected!("avx512f"),
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        "avx512cd" => is_x86_feature_detected!("avx512cd"),
        "avx512dq" => is_x86_feature_detected!("avx512dq"),
        "avx512vl" => is_x86_feature_detected!("avx512vl"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn host_has(_feature: &str) -> bool {
    false
}

/// The instruction set kernels are compiled for: the host's widest ([`IsaTarget::native`]) or
/// one forced by [`CPU_ISA_ENV`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IsaTarget {
    /// The set kernels use.
    pub isa: Isa,
    /// Whether it was chosen rather than the host's widest (compiled for that level, not
    /// `-march=native`): by [`CPU_ISA_ENV`] or by a compiler pair such as `cc-avx2`.
    pub forced: bool,
    /// Whether [`CPU_ISA_ENV`] chose it.
    pub by_env: bool,
}

impl IsaTarget {
    /// The widest set of this CPU, compiled with `-march=native`.
    pub fn native() -> IsaTarget {
        IsaTarget { isa: Isa::host(), forced: false, by_env: false }
    }

    /// `isa` forced (compiled for that level) by a device, as `KILN_CPU_ISA` would force it.
    ///
    /// # Errors
    /// Those of [`IsaTarget::parse`]: [`Error::Config`] when this CPU cannot run `isa`.
    pub fn force(isa: Isa) -> Result<IsaTarget> {
        Ok(IsaTarget { by_env: false, ..IsaTarget::parse(Some(isa.env_name()))? })
    }

    /// The target [`CPU_ISA_ENV`] asks for (see [`IsaTarget::parse`]).
    pub fn from_env() -> Result<IsaTarget> {
        IsaTarget::parse(std::env::var(CPU_ISA_ENV).ok().as_deref())
    }

    /// The target a [`CPU_ISA_ENV`] value asks for on this CPU: unset, empty or `native` is
    /// [`IsaTarget::native`]; otherwise one of [`Isa::FORCEABLE`] by name (case-insensitive).
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown name, or a set this CPU cannot run (another
    /// architecture's, or one whose features it lacks).
    pub fn parse(value: Option<&str>) -> Result<IsaTarget> {
        IsaTarget::parse_for(value, std::env::consts::ARCH, host_has)
    }

    /// [`IsaTarget::parse`] for a CPU of architecture `arch` whose features `has` reports.
    fn parse_for(value: Option<&str>, arch: &str, has: impl Fn(&str) -> bool) -> Result<IsaTarget> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("native")) else {
            return Ok(IsaTarget::native());
        };
        let choices = || {
            let names: Vec<&str> = Isa::FORCEABLE.iter().map(|i| i.env_name()).collect();
            format!("native, {}", names.join(", "))
        };
        let isa = Isa::FORCEABLE.iter().copied().find(|i| i.env_name().eq_ignore_ascii_case(v)).ok_or_else(|| {
            Error::Config(format!("{CPU_ISA_ENV}=`{v}` is not an instruction set; use one of: {}", choices()))
        })?;
        if isa.arch() != Some(arch) {
            return Err(Error::Config(format!(
                "{CPU_ISA_ENV}={v}: {isa} is an instruction set of {}, this CPU is {arch}; unset it or use native",
                isa.arch().unwrap_or("another architecture")
            )));
        }
        let missing = isa.missing(has);
        if !missing.is_empty() {
            return Err(Error::Config(format!(
                "{CPU_ISA_ENV}={v}: this CPU lacks {} (needed by {isa}), so kernels built for it would stop \
                 with an illegal instruction; use an older set or native",
                missing.join(", ")
            )));
        }
        Ok(IsaTarget { isa, forced: true, by_env: true })
    }

    /// The C compiler's target flags for this set.
    pub fn march_flags(&self) -> &'static [&'static str] {
        if !self.forced {
            return &["-march=native"];
        }
        match self.isa {
            Isa::Avx512 => &["-march=x86-64-v4", "-mtune=native"],
            Isa::Avx2 => &["-march=x86-64-v3", "-mtune=native"],
            Isa::Sse2 => &["-march=x86-64", "-mtune=native"],
            Isa::Neon => &["-march=armv8-a"],
            Isa::Generic => &["-march=native"],
        }
    }
}

/// The sizes of CPU 0's caches as the OS reports them; `None` where it does not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheSizes {
    /// Level-1 data cache, in bytes.
    pub l1d: Option<usize>,
    /// Level-2 cache, in bytes.
    pub l2: Option<usize>,
    /// Level-3 cache, in bytes.
    pub l3: Option<usize>,
}

impl CacheSizes {
    /// This machine's caches (from `/sys/devices/system/cpu/cpu0/cache`).
    pub fn host() -> CacheSizes {
        CacheSizes::read(Path::new(CACHE_DIR))
    }

    /// The caches described under `dir` (`index*/level`, `type`, `size` as Linux writes them:
    /// `1`, `Data`, `32K`). Missing or malformed entries are skipped; an instruction cache is
    /// never counted as L1d.
    pub fn read(dir: &Path) -> CacheSizes {
        let mut sizes = CacheSizes::default();
        let Ok(entries) = std::fs::read_dir(dir) else { return sizes };
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with("index") {
                continue;
            }
            let field = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
            let level = field("level").and_then(|l| l.trim().parse::<u32>().ok());
            let kind = field("type").unwrap_or_default();
            let Some(size) = field("size").and_then(|s| parse_cache_size(&s)) else { continue };
            let slot = match (level, kind.trim()) {
                (Some(1), "Data" | "Unified") => &mut sizes.l1d,
                (Some(2), "Data" | "Unified") => &mut sizes.l2,
                (Some(3), "Data" | "Unified") => &mut sizes.l3,
                _ => continue,
            };
            *slot = Some(slot.map_or(size, |s| s.max(size)));
        }
        sizes
    }
}

/// `32K` → 32768 (also `M`, `G` and plain bytes); `None` when malformed.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// The CPU device's [`DeviceProperties`]: the target's set and vector width, `caches`, and the
/// `threads` its launches run on.
pub fn properties(target: IsaTarget, caches: CacheSizes, threads: usize) -> DeviceProperties {
    DeviceProperties {
        isa: Some(target.isa.to_string()),
        vector_bytes: target.isa.vector_bytes(),
        l1d_bytes: caches.l1d,
        l2_bytes: caches.l2,
        l3_bytes: caches.l3,
        wmma: crate::renderer::cpu_wmma_forms(target.isa.vector_bytes().unwrap_or(16)),
        threads: Some(threads),
        // no work groups or local memory
        ..DeviceProperties::default()
    }
}

/// `AVX-512 (64-byte vectors), L1d 32 KiB, L2 1 MiB, L3 32 MiB`, for the device description;
/// a forced set says so.
pub fn describe(target: IsaTarget, caches: CacheSizes) -> String {
    let mut s = target.isa.to_string();
    let forced = match (target.forced, target.by_env) {
        (false, _) => String::new(),
        (true, true) => format!(", forced by {CPU_ISA_ENV}"),
        (true, false) => ", this device's set".to_string(),
    };
    if let Some(b) = target.isa.vector_bytes() {
        s += &format!(" ({b}-byte vectors{forced})");
    }
    s += &MatrixUnits::of(target).describe();
    for (name, size) in [("L1d", caches.l1d), ("L2", caches.l2), ("L3", caches.l3)] {
        if let Some(size) = size {
            s += &format!(", {name} {}", kib(size));
        }
    }
    s
}

/// `32768` → `32 KiB`, `1048576` → `1 MiB`.
fn kib(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isa_values_parse_and_bad_ones_are_config_errors() {
        let all = |_: &str| true;
        for native in [None, Some(""), Some(" native "), Some("NATIVE")] {
            assert_eq!(IsaTarget::parse_for(native, "x86_64", all).unwrap(), IsaTarget::native());
        }
        let avx2 = IsaTarget::parse_for(Some("AVX2"), "x86_64", all).unwrap();
        assert_eq!(avx2, IsaTarget { isa: Isa::Avx2, forced: true, by_env: true });
        assert_eq!(avx2.march_flags(), ["-march=x86-64-v3", "-mtune=native"]);
        assert_eq!(IsaTarget::parse_for(Some("neon"), "aarch64", all).unwrap().isa, Isa::Neon);
        for bad in ["avx9", "x86-64-v3", "-march=native"] {
            match IsaTarget::parse_for(Some(bad), "x86_64", all) {
                Err(Error::Config(m)) => {
                    assert!(m.contains(CPU_ISA_ENV) && m.contains(bad) && m.contains("avx2"), "{m}")
                }
                other => panic!("`{bad}`: expected a configuration error, got {other:?}"),
            }
        }
    }

    #[test]
    fn forcing_a_set_the_cpu_lacks_is_a_config_error() {
        // An AVX2-only CPU asked for AVX-512.
        let avx2_only = |f: &str| X86_V3.contains(&f);
        match IsaTarget::parse_for(Some("avx512"), "x86_64", avx2_only) {
            Err(Error::Config(m)) => assert!(m.contains("avx512f") && m.contains("illegal instruction"), "{m}"),
            other => panic!("expected a configuration error, got {other:?}"),
        }
        assert!(IsaTarget::parse_for(Some("avx2"), "x86_64", avx2_only).is_ok());
        // Another architecture's set.
        for (value, arch) in [("neon", "x86_64"), ("avx2", "aarch64"), ("sse2", "riscv64")] {
            match IsaTarget::parse_for(Some(value), arch, |_| true) {
                Err(Error::Config(m)) => assert!(m.contains(arch), "{m}"),
                other => panic!("{value} on {arch}: expected a configuration error, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_host_can_run_every_set_up_to_its_own() {
        let host = Isa::host();
        let order = [Isa::Sse2, Isa::Avx2, Isa::Avx512];
        if let Some(level) = order.iter().position(|&i| i == host) {
            for isa in &order[..=level] {
                let t = IsaTarget::parse(Some(isa.env_name())).unwrap();
                assert_eq!((t.isa, t.forced), (*isa, true));
            }
        }
    }

    #[test]
    fn cache_sizes_come_from_sysfs_and_missing_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let index = |n: u32, files: &[(&str, &str)]| {
            let d = dir.path().join(format!("index{n}"));
            std::fs::create_dir(&d).unwrap();
            for (name, text) in files {
                std::fs::write(d.join(name), text).unwrap();
            }
        };
        index(0, &[("level", "1\n"), ("type", "Data\n"), ("size", "48K\n")]);
        index(1, &[("level", "1\n"), ("type", "Instruction\n"), ("size", "64K\n")]);
        index(2, &[("level", "2\n"), ("type", "Unified\n"), ("size", "2048K\n")]);
        index(3, &[("level", "3\n"), ("type", "Unified\n")]); // no size
        index(4, &[("level", "x"), ("type", "Unified"), ("size", "1M")]); // bad level
        index(5, &[("level", "3"), ("type", "Unified"), ("size", "lots")]); // bad size
        std::fs::write(dir.path().join("uevent"), "").unwrap();
        let sizes = CacheSizes::read(dir.path());
        assert_eq!(sizes, CacheSizes { l1d: Some(48 << 10), l2: Some(2 << 20), l3: None });
        assert_eq!(CacheSizes::read(&dir.path().join("absent")), CacheSizes::default());
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("99999999999999999999K"), None);
    }

    #[test]
    fn properties_and_description_carry_the_set_and_caches() {
        let caches = CacheSizes { l1d: Some(32 << 10), l2: Some(1 << 20), l3: None };
        let t = IsaTarget { isa: Isa::Avx2, forced: true, by_env: true };
        let p = properties(t, caches, 1);
        assert_eq!((p.isa.as_deref(), p.vector_bytes, p.f32_lanes()), (Some("AVX2"), Some(32), Some(8)));
        assert_eq!((p.l1d_bytes, p.l2_bytes, p.l3_bytes), (Some(32 << 10), Some(1 << 20), None));
        assert_eq!(describe(t, caches), "AVX2 (32-byte vectors, forced by KILN_CPU_ISA), L1d 32 KiB, L2 1 MiB");
        let native = IsaTarget { isa: Isa::Avx512, forced: false, by_env: false };
        let units = MatrixUnits::of(native).describe();
        assert_eq!(describe(native, CacheSizes::default()), format!("AVX-512 (64-byte vectors){units}"));
        let both = MatrixUnits { avx512_bf16: true, avx512_fp16: true };
        assert_eq!(both.describe(), ", AVX512-BF16, AVX512-FP16");
        assert_eq!(MatrixUnits::of(t), MatrixUnits::default(), "a forced set has no extension");
        let device = IsaTarget { by_env: false, ..t };
        assert_eq!(describe(device, CacheSizes::default()), "AVX2 (32-byte vectors, this device's set)");
    }
}
