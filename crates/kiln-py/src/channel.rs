//! `kiln.Channel`: one rank's end of a group of ranks, which `kiln.Plan`'s collectives combine
//! buffers over (see `kiln_device::collective`).

use std::sync::{Arc, Mutex, Weak};

use kiln_device::{Channel, Error, LocalChannel};
use pyo3::prelude::*;

use crate::errors::detached;

/// Every channel end made from Python, while any of it lives: exit stops their waits.
static LIVE: Mutex<Vec<Weak<dyn Channel>>> = Mutex::new(Vec::new());

fn track(end: Arc<dyn Channel>) -> PyChannel {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&end));
    PyChannel { channel: end }
}

/// Breaks every channel end made from Python that is still alive (at interpreter exit): a
/// collective of a run still in flight stops waiting for its peers at once (instead of at
/// its timeout), so that exit does not wait for it.
pub fn stop_all(why: &str) {
    let live: Vec<Arc<dyn Channel>> =
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
    for end in live {
        end.abort(&Error::Invalid(why.into()));
    }
}

/// One rank's end of a channel. Every rank records the same collectives of the channel in
/// the same order, each in its own plan, and the ranks' plans run at once (`run_async` on each,
/// then `wait` on each; or one thread per rank).
#[pyclass(frozen, name = "Channel", module = "kiln")]
pub struct PyChannel {
    pub channel: Arc<dyn Channel>,
}

#[pymethods]
impl PyChannel {
    /// The `count` ends of a new in-process channel, rank 0 first: give each to the plans of
    /// one device. A collective waits at most `timeout` seconds for its peers (60 by default,
    /// more than 0) before it breaks the channel with `ChannelError`.
    #[staticmethod]
    #[pyo3(signature = (count, timeout=None))]
    fn local(py: Python<'_>, count: &Bound<'_, PyAny>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<PyChannel>> {
        let count = crate::buffer::size_arg(py, "a channel's rank count", count)?;
        let timeout = match timeout {
            Some(t) => crate::errors::seconds_arg(py, t)?,
            None => kiln_device::collective::DEFAULT_TIMEOUT,
        };
        let ends = detached(py, None, || Ok(LocalChannel::world_with_timeout(count, timeout)?))?;
        Ok(ends.into_iter().map(|end| track(end)).collect())
    }

    /// This process's end of a new channel over every process of the MPI job (`mpirun -n N
    /// python ...`): rank and count come from MPI. Host buffers go to MPI directly, buffers of
    /// other devices through host memory. A collective waits at most `timeout` seconds (60 by
    /// default, more than 0) for the other processes, now and in each collective. Raises
    /// `ChannelError` when a process of the job does not come in time, `UnavailableError` when
    /// this build of kiln has no MPI.
    #[staticmethod]
    #[pyo3(signature = (timeout=None))]
    fn mpi_world(py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<PyChannel> {
        let timeout = match timeout {
            Some(t) => crate::errors::seconds_arg(py, t)?,
            None => kiln_device::collective::DEFAULT_TIMEOUT,
        };
        let end = detached(py, None, || Ok(kiln_mpi::MpiChannel::world_with_timeout(timeout)?))?;
        Ok(track(end))
    }

    /// This end's rank, `0 .. count`.
    #[getter]
    fn rank(&self) -> usize {
        self.channel.rank()
    }

    /// How many ranks the channel joins.
    #[getter]
    fn count(&self) -> usize {
        self.channel.count()
    }

    /// How the ranks meet: `"local"` (devices of one process) or `"mpi"`.
    #[getter]
    fn provider(&self) -> &'static str {
        self.channel.provider()
    }

    /// The longest a collective waits for its peers, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.channel.timeout().as_secs_f64()
    }

    /// The message of the error that broke the channel, or `None` while it works.
    #[getter]
    fn broken(&self) -> Option<String> {
        self.channel.broken().map(|e| e.to_string())
    }

    fn __repr__(&self) -> String {
        let c = &self.channel;
        let state = if c.broken().is_some() { ", broken" } else { "" };
        format!(
            "<kiln.Channel {} rank {} of {}, timeout {}s{state}>",
            c.provider(),
            c.rank(),
            c.count(),
            c.timeout().as_secs_f64()
        )
    }
}
