//! WMMA: a matrix multiply-accumulate on register fragments, `D = A·B + C`.
//!
//! A WMMA node multiplies an M×K matrix A by a K×N matrix B and adds the M×N matrix C. The
//! matrices are not in memory: each of the `threads` threads that run the op together holds
//! a *fragment* of each, a vector value of [`Wmma::a_elems`], [`Wmma::b_elems`] and
//! [`Wmma::c_elems`] lanes. Which element of which matrix a thread's lane holds is the
//! fragment layout ([`Wmma::a_coord`], [`Wmma::b_coord`], [`Wmma::c_coord`]); the result D
//! is laid out like C.
//!
//! Two layouts exist:
//! - `threads = 1` (the CPU's register micro-tile): one thread holds whole matrices, each
//!   row-major: lane `i` of A is `(i / K, i % K)`, of B `(i / N, i % N)`, of C and D
//!   `(i / N, i % N)`. Any shape whose fragments fit a vector (at most 64 lanes) is valid.
//! - `threads = 32` (a CUDA warp): the register layout of PTX `mma.sync.aligned` with `.row`
//!   A and `.col` B, for exactly the shapes of [`Wmma::WARP_SHAPES`] (tinygrad's
//!   `tc.cuda_sm80`). With `g = lane / 4` and `t = lane % 4`, lane `i` of a fragment is:
//!   - m16n8k16 (f16, bf16): A `(g + 8·(i/2 % 2), 2t + i%2 + 8·(i/4))`, B
//!     `(2t + i%2 + 8·(i/2), g)`;
//!   - m16n8k8 f16: A `(g + 8·(i/2), 2t + i%2)`, B `(2t + i, g)`;
//!   - m16n8k8 tf32 (f32 inputs): A `(g + 8·(i%2), t + 4·(i/2))`, B `(t + 4·i, g)`;
//!   - C and D of every shape: `(g + 8·(i/2), 2t + i%2)`.
//!
//! Arithmetic: every element of D is `C[m][n]` followed by one fused multiply-add per k, in
//! increasing k, computed in f32 (f16 and bf16 inputs are exact in f32, and so is the
//! product of two of them), then rounded once to the accumulator dtype. The CPU's portable
//! micro-tile is exactly that; its AVX512-BF16 and AVX512-FP16 instructions, like a GPU's
//! matrix unit, are within one rounding of the accumulator per term. A GPU's matrix unit
//! sums in an order and with internal precision of its own (and rounds f32 inputs of the tf32
//! shape to tf32): its results are within the accumulator's rounding of that reference, not
//! equal to it.

use std::fmt;

use crate::dtype::{DType, Scalar};

/// The argument of a WMMA node: the shape, the dtypes and the fragment layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Wmma {
    /// Rows of A, C and D.
    pub m: u16,
    /// Columns of B, C and D.
    pub n: u16,
    /// Columns of A, rows of B: the reduction length.
    pub k: u16,
    /// The element type of A and B (f16, bf16 or f32).
    pub input: Scalar,
    /// The element type of C and D (f32, or the input type for f16 and bf16).
    pub acc: Scalar,
    /// How many threads hold the fragments together: 1 (one thread, row-major whole
    /// matrices) or 32 (a CUDA warp, PTX `mma.sync` layout).
    pub threads: u16,
}

impl Wmma {
    /// The warp shapes `(m, n, k, input, acc)` that `threads = 32` takes: the shapes of PTX
    /// `mma.sync` that tinygrad 0.14 declares for CUDA (`tc.cuda_sm80`): m16n8k16 f16→f32,
    /// bf16→f32 and f16→f16; m16n8k8 f16→f32 and f16→f16; m16n8k8 tf32 (f32 in)→f32.
    pub const WARP_SHAPES: [(u16, u16, u16, Scalar, Scalar); 6] = [
        (16, 8, 16, Scalar::F16, Scalar::F32),
        (16, 8, 16, Scalar::BF16, Scalar::F32),
        (16, 8, 16, Scalar::F16, Scalar::F16),
        (16, 8, 8, Scalar::F16, Scalar::F32),
        (16, 8, 8, Scalar::F16, Scalar::F16),
        (16, 8, 8, Scalar::F32, Scalar::F32),
    ];

    /// The most lanes a fragment may have (the widest vector dtype).
    pub const MAX_FRAGMENT: usize = 64;

    /// The one-thread (CPU) form of the shape `m`×`n`×`k`.
    pub const fn single(m: u16, n: u16, k: u16, input: Scalar, acc: Scalar) -> Wmma {
        Wmma { m, n, k, input, acc, threads: 1 }
    }

    /// The warp (CUDA `mma.sync`) form of the shape `m`×`n`×`k`.
    pub const fn warp(m: u16, n: u16, k: u16, input: Scalar, acc: Scalar) -> Wmma {
        Wmma { m, n, k, input, acc, threads: 32 }
    }

    /// Every warp shape of [`Wmma::WARP_SHAPES`], as arguments.
    pub fn warp_shapes() -> Vec<Wmma> {
        Self::WARP_SHAPES.iter().map(|&(m, n, k, i, a)| Wmma::warp(m, n, k, i, a)).collect()
    }

    /// Lanes of each thread's A fragment: `m·k / threads`.
    pub fn a_elems(&self) -> usize {
        self.m as usize * self.k as usize / self.threads.max(1) as usize
    }

    /// Lanes of each thread's B fragment: `k·n / threads`.
    pub fn b_elems(&self) -> usize {
        self.k as usize * self.n as usize / self.threads.max(1) as usize
    }

    /// Lanes of each thread's C (and D) fragment: `m·n / threads`.
    pub fn c_elems(&self) -> usize {
        self.m as usize * self.n as usize / self.threads.max(1) as usize
    }

    /// The dtypes of the A, B and C operands (D has C's).
    pub fn operand_dtypes(&self) -> [DType; 3] {
        let lanes = |e: usize| u8::try_from(e).unwrap_or(u8::MAX);
        [
            DType::vec(self.input, lanes(self.a_elems())),
            DType::vec(self.input, lanes(self.b_elems())),
            DType::vec(self.acc, lanes(self.c_elems())),
        ]
    }

    /// The shape in PTX's spelling: `m16n8k16`.
    pub fn shape_name(&self) -> String {
        format!("m{}n{}k{}", self.m, self.n, self.k)
    }

    /// Why this argument is not a WMMA kiln defines (`None` when it is one): a dtype pair
    /// outside the table, a thread count other than 1 or 32, a warp shape `mma.sync` lacks,
    /// or fragments that do not fit a vector.
    pub fn check(&self) -> Option<String> {
        let pair_ok = matches!(
            (self.input, self.acc),
            (Scalar::F32, Scalar::F32)
                | (Scalar::F16, Scalar::F32 | Scalar::F16)
                | (Scalar::BF16, Scalar::F32 | Scalar::BF16)
        );
        if !pair_ok {
            return Some(format!(
                "inputs {} accumulating in {} is not a WMMA dtype pair: use f32->f32, f16->f32, f16->f16, bf16->f32 or \
                 bf16->bf16",
                self.input, self.acc
            ));
        }
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return Some(format!("shape {} has an empty dimension", self.shape_name()));
        }
        match self.threads {
            1 => {
                let worst = self.a_elems().max(self.b_elems()).max(self.c_elems());
                if worst > Self::MAX_FRAGMENT {
                    return Some(format!(
                        "shape {} needs a {worst}-lane fragment on one thread; at most {} fit a vector: use smaller \
                         tiles",
                        self.shape_name(),
                        Self::MAX_FRAGMENT
                    ));
                }
                None
            }
            32 => {
                let key = (self.m, self.n, self.k, self.input, self.acc);
                if Self::WARP_SHAPES.contains(&key) {
                    None
                } else {
                    let known: Vec<String> = Self::warp_shapes().iter().map(|w| w.to_string()).collect();
                    Some(format!(
                        "{} {}->{} is not a warp shape of mma.sync that kiln knows; the warp shapes are: {}",
                        self.shape_name(),
                        self.input,
                        self.acc,
                        known.join(", ")
                    ))
                }
            }
            t => Some(format!("{t} threads: a WMMA runs on 1 thread (the CPU form) or 32 (a CUDA warp)")),
        }
    }

    /// `(row, column)` in A of lane `i` of thread `lane`'s A fragment.
    pub fn a_coord(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        match (self.threads, self.k, self.input) {
            (32, 16, _) => (g + 8 * (i / 2 % 2), 2 * t + i % 2 + 8 * (i / 4)),
            (32, _, Scalar::F32) => (g + 8 * (i % 2), t + 4 * (i / 2)),
            (32, _, _) => (g + 8 * (i / 2), 2 * t + i % 2),
            _ => (i / self.k as usize, i % self.k as usize),
        }
    }

    /// `(row, column)` in B of lane `i` of thread `lane`'s B fragment.
    pub fn b_coord(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        match (self.threads, self.k, self.input) {
            (32, 16, _) => (2 * t + i % 2 + 8 * (i / 2), g),
            (32, _, Scalar::F32) => (t + 4 * i, g),
            (32, _, _) => (2 * t + i, g),
            _ => (i / self.n as usize, i % self.n as usize),
        }
    }

    /// `(row, column)` in C (and D) of lane `i` of thread `lane`'s C fragment.
    pub fn c_coord(&self, lane: usize, i: usize) -> (usize, usize) {
        match self.threads {
            32 => (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2),
            _ => (i / self.n as usize, i % self.n as usize),
        }
    }

    /// The text form after the op's dtype: `m16n8k16 f16 f32 threads 32`.
    pub(crate) fn text(&self) -> String {
        format!("{} {} {} threads {}", self.shape_name(), self.input, self.acc, self.threads)
    }

    /// Reads `m16n8k16` into `(16, 8, 16)`.
    pub(crate) fn parse_shape(w: &str) -> Option<(u16, u16, u16)> {
        let rest = w.strip_prefix('m')?;
        let (m, rest) = rest.split_once('n')?;
        let (n, k) = rest.split_once('k')?;
        let num = |s: &str| if s.chars().all(|c| c.is_ascii_digit()) { s.parse::<u16>().ok() } else { None };
        Some((num(m)?, num(n)?, num(k)?))
    }
}

/// `m16n8k16 f16->f32 (32 threads)`, the form messages use.
impl fmt::Display for Wmma {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.threads == 1 { "" } else { "s" };
        write!(f, "{} {}->{} ({} thread{s})", self.shape_name(), self.input, self.acc, self.threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of every matrix is held by exactly one (thread, lane) of the warp.
    #[test]
    fn warp_layouts_cover_each_element_once() {
        for w in Wmma::warp_shapes().into_iter().chain([Wmma::single(4, 16, 4, Scalar::F32, Scalar::F32)]) {
            assert_eq!(w.check(), None, "{w}");
            let (m, n, k) = (w.m as usize, w.n as usize, w.k as usize);
            for (rows, cols, elems, coord) in [
                (m, k, w.a_elems(), Wmma::a_coord as fn(&Wmma, usize, usize) -> (usize, usize)),
                (k, n, w.b_elems(), Wmma::b_coord),
                (m, n, w.c_elems(), Wmma::c_coord),
            ] {
                let mut seen = vec![0u32; rows * cols];
                for lane in 0..w.threads as usize {
                    for i in 0..elems {
                        let (r, c) = coord(&w, lane, i);
                        assert!(r < rows && c < cols, "{w}: lane {lane} element {i} at ({r}, {c})");
                        seen[r * cols + c] += 1;
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "{w}: {seen:?}");
            }
        }
    }

    #[test]
    fn fragment_sizes_match_ptx() {
        let w = Wmma::warp(16, 8, 16, Scalar::F16, Scalar::F32);
        assert_eq!((w.a_elems(), w.b_elems(), w.c_elems()), (8, 4, 4));
        let t = Wmma::warp(16, 8, 8, Scalar::F32, Scalar::F32);
        assert_eq!((t.a_elems(), t.b_elems(), t.c_elems()), (4, 2, 4));
        // PTX's m16n8k8 tf32 A fragment: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4).
        assert_eq!([0, 1, 2, 3].map(|i| t.a_coord(5, i)), [(1, 1), (9, 1), (1, 5), (9, 5)]);
        // m16n8k16 f16 A: a0,a1 (g, 2t..), a2,a3 (g+8, 2t..), a4,a5 (g, 2t+8..), a6,a7 (g+8, 2t+8..).
        assert_eq!(w.a_coord(5, 4), (1, 10));
        assert_eq!(w.a_coord(5, 7), (9, 11));
        assert_eq!(w.b_coord(5, 3), (11, 1));
    }

    #[test]
    fn bad_arguments_are_explained() {
        let too_big = Wmma::single(16, 16, 1, Scalar::F32, Scalar::F32).check().unwrap_or_default();
        assert!(too_big.contains("256-lane fragment"), "{too_big}");
        let shape = Wmma::warp(16, 16, 16, Scalar::F16, Scalar::F32).check().unwrap_or_default();
        assert!(shape.contains("m16n16k16 f16->f32 is not a warp shape") && shape.contains("m16n8k8"), "{shape}");
        let pair = Wmma::single(4, 4, 4, Scalar::F32, Scalar::F16).check().unwrap_or_default();
        assert!(pair.contains("not a WMMA dtype pair"), "{pair}");
        let threads = Wmma { threads: 64, ..Wmma::single(4, 4, 4, Scalar::F32, Scalar::F32) };
        assert!(threads.check().unwrap_or_default().contains("64 threads"));
        assert!(Wmma::single(0, 4, 4, Scalar::F32, Scalar::F32).check().is_some());
        assert_eq!(Wmma::parse_shape("m16n8k16"), Some((16, 8, 16)));
        assert_eq!(Wmma::parse_shape("m16n8"), None);
        assert_eq!(Wmma::parse_shape("m+1n8k8"), None);
    }
}
