//! Plan tests on the CPU backend's queues over host memory with mock programs (native Rust
//! over the raw pointers), so they need no C compiler; `cpu_backend` at the end repeats the
//! key checks with kernels compiled by the CPU backend.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar, Val};
use kiln_device::{Allocator, LaunchDims, Program, ProgramSpec, RawPtr, RawView};
use proptest::prelude::*;

use super::*;
use crate::hazard::Hazard;
use kiln_device::ReduceOp;

/// Host memory from the global allocator, 64-byte aligned.
struct HostAllocator {
    device: DeviceSpec,
}

impl HostAllocator {
    fn shared() -> Arc<dyn Allocator> {
        Arc::new(HostAllocator { device: DeviceSpec::new("CPU", 0) })
    }

    fn layout(bytes: usize) -> Result<std::alloc::Layout> {
        std::alloc::Layout::from_size_align(bytes, 64).map_err(|e| Error::Buffer(e.to_string()))
    }
}

impl Allocator for HostAllocator {
    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        // SAFETY: the layout has a non-zero size (Buffer allocates at least 1 byte).
        let p = unsafe { std::alloc::alloc_zeroed(Self::layout(bytes)?) };
        if p.is_null() {
            return Err(Error::Buffer(format!("host allocation of {bytes} bytes failed")));
        }
        Ok(RawPtr(p.cast()))
    }

    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        if let Ok(layout) = Self::layout(bytes) {
            // SAFETY: `ptr` came from `alloc(bytes)` with this layout (caller's contract).
            unsafe { std::alloc::dealloc(ptr.0.cast(), layout) }
        }
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        // SAFETY: `dst` is a live window of `src.len()` bytes (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.host_ptr(), src.len()) };
        Ok(())
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        // SAFETY: `src` is a live window of `dst.len()` bytes (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.host_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn is_host(&self) -> bool {
        true
    }
}

/// `out[i] = in[i] * mul + add` for `i < global[0]` over f32 host memory; slot 0 is read,
/// slot 1 written.
struct AffineProgram {
    mul: f32,
    add: f32,
}

impl Program for AffineProgram {
    unsafe fn execute(&self, bufs: &[RawView], _vals: &[i64], launch: &LaunchDims) -> Result<()> {
        let n = launch.global[0];
        let (src, dst) = (bufs[0].host_ptr() as *const f32, bufs[1].host_ptr() as *mut f32);
        for i in 0..n {
            // SAFETY: the launch was checked: both windows hold at least `n` f32 and no
            // other thread touches them while this node runs. Element-wise reads then
            // writes keep overlapping windows well-defined for this sequential loop.
            unsafe { *dst.add(i) = *src.add(i) * self.mul + self.add };
        }
        Ok(())
    }

    fn name(&self) -> &str {
        "affine"
    }
}

/// A program that always fails at run time.
struct FailingProgram;

impl Program for FailingProgram {
    unsafe fn execute(&self, _: &[RawView], _: &[i64], _: &LaunchDims) -> Result<()> {
        Err(Error::driver("mock", "the kernel trapped"))
    }

    fn name(&self) -> &str {
        "failing"
    }
}

fn queue_factory() -> Arc<dyn DynQueueFactory> {
    Arc::new(kiln_cpu::queue::CpuQueueFactory::new())
}

/// The metadata of `out[i] = f(in[i])` over `len` elements, or over a variable `n` when
/// `len` is `None`.
fn affine_spec(len: Option<usize>) -> Arc<ProgramSpec> {
    let mut k = KernelBuilder::new();
    let n = match len {
        Some(l) => Val::int(l as i64),
        None => k.var("n", 1, 4096),
    };
    let x = k.param(0, Scalar::F32, &n);
    let y = k.param(1, Scalar::F32, &n);
    let i = k.global(0, &n);
    let v = x.at(&i).load() * 2.0f32 + 1.0f32;
    k.store(&y.at(&i), &v);
    let sink = k.finish().expect("valid kernel");
    Arc::new(ProgramSpec::from_sink("affine", String::new(), DeviceSpec::new("CPU", 0), &sink).expect("valid spec"))
}

fn affine(len: Option<usize>, mul: f32, add: f32) -> Kernel {
    Kernel::new(affine_spec(len), Arc::new(AffineProgram { mul, add }))
}

fn failing(len: usize) -> Kernel {
    Kernel::new(affine_spec(Some(len)), Arc::new(FailingProgram))
}

fn plan(compute_queues: usize) -> ExecutionPlan {
    plan_with(compute_queues, true)
}

fn plan_with(compute_queues: usize, fuse: bool) -> ExecutionPlan {
    let options =
        PlanOptions { compute_queues, use_copy_queue: true, timeout: Duration::from_secs(60), fuse, graph: true };
    ExecutionPlan::on_queues(queue_factory(), options)
}

fn filled(alloc: &Arc<dyn Allocator>, len: usize, seed: f32) -> Buffer {
    let data: Vec<f32> = (0..len).map(|i| seed + i as f32 * 0.25).collect();
    Buffer::from_slice(alloc.clone(), &data).expect("host buffer")
}

#[test]
fn hazards_become_dependencies() {
    let alloc = HostAllocator::shared();
    let a = filled(&alloc, 32, 0.0);
    let b = filled(&alloc, 32, 1.0);
    let k8 = affine(Some(8), 1.0, 1.0);
    let mut p = plan(2);
    let v = |buf: &Buffer, off| buf.view(off, 8).expect("view");
    let w0 = p.exec(&k8, &[&v(&a, 0), &v(&b, 0)], &[]).expect("record"); // reads a[0..8], writes b[0..8]
    let raw = p.exec(&k8, &[&v(&b, 4), &v(&a, 16)], &[]).expect("record"); // reads b[4..12]
    let war = p.exec(&k8, &[&v(&b, 16), &v(&a, 0)], &[]).expect("record"); // writes a[0..8]
    let waw = p.exec(&k8, &[&v(&b, 24), &v(&a, 20)], &[]).expect("record"); // writes a[20..28]
    let free = p.exec(&k8, &[&v(&b, 24), &v(&a, 8)], &[]).expect("record"); // a[8..16]: untouched
    let dep = |n: usize| p.dependencies(n).to_vec();
    assert!(dep(w0).is_empty());
    assert_eq!(dep(raw), vec![Dependency { node: w0, hazard: Hazard::ReadAfterWrite }]);
    assert_eq!(dep(war), vec![Dependency { node: w0, hazard: Hazard::WriteAfterRead }]);
    assert_eq!(dep(waw), vec![Dependency { node: raw, hazard: Hazard::WriteAfterWrite }]);
    assert!(dep(free).is_empty(), "disjoint views of the same buffers: no edge");
}

#[test]
fn recording_checks_arguments() {
    let alloc = HostAllocator::shared();
    let a = filled(&alloc, 8, 0.0);
    let small = filled(&alloc, 4, 0.0);
    let mut p = plan(2);
    let k = affine(None, 1.0, 0.0);
    assert!(matches!(p.exec(&k, &[&a, &small], &[("n", 8)]), Err(Error::Launch(_))), "buffer too small");
    assert!(matches!(p.exec(&k, &[&a, &a], &[]), Err(Error::Ir(_))), "missing variable");
    assert!(matches!(p.exec(&k, &[&a, &a], &[("n", 8), ("m", 1)]), Err(Error::Launch(_))), "unknown variable");
    assert!(matches!(p.exec(&k, &[&a], &[("n", 8)]), Err(Error::Launch(_))), "missing buffer");
    p.exec(&k, &[&small, &small], &[("n", 4)]).expect("valid");
    assert!(matches!(p.exec(&k, &[&a, &a], &[("n", 8)]), Err(Error::Launch(_))), "n recorded as 4 before");
    assert!(matches!(p.copy(&a, &small), Err(Error::Buffer(_))), "size mismatch");
    assert!(matches!(p.copy(&a.view(0, 4).expect("view"), &a.view(2, 4).expect("view")), Err(Error::Buffer(_))));
    let mut foreign_spec = (*affine_spec(Some(8))).clone();
    foreign_spec.device = DeviceSpec::new("OPENCL", 0);
    let foreign = Kernel::new(Arc::new(foreign_spec), Arc::new(AffineProgram { mul: 1.0, add: 0.0 }));
    assert!(matches!(p.exec(&foreign, &[&a, &a], &[]), Err(Error::Launch(m)) if m.contains("OPENCL")));
    assert_eq!(p.len(), 1, "failed recordings add nothing");
    assert!(matches!(p.run(&[("m", 3)]), Err(Error::Launch(_))), "unknown plan variable");
}

/// Shares `out[i] = f(in[i])` kernels by (length, mul, add) so a random plan reuses them.
#[derive(Default)]
struct Kernels(HashMap<(usize, u32, u32), Kernel>);

impl Kernels {
    fn get(&mut self, len: usize, mul: f32, add: f32) -> Kernel {
        self.0.entry((len, mul.to_bits(), add.to_bits())).or_insert_with(|| affine(Some(len), mul, add)).clone()
    }
}

/// One recorded operation of a random plan: `dst[..len] = f(src[..len])` or a copy, over
/// views at element offsets of three shared allocations.
#[derive(Clone, Debug)]
struct Op {
    copy: bool,
    src: (usize, usize),
    dst: (usize, usize),
    len: usize,
    mul: f32,
    add: f32,
}

const LEN: usize = 48;

fn op_strategy() -> impl Strategy<Value = Op> {
    (0u8..10, 0usize..3, 0usize..LEN, 0usize..3, 0usize..LEN, 1usize..12, 0usize..4, 0usize..3).prop_map(
        |(kind, sa, so, da, dof, len, m, a)| {
            let len = len.min(LEN);
            let (so, mut dof) = (so.min(LEN - len), dof.min(LEN - len));
            let mut da = da;
            // A kernel's or copy's input and output never overlap (their order inside one
            // launch is the backend's business): move the output to the next allocation.
            if sa == da && so < dof + len && dof < so + len {
                da = (da + 1) % 3;
                dof = dof.min(LEN - len);
            }
            Op {
                copy: kind >= 8,
                src: (sa, so),
                dst: (da, dof),
                len,
                mul: [0.5, 1.0, -1.0, 2.0][m],
                add: [0.0, 1.0, 0.25][a],
            }
        },
    )
}

/// Applies `ops` serially (Kernel::launch and Buffer::copy_from in recording order).
fn serial(ops: &[Op], bufs: &[Buffer], kernels: &mut Kernels) -> Result<()> {
    for op in ops {
        let src = bufs[op.src.0].view(op.src.1, op.len)?;
        let dst = bufs[op.dst.0].view(op.dst.1, op.len)?;
        if op.copy {
            dst.copy_from(&src)?;
        } else {
            kernels.get(op.len, op.mul, op.add).launch(&[&src, &dst], &[])?;
        }
    }
    Ok(())
}

fn record(ops: &[Op], bufs: &[Buffer], kernels: &mut Kernels, p: &mut ExecutionPlan) -> Result<()> {
    for op in ops {
        let src = bufs[op.src.0].view(op.src.1, op.len)?;
        let dst = bufs[op.dst.0].view(op.dst.1, op.len)?;
        if op.copy {
            p.copy(&dst, &src)?;
        } else {
            p.exec(&kernels.get(op.len, op.mul, op.add), &[&src, &dst], &[])?;
        }
    }
    Ok(())
}

fn contents(bufs: &[Buffer]) -> Vec<Vec<u32>> {
    bufs.iter().map(|b| b.to_vec::<f32>().expect("read back").iter().map(|v| v.to_bits()).collect()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A random DAG over overlapping views gives bit-identical results to serial execution,
    /// on the first run and on a replay (which applies every node a second time).
    #[test]
    fn plan_equals_serial_execution(
        ops in proptest::collection::vec(op_strategy(), 1..40),
        queues in 1usize..4,
        fuse in proptest::bool::ANY,
    ) {
        let alloc = HostAllocator::shared();
        let mut kernels = Kernels::default();
        let make = || -> Vec<Buffer> { (0..3).map(|i| filled(&alloc, LEN, i as f32 * 100.0)).collect() };
        let (expected, actual) = (make(), make());
        let mut p = plan_with(queues, fuse);
        record(&ops, &actual, &mut kernels, &mut p).expect("record");
        for _ in 0..2 {
            serial(&ops, &expected, &mut kernels).expect("serial");
            p.run(&[]).expect("plan run");
            prop_assert_eq!(contents(&expected), contents(&actual));
        }
    }
}

#[test]
fn replay_uses_new_variable_values() {
    let alloc = HostAllocator::shared();
    let x = filled(&alloc, 64, 1.0);
    let y = Buffer::new(alloc.clone(), Scalar::F32, 64).expect("buffer");
    let z = Buffer::new(alloc.clone(), Scalar::F32, 64).expect("buffer");
    let k = affine(None, 2.0, 0.0);
    let mut p = plan(2);
    p.exec(&k, &[&x, &y], &[("n", 64)]).expect("record");
    p.exec(&k, &[&y, &z], &[("n", 64)]).expect("record");
    assert_eq!(p.var_names(), ["n".to_string()]);
    let xs = x.to_vec::<f32>().expect("read");
    p.run(&[]).expect("run with the recorded n");
    assert_eq!(z.to_vec::<f32>().expect("read"), xs.iter().map(|v| v * 4.0).collect::<Vec<_>>());

    // Clear, then replay over the first 16 elements only.
    y.copy_from_slice(&[0.0f32; 64]).expect("clear");
    z.copy_from_slice(&[0.0f32; 64]).expect("clear");
    p.run(&[("n", 16)]).expect("run with n = 16");
    let got = z.to_vec::<f32>().expect("read");
    assert_eq!(&got[..16], &xs[..16].iter().map(|v| v * 4.0).collect::<Vec<_>>()[..]);
    assert!(got[16..].iter().all(|&v| v == 0.0), "elements past n are untouched");
    p.run_vals(&[32]).expect("positional values");
    assert_eq!(z.to_vec::<f32>().expect("read")[16..32], xs[16..32].iter().map(|v| v * 4.0).collect::<Vec<_>>()[..]);
}

#[test]
fn a_variable_out_of_range_fails_before_anything_runs() {
    let alloc = HostAllocator::shared();
    let x = filled(&alloc, 64, 1.0);
    let y = Buffer::new(alloc.clone(), Scalar::F32, 64).expect("buffer");
    let k = affine(None, 2.0, 0.0);
    let mut p = plan(2);
    p.exec(&k, &[&x, &y], &[("n", 64)]).expect("record");
    let err = p.run(&[("n", 5000)]).expect_err("n is above its bound");
    assert!(matches!(err, Error::Ir(kiln_device::kiln_ir::IrError::VarOutOfRange { value: 5000, .. })), "{err}");
    // Within the variable's bounds but beyond the buffers: the size check refuses it.
    let err = p.run(&[("n", 65)]).expect_err("buffers hold 64");
    assert!(matches!(&err, Error::Launch(m) if m.contains("node 0")), "{err}");
    assert!(y.to_vec::<f32>().expect("read").iter().all(|&v| v == 0.0), "nothing ran");
    p.run(&[]).expect("the plan still runs with good values");
    assert_eq!(y.to_vec::<f32>().expect("read")[0], 2.0);
}

#[test]
fn submitted_runs_never_overlap() {
    let alloc = HostAllocator::shared();
    let x = filled(&alloc, 256, 0.0);
    let y = Buffer::new(alloc.clone(), Scalar::F32, 256).expect("buffer");
    let k = affine(Some(256), 1.0, 1.0);
    let mut p = plan(2);
    p.exec(&k, &[&x, &y], &[]).expect("record");
    p.exec(&k, &[&y, &x], &[]).expect("record"); // x += 2 per run
    p.submit(&[]).expect("submit").wait().expect("wait");
    // A leaked handle: the next run still waits for this one before it submits.
    std::mem::forget(p.submit(&[]).expect("submit"));
    drop(p.submit(&[]).expect("submit")); // dropping waits
    p.run(&[]).expect("run");
    let want: Vec<f32> = (0..256).map(|i| i as f32 * 0.25 + 8.0).collect();
    assert_eq!(x.to_vec::<f32>().expect("read"), want);
}

/// Fails while `armed` is set, else behaves like [`AffineProgram`].
struct FlakyProgram {
    armed: std::sync::atomic::AtomicBool,
}

impl Program for FlakyProgram {
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()> {
        if self.armed.load(Ordering::Acquire) {
            return Err(Error::driver("mock", "the kernel trapped"));
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { AffineProgram { mul: 1.0, add: 1.0 }.execute(bufs, vals, launch) }
    }

    fn name(&self) -> &str {
        "flaky"
    }
}

#[test]
fn a_failing_node_fails_the_run_and_nothing_hangs() {
    let alloc = HostAllocator::shared();
    let bufs: Vec<Buffer> = (0..5).map(|i| filled(&alloc, 8, i as f32)).collect();
    let flaky = Arc::new(FlakyProgram { armed: true.into() });
    let bad = Kernel::new(affine_spec(Some(8)), flaky.clone());
    let ok = affine(Some(8), 1.0, 1.0);
    let mut p = plan(2);
    // Branch A: bad (0 → 1), then 1 → 2. Branch B: 3 → 4. Join: 2 and 4 → 0 (via two nodes).
    p.exec(&bad, &[&bufs[0], &bufs[1]], &[]).expect("record");
    p.exec(&ok, &[&bufs[1], &bufs[2]], &[]).expect("record");
    p.exec(&ok, &[&bufs[3], &bufs[4]], &[]).expect("record");
    p.exec(&ok, &[&bufs[4], &bufs[0]], &[]).expect("record");
    p.exec(&ok, &[&bufs[2], &bufs[3]], &[]).expect("record");
    let queues = p.queue_assignment().expect("schedule");
    assert_ne!(queues[0], queues[2], "the branches run on different queues");
    let mut timeline = p.timeline().to_vec();
    for _ in 0..2 {
        let err = p.run(&[]).expect_err("the flaky node fails");
        let pairs = || p.timeline().iter().zip(&timeline);
        assert!(pairs().all(|(now, before)| now >= before) && pairs().any(|(now, before)| now > before));
        timeline = p.timeline().to_vec();
        assert!(
            matches!(&err, Error::Driver { backend: "mock", message, .. } if message == "the kernel trapped"),
            "{err}"
        );
    }
    // Disarmed, the same plan runs to completion on fresh signals.
    flaky.armed.store(false, Ordering::Release);
    for (i, b) in bufs.iter().enumerate() {
        b.copy_from_slice(&(0..8).map(|j| i as f32 + j as f32 * 0.25).collect::<Vec<_>>()).expect("reset");
    }
    p.run(&[]).expect("runs after failures");
    assert!(p.timeline().iter().zip(&timeline).all(|(now, before)| now >= before), "values never go back");
    assert_eq!(bufs[2].to_vec::<f32>().expect("read")[0], 2.0, "0 → +1 → +1");

    // A node that always fails, alone on its queue, with a dependent on another queue.
    let mut p = plan(2);
    p.exec(&failing(8), &[&bufs[0], &bufs[1]], &[]).expect("record");
    p.exec(&ok, &[&bufs[3], &bufs[4]], &[]).expect("record");
    p.exec(&ok, &[&bufs[1], &bufs[2]], &[]).expect("record");
    assert!(matches!(p.run(&[]), Err(Error::Driver { .. })));
}

#[test]
fn copies_are_ordered_with_kernels() {
    let alloc = HostAllocator::shared();
    let a = filled(&alloc, 16, 1.0);
    let b = Buffer::new(alloc.clone(), Scalar::F32, 16).expect("buffer");
    let c = Buffer::new(alloc.clone(), Scalar::F32, 16).expect("buffer");
    let k = affine(Some(16), 3.0, 0.0);
    let mut p = plan(2);
    p.exec(&k, &[&a, &b], &[]).expect("record");
    p.copy(&c, &b).expect("record");
    p.exec(&k, &[&c, &a], &[]).expect("record"); // a = 9 * a: after the copy read c
    p.run(&[]).expect("run");
    let a0: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 * 0.25).collect();
    assert_eq!(c.to_vec::<f32>().expect("read"), a0.iter().map(|v| v * 3.0).collect::<Vec<_>>());
    assert_eq!(a.to_vec::<f32>().expect("read"), a0.iter().map(|v| v * 9.0).collect::<Vec<_>>());
}

#[test]
fn profile_of_two_branches_uses_two_queues() {
    let alloc = HostAllocator::shared();
    let bufs: Vec<Buffer> = (0..4).map(|i| filled(&alloc, 1024, i as f32)).collect();
    let k = affine(Some(1024), 1.0, 1.0);
    let mut p = plan(2);
    // Branch A ping-pongs between buffers 0 and 1, branch B between 2 and 3.
    for step in 0..3 {
        let (s, d) = if step % 2 == 0 { (0, 1) } else { (1, 0) };
        p.exec(&k, &[&bufs[s], &bufs[d]], &[]).expect("record");
        p.exec(&k, &[&bufs[s + 2], &bufs[d + 2]], &[]).expect("record");
    }
    p.copy(&bufs[0], &bufs[3]).expect("record");
    let profile = p.run_profiled(&[]).expect("profiled run");
    assert_eq!(profile.events.len(), p.len(), "one slice per node");
    let queue_of = |node: usize| profile.events.iter().find(|e| e.node == node).map(|e| e.queue);
    let (a, b) = (queue_of(0).expect("node 0"), queue_of(1).expect("node 1"));
    assert_ne!(a, b, "independent branches on different queues");
    for node in (0..6).step_by(2) {
        assert_eq!(queue_of(node), Some(a));
        assert_eq!(queue_of(node + 1), Some(b));
    }
    assert!(profile.events.iter().all(|e| e.start <= e.end && e.end <= profile.wall + Duration::from_millis(1)));
    assert!(profile.events.iter().any(|e| e.name == "copy"));

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("trace.json");
    profile.write_chrome_trace(&path).expect("write trace");
    let json = std::fs::read_to_string(&path).expect("read trace");
    assert!(json.trim_start().starts_with("{\"traceEvents\":["));
    assert_eq!(json.matches("\"ph\":\"X\"").count(), p.len());
    assert!(json.contains(&format!("\"ph\":\"X\",\"pid\":0,\"tid\":{a},")));
    assert!(json.contains(&format!("\"ph\":\"X\",\"pid\":0,\"tid\":{b},")));
    assert_eq!(json.matches('{').count(), json.matches('}').count());
    assert_eq!(json.matches('[').count(), json.matches(']').count());
    // Profiling leaves the plan's results right: a plain run after it still works.
    p.run(&[]).expect("plain run after profiling");
}

/// The same checks with kernels compiled by the CPU backend (skipped, with a note, when
/// no C compiler is installed).
mod cpu_backend {
    use super::*;
    use kiln_device::kiln_ir::UOp;

    /// The CPU device with its queues.
    fn device() -> Option<Arc<Device>> {
        let d = match kiln_cpu::open(&DeviceSpec::new("CPU", 0)) {
            Ok(d) => d,
            Err(Error::CompilerMissing(m)) => {
                eprintln!("skipping: no C compiler ({m})");
                return None;
            }
            Err(e) => panic!("the CPU device does not open: {e}"),
        };
        assert!(d.queues().is_some(), "the CPU device has queues");
        Some(d)
    }

    /// `y[i] = x[i] * mul + add` for `i < n`.
    pub(super) fn scale(mul: f32, add: f32) -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 16);
        let x = k.param(0, Scalar::F32, &n);
        let y = k.param(1, Scalar::F32, &n);
        let i = k.global(0, &n);
        k.store(&y.at(&i), &(x.at(&i).load() * mul + add));
        k.finish().expect("valid kernel")
    }

    /// `c[i] = a[i] + b[i]` for `i < n`.
    fn add() -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 16);
        let a = k.param(0, Scalar::F32, &n);
        let b = k.param(1, Scalar::F32, &n);
        let c = k.param(2, Scalar::F32, &n);
        let i = k.global(0, &n);
        k.store(&c.at(&i), &(a.at(&i).load() + b.at(&i).load()));
        k.finish().expect("valid kernel")
    }

    #[test]
    fn compiled_branches_join_and_replay() {
        let Some(dev) = device() else { return };
        let double = dev.compile(&scale(2.0, 0.0), Some("double")).expect("compile");
        let inc = dev.compile(&scale(1.0, 1.0), Some("inc")).expect("compile");
        let sum = dev.compile(&add(), Some("sum")).expect("compile");
        const N: usize = 256;
        let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let make = || -> Vec<Buffer> {
            let mut v = vec![Buffer::from_slice(dev.allocator(), &x).expect("buffer")];
            v.extend((0..5).map(|_| dev.buffer(Scalar::F32, N).expect("buffer")));
            v
        };
        // b1 = 2·b0 → b2 = b1 + 1  |  b3 = b0 + 1 → b4 = 2·b3  |  b5 = b2 + b4; b0 = b5 + 1 (WAR on b0).
        let steps: Vec<(&Kernel, Vec<usize>)> = vec![
            (&double, vec![0, 1]),
            (&inc, vec![1, 2]),
            (&inc, vec![0, 3]),
            (&double, vec![3, 4]),
            (&sum, vec![2, 4, 5]),
            (&inc, vec![5, 0]),
        ];
        let (expected, actual) = (make(), make());
        let mut p = ExecutionPlan::with_options(&dev, PlanOptions { compute_queues: 2, ..PlanOptions::default() })
            .expect("plan");
        for (k, slots) in &steps {
            let bufs: Vec<&Buffer> = slots.iter().map(|&s| &actual[s]).collect();
            p.exec(k, &bufs, &[("n", N as i64)]).expect("record");
        }
        let q = p.queue_assignment().expect("schedule");
        assert_ne!(q[0], q[2], "independent branches on different queues");
        for n in [N, N, 100] {
            for (k, slots) in &steps {
                let bufs: Vec<&Buffer> = slots.iter().map(|&s| &expected[s]).collect();
                k.launch(&bufs, &[n as i64]).expect("serial");
            }
            p.run(&[("n", n as i64)]).expect("plan run");
            for (e, a) in expected.iter().zip(&actual) {
                assert_eq!(e.to_vec::<f32>().expect("read"), a.to_vec::<f32>().expect("read"), "n = {n}");
            }
        }
    }

    #[test]
    fn exec_many_compiles_the_plans_kernels_once_each_and_records_them_in_order() {
        let Some(dev) = device() else { return };
        let (triple, dec) = (scale(3.0, 0.5), scale(1.0, -1.0));
        const N: usize = 64;
        let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let bufs: Vec<Buffer> = (0..4).map(|_| Buffer::from_slice(dev.allocator(), &x).expect("buffer")).collect();
        let vars = [("n", N as i64)];
        fn launch<'a>(
            sink: &'a Arc<UOp>,
            name: &'a str,
            bufs: &'a [&'a Buffer],
            vars: &'a [(&'a str, i64)],
        ) -> KernelLaunch<'a> {
            KernelLaunch { sink, name: Some(name), bufs, vars }
        }
        let slots = |a: usize, b: usize| [&bufs[a], &bufs[b]];
        let (s01, s12, s23) = (slots(0, 1), slots(1, 2), slots(2, 3));
        let mut p = ExecutionPlan::new(&dev).expect("plan");
        let before = dev.cache().stats();
        // b1 = 3·b0 + 0.5 → b2 = b1 - 1 → b3 = 3·b2 + 0.5: `triple` is launched twice.
        let nodes = p
            .exec_many(
                &dev,
                &[
                    launch(&triple, "triple", &s01, &vars),
                    launch(&dec, "dec", &s12, &vars),
                    launch(&triple, "triple", &s23, &vars),
                ],
            )
            .expect("record");
        assert_eq!(nodes, [0, 1, 2]);
        let after = dev.cache().stats();
        // This device's memory cache was empty: each distinct kernel came from below it once.
        assert_eq!((after.misses + after.disk_hits) - (before.misses + before.disk_hits), 2);
        p.run(&[]).expect("plan run");
        let want: Vec<f32> = x.iter().map(|v| ((v * 3.0 + 0.5) - 1.0) * 3.0 + 0.5).collect();
        assert_eq!(bufs[3].to_vec::<f32>().expect("read"), want);

        // A kernel that does not compile fails the batch before anything is recorded.
        let mut k = KernelBuilder::new();
        let out = k.param(0, Scalar::F32, 4);
        let i = k.special("gidx7", 4);
        k.store(&out.at(&i), &(out.at(&i).load() + 1.0));
        let bad = k.finish().expect("valid graph");
        let mut q = ExecutionPlan::new(&dev).expect("plan");
        let s0 = [&bufs[0]];
        let err = q.exec_many(&dev, &[launch(&dec, "dec", &s01, &vars), launch(&bad, "bad", &s0, &[])]).unwrap_err();
        assert!(matches!(&err, Error::Render(m) if m.contains("gidx7")), "{err}");
        assert!(q.is_empty());
    }

    #[test]
    fn compiled_profile_shows_both_branches() {
        let Some(dev) = device() else { return };
        let k = dev.compile(&scale(0.5, 1.0), Some("halve_inc")).expect("compile");
        let bufs: Vec<Buffer> = (0..4).map(|_| dev.buffer(Scalar::F32, 4096).expect("buffer")).collect();
        let mut p = ExecutionPlan::with_options(&dev, PlanOptions { compute_queues: 2, ..PlanOptions::default() })
            .expect("plan");
        for step in 0..4 {
            let (s, d) = if step % 2 == 0 { (0, 1) } else { (1, 0) };
            p.exec(&k, &[&bufs[s], &bufs[d]], &[("n", 4096)]).expect("record");
            p.exec(&k, &[&bufs[s + 2], &bufs[d + 2]], &[("n", 4096)]).expect("record");
        }
        let profile = p.run_profiled(&[]).expect("profiled run");
        assert_eq!(profile.events.len(), 8);
        let tids: std::collections::BTreeSet<usize> = profile.events.iter().map(|e| e.queue).collect();
        assert_eq!(tids.len(), 2, "two branches, two queues");
        assert!(profile.events.iter().all(|e| e.name == "halve_inc"));
        let json = profile.to_chrome_trace();
        assert_eq!(json.matches("\"ph\":\"X\"").count(), 8);
        for tid in tids {
            assert!(json.contains(&format!("\"tid\":{tid},\"ts\"")));
        }
    }
}

/// A plan on an OpenCL device's queues (skipped when no OpenCL device is present): device
/// memory, native enqueues, signals as marker events.
mod opencl_backend {
    use super::*;

    #[test]
    fn branches_copies_and_replay_match_serial() {
        let dev = match kiln_opencl::open(&DeviceSpec::new("OPENCL", 0)) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipping: no OpenCL device ({e})");
                return;
            }
        };
        let k =
            |mul: f32, add: f32, name: &str| dev.compile(&cpu_backend::scale(mul, add), Some(name)).expect("compile");
        let (double, inc) = (k(2.0, 0.0, "double"), k(1.0, 1.0, "inc"));
        const N: usize = 128;
        let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let make =
            || -> Vec<Buffer> { (0..4).map(|_| Buffer::from_slice(dev.allocator(), &x).expect("buffer")).collect() };
        let (expected, actual) = (make(), make());
        let mut p = ExecutionPlan::with_options(&dev, PlanOptions { compute_queues: 2, ..PlanOptions::default() })
            .expect("plan");
        // 0 → 1 (double), 2 → 3 (inc) in parallel; then 1 copied into 2 (after inc read 2).
        p.exec(&double, &[&actual[0], &actual[1]], &[("n", N as i64)]).expect("record");
        p.exec(&inc, &[&actual[2], &actual[3]], &[("n", N as i64)]).expect("record");
        p.copy(&actual[2], &actual[1]).expect("record");
        p.exec(&inc, &[&actual[2], &actual[0]], &[("n", N as i64)]).expect("record");
        for n in [N, 64] {
            double.launch(&[&expected[0], &expected[1]], &[n as i64]).expect("serial");
            inc.launch(&[&expected[2], &expected[3]], &[n as i64]).expect("serial");
            expected[2].copy_from(&expected[1]).expect("serial");
            inc.launch(&[&expected[2], &expected[0]], &[n as i64]).expect("serial");
            p.run(&[("n", n as i64)]).expect("plan run");
            for (e, a) in expected.iter().zip(&actual) {
                assert_eq!(e.to_vec::<f32>().expect("read"), a.to_vec::<f32>().expect("read"), "n = {n}");
            }
        }
        // Every node, kernels and the device copy, carries the device's own times.
        let profile = p.run_profiled(&[]).expect("profiled run");
        let mut nodes: Vec<usize> = profile.events.iter().map(|e| e.node).collect();
        nodes.sort_unstable();
        assert_eq!(nodes, (0..p.len()).collect::<Vec<_>>(), "{profile:?}");
        assert!(profile.events.iter().all(|e| e.start <= e.end && e.end <= profile.wall + Duration::from_millis(1)));
        assert_eq!(profile.events.iter().filter(|e| e.name == "copy").count(), 1);
        let queues = p.queue_assignment().expect("schedule");
        assert!(profile.events.iter().all(|e| e.queue == queues[e.node]));
    }
}

mod graph_replay;
mod rebind;

/// Two ends of an in-process channel, as plan nodes take them.
fn channel_pair(timeout: Duration) -> Vec<Arc<dyn kiln_device::Channel>> {
    let ends = kiln_device::LocalChannel::world_with_timeout(2, timeout).expect("channel");
    ends.into_iter().map(|c| c as Arc<dyn kiln_device::Channel>).collect()
}

#[test]
fn collectives_of_one_channel_keep_their_order_and_kernels_wait_for_them() {
    let alloc = HostAllocator::shared();
    let chans = channel_pair(Duration::from_secs(60));
    let (a, b) = (filled(&alloc, 8, 1.0), filled(&alloc, 8, 1.0));
    let mut p = plan(4);
    let first = p.all_reduce(&chans[0], &a, &a, ReduceOp::Sum).expect("record");
    let second = p.broadcast(&chans[0], &b, 1).expect("record");
    let out = filled(&alloc, 8, 0.0);
    let after = p.exec(&affine(Some(8), 2.0, 1.0), &[&a, &out], &[]).expect("record");
    assert_eq!(p.dependencies(second), [Dependency { node: first, hazard: Hazard::WriteAfterWrite }]);
    assert_eq!(p.dependencies(after), [Dependency { node: first, hazard: Hazard::ReadAfterWrite }]);
    let mut peer = plan(4);
    let (c, d) = (filled(&alloc, 8, 10.0), filled(&alloc, 8, 7.0));
    peer.all_reduce(&chans[1], &c, &c, ReduceOp::Sum).expect("record");
    peer.broadcast(&chans[1], &d, 1).expect("record");
    let run = peer.submit(&[]).expect("submit");
    p.run(&[]).expect("rank 0");
    run.wait().expect("rank 1");
    let sum: Vec<f32> = (0..8).map(|i| 11.0 + i as f32 * 0.5).collect();
    assert_eq!(a.to_vec::<f32>().unwrap(), sum);
    assert_eq!(c.to_vec::<f32>().unwrap(), sum);
    assert_eq!(b.to_vec::<f32>().unwrap(), d.to_vec::<f32>().unwrap(), "rank 1's buffer reached rank 0");
    assert_eq!(out.to_vec::<f32>().unwrap(), sum.iter().map(|x| x * 2.0 + 1.0).collect::<Vec<_>>());
}

#[test]
fn a_rank_whose_plan_fails_before_a_collective_releases_its_peers_at_once() {
    let alloc = HostAllocator::shared();
    let chans = channel_pair(Duration::from_secs(600));
    let (a, b) = (filled(&alloc, 8, 0.0), filled(&alloc, 8, 0.0));
    let mut failing_rank = plan(1);
    failing_rank.exec(&failing(8), &[&a, &a], &[]).expect("record");
    failing_rank.all_reduce(&chans[1], &a, &a, ReduceOp::Sum).expect("record");
    let mut waiting_rank = plan(1);
    waiting_rank.all_reduce(&chans[0], &b, &b, ReduceOp::Sum).expect("record");
    let run = waiting_rank.submit(&[]).expect("submit");
    assert!(failing_rank.run(&[]).is_err(), "the failing kernel fails its own plan");
    // Without `leave`, this would wait the channel's 600 s timeout.
    let e = run.wait().expect_err("the peer left");
    assert!(matches!(e.root_cause(), Error::Channel { message, .. } if message.contains("rank 1 left")), "{e}");
}

#[test]
fn a_rank_whose_run_is_refused_before_anything_is_queued_releases_its_peers_at_once() {
    // Refused for the run's values (a buffer too small for `n`), and for a name that is no
    // plan variable: neither queues anything, and each must still tell the peer at once.
    let refusals: [&[(&str, i64)]; 2] = [&[("n", 65)], &[("m", 1)]];
    for vars in refusals {
        let alloc = HostAllocator::shared();
        let chans = channel_pair(Duration::from_secs(30));
        let (x, y) = (filled(&alloc, 64, 1.0), filled(&alloc, 64, 0.0));
        let mut refused_rank = plan(1);
        refused_rank.exec(&affine(None, 2.0, 0.0), &[&x, &y], &[("n", 64)]).expect("record");
        refused_rank.all_reduce(&chans[1], &y, &y, ReduceOp::Sum).expect("record");
        let b = filled(&alloc, 64, 0.0);
        let mut waiting_rank = plan(1);
        waiting_rank.all_reduce(&chans[0], &b, &b, ReduceOp::Sum).expect("record");
        let start = Instant::now();
        let run = waiting_rank.submit(&[]).expect("submit");
        let refused = refused_rank.run(vars).expect_err("refused before anything is queued");
        assert!(matches!(refused, Error::Launch(_)), "{refused}");
        let e = run.wait().expect_err("the peer left");
        // Without the leave, the peer waits the channel's 30 s.
        assert!(start.elapsed() < Duration::from_secs(10), "the peer waited {:?}", start.elapsed());
        assert!(matches!(e.root_cause(), Error::Channel { message, .. } if message.contains("rank 1 left")), "{e}");
    }
}

#[test]
fn a_peer_missing_past_the_plans_timeout_is_a_channel_error_and_a_replay_fails_at_once() {
    // The plan's timeout (150 ms) is far shorter than the channel's (30 s): the collective
    // gives up with the plan, and the run reports the channel error every time (the queue
    // wait and the collective time out together: the run must not report whichever came
    // first). The immediate replay meets the broken channel, not its predecessor's collective.
    for attempt in 0..5 {
        let alloc = HostAllocator::shared();
        let chans = channel_pair(Duration::from_secs(30));
        let b = filled(&alloc, 8, 0.0);
        let options = PlanOptions { timeout: Duration::from_millis(150), ..PlanOptions::default() };
        let mut lonely = ExecutionPlan::on_queues(queue_factory(), options);
        lonely.all_reduce(&chans[0], &b, &b, ReduceOp::Sum).expect("record");
        let start = Instant::now();
        let e = lonely.run(&[]).expect_err("rank 1 never runs");
        assert!(start.elapsed() < Duration::from_secs(10), "attempt {attempt}: waited {:?}", start.elapsed());
        assert!(matches!(e.root_cause(), Error::Channel { .. }), "attempt {attempt}: {e}");
        let again = lonely.run(&[]).expect_err("the channel is broken");
        assert!(matches!(&again, Error::Channel { .. }), "attempt {attempt}: the replay gave {again}");
        assert_eq!(again.to_string(), e.root_cause().to_string(), "attempt {attempt}");
    }
}
