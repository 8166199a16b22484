//! A loaded OpenCL kernel.
//!
//! Argument ABI (the renderer emits exactly this signature): for every buffer slot in
//! `ProgramSpec::globals` order, `__global T* dataN_base, ulong dataN_off` (the view's
//! byte offset into its `cl_mem`, so views need no sub-buffers and no base-address
//! alignment); then every variable in `var_names` order, as its own integer type.
//!
//! A `cl_kernel`'s arguments are per-object state, so concurrent launches must not share
//! one: each launch takes a kernel object from a pool (creating one when the pool is
//! empty), sets its arguments, enqueues it and puts it back. OpenCL captures argument
//! values at enqueue time, so the object can be reused as soon as the enqueue returns.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use kiln_device::kiln_ir::{Arg, DType, variables};
use kiln_device::{CompiledSpec, Error, LaunchDims, Program, RawView, Result};
use opencl3::command_queue::enqueue_nd_range_kernel;
use opencl3::kernel::Kernel;
use opencl3::program::Program as ClProgram;
use opencl3::types::{cl_command_queue, cl_event, cl_mem, cl_ulong};

use crate::allocator::mem;
use crate::compiler::{BUILD_OPTIONS, build_source};
use crate::signal::ClEvent;
use crate::{ClDevice, driver};

/// A kernel ready to launch on one OpenCL device. `Send + Sync` and reentrant.
pub struct OpenClProgram {
    cl: Arc<ClDevice>,
    program: ClProgram,
    name: String,
    /// Idle kernel objects; see the module docs.
    pool: Mutex<Vec<Kernel>>,
    params: usize,
    /// Byte size and signedness of every variable argument, in `var_names` order.
    vars: Vec<(usize, bool)>,
    /// The largest work-group this kernel can run with on this device.
    max_group: usize,
}

impl std::fmt::Debug for OpenClProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpenClProgram({} on {})", self.name, self.cl.spec)
    }
}

impl OpenClProgram {
    /// Loads `compiled`: from its binary (`clCreateProgramWithBinary`) when it has one,
    /// otherwise by building its source.
    pub fn load(cl: Arc<ClDevice>, compiled: &CompiledSpec) -> Result<OpenClProgram> {
        let program = if compiled.bytes.is_empty() {
            let src = compiled
                .src
                .as_deref()
                .ok_or_else(|| Error::Load(format!("`{}` has neither an OpenCL binary nor source", compiled.name)))?;
            build_source(&cl, src, &compiled.name)?
        } else {
            // SAFETY: the device is a member of the context (the context was created from it).
            let mut p = unsafe { ClProgram::create_from_binary(cl.context(), &[cl.device_id()], &[&compiled.bytes]) }
                .map_err(|e| {
                Error::Load(format!(
                    "{} rejected the binary of `{}` ({e}); it was built for another device or driver: \
                         clear the kernel cache entry",
                    cl.info.name.trim(),
                    compiled.name
                ))
            })?;
            p.build(&[cl.device_id()], BUILD_OPTIONS).map_err(|e| {
                let log = p.get_build_log(cl.device_id()).unwrap_or_default();
                Error::Load(format!("building the binary of `{}` failed ({e}): {}", compiled.name, log.trim()))
            })?;
            p
        };
        let spec = &compiled.spec;
        let vars = variables(&spec.ast)
            .iter()
            .map(|v| match (v.arg(), v.dtype()) {
                (Arg::Var { .. }, DType::Scalar(s)) if s.is_int() => Ok((s.size(), s.is_signed())),
                (_, dt) => Err(Error::Load(format!("variable {:?} has non-integer dtype {dt}", v.arg_name()))),
            })
            .collect::<Result<Vec<_>>>()?;
        let kernel = Kernel::create(&program, &compiled.name)
            .map_err(|e| Error::Load(format!("kernel `{}` is not in the OpenCL program ({e})", compiled.name)))?;
        let max_group = kernel
            .get_work_group_size(cl.device_id())
            .map_err(|e| driver("clGetKernelWorkGroupInfo", e))?
            .min(cl.info.max_work_group_size);
        Ok(OpenClProgram {
            cl,
            program,
            name: compiled.name.clone(),
            pool: Mutex::new(vec![kernel]),
            params: spec.globals.len(),
            vars,
            max_group,
        })
    }

    pub fn device(&self) -> &Arc<ClDevice> {
        &self.cl
    }

    /// Global and local work sizes for `launch`: grouped launches run `groups × local` work
    /// items in groups of `local`; direct launches run exactly `global` items and let the
    /// driver pick the group size.
    fn work_sizes(&self, launch: &LaunchDims) -> Result<([usize; 3], Option<[usize; 3]>)> {
        let Some(local) = launch.local else { return Ok((launch.global, None)) };
        let items: usize = local.iter().product();
        if items > self.max_group {
            return Err(Error::Launch(format!(
                "`{}`: work-group of {local:?} = {items} items exceeds this kernel's limit of {} on {}",
                self.name,
                self.max_group,
                self.cl.info.name.trim()
            )));
        }
        if let Some(axis) = (0..3).find(|&a| local[a] > self.cl.info.max_work_item_sizes[a]) {
            return Err(Error::Launch(format!(
                "`{}`: local size {} on axis {axis} exceeds the device limit {}",
                self.name, local[axis], self.cl.info.max_work_item_sizes[axis]
            )));
        }
        let mut global = [1usize; 3];
        for a in 0..3 {
            global[a] = launch.global[a].checked_mul(local[a]).ok_or_else(|| {
                Error::Launch(format!(
                    "`{}`: {} groups × {} items on axis {a} overflows",
                    self.name, launch.global[a], local[a]
                ))
            })?;
        }
        Ok((global, Some(local)))
    }

    /// Sets the arguments of `kernel` for one launch.
    ///
    /// # Safety
    /// Every `bufs[i].base` is a live `cl_mem` of this device's context.
    unsafe fn set_args(&self, kernel: &Kernel, bufs: &[RawView], vals: &[i64]) -> Result<()> {
        let set = |i: usize, size: usize, value: *const c_void| -> Result<()> {
            // SAFETY: `value` points at `size` readable bytes that live across this call; the
            // argument index and size follow the ABI the renderer emits (module docs).
            unsafe { opencl3::kernel::set_kernel_arg(kernel.get(), i as u32, size, value) }
                .map_err(|e| driver(&format!("clSetKernelArg({i}) of `{}`", self.name), e))
        };
        for (slot, view) in bufs.iter().enumerate() {
            let m: cl_mem = mem(view.base);
            let off = view.offset as cl_ulong;
            set(2 * slot, size_of::<cl_mem>(), &m as *const cl_mem as *const c_void)?;
            set(2 * slot + 1, size_of::<cl_ulong>(), &off as *const cl_ulong as *const c_void)?;
        }
        for (k, (&(size, signed), &v)) in self.vars.iter().zip(vals).enumerate() {
            let bytes = int_bytes(v, size, signed)
                .ok_or_else(|| Error::Launch(format!("`{}`: value {v} does not fit variable {k}", self.name)))?;
            set(2 * bufs.len() + k, size, bytes.as_ptr() as *const c_void)?;
        }
        Ok(())
    }

    /// Enqueues one launch on `queue` after the events in `wait` and returns its event (the
    /// caller owns that reference). Does not wait; the caller keeps `bufs` alive until the
    /// event completes.
    ///
    /// # Safety
    /// As [`Program::execute`], except that the launch runs asynchronously: the memory must
    /// stay valid and unraced until the returned event completes. `queue` belongs to this
    /// program's context.
    pub unsafe fn enqueue_raw(
        &self,
        queue: cl_command_queue,
        bufs: &[RawView],
        vals: &[i64],
        launch: &LaunchDims,
        wait: &[cl_event],
    ) -> Result<cl_event> {
        if bufs.len() != self.params || vals.len() != self.vars.len() {
            return Err(Error::Launch(format!(
                "`{}` takes {} buffer(s) and {} variable(s), got {} and {}",
                self.name,
                self.params,
                self.vars.len(),
                bufs.len(),
                vals.len()
            )));
        }
        let (global, local) = self.work_sizes(launch)?;
        let kernel = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            match pool.pop() {
                Some(k) => k,
                None => Kernel::create(&self.program, &self.name).map_err(|e| driver("clCreateKernel", e))?,
            }
        };
        // SAFETY: the caller guarantees live cl_mem handles of this context.
        let result = unsafe { self.set_args(&kernel, bufs, vals) }.and_then(|()| {
            let local_ptr = local.as_ref().map_or(std::ptr::null(), |l| l.as_ptr());
            let (n, list) = if wait.is_empty() { (0, std::ptr::null()) } else { (wait.len() as u32, wait.as_ptr()) };
            // SAFETY: `global`/`local` are 3-element arrays matching work_dim 3; the wait list
            // holds `n` live events; all arguments are set.
            unsafe {
                enqueue_nd_range_kernel(queue, kernel.get(), 3, std::ptr::null(), global.as_ptr(), local_ptr, n, list)
            }
            .map_err(|e| {
                driver(&format!("clEnqueueNDRangeKernel of `{}` (global {global:?}, local {local:?})", self.name), e)
            })
        });
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(kernel);
        result
    }
}

/// `v` as a native-endian integer argument of `size` bytes, if it fits.
fn int_bytes(v: i64, size: usize, signed: bool) -> Option<Vec<u8>> {
    Some(match (size, signed) {
        (1, true) => i8::try_from(v).ok()?.to_ne_bytes().to_vec(),
        (1, false) => u8::try_from(v).ok()?.to_ne_bytes().to_vec(),
        (2, true) => i16::try_from(v).ok()?.to_ne_bytes().to_vec(),
        (2, false) => u16::try_from(v).ok()?.to_ne_bytes().to_vec(),
        (4, true) => i32::try_from(v).ok()?.to_ne_bytes().to_vec(),
        (4, false) => u32::try_from(v).ok()?.to_ne_bytes().to_vec(),
        (8, true) => v.to_ne_bytes().to_vec(),
        (8, false) => u64::try_from(v).ok()?.to_ne_bytes().to_vec(),
        _ => return None,
    })
}

impl Program for OpenClProgram {
    /// Enqueues on the device's synchronous queue and waits for completion.
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()> {
        // SAFETY: forwarded from this function's contract; we wait below, so the memory
        // outlives the launch.
        let event = unsafe { self.enqueue_raw(self.cl.sync_queue().get(), bufs, vals, launch, &[]) }?;
        let event = ClEvent::from_raw(event, self.cl.context().get());
        event.wait().map_err(|e| Error::Driver {
            backend: "OpenCL",
            code: match &e {
                Error::Driver { code, .. } => *code,
                _ => None,
            },
            fatal: e.is_fatal(),
            message: format!("kernel `{}` failed while running on {}: {e}", self.name, self.cl.info.name.trim()),
        })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::kiln_ir::{KernelBuilder, Scalar, Val};
    use kiln_device::{Buffer, Kernel as KilnKernel, ProgramSpec};

    use crate::test_device;

    const ADD: &str = "__kernel void add(__global float* b0, ulong o0, __global float* b1, ulong o1,
                                         __global float* b2, ulong o2, int n) {
        __global float* a = (__global float*)((__global uchar*)b0 + o0);
        __global float* b = (__global float*)((__global uchar*)b1 + o1);
        __global float* c = (__global float*)((__global uchar*)b2 + o2);
        int i = get_global_id(0);
        c[i] = a[i] + b[i] + (float)(n - n);
    }";

    /// A hand-written kernel over the IR of `c[i] = a[i] + b[i]` (tests the ABI, not the renderer).
    #[test]
    fn hand_written_source_runs_with_views_and_a_variable() {
        let Some(dev) = test_device() else { return };
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
        let i = k.global(0, &n);
        k.store(&c.at(&i), &(a.at(&i).load() + b.at(&i).load()));
        let sink = k.finish().unwrap();
        let spec = ProgramSpec::from_sink("add", ADD.into(), dev.spec().clone(), &sink).unwrap();
        let compiled = dev.compiler().compile(&spec).unwrap();
        assert!(!compiled.bytes.is_empty());
        let kernel = KilnKernel { spec: compiled.spec.clone(), program: (dev.runtime())(&compiled).unwrap() };
        let xs: Vec<f32> = (0..103).map(|x| x as f32).collect();
        let a = Buffer::from_slice(dev.allocator(), &xs).unwrap();
        let b = Buffer::from_slice(dev.allocator(), &xs).unwrap();
        let c = Buffer::from_slice(dev.allocator(), &[0f32; 110]).unwrap();
        // Views at element offsets 3, 1 and 5.
        let (av, bv, cv) = (a.view(3, 100).unwrap(), b.view(1, 100).unwrap(), c.view(5, 100).unwrap());
        kernel.launch(&[&av, &bv, &cv], &[100]).unwrap();
        let out = c.to_vec::<f32>().unwrap();
        for j in 0..100 {
            assert_eq!(out[5 + j], (j + 3 + j + 1) as f32);
        }
        // Reentrant: many threads launch the same program at once.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10 {
                        kernel.launch(&[&av, &bv, &cv], &[100]).unwrap();
                    }
                });
            }
        });
        assert_eq!(c.to_vec::<f32>().unwrap(), out);
    }

    #[test]
    fn build_error_carries_the_log_and_line() {
        let Some(dev) = test_device() else { return };
        let mut k = KernelBuilder::new();
        let a = k.param(0, Scalar::F32, 4);
        let i = k.global(0, 4);
        k.store(&a.at(&i), &Val::f32(1.0));
        let sink = k.finish().unwrap();
        let bad = "__kernel void bad(__global float* b0, ulong o0) {\n  int x = undefined_thing;\n}\n";
        let spec = ProgramSpec::from_sink("bad", bad.into(), dev.spec().clone(), &sink).unwrap();
        match dev.compiler().compile(&spec) {
            Err(Error::Compile { log, line, .. }) => {
                assert!(log.contains("undefined_thing"), "{log}");
                assert_eq!(line.as_deref(), Some("2: int x = undefined_thing;"));
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }

    #[test]
    fn integer_arguments_are_range_checked() {
        assert_eq!(int_bytes(5, 4, true), Some(5i32.to_ne_bytes().to_vec()));
        assert_eq!(int_bytes(-1, 4, false), None);
        assert_eq!(int_bytes(1 << 40, 4, true), None);
        assert_eq!(int_bytes(1 << 40, 8, true), Some((1i64 << 40).to_ne_bytes().to_vec()));
        assert_eq!(int_bytes(1, 3, true), None);
    }
}
