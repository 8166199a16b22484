//! Recovery from a real sticky CUDA error, in-process (needs a GPU; skipped without one
//! unless `KILN_REQUIRE` names `cuda`).
//!
//! Its own test binary (process): the fault poisons the device's primary context, which
//! every kiln device of that ordinal in the process shares, so it must not run beside other
//! GPU tests.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use kiln_device::kiln_ir::{DeviceSpec, Scalar, parse};
use kiln_device::{Buffer, Device, Error, ErrorClass, RawPtr, RawView, Result};

/// Far above any healthy wait; bounds a hang.
const LONG: Duration = Duration::from_secs(60);
const N: usize = 64;

fn device() -> Option<Arc<Device>> {
    kiln_device::testing::or_skip("cuda", "the recovery test", kiln_cuda::open(&DeviceSpec::new("CUDA", 0)))
}

/// `c = a + b` over `N` elements on a queue of `dev`, read back.
fn workload(dev: &Device) -> Result<Vec<f32>> {
    let add = parse(include_str!("../../../examples/kernels/add.kiln"))?;
    let k = dev.compile(&add, Some("add"))?;
    let a = Buffer::from_slice(dev.allocator(), &[1.0f32; N])?;
    let b = Buffer::from_slice(dev.allocator(), &[2.0f32; N])?;
    let c = dev.buffer(Scalar::F32, N)?;
    let queues = dev.queues().ok_or_else(|| Error::Invalid("no queues".into()))?;
    let (mut q, s) = (queues.create_dyn_compute_queue()?, queues.create_dyn_signal()?);
    q.exec(&k, &[&a, &b, &c], &[N as i64]).signal(&s, 1).submit()?;
    s.wait(1, LONG)?;
    c.to_vec()
}

/// A sticky CUDA error as the device reports it.
fn sticky(e: &Error) -> bool {
    matches!(e.root_cause(), Error::Driver { backend: "CUDA", code: Some(_), fatal: true, .. })
}

/// An illegal address through the unsafe `Program::execute`: the device is marked lost, a
/// waiter parked on the device gets the typed root cause, every entry point refuses work.
/// `reset()` resets the poisoned primary context; where the driver allows the process to
/// use the device again, the same workload runs and handles of the old generation are
/// `DeviceLost`; where it does not (the H100 / CUDA 13.0 driver, see `kiln_cuda::CudaDevice`),
/// `reset()` returns the sticky error and the device stays lost with it, refusing work.
#[test]
fn a_sticky_error_loses_the_device_and_reset_recovers() {
    let Some(dev) = device() else { return };
    assert_eq!(workload(&dev).unwrap(), vec![3.0; N]);

    // Work parked on the device: a queue waiting on a signal nothing sets.
    let queues = dev.queues().unwrap();
    let (gate, done) = (queues.create_dyn_signal().unwrap(), queues.create_dyn_signal().unwrap());
    let mut parked = queues.create_dyn_compute_queue().unwrap();
    parked.wait(&gate, 1).signal(&done, 1).submit().unwrap();
    let stale = Buffer::from_slice(dev.allocator(), &[1.0f32; N]).unwrap();

    let add = parse(include_str!("../../../examples/kernels/add.kiln")).unwrap();
    let k = dev.compile(&add, Some("add")).unwrap();
    let (mut views, dims) = k.check(&[&stale, &stale, &stale], &[N as i64]).unwrap();
    views[2] = RawView { base: RawPtr(0x10 as *mut c_void), offset: 0, bytes: N * 4 };
    // SAFETY: deliberately out of bounds on the device (that is the fault under test): the
    // store goes to an unmapped device address; no host memory is involved.
    let fault = unsafe { k.execute(&views, &[N as i64], &dims) }.unwrap_err();
    assert!(sticky(&fault), "{fault}");
    println!("fault: {fault}");
    assert!(dev.is_lost());

    // The parked waiter ends with the root cause; nothing hangs.
    match done.wait(1, LONG) {
        Err(e) => match e.root_cause() {
            Error::DeviceFailed { cause, .. } => assert!(sticky(cause), "{e}"),
            other => panic!("expected DeviceFailed, got {other}"),
        },
        Ok(()) => panic!("a signal behind the fault was reached"),
    }
    assert!(matches!(stale.to_vec::<f32>(), Err(Error::DeviceFailed { .. })));
    assert!(matches!(dev.compile(&add, Some("add")), Err(Error::DeviceFailed { .. })));

    if let Err(e) = dev.reset() {
        println!("the driver refuses the device after the sticky error: {e}");
        assert!(sticky(&e), "{e}");
        assert!(dev.is_lost());
        assert!(matches!(dev.compile(&add, Some("add")), Err(Error::DeviceFailed { cause, .. }) if sticky(&cause)));
        // A new buffer is refused as soon as it needs device memory: the device is lost
        // (`DeviceFailed`) or the failed rebuild left no current generation (`DeviceLost`).
        match dev.buffer(Scalar::F32, N).and_then(|b| b.raw()) {
            Err(e) => assert_eq!(e.class(), ErrorClass::DeviceLost, "{e}"),
            Ok(_) => panic!("a lost device handed out device memory"),
        }
        return;
    }
    assert!(!dev.is_lost() && dev.generation() == 1);
    assert!(matches!(stale.to_vec::<f32>(), Err(Error::DeviceLost { minted: 0, current: 1, .. })));
    assert_eq!(workload(&dev).unwrap(), vec![3.0; N], "the same workload after the reset");
    drop((parked, gate, done, stale, k));
    assert_eq!(workload(&dev).unwrap(), vec![3.0; N], "after the old generation's objects were dropped");
}
