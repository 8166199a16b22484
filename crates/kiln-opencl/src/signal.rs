//! Timeline signals backed by cl_events.
