//! `kiln.Channel`: one rank's end of a group of ranks, which `kiln.Plan`'s collectives combine
//! buffers over (see `kiln_device::collective`).

use std::sync::Arc;

use kiln_device::{Channel, LocalChannel};
use pyo3::prelude::*;

use crate::errors::detached;

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
    /// one device. A collective waits at most `timeout` seconds for its peers (60 by default)
    /// before it breaks the channel with `ChannelError`.
    #[staticmethod]
    #[pyo3(signature = (count, timeout=None))]
    fn local(py: Python<'_>, count: &Bound<'_, PyAny>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<PyChannel>> {
        let count = crate::buffer::size_arg(py, "a channel's rank count", count)?;
        let timeout = match timeout {
            Some(t) => crate::errors::seconds_arg(py, t)?,
            None => kiln_device::collective::DEFAULT_TIMEOUT,
        };
        let ends = detached(py, None, || Ok(LocalChannel::world_with_timeout(count, timeout)?))?;
        Ok(ends.into_iter().map(|end| PyChannel { channel: end }).collect())
    }

    /// This process's end of a new channel over every process of the MPI job (`mpirun -n N
    /// python ...`): rank and count come from MPI. Host buffers go to MPI directly, buffers of
    /// other devices through host memory. A collective waits at most `timeout` seconds (60 by
    /// default) for its peers. Raises `UnavailableError` when this build of kiln has no MPI.
    #[staticmethod]
    #[pyo3(signature = (timeout=None))]
    fn mpi_world(py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<PyChannel> {
        let timeout = match timeout {
            Some(t) => crate::errors::seconds_arg(py, t)?,
            None => kiln_device::collective::DEFAULT_TIMEOUT,
        };
        let end = detached(py, None, || Ok(kiln_mpi::MpiChannel::world_with_timeout(timeout)?))?;
        Ok(PyChannel { channel: end })
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
