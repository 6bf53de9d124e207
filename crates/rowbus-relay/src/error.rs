//! What can go wrong setting up or running a relay.

/// Why a relay, a sink or a template was refused, or why a relay stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// A subject, stream, routing key or topic template that cannot be read.
    #[error("template {template:?}: {reason}")]
    Template {
        /// The template as given.
        template: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A sink's setting that the broker cannot use (a URL of another scheme, an empty
    /// stream name, ...).
    #[error("{system}: {reason}")]
    Config {
        /// The broker's name ("nats", "redis", "amqp", "mqtt").
        system: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The broker could not be reached when the sink was first set up.
    #[error("{system}: cannot connect to {url}: {reason}")]
    Connect {
        /// The broker's name ("nats", "redis", "amqp", "mqtt").
        system: &'static str,
        /// The broker's address, without its password.
        url: String,
        /// What the broker's client said.
        reason: String,
    },
    /// The queue's database refused or failed.
    #[error(transparent)]
    Rowbus(#[from] rowbus::Error),
}
