//! Graphs as deep as a caller can make them: every pass over the graph (validate,
//! linearize, print, parse, evaluation, hashing) works on an ordinary 8 MiB thread stack and
//! in time linear in the graph.

use std::sync::Arc;

use kiln_ir::{
    Arg, DType, IrError, KernelBuilder, MAX_LOOPS, Op, Scalar, UOp, Val, eval_int, linearize, parse, parse_kernel,
    print, validate,
};

/// Runs `f` on a thread with the 8 MiB stack of an ordinary main thread.
fn on_8_mib_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let worker = std::thread::Builder::new().stack_size(8 << 20).spawn(f).expect("spawn");
    worker.join().expect("the pass overflowed an 8 MiB stack")
}

/// `c[i] = 1` for `i < n`, with `c`'s length `n + 0 + 0 + ...` (`depth` ADDs deep).
fn deep_length_kernel(depth: usize) -> Arc<UOp> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1024);
    let mut len = n.clone();
    for _ in 0..depth {
        len = &len + 0;
    }
    let c = k.param(0, Scalar::F32, &len);
    let i = k.global(0, &n);
    k.store(&c.at(&i), &Val::f32(1.0));
    k.finish().expect("a deep size expression is a valid kernel")
}

#[test]
fn a_100k_deep_size_expression_passes_every_stage_on_an_8_mib_stack() {
    on_8_mib_stack(|| {
        let sink = deep_length_kernel(100_000);
        validate(&sink).unwrap();
        assert_eq!(linearize(&sink).unwrap().len(), sink.toposort().len());
        let text = print(&sink);
        assert!(Arc::ptr_eq(&parse(&text).unwrap(), &sink));
        assert!(Arc::ptr_eq(&parse_kernel(&text).unwrap(), &sink));
        let param = sink.toposort().into_iter().find(|n| n.op() == Op::Param).unwrap();
        assert_eq!(eval_int(&param.src()[0], &|_| Some(5)).unwrap(), 5);
        assert_eq!(sink.content_hash(), parse(&text).unwrap().content_hash());
    });
}

/// `depth` nested loops of one iteration each around one store.
fn nested_ranges(depth: usize) -> Arc<UOp> {
    let sink = nested_ranges_unchecked(depth);
    validate(&sink).expect("nested loops are a valid kernel");
    sink
}

/// As [`nested_ranges`], without the builder's checks (which linearize).
fn nested_ranges_unchecked(depth: usize) -> Arc<UOp> {
    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::I32, 1);
    let ranges: Vec<Val> = (0..depth).map(|_| k.range(1)).collect();
    let mut idx = ranges[0].clone();
    for r in &ranges[1..] {
        idx = &idx + r;
    }
    let mut effect = k.store(&out.at(&idx), &idx);
    for r in ranges.iter().rev() {
        effect = k.end(r, &[&effect]);
    }
    UOp::new(Op::Sink, DType::Void, Arg::None, vec![effect.0])
}

/// Nested loops up to the limit lay out (outer loops first, every END after the innermost
/// body); 8,000 nested loops are a typed structure error at once instead of minutes of work.
#[test]
fn nested_ranges_up_to_the_limit_linearize_and_beyond_it_are_an_error() {
    on_8_mib_stack(|| {
        let order = linearize(&nested_ranges(MAX_LOOPS)).unwrap();
        let opens: Vec<usize> = order.iter().enumerate().filter(|(_, n)| n.op() == Op::Range).map(|(p, _)| p).collect();
        let ends = order.iter().filter(|n| n.op() == Op::End).count();
        assert_eq!((opens.len(), ends), (MAX_LOOPS, MAX_LOOPS));
        let axes: Vec<i64> = opens.iter().map(|&p| order[p].arg_int().unwrap()).collect();
        assert!(axes.windows(2).all(|w| w[0] < w[1]), "outer loops open first");
        let first_end = order.iter().position(|n| n.op() == Op::End).unwrap();
        assert!(first_end > *opens.last().unwrap(), "the loops nest");

        let deep = nested_ranges_unchecked(8000);
        match linearize(&deep) {
            Err(IrError::Structure(m)) => assert!(m.contains("8000 loops") && m.contains("at most"), "{m}"),
            other => panic!("{other:?}"),
        }
    });
}
