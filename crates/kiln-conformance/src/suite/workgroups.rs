//! The GPU kernel constructs compilers emit: work-group local memory (DEFINE_LOCAL),
//! barriers (BARRIER) and guarded blocks (IF … ENDIF).
//!
//! Guarded blocks run on every backend. Local memory and barriers run on every backend with
//! work groups; the CPU backend has none and must refuse them with [`Error::Render`] saying
//! so (and naming OpenCL), never run them wrongly. Results are compared exactly against a
//! host reference: the data are small integers, so every f32 sum is exact in any order.

use std::sync::Arc;

use kiln_device::kiln_ir::{DeviceSpec, parse_kernel};
use kiln_device::{Buffer, Device, Error, Kernel};

use crate::kernels::compile;
use crate::{Failure, Outcome, ensure, expect_err};

/// Compiles a kernel with local memory or barriers: `None` when the device has no work
/// groups and refused it as it must (the CPU), a failure for any other outcome.
fn compile_work_group_kernel(dev: &Device, text: &str, name: &str) -> Result<Option<Kernel>, Failure> {
    let sink = parse_kernel(text)?;
    if *dev.spec() != DeviceSpec::Cpu {
        return compile(dev, &sink, name).map(Some);
    }
    let e = expect_err(name, dev.compile(&sink, Some(name)), |e| matches!(e, Error::Render(_)))?;
    ensure!(e.to_string().contains("no work groups") && e.to_string().contains("OpenCL"), "refusal: {e}");
    Ok(None)
}

/// `examples/kernels/matmul_tiled.kiln` (16 x 16 tiles in local memory, two barriers per
/// tile step, an IF block around the store) on sizes that are not multiples of 16.
pub fn tiled_matmul(dev: &Arc<Device>) -> Outcome {
    let text = include_str!("../../../../examples/kernels/matmul_tiled.kiln");
    let Some(kernel) = compile_work_group_kernel(dev, text, "conf_matmul_tiled")? else { return Ok(()) };
    for (m, k, n) in [(37usize, 45usize, 29usize), (16, 16, 16), (1, 1, 1), (5, 33, 17)] {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
        let want: Vec<f32> = (0..m * n).map(|e| (0..k).map(|r| a[e / n * k + r] * b[r * n + e % n]).sum()).collect();
        let (ba, bb) =
            (Buffer::from_slice(dev.allocator().clone(), &a)?, Buffer::from_slice(dev.allocator().clone(), &b)?);
        let bc = Buffer::from_slice(dev.allocator().clone(), &vec![f32::NAN; m * n])?;
        // Variables in name order: k, m, n.
        kernel.launch(&[&ba, &bb, &bc], &[k as i64, m as i64, n as i64])?;
        let got = bc.to_vec::<f32>()?;
        let bad = (0..m * n).find(|&e| got[e] != want[e]);
        ensure!(
            bad.is_none(),
            "m={m} k={k} n={n}: C[{0}] = {1:?}, want {2:?}",
            bad.unwrap_or(0),
            got.get(bad.unwrap_or(0)),
            want.get(bad.unwrap_or(0))
        );
    }
    Ok(())
}

/// Per-group sums of 256 elements: each item stores one element in local memory, then
/// eight halving steps add the upper half onto the lower (`if (l < s)`, a barrier after
/// each), and item 0 stores the group's sum.
const GROUP_SUM: &str = r#"
%g    = DEFINE_VAR i32 "groups" 1 1024
%c256 = CONST i32 256
%n    = MUL i32 (%g, %c256)
%a    = PARAM ptr<f32> 0 (%n)
%out  = PARAM ptr<f32> 1 (%g)
%gi   = SPECIAL i32 "gidx0" (%g)
%l    = SPECIAL i32 "lidx0" (%c256)
%tmp  = DEFINE_LOCAL lptr<f32> 0 (%c256)
%base = MUL i32 (%gi, %c256)
%ai   = ADD i32 (%base, %l)
%pa   = INDEX ptr<f32> (%a, %ai)
%x    = LOAD f32 (%pa)
%pt   = INDEX lptr<f32> (%tmp, %l)
%st   = STORE void (%pt, %x)
%bar0 = BARRIER void (%st)
%c8   = CONST i32 8
%r    = RANGE i32 0 (%c8)
%c128 = CONST i32 128
%s    = SHR i32 (%c128, %r)
%lt   = CMPLT bool (%l, %s)
%if   = IF void (%lt, %bar0)
%t1   = AFTER lptr<f32> (%tmp, %if)
%ls   = ADD i32 (%l, %s)
%p1   = INDEX lptr<f32> (%t1, %ls)
%p0   = INDEX lptr<f32> (%t1, %l)
%y    = LOAD f32 (%p1)
%z    = LOAD f32 (%p0)
%sum  = ADD f32 (%z, %y)
%st1  = STORE void (%p0, %sum)
%eif  = ENDIF void (%if, %st1)
%bar  = BARRIER void (%eif)
%end  = END void (%r, %bar)
%zero = CONST i32 0
%is0  = CMPEQ bool (%l, %zero)
%if0  = IF void (%is0, %end)
%t2   = AFTER lptr<f32> (%tmp, %if0)
%pr   = INDEX lptr<f32> (%t2, %zero)
%res  = LOAD f32 (%pr)
%o1   = AFTER ptr<f32> (%out, %if0)
%po   = INDEX ptr<f32> (%o1, %gi)
%st2  = STORE void (%po, %res)
%e0   = ENDIF void (%if0, %st2)
SINK void (%e0)
"#;

/// A two-level reduction: 256 groups sum 65536 elements into 256 partial sums in local
/// memory with a tree reduction, then a second launch of the same kernel (one group) sums
/// the partials.
pub fn two_level_reduction(dev: &Arc<Device>) -> Outcome {
    let Some(kernel) = compile_work_group_kernel(dev, GROUP_SUM, "conf_group_sum")? else { return Ok(()) };
    let a: Vec<f32> = (0..256 * 256).map(|i| (i % 17) as f32).collect();
    let partial_want: Vec<f32> = a.chunks(256).map(|c| c.iter().sum()).collect();
    let ba = Buffer::from_slice(dev.allocator().clone(), &a)?;
    let partials = Buffer::from_slice(dev.allocator().clone(), &[f32::NAN; 256])?;
    let total = Buffer::from_slice(dev.allocator().clone(), &[f32::NAN])?;
    kernel.launch(&[&ba, &partials], &[256])?;
    kernel.launch(&[&partials, &total], &[1])?;
    let got = partials.to_vec::<f32>()?;
    ensure!(got == partial_want, "partial sums {:?}.. differ from {:?}..", &got[..4], &partial_want[..4]);
    let want: f32 = partial_want.iter().sum();
    let got = total.to_vec::<f32>()?[0];
    ensure!(got == want, "total {got}, want {want}");
    Ok(())
}

/// Nested IF blocks with a tail: `c[i] = -a[i]` where `i < n` and `a[i] < 0`, over groups
/// of 8 items (the last group runs past `n`); every other element of `c` keeps its value.
const NEGATE_NEGATIVES: &str = r#"
%n    = DEFINE_VAR i32 "n" 1 1024
%c7   = CONST i32 7
%c8   = CONST i32 8
%n7   = ADD i32 (%n, %c7)
%gs   = IDIV i32 (%n7, %c8)
%a    = PARAM ptr<i32> 0 (%n)
%c    = PARAM ptr<i32> 1 (%n)
%gi   = SPECIAL i32 "gidx0" (%gs)
%l    = SPECIAL i32 "lidx0" (%c8)
%g8   = MUL i32 (%gi, %c8)
%i    = ADD i32 (%g8, %l)
%inb  = CMPLT bool (%i, %n)
%if   = IF void (%inb)
%a1   = AFTER ptr<i32> (%a, %if)
%pa   = INDEX ptr<i32> (%a1, %i)
%x    = LOAD i32 (%pa)
%zero = CONST i32 0
%neg  = CMPLT bool (%x, %zero)
%if2  = IF void (%neg)
%c1   = AFTER ptr<i32> (%c, %if2)
%pc   = INDEX ptr<i32> (%c1, %i)
%nx   = NEG i32 (%x)
%st   = STORE void (%pc, %nx)
%e2   = ENDIF void (%if2, %st)
%e1   = ENDIF void (%if, %e2)
SINK void (%e1)
"#;

/// IF blocks run on every backend, nested and with work items past the end.
pub fn if_blocks(dev: &Arc<Device>) -> Outcome {
    let kernel = compile(dev, &parse_kernel(NEGATE_NEGATIVES)?, "conf_if_blocks")?;
    for n in [1usize, 8, 21, 1024] {
        let a: Vec<i32> = (0..n as i32).map(|i| if i % 3 == 0 { -i - 1 } else { i }).collect();
        let want: Vec<i32> = a.iter().map(|&x| if x < 0 { -x } else { 100 }).collect();
        let ba = Buffer::from_slice(dev.allocator().clone(), &a)?;
        let bc = Buffer::from_slice(dev.allocator().clone(), &vec![100i32; n])?;
        kernel.launch(&[&ba, &bc], &[n as i64])?;
        let got = bc.to_vec::<i32>()?;
        ensure!(got == want, "n={n}: got {:?}.., want {:?}..", &got[..n.min(8)], &want[..n.min(8)]);
    }
    Ok(())
}
