//! Allocating under an address-space limit (`ulimit -v`) is a typed out-of-memory error.
//!
//! PoCL creates a buffer's memory lazily, at the first command that uses it, and aborts the
//! process when that allocation fails; kiln must find out at `alloc`. The check runs in a
//! child process (this test binary re-executed), so an abort fails the test instead of
//! killing the test harness.

use std::process::Command;

use kiln_device::kiln_ir::{DeviceSpec, Scalar};
use kiln_device::{Buffer, Error};

/// Set in the child: run the allocation under the limit instead of spawning.
const CHILD: &str = "KILN_TEST_ADDRESS_SPACE_CHILD";
const TEST: &str = "allocation_under_an_address_space_limit_is_out_of_memory";
/// What the child prints when every check passed.
const PASSED: &str = "address-space child passed";

/// Headroom above the child's mapped size once the device is warm.
const HEADROOM: u64 = 256 << 20;

#[test]
fn allocation_under_an_address_space_limit_is_out_of_memory() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe).args(["--exact", TEST, "--nocapture"]).env(CHILD, "1").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stdout.contains("skipped:") {
        println!("{stdout}");
        return;
    }
    assert!(out.status.success() && stdout.contains(PASSED), "child: {:?}\n{stdout}\n{stderr}", out.status);
}

/// The bytes this process has mapped (`VmSize` of `/proc/self/status`).
fn mapped_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn child() {
    let spec = DeviceSpec::new("OPENCL", 0);
    let (dev, cl) = match kiln_opencl::open(&spec).and_then(|d| Ok((d, kiln_opencl::cl_device(&spec)?))) {
        Ok(d) => d,
        Err(e) => return println!("skipped: {e}"),
    };
    // Warm up: the driver's threads and first buffer exist before the limit applies.
    let warm = Buffer::from_slice(dev.allocator().clone(), &[1u8; 4096]).unwrap();
    assert_eq!(warm.to_vec::<u8>().unwrap(), [1u8; 4096]);
    let request = cl.info.max_mem_alloc_size.min(1 << 30);
    if request <= 2 * HEADROOM {
        return println!("skipped: the device allocates at most {request} B per buffer");
    }
    let limit = mapped_bytes() + HEADROOM;
    let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit reads the struct we pass; lowering the soft limit of this (child)
    // process is what the test is about.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlimit) }, 0);

    let big = dev.buffer(Scalar::U8, request as usize).unwrap();
    match big.view(0, 16).unwrap().copyin(&[7u8; 16]) {
        Err(Error::OutOfMemory { requested, .. }) => assert!(requested as u64 >= request),
        other => panic!("expected out of memory for {request} B under a {limit} B limit, got {other:?}"),
    }
    // Smaller buffers still work under the limit.
    let small = Buffer::from_slice(dev.allocator().clone(), &[3u32; 1024]).unwrap();
    assert_eq!(small.to_vec::<u32>().unwrap(), [3u32; 1024]);
    println!("{PASSED}");
}
