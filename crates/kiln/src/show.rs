//! Human-readable views of a compiled kernel for `kiln compile --emit spec|linear` and of
//! buffers for `kiln run`.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use kiln_device::ProgramSpec;
use kiln_ir::{Arg, DeviceSpec, Op, Scalar, UOp};

use crate::npy;

/// An integer size expression in infix form: `n`, `(n * 4)`, `max(n, 1)`.
pub fn expr(e: &Arc<UOp>) -> String {
    let src = e.src();
    let sub = |i: usize| src.get(i).map(expr).unwrap_or_else(|| "?".into());
    match e.op() {
        Op::Const => match e.arg() {
            Arg::Int(v) => v.to_string(),
            Arg::Float(v) => format!("{v:?}"),
            Arg::Bool(b) => b.to_string(),
            other => format!("{other:?}"),
        },
        Op::DefineVar | Op::Special => e.arg_name().unwrap_or("?").to_string(),
        Op::Bind => sub(0),
        Op::Cast | Op::After => sub(0),
        Op::Neg => format!("-{}", sub(0)),
        Op::Max | Op::Min => format!("{}({}, {})", e.op().name().to_lowercase(), sub(0), sub(1)),
        Op::Where => format!("({} ? {} : {})", sub(0), sub(1), sub(2)),
        op if op.is_binary() => {
            let sym = match op {
                Op::Add => "+",
                Op::Sub => "-",
                Op::Mul => "*",
                Op::Div | Op::Idiv => "/",
                Op::Mod => "%",
                Op::Lt => "<",
                Op::Le => "<=",
                Op::Eq => "==",
                Op::Ne => "!=",
                Op::And => "&",
                Op::Or => "|",
                Op::Xor => "^",
                Op::Shl => "<<",
                Op::Shr => ">>",
                other => other.name(),
            };
            format!("({} {sym} {})", sub(0), sub(1))
        }
        op => format!("{}({})", op.name(), src.iter().map(expr).collect::<Vec<_>>().join(", ")),
    }
}

/// The metadata of a rendered kernel, one fact per line.
pub fn spec(spec: &ProgramSpec, text: &str) -> String {
    let mut out = String::new();
    let list = |v: &[usize]| if v.is_empty() { "none".into() } else { join(v.iter()) };
    let _ = writeln!(out, "kernel:      {} on {}", spec.name, spec.device);
    let _ = writeln!(out, "globals:     {}", list(&spec.globals));
    let _ = writeln!(out, "ins:         {}", list(&spec.ins));
    let _ = writeln!(out, "outs:        {}", list(&spec.outs));
    for p in &spec.params {
        let role = match (spec.ins.contains(&p.slot), spec.outs.contains(&p.slot)) {
            (true, true) => "in+out",
            (true, false) => "in",
            (false, true) => "out",
            (false, false) => "unused",
        };
        let _ = writeln!(out, "  slot {}:    {} x {} ({role})", p.slot, p.scalar, expr(&p.len));
    }
    if spec.vars.is_empty() {
        let _ = writeln!(out, "vars:        none");
    } else {
        let vars = spec.vars.iter().map(|v| format!("{} in [{}, {}]", v.name, v.min, v.max));
        let _ = writeln!(out, "vars:        {}", join(vars));
    }
    let dims = |d: &[Arc<UOp>; 3]| format!("[{}]", join(d.iter().map(expr)));
    let _ = writeln!(out, "global size: {}", dims(&spec.global_size));
    match &spec.local_size {
        Some(l) => {
            let _ = writeln!(out, "local size:  {}", dims(l));
        }
        None => {
            let _ = writeln!(out, "local size:  chosen by the backend");
        }
    }
    let proofs = spec.access_proofs();
    let later = proofs.iter().filter(|p| p.at_launch).count();
    let _ = writeln!(
        out,
        "accesses:    {} ({} proven in bounds when built, {later} proven at each launch or else guarded)",
        proofs.len(),
        proofs.len() - later
    );
    for p in &proofs {
        let memory = p.slot.map_or_else(|| "local memory".to_string(), |s| format!("buffer {s}"));
        let how = if p.at_launch { "at launch, else guarded" } else { "when built" };
        let at = kiln_ir::locate_node(text, p.node).unwrap_or_else(|| format!("%{}", p.node));
        let _ = writeln!(out, "  {:<5} {at} {memory}: proven {how}", p.op);
    }
    out
}

/// The first lines of [`linear`]'s listing: it looks like kernel text but is not, and says so.
pub const LINEAR_HEADER: &str = "# kiln linear order listing (not kernel text: it does not parse back)\n\
# The nodes in the order the renderer walks them, indented by loop depth; %N is a position in\n\
# this listing. An accumulator comes before the loop it names, which kernel text cannot say.\n";

/// A one-row table of a kernel's repeated launch times (each a whole synchronous launch:
/// checks, execution and completion): the run count, median and minimum.
pub fn timings(kernel: &str, device: &DeviceSpec, times: &mut [Duration]) -> String {
    times.sort_unstable();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    let min = times.first().copied().unwrap_or_default();
    let mut out = format!("{:<24} {:<10} {:>8} {:>12} {:>12}\n", "kernel", "device", "runs", "median", "min");
    let _ = writeln!(
        out,
        "{kernel:<24} {:<10} {:>8} {:>12} {:>12}",
        device.to_string(),
        times.len(),
        human(median),
        human(min)
    );
    out
}

/// `850 ns`, `12.5 µs`, `3.20 ms`, `1.500 s`: three or four significant digits.
fn human(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    match ns {
        n if n < 1e3 => format!("{n:.0} ns"),
        n if n < 1e6 => format!("{:.1} µs", n / 1e3),
        n if n < 1e9 => format!("{:.2} ms", n / 1e6),
        n => format!("{:.3} s", n / 1e9),
    }
}

/// The kernel in linear order, one node per line, indented by loop depth, under
/// [`LINEAR_HEADER`]. Node numbers are positions in this listing. It is a listing for
/// reading, not the text format: the linear order is not a topological one (DEFINE_ACC
/// precedes its RANGE), and arguments are written for people (`n [1, 16]`).
pub fn linear(order: &[Arc<UOp>]) -> String {
    let pos: HashMap<*const UOp, usize> = order.iter().enumerate().map(|(i, n)| (Arc::as_ptr(n), i)).collect();
    let mut out = String::from(LINEAR_HEADER);
    let mut depth = 0usize;
    for (i, node) in order.iter().enumerate() {
        if node.op() == Op::End && node.src().first().is_some_and(|r| r.op() == Op::Range) {
            depth = depth.saturating_sub(1);
        }
        let mut line = format!("{:indent$}%{i} = {} {}", "", node.op(), node.dtype(), indent = 2 * depth);
        match node.arg() {
            Arg::None => {}
            Arg::Int(v) => line.push_str(&format!(" {v}")),
            Arg::Float(v) => line.push_str(&format!(" {v:?}")),
            Arg::Bool(b) => line.push_str(&format!(" {b}")),
            Arg::Str(s) => line.push_str(&format!(" {s:?}")),
            Arg::Var { name, min, max } => line.push_str(&format!(" {name} [{min}, {max}]")),
            Arg::Device(d) => line.push_str(&format!(" {d}")),
            Arg::Bytes(b) => line.push_str(&format!(" <{} bytes>", b.len())),
            Arg::Wmma(w) => line.push_str(&format!(" {w}")),
        }
        if !node.src().is_empty() {
            let srcs = node.src().iter().map(|s| match pos.get(&Arc::as_ptr(s)) {
                Some(p) => format!("%{p}"),
                None => "?".into(),
            });
            line.push_str(&format!(" ({})", join(srcs)));
        }
        out.push_str(&line);
        out.push('\n');
        if node.op() == Op::Range {
            depth += 1;
        }
    }
    out
}

/// `slot 2: f32 x 1024 [0.0, 1.0, ..., 7.0, ...]`: at most `max` leading elements.
pub fn buffer_summary(slot: usize, scalar: Scalar, data: &[u8], max: usize) -> String {
    let n = data.len() / scalar.size();
    let shown: Vec<String> = (0..n.min(max)).map(|i| npy::element_text(scalar, data, i)).collect();
    let more = if n > max { format!(", ... ({} more)", n - max) } else { String::new() };
    format!("slot {slot}: {scalar} x {n} [{}{more}]", shown.join(", "))
}

fn join<T: ToString>(items: impl Iterator<Item = T>) -> String {
    items.map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// `1536` → `1.5 KiB`.
pub fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_read_well() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
    use kiln_ir::{DeviceSpec, KernelBuilder, Val};

    fn kernel() -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 64);
        let a = k.param(0, Scalar::F32, &n * 4);
        let r = k.range(&n);
        let v = a.at(&r).load();
        let st = k.store(&a.at(&r), &(v + 1.0));
        k.end(&r, &[&st]);
        k.finish().unwrap()
    }

    #[test]
    fn spec_lists_every_fact() {
        let s = ProgramSpec::from_sink("k", String::new(), DeviceSpec::new("CPU", 0), &kernel()).unwrap();
        let text = spec(&s, &kiln_ir::print(&kernel()));
        assert!(text.contains("slot 0:    f32 x (n * 4) (in+out)"), "{text}");
        assert!(text.contains("accesses:    2 (2 proven in bounds when built"), "{text}");
        assert!(text.contains("vars:        n in [1, 64]"), "{text}");
        assert!(text.contains("global size: [1, 1, 1]"), "{text}");
    }

    #[test]
    fn linear_indents_loop_bodies() {
        let order = kiln_ir::linearize(&kernel()).unwrap();
        let text = linear(&order);
        let store = text.lines().find(|l| l.contains("STORE")).unwrap();
        assert!(store.starts_with("  %"), "{text}");
        let end = text.lines().find(|l| l.contains("= END")).unwrap();
        assert!(end.starts_with('%'), "{text}");
        assert_eq!(expr(&Val::int(3).0), "3");
    }

    #[test]
    fn summaries_are_short() {
        let data: Vec<u8> = (0..10i32).flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(buffer_summary(1, Scalar::I32, &data, 3), "slot 1: i32 x 10 [0, 1, 2, ... (7 more)]");
        assert_eq!(buffer_summary(1, Scalar::I32, &data[..8], 3), "slot 1: i32 x 2 [0, 1]");
    }
}
