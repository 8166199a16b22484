//! The text format through the public API, as a new user meets it: the example in the
//! module docs (which the README copies) must parse to exactly the kernel the builder makes.

use std::sync::Arc;

use kiln_ir::{IrError, KernelBuilder, Scalar, parse, parse_kernel, print};

/// The first ```text block of the `text` module docs, without the `//! ` prefixes.
fn doc_example() -> String {
    let source = include_str!("../src/text.rs");
    let doc: Vec<&str> =
        source.lines().map_while(|l| l.strip_prefix("//!")).map(|l| l.strip_prefix(' ').unwrap_or(l)).collect();
    let start = doc.iter().position(|l| *l == "```text").expect("the module docs have a text example") + 1;
    let len = doc[start..].iter().position(|l| *l == "```").expect("the example block is closed");
    doc[start..start + len].join("\n")
}

#[test]
fn the_documented_example_is_the_builder_kernel() {
    let text = doc_example();
    let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 16777216);
    let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
    let i = k.global(0, &n);
    let sum = a.at(&i).load() + b.at(&i).load();
    k.store(&c.at(&i), &sum);
    let built = k.finish().unwrap();

    assert!(Arc::ptr_eq(&parsed, &built), "doc example:\n{text}\nbuilder prints:\n{}", print(&built));
    assert!(Arc::ptr_eq(&parse(&print(&built)).unwrap(), &built));
}

#[test]
fn errors_display_line_and_column() {
    let err = parse("%x = CONST f32 1.0\n%y = NEG f32 (%z)\n").unwrap_err();
    assert_eq!(err, IrError::Parse { line: 2, col: 15, message: "undefined %z".into() });
    assert_eq!(err.to_string(), "line 2, column 15: undefined %z");
}
