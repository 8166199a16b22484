//! In-order command queues.
