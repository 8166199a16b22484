//! Test doubles and kernels the unit tests of several modules share.

use std::sync::{Arc, Mutex};

use kiln_device::kiln_ir::{KernelBuilder, Scalar, UOp, Val};
use kiln_device::{Error, Kernel, LaunchDims, Program, ProgramSpec, RawView, Result};

/// `a[i] *= 2` over 8 f32s, one work item each: the smallest kernel with a load, a store and a
/// launch index.
pub(crate) fn double_in_place() -> Arc<UOp> {
    let mut b = KernelBuilder::new();
    let a = b.param(0, Scalar::F32, 8);
    let i = b.special("gidx0", 8);
    let v = a.at(&i).load();
    b.store(&a.at(&i), &(v * 2.0));
    b.finish().expect("a valid kernel")
}

/// `out[0] = Σ a[i]·b[i]` over `n` products at constant indices, summed as a balanced tree:
/// one straight-line stretch of `2n` buffer loads.
pub(crate) fn products(n: usize) -> Arc<UOp> {
    let mut k = KernelBuilder::new();
    let (a, b, out) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n), k.param(2, Scalar::F32, 1));
    let mut terms: Vec<Val> = (0..n as i64)
        .map(|i| {
            let at = Val::int(i);
            a.at(&at).load() * b.at(&at).load()
        })
        .collect();
    while terms.len() > 1 {
        let odd = (terms.len() % 2 == 1).then(|| terms[terms.len() - 1].clone());
        terms = terms.chunks_exact(2).map(|p| &p[0] + &p[1]).chain(odd).collect();
    }
    k.store(&out.at(&Val::int(0)), &terms[0]);
    k.finish().expect("a valid kernel")
}

/// What a [`MockProgram`] does when run.
#[derive(Clone)]
pub(crate) enum Behaviour {
    /// `out[i] = in[i] + 1` over the f32 buffers (slot 0 in, slot 1 out), then log `tag`.
    AddOne(u32),
    /// Fails with a launch error.
    Fail,
    /// Panics (the queue's worker must survive it).
    Panic,
}

/// A program that does what its [`Behaviour`] says, for the queue's tests.
pub(crate) struct MockProgram {
    behaviour: Behaviour,
    log: Arc<Mutex<Vec<u32>>>,
}

impl Program for MockProgram {
    unsafe fn execute(&self, bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        match self.behaviour {
            Behaviour::AddOne(tag) => {
                let n = bufs[0].bytes / 4;
                for i in 0..n {
                    // SAFETY: the queue checked both views against the kernel (f32 slots
                    // of at least `n` elements in live host memory) and orders accesses.
                    unsafe {
                        let x = (bufs[0].host_ptr() as *const f32).add(i).read_unaligned();
                        (bufs[1].host_ptr() as *mut f32).add(i).write_unaligned(x + 1.0);
                    }
                }
                self.log.lock().unwrap().push(tag);
                Ok(())
            }
            Behaviour::Fail => Err(Error::Launch("injected kernel failure".into())),
            Behaviour::Panic => panic!("injected kernel panic"),
        }
    }

    fn name(&self) -> &str {
        "add_one"
    }
}

/// `c[i] = a[i] + 1` over `n` f32 elements: [`MockProgram`]'s metadata, and a real kernel where
/// compiled.
pub(crate) fn add_one_sink() -> Arc<UOp> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 20);
    let a = k.param(0, Scalar::F32, &n);
    let c = k.param(1, Scalar::F32, &n);
    let i = k.global(0, &n);
    k.store(&c.at(&i), &(a.at(&i).load() + 1.0));
    k.finish().unwrap()
}

/// A kernel of `add_one`'s metadata whose program is a [`MockProgram`] logging to `log`.
pub(crate) fn mock_kernel(behaviour: Behaviour, log: &Arc<Mutex<Vec<u32>>>) -> Kernel {
    let spec = ProgramSpec::from_sink("add_one", String::new(), crate::CPU.clone(), &add_one_sink()).unwrap();
    Kernel::new(Arc::new(spec), Arc::new(MockProgram { behaviour, log: log.clone() }))
}
