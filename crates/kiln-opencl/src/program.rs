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

use kiln_device::kiln_ir::{Arg, DType, Scalar, variables};
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
    /// Name and integer dtype of every variable argument, in `var_names` order.
    vars: Vec<(String, Scalar)>,
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
            build_source(&cl, &compiled.spec.src, &compiled.name)?
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
                (Arg::Var { name, .. }, DType::Scalar(s)) if s.is_int() => Ok((name.clone(), s)),
                (_, dt) => Err(Error::Load(format!(
                    "`{}`: variable `{}` has the non-integer dtype {dt}; variables must be integers",
                    compiled.name,
                    v.arg_name().unwrap_or("?")
                ))),
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

    /// Global and local work sizes for `launch`, checked against this kernel's and device's
    /// limits (see [`work_sizes`]).
    pub(crate) fn work_sizes(&self, launch: &LaunchDims) -> Result<([usize; 3], Option<[usize; 3]>)> {
        let info = &self.cl.info;
        let limits = Limits {
            max_group: self.max_group,
            max_item_sizes: info.max_work_item_sizes,
            max_size_t: info.max_size_t(),
            address_bits: info.address_bits,
        };
        work_sizes(launch, &limits)
            .map_err(|e| Error::Launch(format!("`{}` on {} ({}): {e}", self.name, self.cl.spec, info.name.trim())))
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
        for (k, ((name, dtype), &v)) in self.vars.iter().zip(vals).enumerate() {
            let bytes = int_bytes(v, *dtype).ok_or_else(|| {
                Error::Launch(format!(
                    "`{}`: variable `{name}` is bound to {v}, which does not fit its dtype {dtype}; bind a value \
                     in {dtype}'s range or declare `{name}` with a wider dtype",
                    self.name
                ))
            })?;
            set(2 * bufs.len() + k, dtype.size(), bytes.as_ptr() as *const c_void)?;
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

/// The most work-groups one launch may have. OpenCL has no query for it, and drivers count
/// groups in 32 bits: PoCL 3.1 aborts the process inside its scheduler past it, and GPU
/// drivers cap the grid lower still. Larger work belongs in several launches.
pub const MAX_WORK_GROUPS: u64 = u32::MAX as u64;

/// The limits one launch is checked against: the kernel's work-group size, the device's
/// per-axis work-item sizes and the range of its `size_t`.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_group: usize,
    max_item_sizes: [usize; 3],
    max_size_t: u64,
    address_bits: u32,
}

/// The global and local work sizes `clEnqueueNDRangeKernel` gets for `launch`, or why the
/// driver must not see it. Grouped launches run `global × local` work items in groups of
/// `local`; direct launches (`local: None`) run exactly `global` items and let the driver
/// pick the group size, possibly one item per group, so their item count is bounded by
/// [`MAX_WORK_GROUPS`]. Every size and the total item count fit the device's `size_t`.
fn work_sizes(launch: &LaunchDims, limits: &Limits) -> std::result::Result<([usize; 3], Option<[usize; 3]>), String> {
    let split = "split the work over several launches";
    if launch.global.contains(&0) || launch.local.is_some_and(|l| l.contains(&0)) {
        return Err(format!("launch {launch:?} has an empty dimension; every size must be at least 1"));
    }
    let count = |sizes: &[usize; 3], what: &str| -> std::result::Result<u64, String> {
        sizes.iter().try_fold(1u64, |n, &s| n.checked_mul(s as u64)).filter(|&n| n <= limits.max_size_t).ok_or_else(
            || format!("{what} {sizes:?} overflow the device's {}-bit size_t; {split}", limits.address_bits),
        )
    };
    let Some(local) = launch.local else {
        let items = count(&launch.global, "the work items")?;
        if items > MAX_WORK_GROUPS {
            return Err(format!(
                "{:?} = {items} work items with a driver-chosen work-group size may need as many work-groups, \
                 more than the {MAX_WORK_GROUPS} one launch may have; use work-groups (gidx/lidx) or {split}",
                launch.global
            ));
        }
        return Ok((launch.global, None));
    };
    let items: usize = local.iter().product();
    if items > limits.max_group {
        return Err(format!(
            "a work-group of {local:?} = {items} items exceeds this kernel's limit of {}; use smaller work-groups",
            limits.max_group
        ));
    }
    if let Some(axis) = (0..3).find(|&a| local[a] > limits.max_item_sizes[a]) {
        return Err(format!(
            "local size {} on axis {axis} exceeds the device limit {} (CL_DEVICE_MAX_WORK_ITEM_SIZES {:?})",
            local[axis], limits.max_item_sizes[axis], limits.max_item_sizes
        ));
    }
    let groups = count(&launch.global, "the work-groups")?;
    if groups > MAX_WORK_GROUPS {
        return Err(format!(
            "{:?} = {groups} work-groups exceed the {MAX_WORK_GROUPS} one launch may have; use larger \
             work-groups or {split}",
            launch.global
        ));
    }
    let mut global = [1usize; 3];
    for a in 0..3 {
        global[a] = launch.global[a]
            .checked_mul(local[a])
            .ok_or_else(|| format!("{} groups × {} items on axis {a} overflow; {split}", launch.global[a], local[a]))?;
    }
    count(&global, "the work items")?;
    Ok((global, Some(local)))
}

/// `v` as a native-endian integer argument of dtype `dtype`, if it fits.
fn int_bytes(v: i64, dtype: Scalar) -> Option<Vec<u8>> {
    if !dtype.is_int() {
        return None;
    }
    Some(match (dtype.size(), dtype.is_signed()) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::kiln_ir::{KernelBuilder, Scalar, Val};
    use kiln_device::{Buffer, ProgramSpec};

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
        let kernel = dev.loader().load(compiled.spec.clone(), &compiled).unwrap();
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

    /// `idx0 < n` (× `idx1 < m` for 2-D) work items storing 1.0 into the first 4 elements.
    fn huge_launch_kernel(two_d: bool) -> String {
        let var = |name: &str| format!("%{name} = DEFINE_VAR i64 \"{name}\" 1 4611686018427387904\n");
        let mut k = var("n") + "%four = CONST i64 4\n%a = PARAM ptr<f32> 0 (%four)\n";
        k += "%i = SPECIAL i64 \"idx0\" (%n)\n%ok = CMPLT bool (%i, %four)\n%p = INDEX ptr<f32> (%a, %i)\n";
        if two_d {
            k += &var("m");
            k += "%j = SPECIAL i64 \"idx1\" (%m)\n%okj = CMPLT bool (%j, %four)\n%both = AND bool (%ok, %okj)\n";
        }
        let gate = if two_d { "%both" } else { "%ok" };
        k + &format!("%one = CONST f32 1.0\n%st = STORE void (%p, %one, {gate})\nSINK void (%st)\n")
    }

    /// Launch sizes the driver cannot run are refused before it sees them: on PoCL 3.1 a
    /// 2^48-item launch and a 2^32 × 2^32 launch aborted the process, and a 2^62 × 2^62
    /// launch (2^124 items, 0 modulo 2^64) returned without running.
    #[test]
    fn launches_past_the_device_limits_are_typed_errors() {
        let Some(dev) = test_device() else { return };
        for (vals, want) in
            [(vec![1i64 << 48], "work-groups"), (vec![1 << 32, 1 << 32], "size_t"), (vec![1 << 62, 1 << 62], "size_t")]
        {
            let two_d = vals.len() == 2;
            let sink = kiln_device::kiln_ir::parse_kernel(&huge_launch_kernel(two_d)).unwrap();
            let kernel = dev.compile(&sink, Some("huge")).unwrap();
            let a = dev.buffer(Scalar::F32, 4).unwrap();
            match kernel.launch(&[&a], &vals) {
                Err(Error::Launch(m)) => assert!(m.contains(want) && m.contains("split"), "{vals:?}: {m}"),
                other => panic!("{vals:?}: expected a launch error, got {other:?}"),
            }
            // A queue refuses the same launch when it is recorded: `submit` returns the error
            // and nothing of the batch reaches the driver, not even the valid launch before it.
            let fresh = Buffer::from_slice(dev.allocator().clone(), &[0f32; 4]).unwrap();
            let mut q = dev.queues().unwrap().create_dyn_compute_queue().unwrap();
            let small: Vec<i64> = vals.iter().map(|_| 4).collect();
            match q.exec(&kernel, &[&fresh], &small).exec(&kernel, &[&fresh], &vals).submit() {
                Err(Error::Launch(m)) => assert!(m.contains(want), "queue, {vals:?}: {m}"),
                other => panic!("queue, {vals:?}: expected a launch error, got {other:?}"),
            }
            assert_eq!(fresh.to_vec::<f32>().unwrap(), [0.0; 4], "{vals:?}: part of a refused batch ran");
            // The same kernel at a size the device can run still works.
            kernel.launch(&[&a], &vals.iter().map(|_| 4).collect::<Vec<_>>()).unwrap();
            assert_eq!(a.to_vec::<f32>().unwrap(), [1.0; 4]);
        }
    }

    #[test]
    fn work_sizes_respect_every_limit() {
        let limits =
            Limits { max_group: 256, max_item_sizes: [256, 256, 64], max_size_t: u32::MAX as u64, address_bits: 32 };
        let direct = |g: [usize; 3]| work_sizes(&LaunchDims { global: g, local: None }, &limits);
        let grouped = |g: [usize; 3], l: [usize; 3]| work_sizes(&LaunchDims { global: g, local: Some(l) }, &limits);
        assert_eq!(direct([1000, 3, 1]), Ok(([1000, 3, 1], None)));
        assert_eq!(grouped([10, 2, 1], [64, 2, 1]), Ok(([640, 4, 1], Some([64, 2, 1]))));
        let refused = |r: std::result::Result<_, String>, want: &str| {
            let m = r.unwrap_err();
            assert!(m.contains(want), "{m}");
        };
        refused(direct([1 << 31, 2, 1]), "32-bit size_t");
        refused(direct([usize::MAX, usize::MAX, 1]), "size_t");
        refused(direct([0, 1, 1]), "empty");
        refused(grouped([1, 1, 1], [0, 1, 1]), "empty");
        refused(grouped([1, 1, 1], [256, 2, 1]), "kernel's limit of 256");
        refused(grouped([1, 1, 1], [1, 1, 128]), "axis 2");
        refused(grouped([1 << 16, 1 << 16, 1], [2, 1, 1]), "size_t");
        refused(grouped([1 << 24, 1, 1], [1 << 8, 1, 1]), "size_t");
        let wide = Limits { max_size_t: u64::MAX, address_bits: 64, ..limits };
        let refused_wide = |l: LaunchDims, want: &str| {
            let m = work_sizes(&l, &wide).unwrap_err();
            assert!(m.contains(want), "{m}");
        };
        refused_wide(LaunchDims { global: [1 << 48, 1, 1], local: None }, "work-groups");
        refused_wide(LaunchDims { global: [1 << 32, 1, 1], local: Some([1, 1, 1]) }, "work-groups");
        refused_wide(LaunchDims { global: [1 << 62, 1 << 62, 1], local: None }, "64-bit size_t");
        refused_wide(LaunchDims { global: [usize::MAX, 1, 1], local: Some([2, 1, 1]) }, "work-groups");
        assert!(work_sizes(&LaunchDims { global: [u32::MAX as usize, 1, 1], local: Some([256, 1, 1]) }, &wide).is_ok());
    }

    /// A value out of its variable's dtype is refused with the variable's name, not its index.
    #[test]
    fn out_of_range_values_name_the_variable() {
        let Some(dev) = test_device() else { return };
        let mut k = KernelBuilder::new();
        let n = k.var("count", 1, 4);
        let a = k.param(0, Scalar::F32, 4);
        let i = k.global(0, 4);
        k.store_gated(&a.at(&i), &Val::f32(1.0), &i.lt(&n));
        let kernel = dev.compile(&k.finish().unwrap(), Some("named")).unwrap();
        let a = dev.buffer(Scalar::F32, 4).unwrap();
        let launch = kernel.spec.launch_dims(&[4]).unwrap();
        // SAFETY: `a` is a live buffer of this device with the kernel's 4 elements and
        // `launch` is the kernel's own; the value outside i32 is refused before anything is
        // enqueued (what this test checks), so no kernel runs with it.
        let r = unsafe { kernel.execute(&[a.raw().unwrap()], &[3_000_000_000], &launch) };
        match r {
            Err(Error::Launch(m)) => assert!(m.contains("`count`") && m.contains("i32"), "{m}"),
            other => panic!("expected a launch error, got {other:?}"),
        }
    }

    #[test]
    fn integer_arguments_are_range_checked() {
        assert_eq!(int_bytes(5, Scalar::I32), Some(5i32.to_ne_bytes().to_vec()));
        assert_eq!(int_bytes(-1, Scalar::U32), None);
        assert_eq!(int_bytes(1 << 40, Scalar::I32), None);
        assert_eq!(int_bytes(1 << 40, Scalar::I64), Some((1i64 << 40).to_ne_bytes().to_vec()));
        assert_eq!(int_bytes(1, Scalar::F32), None);
    }
}
