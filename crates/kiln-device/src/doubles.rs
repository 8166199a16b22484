//! Test doubles shared by this crate's unit tests: an allocator with a hard capacity that
//! counts its calls ([`MockAllocator`]), and a toolchain whose "binaries" are bytes derived
//! from the source ([`rig`]), for the cache and device tests; and a device event completed
//! by hand ([`FakeEvent`]), for the event ring's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_ir::{DeviceSpec, KernelBuilder, Scalar, UOp};

use crate::buffer::{Allocator, RawPtr, RawView};
use crate::cache::Toolchain;
use crate::error::{Error, Result};
use crate::program::{CompiledSpec, Compiler, LaunchDims, Program, ProgramSpec, Renderer, RuntimeFactory};

/// A host allocator with a hard capacity that counts backend calls and live blocks.
pub struct MockAllocator {
    pub capacity: usize,
    pub live: AtomicUsize,
    pub allocs: AtomicUsize,
    pub frees: AtomicUsize,
    pub blocks: Mutex<HashMap<usize, usize>>,
}

impl MockAllocator {
    pub fn new(capacity: usize) -> Arc<MockAllocator> {
        Arc::new(MockAllocator {
            capacity,
            live: AtomicUsize::new(0),
            allocs: AtomicUsize::new(0),
            frees: AtomicUsize::new(0),
            blocks: Mutex::new(HashMap::new()),
        })
    }
}

impl Allocator for MockAllocator {
    fn device(&self) -> &DeviceSpec {
        static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
        &SPEC
    }
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        let live = self.live.load(Ordering::SeqCst);
        if live + bytes > self.capacity {
            return Err(Error::OutOfMemory {
                device: "MOCK".into(),
                requested: bytes,
                in_use: live,
                cached: 0,
                budget: None,
            });
        }
        self.live.fetch_add(bytes, Ordering::SeqCst);
        let n = self.allocs.fetch_add(1, Ordering::SeqCst) + 1;
        // Fake, distinct, never-dereferenced addresses.
        let addr = n * 4096;
        self.blocks.lock().unwrap().insert(addr, bytes);
        Ok(RawPtr(addr as *mut std::ffi::c_void))
    }
    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        let had = self.blocks.lock().unwrap().remove(&(ptr.0 as usize));
        assert_eq!(had, Some(bytes), "free of an unknown block or with a different size");
        self.live.fetch_sub(bytes, Ordering::SeqCst);
        self.frees.fetch_add(1, Ordering::SeqCst);
    }
    unsafe fn copyin(&self, _dst: RawView, _src: &[u8]) -> Result<()> {
        Ok(())
    }
    unsafe fn copyout(&self, _dst: &mut [u8], _src: RawView) -> Result<()> {
        Ok(())
    }
}

pub struct MockRenderer;

impl Renderer for MockRenderer {
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        let src = format!("// kernel {}", ast.content_hash().to_hex());
        ProgramSpec::from_sink(name.unwrap_or("kernel"), src, DeviceSpec::new("CPU", 0), ast)
    }
    fn device(&self) -> &DeviceSpec {
        static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
        &SPEC
    }
}

/// [`MockRenderer`] with an identity, counting what it renders and describes.
pub struct IdentifiedRenderer {
    pub identity: String,
    pub renders: AtomicUsize,
    pub describes: AtomicUsize,
}

impl IdentifiedRenderer {
    pub fn new(identity: &str) -> IdentifiedRenderer {
        IdentifiedRenderer { identity: identity.into(), renders: AtomicUsize::new(0), describes: AtomicUsize::new(0) }
    }
}

impl Renderer for IdentifiedRenderer {
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        self.renders.fetch_add(1, Ordering::SeqCst);
        MockRenderer.render(ast, name)
    }
    fn describe(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        self.describes.fetch_add(1, Ordering::SeqCst);
        ProgramSpec::from_sink(name.unwrap_or("kernel"), String::new(), DeviceSpec::new("CPU", 0), ast)
    }
    fn identity(&self) -> Option<String> {
        Some(self.identity.clone())
    }
    fn device(&self) -> &DeviceSpec {
        MockRenderer.device()
    }
}

/// Counts compiles; can be slowed down (to widen races) and made to fail.
pub struct MockCompiler {
    pub fingerprint: String,
    pub compiles: AtomicUsize,
    pub delay: Duration,
    pub fail: AtomicBool,
    /// Produce source (like a JIT backend) instead of bytes.
    pub jit: bool,
}

impl MockCompiler {
    pub fn new(fingerprint: &str) -> MockCompiler {
        MockCompiler {
            fingerprint: fingerprint.into(),
            compiles: AtomicUsize::new(0),
            delay: Duration::ZERO,
            fail: AtomicBool::new(false),
            jit: false,
        }
    }
}

impl Compiler for MockCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        self.compiles.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Compile { message: "mock failure".into(), log: String::new(), line: None });
        }
        let bytes = if self.jit { Vec::new() } else { format!("BIN[{}]{}", self.fingerprint, spec.src).into_bytes() };
        Ok(CompiledSpec { name: spec.name.clone(), bytes, spec: Arc::new(spec.clone()) })
    }
    fn cache_key(&self) -> &'static str {
        "mockcc"
    }
    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}

pub struct MockProgram(String);

impl Program for MockProgram {
    unsafe fn execute(&self, _bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        &self.0
    }
}

/// The runtime records what it loaded; it refuses bytes that are not a mock binary.
pub fn runtime(loaded: Arc<Mutex<Vec<Vec<u8>>>>) -> RuntimeFactory {
    Arc::new(move |c: &CompiledSpec| {
        let payload = if c.bytes.is_empty() { c.spec.src.clone().into_bytes() } else { c.bytes.clone() };
        if !(payload.starts_with(b"BIN[") || payload.starts_with(b"// kernel")) {
            return Err(Error::Load("not a mock binary".into()));
        }
        loaded.lock().unwrap().push(payload);
        Ok(Arc::new(MockProgram(c.name.clone())) as Arc<dyn Program>)
    })
}

pub struct Rig {
    pub compiler: Arc<MockCompiler>,
    pub loaded: Arc<Mutex<Vec<Vec<u8>>>>,
    pub toolchain: Toolchain,
}

pub fn rig(compiler: MockCompiler) -> Rig {
    let compiler = Arc::new(compiler);
    let loaded = Arc::new(Mutex::new(Vec::new()));
    let toolchain = Toolchain::new(Arc::new(MockRenderer), compiler.clone(), runtime(loaded.clone()).into());
    Rig { compiler, loaded, toolchain }
}

impl Rig {
    pub fn compiles(&self) -> usize {
        self.compiler.compiles.load(Ordering::SeqCst)
    }
}

/// `c[i] = a[i] * k`: a distinct kernel per `k`.
pub fn kernel(k: f64) -> Arc<UOp> {
    let mut b = KernelBuilder::new();
    let a = b.param(0, Scalar::F32, 16);
    let c = b.param(1, Scalar::F32, 16);
    let i = b.special("gidx0", 16);
    let v = a.at(&i).load();
    b.store(&c.at(&i), &(v * k));
    b.finish().expect("a valid test kernel")
}

/// The path `tag` in a fresh private folder (deleted on drop); the path itself does not
/// exist yet.
pub struct TempDir(pub PathBuf, #[allow(dead_code, reason = "held to delete the folder on drop")] tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let parent = tempfile::Builder::new().prefix("kiln-cache-test-").tempdir().expect("a temporary folder");
        TempDir(parent.path().join(tag), parent)
    }
}

/// A device event a test completes or breaks by hand (the event ring's tests).
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct FakeEvent {
    /// Set by [`FakeEvent::complete`].
    pub done: AtomicBool,
    /// Makes every query fail, as a device fault would.
    pub broken: AtomicBool,
    /// Calls of the blocking `wait`.
    pub blocking_waits: AtomicUsize,
}

#[cfg(not(loom))]
impl FakeEvent {
    /// Marks the event done.
    pub fn complete(&self) {
        self.done.store(true, Ordering::Release);
    }
}

#[cfg(not(loom))]
impl crate::ring::BackendEvent for Arc<FakeEvent> {
    fn is_complete(&self) -> Result<bool> {
        if self.broken.load(Ordering::Acquire) {
            return Err(Error::driver("fake", "device fault"));
        }
        Ok(self.done.load(Ordering::Acquire))
    }

    fn wait(&self) -> Result<()> {
        self.blocking_waits.fetch_add(1, Ordering::Relaxed);
        while !self.is_complete()? {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }
}
