//! `kiln run --trace`: one run through kiln-runtime's [`ExecutionPlan`], timed on the
//! executing side and written as a Chrome trace (open it in `chrome://tracing` or Perfetto).

use std::path::Path;

use kiln_device::{Buffer, Device, Kernel};
use kiln_runtime::{ExecutionPlan, Profile};

use crate::error::{CliError, Context};

/// Records `kernel` over `bufs` in an execution plan, runs it once with profiling and
/// returns the profile, for the caller to write to `path` (named in the notes). A device
/// without command queues cannot be profiled: the kernel then runs directly, a note on
/// stderr says why no trace is written, and the result is `None`. Queues that report no
/// command times give a profile without kernel slices, and a note says so.
pub fn run_traced(
    device: &Device,
    kernel: &Kernel,
    bufs: &[&Buffer],
    vals: &[i64],
    path: &Path,
) -> Result<Option<Profile>, CliError> {
    let name = &kernel.spec.name;
    let mut plan = match ExecutionPlan::new(device) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("note: no trace written to {}: {e}", path.display());
            return kernel.launch(bufs, vals).context(|| format!("kernel `{name}` failed")).map(|_| None);
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
    Ok(Some(profile))
}
