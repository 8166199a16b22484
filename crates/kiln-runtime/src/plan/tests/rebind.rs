//! [`ExecutionPlan::rebind`]: new buffers for recorded launches, and the rebindings that are
//! refused because the plan's order might not hold for them.

use super::*;

/// `y = 2x + 1` then `z = 2y + 1` over 16 elements, with its buffers.
fn chain() -> (ExecutionPlan, [Buffer; 3], Arc<dyn Allocator>) {
    let alloc = HostAllocator::shared();
    let bufs = [filled(&alloc, 16, 1.0), filled(&alloc, 16, 0.0), filled(&alloc, 16, 0.0)];
    let k = affine(Some(16), 2.0, 1.0);
    let mut p = plan(2);
    p.exec(&k, &[&bufs[0], &bufs[1]], &[]).expect("record");
    p.exec(&k, &[&bufs[1], &bufs[2]], &[]).expect("record");
    (p, bufs, alloc)
}

fn twice_affine(x: &Buffer) -> Vec<f32> {
    x.to_vec::<f32>().expect("read").iter().map(|v| (v * 2.0 + 1.0) * 2.0 + 1.0).collect()
}

#[test]
fn runs_after_a_rebinding_use_the_new_buffers() {
    let (mut p, [x, _, z], alloc) = chain();
    p.run(&[]).expect("run");
    assert_eq!(z.to_vec::<f32>().expect("read"), twice_affine(&x));
    let (x2, z2) = (filled(&alloc, 16, 7.0), filled(&alloc, 16, 0.0));
    p.rebind(&[(0, 0, &x2), (1, 1, &z2)]).expect("fresh buffers rebind");
    let before = z.to_vec::<f32>().expect("read");
    p.run(&[]).expect("run");
    assert_eq!(z2.to_vec::<f32>().expect("read"), twice_affine(&x2));
    assert_eq!(z.to_vec::<f32>().expect("read"), before, "the old output is no longer written");
    p.rebind(&[(0, 0, &x), (1, 1, &z)]).expect("back to the recorded buffers");
    x.copy_from_slice(&[3.0f32; 16]).expect("write");
    p.run(&[]).expect("run");
    assert_eq!(z.to_vec::<f32>().expect("read"), twice_affine(&x));
}

#[test]
fn rebindings_that_could_reorder_are_refused_and_change_nothing() {
    let (mut p, [x, _, z], alloc) = chain();
    let fresh = filled(&alloc, 16, 5.0);
    let refused = |p: &mut ExecutionPlan, b: &[(usize, usize, &Buffer)], what: &str| {
        let e = p.rebind(b).expect_err(what);
        assert!(matches!(e, Error::Launch(_)), "{what}: {e}");
    };
    refused(&mut p, &[(0, 0, &z)], "an input that is another launch's output");
    refused(&mut p, &[(0, 0, &fresh), (1, 1, &fresh)], "one new buffer for two different recorded ones");
    refused(&mut p, &[(0, 0, &fresh), (0, 0, &z)], "two buffers for one argument");
    refused(&mut p, &[(0, 0, &fresh), (2, 0, &fresh)], "no node 2");
    refused(&mut p, &[(0, 2, &fresh)], "no slot 2");
    p.copy(&fresh, &z).expect("record a copy");
    refused(&mut p, &[(2, 0, &fresh)], "a copy node");
    // Nothing was applied: the plan still computes from x into z, then copies z.
    p.run(&[]).expect("run");
    assert_eq!(z.to_vec::<f32>().expect("read"), twice_affine(&x));
    assert_eq!(fresh.to_vec::<f32>().expect("read"), twice_affine(&x));
}

#[test]
fn one_input_of_several_launches_is_renamed_together() {
    let alloc = HostAllocator::shared();
    let (x, a, b) = (filled(&alloc, 16, 1.0), filled(&alloc, 16, 0.0), filled(&alloc, 16, 0.0));
    let k = affine(Some(8), 2.0, 1.0);
    let mut p = plan(2);
    p.exec(&k, &[&x.view(0, 8).expect("view"), &a], &[]).expect("record");
    p.exec(&k, &[&x.view(0, 8).expect("view"), &b], &[]).expect("record");
    let x2 = filled(&alloc, 16, 4.0);
    let e = p.rebind(&[(0, 0, &x2.view(0, 8).expect("view")), (1, 0, &x2.view(8, 8).expect("view"))]);
    assert!(e.is_err(), "two windows of one new buffer for one recorded window");
    let v = x2.view(0, 8).expect("view");
    p.rebind(&[(0, 0, &v), (1, 0, &v)]).expect("the same new window for the same recorded one");
    p.run(&[]).expect("run");
    let want: Vec<f32> = x2.to_vec::<f32>().expect("read")[..8].iter().map(|v| v * 2.0 + 1.0).collect();
    assert_eq!(a.to_vec::<f32>().expect("read")[..8], want[..]);
    assert_eq!(b.to_vec::<f32>().expect("read")[..8], want[..]);
}

#[test]
fn a_node_recorded_after_a_rebinding_is_ordered_by_the_new_buffers() {
    let (mut p, [_, _, _], alloc) = chain();
    let z2 = filled(&alloc, 16, 0.0);
    p.rebind(&[(1, 1, &z2)]).expect("rebind the output");
    let out = filled(&alloc, 16, 0.0);
    let reader = p.exec(&affine(Some(16), 1.0, 0.0), &[&z2, &out], &[]).expect("record");
    assert_eq!(p.dependencies(reader), [Dependency { node: 1, hazard: Hazard::ReadAfterWrite }]);
}
