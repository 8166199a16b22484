//! [`MpiChannel`] in a build without MPI: never made.

use std::sync::Arc;
use std::time::Duration;

use kiln_device::{Buffer, Channel, Collective, Error, Result};

/// The longest `MPI_Finalize` may take at exit after a failed wait (see the MPI build's docs).
pub const EXIT_GRACE: Duration = Duration::from_secs(10);

/// This process's end of an MPI channel; this build has no MPI, so there is none.
#[derive(Debug)]
pub struct MpiChannel {
    never: std::convert::Infallible,
}

impl MpiChannel {
    /// [`Error::Unavailable`]: this build has no MPI (see [`crate::NOT_LINKED`]).
    ///
    /// # Errors
    /// Always [`Error::Unavailable`].
    pub fn world() -> Result<Arc<MpiChannel>> {
        Err(Error::Unavailable(crate::NOT_LINKED.into()))
    }

    /// As [`MpiChannel::world`].
    ///
    /// # Errors
    /// Always [`Error::Unavailable`].
    pub fn world_with_timeout(timeout: Duration) -> Result<Arc<MpiChannel>> {
        let _ = timeout;
        Self::world()
    }
}

impl MpiChannel {
    /// Never called: there is no channel.
    ///
    /// # Errors
    /// None: there is no channel to call it on.
    pub fn first(&self, n: usize) -> Result<Option<Arc<MpiChannel>>> {
        let _ = n;
        match self.never {}
    }

    /// Never called: there is no channel.
    ///
    /// # Errors
    /// None: there is no channel to call it on.
    pub fn barrier(&self) -> Result<()> {
        match self.never {}
    }

    /// Never called: there is no channel.
    ///
    /// # Errors
    /// None: there is no channel to call it on.
    pub fn agree_ok(&self, ok: bool) -> Result<bool> {
        let _ = ok;
        match self.never {}
    }

    /// Never called: there is no channel.
    ///
    /// # Errors
    /// None: there is no channel to call it on.
    pub fn baseline_all_reduce_f32(&self, send: Vec<f32>, recv: Vec<f32>) -> Result<(Vec<f32>, Vec<f32>)> {
        let _ = (send, recv);
        match self.never {}
    }
}

/// [`Error::Unavailable`]: this build has no MPI (see [`crate::NOT_LINKED`]).
///
/// # Errors
/// Always [`Error::Unavailable`].
pub fn world_rank() -> Result<usize> {
    Err(Error::Unavailable(crate::NOT_LINKED.into()))
}

impl Channel for MpiChannel {
    fn rank(&self) -> usize {
        match self.never {}
    }
    fn count(&self) -> usize {
        match self.never {}
    }
    fn provider(&self) -> &'static str {
        "mpi"
    }
    fn timeout(&self) -> Duration {
        match self.never {}
    }
    fn run(&self, _: Collective, _: &Buffer, _: &Buffer, _: Duration) -> Result<()> {
        match self.never {}
    }
    fn broken(&self) -> Option<Error> {
        match self.never {}
    }
}
