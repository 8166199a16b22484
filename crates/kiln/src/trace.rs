//! `kiln run --trace`: one run through kiln-runtime's [`ExecutionPlan`], timed on the
//! executing side and written as a Chrome trace (open it in `chrome://tracing` or Perfetto).

use std::path::Path;

use kiln_device::{Buffer, Device, Kernel};
use kiln_runtime::ExecutionPlan;

use crate::error::{CliError, Context};

/// Records `kernel` over `bufs` in an execution plan, runs it once with profiling and
/// writes the trace to `path`. A device without command queues cannot be profiled: the
/// kernel then runs directly and a note on stderr says why no trace was written. Queues that
/// enqueue their own programs (OpenCL) run untimed: the trace then has no kernel slices,
/// and a note says so.
pub fn run_traced(
    device: &Device,
    kernel: &Kernel,
    bufs: &[&Buffer],
    vals: &[i64],
    path: &Path,
) -> Result<(), CliError> {
    let name = &kernel.spec.name;
    let mut plan = match ExecutionPlan::new(device) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("note: no trace written to {}: {e}", path.display());
            return kernel.launch(bufs, vals).context(|| format!("kernel `{name}` failed"));
        }
    };
    plan.exec_vals(kernel, bufs, vals).context(|| format!("cannot record kernel `{name}` in an execution plan"))?;
    let vars: Vec<(&str, i64)> = kernel.spec.var_names.iter().map(String::as_str).zip(vals.iter().copied()).collect();
    let profile = plan.run_profiled(&vars).context(|| format!("kernel `{name}` failed"))?;
    if profile.events.is_empty() {
        eprintln!(
            "note: the queues of {} reported no command times, so the trace in {} has its queues but no kernel slices",
            device.spec(),
            path.display()
        );
    }
    profile.write_chrome_trace(path).context(|| format!("cannot write the trace to {}", path.display()))
}
