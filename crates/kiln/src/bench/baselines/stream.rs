//! The memory bandwidth limit, measured as STREAM measures it: STREAM's `copy` (`c = a`, 8
//! bytes per element) and `add` (`c = a + b`, 12 bytes) over the arrays it is given (the
//! bench gives it `add_f32_16m`'s, 64 MiB each, so that it bounds that entry), on all cores
//! at once (one contiguous part each, started together and timed to the last one
//! done), once with plain vector stores and once with non-temporal ones (which skip the read
//! of the line a store would otherwise fetch first). Each variant is verified, then timed;
//! the one with the best median is the limit.
//!
//! The vector width is the widest the CPU has, chosen at run time (`is_x86_feature_detected!`);
//! without x86-64 vectors the kernels are plain loops with plain stores.

use std::sync::Barrier;
use std::time::Instant;

use super::threads;

/// What one pass computes per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// `c = a`: one read and one write.
    Copy,
    /// `c = a + b`: two reads and one write.
    Add,
}

impl Kernel {
    fn bytes_per_element(self) -> f64 {
        match self {
            Kernel::Copy => 8.0,
            Kernel::Add => 12.0,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kernel::Copy => "copy",
            Kernel::Add => "add",
        }
    }
}

/// The vector instructions the kernels run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx,
    #[cfg(target_arch = "x86_64")]
    Sse,
    /// Plain loops, plain stores.
    Portable,
}

impl Isa {
    /// The widest this CPU runs.
    fn widest() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                Isa::Avx512
            } else if std::arch::is_x86_feature_detected!("avx") {
                Isa::Avx
            } else {
                Isa::Sse
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Isa::Portable
        }
    }

    fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "AVX-512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx => "AVX",
            #[cfg(target_arch = "x86_64")]
            Isa::Sse => "SSE",
            Isa::Portable => "scalar",
        }
    }

    /// Whether it has non-temporal stores.
    fn nontemporal(self) -> bool {
        self != Isa::Portable
    }

    /// One pass of `kernel` over one thread's part: `c = a` when `b` is `None`, else
    /// `c = a + b`, over the shortest of the slices.
    fn pass(self, a: &[f32], b: Option<&[f32]>, c: &mut [f32], nontemporal: bool) {
        match self {
            // SAFETY: `widest` returns Avx512 only where it detected avx512f.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::avx512(a, b, c, nontemporal) },
            // SAFETY: `widest` returns Avx only where it detected avx.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx => unsafe { x86::avx(a, b, c, nontemporal) },
            // SAFETY: every x86-64 CPU has SSE.
            #[cfg(target_arch = "x86_64")]
            Isa::Sse => unsafe { x86::sse(a, b, c, nontemporal) },
            Isa::Portable => scalar(a, b, c),
        }
    }
}

/// The scalar loop: the whole pass without vectors, and the unaligned ends of a vector one.
fn scalar(a: &[f32], b: Option<&[f32]>, c: &mut [f32]) {
    match b {
        Some(b) => c.iter_mut().zip(a).zip(b).for_each(|((c, a), b)| *c = a + b),
        None => c.iter_mut().zip(a).for_each(|(c, a)| *c = *a),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One kernel per vector ISA: `c = a (+ b)` with aligned vector stores of `c`, plain or
    /// non-temporal (then fenced before it returns), and the unaligned ends done by
    /// [`super::scalar`].
    macro_rules! vector_pass {
        ($name:ident, $feature:literal, $lanes:literal, $load:ident, $add:ident, $store:ident, $stream:ident) => {
            /// # Safety
            /// The CPU must have the target feature this function is compiled for.
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(a: &[f32], b: Option<&[f32]>, c: &mut [f32], nontemporal: bool) {
                let n = c.len().min(a.len()).min(b.map_or(usize::MAX, <[f32]>::len));
                let head = c.as_ptr().align_offset(4 * $lanes).min(n);
                let body = head + (n - head) / $lanes * $lanes;
                super::scalar(&a[..head], b.map(|b| &b[..head]), &mut c[..head]);
                for i in (head..body).step_by($lanes) {
                    // SAFETY: i + lanes <= body <= n, at most every slice's length, so each
                    // load reads and the store writes in bounds; `c + i` is aligned to the
                    // vector (i starts at the first aligned element and steps a whole
                    // vector), as the aligned and non-temporal stores require.
                    unsafe {
                        let mut v = $load(a.as_ptr().add(i));
                        if let Some(b) = b {
                            v = $add(v, $load(b.as_ptr().add(i)));
                        }
                        if nontemporal {
                            $stream(c.as_mut_ptr().add(i), v);
                        } else {
                            $store(c.as_mut_ptr().add(i), v);
                        }
                    }
                }
                if nontemporal {
                    _mm_sfence();
                }
                super::scalar(&a[body..n], b.map(|b| &b[body..n]), &mut c[body..n]);
            }
        };
    }

    vector_pass!(avx512, "avx512f", 16, _mm512_loadu_ps, _mm512_add_ps, _mm512_store_ps, _mm512_stream_ps);
    vector_pass!(avx, "avx", 8, _mm256_loadu_ps, _mm256_add_ps, _mm256_store_ps, _mm256_stream_ps);
    vector_pass!(sse, "sse", 4, _mm_loadu_ps, _mm_add_ps, _mm_store_ps, _mm_stream_ps);
}

/// The limit: GB/s per timed pass of the fastest variant, and what that variant is.
#[derive(Debug, Clone)]
pub(in crate::bench) struct Limit {
    pub(in crate::bench) gbps: Vec<f64>,
    pub(in crate::bench) variant: String,
}

/// Measures every variant (copy and add, plain and non-temporal stores) over `a` and `b`
/// (as long as each other) with `reps` timed passes each after one verified pass, and returns
/// the variant with the best median.
///
/// # Errors
/// Says what was wrong when the slices differ in length or are empty, or when a variant
/// computes a wrong result.
pub(in crate::bench) fn limit(a: &[f32], b: &[f32], reps: usize) -> Result<Limit, String> {
    if a.len() != b.len() || a.is_empty() || reps == 0 {
        return Err(format!(
            "the streaming limit needs two equal non-empty inputs and a rep, got {} and {} elements, {reps} reps",
            a.len(),
            b.len()
        ));
    }
    let isa = Isa::widest();
    let mut c = vec![0f32; a.len()];
    let mut best: Option<(f64, Limit)> = None;
    for kernel in [Kernel::Copy, Kernel::Add] {
        for nontemporal in [false, true].into_iter().filter(|&nt| !nt || isa.nontemporal()) {
            let b = (kernel == Kernel::Add).then_some(b);
            c.fill(f32::NAN);
            let seconds = on_all_cores(a, b, &mut c, reps + 1, |a, b, c| isa.pass(a, b, c, nontemporal));
            let want = |i: usize| b.map_or(a[i], |b| a[i] + b[i]);
            if let Some(i) = (0..a.len()).find(|&i| c[i].to_bits() != want(i).to_bits()) {
                return Err(format!(
                    "the streaming {} kernel wrote c[{i}] = {}, want {}",
                    kernel.name(),
                    c[i],
                    want(i)
                ));
            }
            let gb = kernel.bytes_per_element() * a.len() as f64 / 1e9;
            // The first pass, which also faults the output's pages in, is not timed.
            let mut gbps: Vec<f64> = seconds[1..].iter().map(|s| gb / s).collect();
            let stores = if nontemporal { "non-temporal" } else { "plain" };
            let variant = format!("STREAM {}, {stores} {} stores, {} threads", kernel.name(), isa.name(), threads());
            gbps.sort_by(f64::total_cmp);
            let median = gbps[gbps.len() / 2];
            if best.as_ref().is_none_or(|(m, _)| median > *m) {
                best = Some((median, Limit { gbps, variant }));
            }
        }
    }
    best.map(|(_, limit)| limit).ok_or_else(|| "the streaming limit measured no variant".to_string())
}

/// Runs `passes` passes of `pass` over `c` split into one contiguous part per core, each
/// thread on its part, all starting together; returns the seconds of each pass, from the
/// start to the last part done.
fn on_all_cores(
    a: &[f32],
    b: Option<&[f32]>,
    c: &mut [f32],
    passes: usize,
    pass: impl Fn(&[f32], Option<&[f32]>, &mut [f32]) + Sync,
) -> Vec<f64> {
    // Parts are whole multiples of 64 bytes (16 f32): two threads share at most the one cache
    // line at each boundary, and each part stores whole aligned vectors between its ends.
    let chunk = c.len().div_ceil(threads()).next_multiple_of(16);
    let parts: Vec<_> = c
        .chunks_mut(chunk)
        .enumerate()
        .map(|(i, c)| {
            let range = i * chunk..i * chunk + c.len();
            (&a[range.clone()], b.map(|b| &b[range]), c)
        })
        .collect();
    let barrier = Barrier::new(parts.len());
    let mut seconds = Vec::with_capacity(passes);
    std::thread::scope(|s| {
        let mut parts = parts.into_iter();
        let mine = parts.next();
        for (a, b, c) in parts {
            let (barrier, pass) = (&barrier, &pass);
            s.spawn(move || {
                for _ in 0..passes {
                    barrier.wait();
                    pass(a, b, c);
                    barrier.wait();
                }
            });
        }
        if let Some((a, b, c)) = mine {
            for _ in 0..passes {
                barrier.wait();
                let t = Instant::now();
                pass(a, b, c);
                barrier.wait();
                seconds.push(t.elapsed().as_secs_f64());
            }
        }
    });
    seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pass this CPU runs, plain and non-temporal, computes copy and add exactly on
    /// slices that start off a vector boundary and end inside one.
    #[test]
    fn every_variant_computes_copy_and_add_on_unaligned_slices() {
        let a: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..1000).map(|i| 1000.0 - i as f32).collect();
        for isa in [Isa::widest(), Isa::Portable] {
            for nontemporal in [false, isa.nontemporal()] {
                for b in [None, Some(&b[3..998])] {
                    let mut c = vec![f32::NAN; 1000];
                    isa.pass(&a[3..998], b, &mut c[3..998], nontemporal);
                    for i in 3..998 {
                        assert_eq!(c[i], a[i] + b.map_or(0.0, |b| b[i - 3]), "{isa:?} nt={nontemporal} at {i}");
                    }
                    assert!(c[..3].iter().chain(&c[998..]).all(|x| x.is_nan()), "{isa:?} wrote outside its slice");
                }
            }
        }
    }

    #[test]
    fn the_limit_reports_the_best_verified_variant_and_refuses_bad_inputs() {
        let a: Vec<f32> = (0..100_003).map(|i| (i % 97) as f32).collect();
        let limit = limit(&a, &a, 2).unwrap();
        assert_eq!(limit.gbps.len(), 2);
        assert!(limit.gbps.iter().all(|g| g.is_finite() && *g > 0.0), "{limit:?}");
        assert!(limit.variant.starts_with("STREAM "), "{}", limit.variant);
        assert!(super::limit(&a, &a[1..], 1).is_err() && super::limit(&[], &[], 1).is_err());
        assert!(super::limit(&a, &a, 0).is_err());
    }
}
