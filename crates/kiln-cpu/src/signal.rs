//! CPU timeline signals: the host [`CpuTimelineSignal`] of kiln-device, used as is. A CPU
//! queue's worker sets it directly when it reaches a `signal` command, so no device event
//! stands in between (GPU backends use [`kiln_device::RingSignal`] instead).

pub use kiln_device::CpuTimelineSignal;
