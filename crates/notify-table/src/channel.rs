//! Limits on what a notification may carry, checked before anything is sent.

use crate::error::Error;

/// Longest channel name, in characters (`VARCHAR(255)`).
pub const MAX_CHANNEL_CHARS: usize = 255;
/// Longest payload, in bytes of UTF-8 (`TEXT`).
pub const MAX_PAYLOAD_BYTES: usize = 65_535;

/// Returns the channel, or the error that refuses it: empty, or longer than
/// [`MAX_CHANNEL_CHARS`]. Refused rather than truncated: a server in a lax `sql_mode`
/// would shorten it silently, and it would then never match the name it was sent under.
///
/// ```
/// use notify_table::{check_channel, Error};
/// assert_eq!(check_channel("jobs"), Ok("jobs"));
/// assert_eq!(check_channel(""), Err(Error::EmptyChannel));
/// ```
pub fn check_channel(channel: &str) -> Result<&str, Error> {
    if channel.is_empty() {
        return Err(Error::EmptyChannel);
    }
    // Byte length bounds character count from above: skip the count for short names.
    if channel.len() > MAX_CHANNEL_CHARS {
        let chars = channel.chars().count();
        if chars > MAX_CHANNEL_CHARS {
            return Err(Error::ChannelTooLong { chars });
        }
    }
    Ok(channel)
}

/// Returns the payload, or [`Error::PayloadTooLarge`] when it has more than
/// [`MAX_PAYLOAD_BYTES`] bytes.
pub fn check_payload(payload: &str) -> Result<&str, Error> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(Error::PayloadTooLarge { bytes: payload.len() });
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_limits_count_characters() {
        assert_eq!(check_channel(&"a".repeat(255)).map(str::len), Ok(255));
        assert_eq!(check_channel(&"a".repeat(256)), Err(Error::ChannelTooLong { chars: 256 }));
        // 255 four-byte characters fit: the column counts characters, not bytes.
        let wide = "𝄞".repeat(255);
        assert_eq!(check_channel(&wide), Ok(wide.as_str()));
        assert_eq!(check_channel(&"é".repeat(256)), Err(Error::ChannelTooLong { chars: 256 }));
        assert_eq!(check_channel(""), Err(Error::EmptyChannel));
        assert_eq!(check_channel(" "), Ok(" "));
    }

    #[test]
    fn payload_limit_counts_bytes() {
        assert!(check_payload(&"a".repeat(65_535)).is_ok());
        assert_eq!(check_payload(&"a".repeat(65_536)), Err(Error::PayloadTooLarge { bytes: 65_536 }));
        // 21,846 three-byte characters are 65,538 bytes: too large although few characters.
        assert_eq!(check_payload(&"€".repeat(21_846)), Err(Error::PayloadTooLarge { bytes: 65_538 }));
        assert!(check_payload("").is_ok());
    }
}
