use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::disk::*;
use super::*;
use crate::doubles::*;
use crate::parts::CompilerPair;

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
fn a_renderer_with_an_identity_is_not_asked_to_render_a_disk_hit() {
    let dir = TempDir::new("identity");
    let compiler = Arc::new(MockCompiler::new("fp1"));
    let loaded = Arc::new(Mutex::new(Vec::new()));
    let toolchain_of = |renderer: &Arc<IdentifiedRenderer>| {
        Toolchain::new(renderer.clone(), compiler.clone(), runtime(loaded.clone()).into())
    };
    let cpu = DeviceSpec::new("CPU", 0);
    let sink = kernel(3.0);
    let first = Arc::new(IdentifiedRenderer::new("wide"));
    let k1 = disk_cache(&dir).get_or_compile(&sink, Some("scale"), &cpu, &toolchain_of(&first)).unwrap();
    assert_eq!((first.renders.load(Ordering::SeqCst), first.describes.load(Ordering::SeqCst)), (1, 0));

    // A new process: the binary and the source come from disk, the metadata from `describe`.
    let second = Arc::new(IdentifiedRenderer::new("wide"));
    let cache = disk_cache(&dir);
    let k2 = cache.get_or_compile(&sink, Some("scale"), &cpu, &toolchain_of(&second)).unwrap();
    assert_eq!((second.renders.load(Ordering::SeqCst), second.describes.load(Ordering::SeqCst)), (0, 1));
    assert_eq!((cache.stats().disk_hits, compiler.compiles.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(k2.spec.src, k1.spec.src, "the stored source, not the described empty one");
    assert_eq!((k2.spec.name.as_str(), k2.spec.ins.clone(), k2.spec.outs.clone()), ("scale", vec![0], vec![1]));
    let bytes = loaded.lock().unwrap().clone();
    assert_eq!(bytes[0], bytes[1], "the disk hit loaded the compiled bytes");

    // Another identity (a narrower target) is another binary.
    let narrow = Arc::new(IdentifiedRenderer::new("narrow"));
    disk_cache(&dir).get_or_compile(&sink, Some("scale"), &cpu, &toolchain_of(&narrow)).unwrap();
    assert_eq!((narrow.renders.load(Ordering::SeqCst), compiler.compiles.load(Ordering::SeqCst)), (1, 2));
    assert_eq!(entries(&dir.0).len(), 2);
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
    use crate::doubles::MockAllocator;
    let dir = TempDir::new("device");
    let r = rig(MockCompiler::new("fp"));
    let open = |cache: KernelCache| {
        let pair = CompilerPair::new("mock", Arc::new(MockRenderer), r.compiler.clone());
        let loaded = r.loaded.clone();
        Device::new(DeviceSpec::new("CPU", 0), "mock".into(), move |_| {
            Ok(crate::parts::DeviceParts::new(MockAllocator::new(1 << 20), vec![pair.clone()], runtime(loaded.clone())))
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
    let e = Entry { spec_name: "k".into(), compiled_name: "k_sym".into(), src: "src".into(), bytes: vec![1, 2, 3] };
    let bytes = e.encode(&key);
    assert_eq!(Entry::decode(&bytes, &key).unwrap(), e);
    assert_eq!(Entry::decode(&bytes, &[8u8; 32]), Err("key mismatch"));
    assert_eq!(Entry::decode(&bytes[..bytes.len() - 1], &key), Err("payload length mismatch"));
    assert_eq!(Entry::decode(b"KILN", &key), Err("truncated header"));
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert_eq!(Entry::decode(&bad, &key), Err("bad magic"));
}
