//! What the agent tells about itself: the Prometheus metrics registry.
//! Below the daemon, the status writer and the HTTP server, which all
//! record into it (the server only encodes it for `/metrics`), so none of
//! them reaches up into another.

pub(crate) mod metrics;

pub(crate) use metrics::Fleet;
pub use metrics::Metrics;
