//! Micro-benchmarks of the hot paths that must stay cheap: a cached allocation, a kernel
//! found in memory, a kernel found on disk. Mock backends only (no compiler, no device), so
//! the figures are the cache's own overhead.

use std::alloc::Layout;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar, UOp};
use kiln_device::{
    Allocator, CacheConfig, CompiledSpec, Compiler, KernelCache, LaunchDims, LruAllocator, Program, ProgramSpec,
    RawPtr, RawView, Renderer, Result, RuntimeFactory, Toolchain,
};

/// Host memory from the global allocator, 64-byte aligned.
struct HostAllocator;

impl Allocator for HostAllocator {
    fn device(&self) -> &DeviceSpec {
        static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
        &SPEC
    }
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        let layout = Layout::from_size_align(bytes, 64).map_err(|e| kiln_device::Error::Invalid(e.to_string()))?;
        // SAFETY: the layout has a non-zero size (callers allocate ≥ 1 byte).
        Ok(RawPtr(unsafe { std::alloc::alloc(layout) }.cast()))
    }
    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        // SAFETY: `ptr` came from `alloc(bytes)` above with the same layout.
        unsafe { std::alloc::dealloc(ptr.0.cast(), Layout::from_size_align_unchecked(bytes, 64)) }
    }
    unsafe fn copyin(&self, _dst: RawView, _src: &[u8]) -> Result<()> {
        Ok(())
    }
    unsafe fn copyout(&self, _dst: &mut [u8], _src: RawView) -> Result<()> {
        Ok(())
    }
}

struct MockRenderer;

impl Renderer for MockRenderer {
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        ProgramSpec::from_sink(name.unwrap_or("kernel"), "// src".into(), DeviceSpec::new("CPU", 0), ast)
    }
    fn device(&self) -> &DeviceSpec {
        static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
        &SPEC
    }
}

/// "Compiles" to 16 KiB of bytes, about the size of a small kernel's shared object.
struct MockCompiler;

impl Compiler for MockCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        Ok(CompiledSpec { name: spec.name.clone(), bytes: vec![0x5a; 16 << 10], spec: Arc::new(spec.clone()) })
    }
    fn cache_key(&self) -> &'static str {
        "bench-cc"
    }
    fn fingerprint(&self) -> String {
        "bench 1.0 -O2".into()
    }
}

struct MockProgram;

impl Program for MockProgram {
    unsafe fn execute(&self, _bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        "kernel"
    }
}

fn toolchain() -> Toolchain {
    let runtime: RuntimeFactory = Arc::new(|_c: &CompiledSpec| Ok(Arc::new(MockProgram) as Arc<dyn Program>));
    Toolchain::new(Arc::new(MockRenderer), Arc::new(MockCompiler), runtime.into())
}

fn kernel() -> Arc<UOp> {
    let mut b = KernelBuilder::new();
    let n = b.var("n", 1, 1 << 20);
    let a = b.param(0, Scalar::F32, &n);
    let c = b.param(1, Scalar::F32, &n);
    let i = b.special("gidx0", &n);
    let v = a.at(&i).load();
    b.store(&c.at(&i), &(v * 2.0 + 1.0));
    b.finish().expect("a valid benchmark kernel")
}

fn allocator(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc");
    let raw: Arc<dyn Allocator> = Arc::new(HostAllocator);
    g.bench_function("host_alloc_free_4KiB", |b| {
        b.iter(|| {
            let p = raw.alloc(black_box(4096)).expect("host memory");
            // SAFETY: just allocated with this size, not used afterwards.
            unsafe { raw.free(p, 4096) }
        })
    });
    let lru = LruAllocator::new(raw.clone(), Some(1 << 30));
    g.bench_function("lru_cached_alloc_free_4KiB", |b| {
        b.iter(|| {
            let p = lru.alloc(black_box(4096)).expect("cached block");
            // SAFETY: just allocated with this size, not used afterwards.
            unsafe { lru.free(p, 4096) }
        })
    });
    g.finish();
}

fn kernel_cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernel_cache");
    let tc = toolchain();
    let sink = kernel();
    let memory = KernelCache::new(CacheConfig::memory_only());
    memory.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &tc).expect("warm-up compile");
    g.bench_function("memory_hit", |b| {
        b.iter(|| memory.get_or_compile(black_box(&sink), None, &DeviceSpec::new("CPU", 0), &tc).expect("memory hit"))
    });

    let dir = tempfile::tempdir().expect("a temporary cache folder");
    let disk = KernelCache::new(CacheConfig::at(dir.path()));
    disk.get_or_compile(&sink, None, &DeviceSpec::new("CPU", 0), &tc).expect("warm-up compile");
    g.bench_function("disk_hit_16KiB", |b| {
        b.iter(|| {
            disk.clear_memory();
            disk.get_or_compile(black_box(&sink), None, &DeviceSpec::new("CPU", 0), &tc).expect("disk hit")
        })
    });
    let stats = disk.stats();
    assert_eq!(stats.misses, 1, "every measured lookup was a hit: {stats:?}");
    g.finish();
}

criterion_group!(benches, allocator, kernel_cache);
criterion_main!(benches);
