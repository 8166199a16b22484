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
    if *dev.spec() != DeviceSpec::new("CPU", 0) {
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

/// `examples/kernels/group_sum.kiln`, the group sum `kiln bench` runs on GPUs: each group of
/// 256 items adds `per` values per item, then reduces the 256 partial sums in local memory
/// in eight halving steps (`if (l < s)`, a barrier after each), and item 0 stores the sum.
const GROUP_SUM: &str = include_str!("../../../../examples/kernels/group_sum.kiln");

/// A two-level reduction: 256 groups sum 65536 elements into 256 partial sums, then a
/// second launch of the same kernel (one group) sums the partials; and 16 groups of 16
/// values per item sum the same elements into 16 partial sums.
pub fn two_level_reduction(dev: &Arc<Device>) -> Outcome {
    let Some(kernel) = compile_work_group_kernel(dev, GROUP_SUM, "conf_group_sum")? else { return Ok(()) };
    let a: Vec<f32> = (0..256 * 256).map(|i| (i % 17) as f32).collect();
    let ba = Buffer::from_slice(dev.allocator().clone(), &a)?;
    // Variables in name order: groups, per.
    for (groups, per) in [(256usize, 1usize), (16, 16)] {
        let partial_want: Vec<f32> = a.chunks(256 * per).map(|c| c.iter().sum()).collect();
        let partials = Buffer::from_slice(dev.allocator().clone(), &vec![f32::NAN; groups])?;
        kernel.launch(&[&ba, &partials], &[groups as i64, per as i64])?;
        let got = partials.to_vec::<f32>()?;
        ensure!(
            got == partial_want,
            "groups={groups} per={per}: partial sums {:?}.. differ from {:?}..",
            &got[..4],
            &partial_want[..4]
        );
        if groups == 256 {
            let total = Buffer::from_slice(dev.allocator().clone(), &[f32::NAN])?;
            kernel.launch(&[&partials, &total], &[1, 1])?;
            let (got, want) = (total.to_vec::<f32>()?[0], partial_want.iter().sum::<f32>());
            ensure!(got == want, "total {got}, want {want}");
        }
    }
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

/// A work group of 8 writes `j = i - (i & 1)` into local memory of 7 at element `j`, then
/// every item reads element `j` back: in bounds (at most 6; the proof reads `i & 1` as
/// `i − 2·(i >> 1)`). Stored one element further (`j + 1`, 7 for the last pair) no proof
/// holds, so the store runs guarded: the guard skips element 7 and the launch fails naming
/// the local memory.
const LOCAL_PAIRS: &str = "\
%c8  = CONST i32 8
%c7  = CONST i32 7
%out = PARAM ptr<f32> 0 (%c8)
%l   = DEFINE_LOCAL lptr<f32> 0 (%c7)
%i   = SPECIAL i32 \"lidx0\" (%c8)
%one = CONST i32 1
%odd = AND i32 (%i, %one)
%j   = SUB i32 (%i, %odd)
%at  = ADD i32 (%j, %shift)
%lp  = INDEX lptr<f32> (%l, %at)
%v   = CAST f32 (%j)
%ls  = STORE void (%lp, %v)
%bar = BARRIER void (%ls)
%la  = AFTER lptr<f32> (%l, %bar)
%lq  = INDEX lptr<f32> (%la, %j)
%x   = LOAD f32 (%lq)
%po  = INDEX ptr<f32> (%out, %i)
%st  = STORE void (%po, %x)
SINK void (%st)
";

/// Local memory is guarded like buffers: the correct kernel is proven and runs, an overrun
/// runs guarded and is reported.
pub fn guarded_local_memory(dev: &Arc<Device>) -> Outcome {
    for (shift, name) in [(0, "conf_local_pairs"), (1, "conf_local_pairs_over")] {
        let text = LOCAL_PAIRS.replace("%shift", &format!("%c{shift}")).replace(
            "%one = CONST i32 1\n",
            &format!(
                "%one = CONST i32 1\n{}",
                if shift == 0 { "%c0  = CONST i32 0\n" } else { "%c1  = CONST i32 1\n" }
            ),
        );
        let Some(kernel) = compile_work_group_kernel(dev, &text, name)? else { return Ok(()) };
        ensure!(kernel.has_fallback() == (shift == 1), "{name}: proven when built should be {}", shift == 0);
        let out = Buffer::from_slice(dev.allocator().clone(), &[-1f32; 8])?;
        let result = kernel.launch(&[&out], &[]);
        if shift == 0 {
            result?;
            let want: Vec<f32> = (0..8).map(|i| (i - (i & 1)) as f32).collect();
            ensure!(out.to_vec::<f32>()? == want, "local pairs: {:?}", out.to_vec::<f32>()?);
        } else {
            expect_err("a local store one past the end", result, |e| {
                matches!(e, Error::OutOfBounds { access, .. }
                    if access.guarded && access.local.is_some() && access.op == "STORE" && access.first == 7 && access.len == 7)
            })?;
        }
    }
    Ok(())
}
