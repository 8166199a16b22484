#!/usr/bin/env python3
"""Writes a kiln kernel that sums N products, out[0] = a[0]*b[0] + ... + a[N-1]*b[N-1], at
constant indices and added as a balanced tree: one straight-line stretch of 2N loads, the shape
on which LLVM 16's compile time grew quadratically (issue 44; see the README's "LLVM pair on
large kernels" and kiln-cpu's `llvm::render`, "Large kernels").

Usage: python3 tools/products_kernel.py N > products.kiln
       KILN_CACHE=0 kiln run products.kiln --compiler llvm    # or --compiler cc
"""

import sys


def kernel(n):
    lines = [
        "# kiln kernel v1",
        f"# out[0] = sum of a[i] * b[i] over i < {n}, added as a balanced tree (tools/products_kernel.py)",
        f"%n = CONST i32 {n}",
        "%one = CONST i32 1",
        "%a = PARAM ptr<f32> 0 (%n)",
        "%b = PARAM ptr<f32> 1 (%n)",
        "%out = PARAM ptr<f32> 2 (%one)",
    ]
    terms = []
    for i in range(n):
        lines += [
            f"%c{i} = CONST i32 {i}",
            f"%pa{i} = INDEX ptr<f32> (%a, %c{i})",
            f"%x{i} = LOAD f32 (%pa{i})",
            f"%pb{i} = INDEX ptr<f32> (%b, %c{i})",
            f"%y{i} = LOAD f32 (%pb{i})",
            f"%p{i} = MUL f32 (%x{i}, %y{i})",
        ]
        terms.append(f"%p{i}")
    k = 0
    while len(terms) > 1:
        pairs = []
        for j in range(0, len(terms) - 1, 2):
            lines.append(f"%s{k} = ADD f32 ({terms[j]}, {terms[j + 1]})")
            pairs.append(f"%s{k}")
            k += 1
        if len(terms) % 2:
            pairs.append(terms[-1])
        terms = pairs
    lines += ["%po = INDEX ptr<f32> (%out, %c0)", f"%st = STORE void (%po, {terms[0]})", "SINK void (%st)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit("usage: products_kernel.py N   (N >= 1 products)")
    sys.stdout.write(kernel(int(sys.argv[1])))
