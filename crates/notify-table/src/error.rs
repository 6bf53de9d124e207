//! The core's errors: one enum for configuration, one for everything else.

/// A configuration that cannot be used. Each variant names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A setting's value breaks its rule.
    #[error("invalid `{key}` = {value}: {rule}")]
    Invalid {
        /// The setting.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What the value must be.
        rule: &'static str,
    },
    /// A key that is not one of [`Config::KEYS`](crate::Config::KEYS).
    #[error(
        "unknown notify-table setting `{key}`: expected one of table, poll_interval, lookback, retention, cleanup_limit"
    )]
    UnknownKey {
        /// The key as given.
        key: String,
    },
    /// An item of configuration text that is not `key=value`.
    #[error("malformed notify-table setting `{item}`: expected key=value")]
    Malformed {
        /// The item as given.
        item: String,
    },
}

/// What the notify-table core refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A channel name must have at least one character.
    #[error("invalid channel: the name is empty")]
    EmptyChannel,
    /// A channel name longer than the `channel` column holds; never truncated.
    #[error("invalid channel: {chars} characters, the notify table holds at most 255")]
    ChannelTooLong {
        /// Its length in characters.
        chars: usize,
    },
    /// A payload longer than the `payload` column holds; never truncated.
    #[error("payload too large: {bytes} bytes of UTF-8, the notify table holds at most 65535")]
    PayloadTooLarge {
        /// Its length in bytes.
        bytes: usize,
    },
    /// One listener polls at most [`MAX_CHANNELS`](crate::MAX_CHANNELS) channels, so a
    /// poll statement stays within every server's limit on bind parameters.
    #[error("too many channels: one listener subscribes at most {max}; use another listener")]
    TooManyChannels {
        /// The limit.
        max: usize,
    },
    /// The rows handed to `subscribed` lack the row carrying the mark.
    #[error("the subscribe statement for channel {channel:?} returned no mark row")]
    MissingMarkRow {
        /// The channel being subscribed.
        channel: String,
    },
    /// The rows handed to `polled` lack the row carrying the cutoff.
    #[error("the poll statement returned no cutoff row")]
    MissingCutoffRow,
    /// A stored position handed to `resumed` that no subscription can be in.
    #[error("invalid stored position for channel {channel:?}: {reason}; forget it and subscribe afresh")]
    InvalidPosition {
        /// The channel being resumed.
        channel: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Text that is not a stored [`Position`](crate::Position).
    #[error("not a stored notify-table position: {reason}")]
    BadPositionText {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A poll token folded after a newer one, or twice.
    #[error("poll token {token} is stale: token {last} was folded already; fold each poll once, in order")]
    StaleToken {
        /// The sequence number of the token given.
        token: u64,
        /// The sequence number of the last token folded.
        last: u64,
    },
}
