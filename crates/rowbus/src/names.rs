//! Queue table, group and durable listener names, validated.

use std::fmt;
use std::sync::Arc;

use crate::error::Error;

/// Longest part of a queue table's name, in bytes: PostgreSQL keeps 63, and the dead-letter
/// table and the claim index add `_dead` and `_claim`.
pub const MAX_TABLE_NAME: usize = 57;
/// Longest group name, in characters.
pub const MAX_GROUP_CHARS: usize = 255;
/// Longest durable listener name, in characters: the positions table keys on it as the
/// notify table does on a channel (MySQL/MariaDB: 255 characters of utf8mb4).
pub const MAX_DURABLE_NAME_CHARS: usize = 255;

/// A queue table's name: `jobs`, or schema-qualified `app.jobs` where the database has
/// schemas (PostgreSQL; on MySQL/MariaDB the qualifier is a database). Each part is a plain
/// identifier `[A-Za-z_][A-Za-z0-9_]*`; the table part at most 57 bytes.
///
/// ```
/// use rowbus::QueueTable;
/// let t: QueueTable = "app.jobs".parse().unwrap();
/// assert_eq!(t.channel(), "app.jobs");
/// assert!("jobs; DROP TABLE x".parse::<QueueTable>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueTable {
    schema: Option<String>,
    name: String,
    channel: Arc<str>,
}

fn is_identifier(part: &str) -> bool {
    let mut bytes = part.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl std::str::FromStr for QueueTable {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = |reason: &str| Error::InvalidName { name: text.to_owned(), reason: reason.to_owned() };
        let (schema, name) = match text.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, text),
        };
        for part in schema.iter().chain([&name]) {
            if !is_identifier(part) {
                return Err(invalid("each part must be a plain identifier [A-Za-z_][A-Za-z0-9_]*"));
            }
            if part.len() > MAX_TABLE_NAME {
                return Err(invalid("each part must be at most 57 characters"));
            }
        }
        Ok(QueueTable { schema: schema.map(str::to_owned), name: name.to_owned(), channel: Arc::from(text) })
    }
}

impl fmt::Display for QueueTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.channel)
    }
}

impl QueueTable {
    /// The name as written (`app.jobs`): also its wake-up channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    pub(crate) fn channel_arc(&self) -> &Arc<str> {
        &self.channel
    }

    /// The schema part, if qualified.
    pub(crate) fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table part.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// Checks a group name as every publish and subscription does: at most 255 characters
/// and no trailing space (MySQL's collation would make `a ` and `a` the same group).
///
/// ```
/// assert!(rowbus::limits::check_group("tenant-42").is_ok());
/// assert!(rowbus::limits::check_group("a ").is_err());
/// ```
pub fn check_group(group: &str) -> Result<(), Error> {
    let invalid = |reason: &str| Error::InvalidName { name: group.to_owned(), reason: reason.to_owned() };
    if group.chars().count() > MAX_GROUP_CHARS {
        return Err(invalid("a group name has at most 255 characters"));
    }
    if group.ends_with(' ') {
        return Err(invalid("a group name must not end with a space"));
    }
    Ok(())
}

/// Checks a durable listener's name
/// ([`Listener::listen_durable`](crate::Listener::listen_durable)): not empty, at most
/// [`MAX_DURABLE_NAME_CHARS`] characters. Refused with [`Error::InvalidDurableName`]
/// rather than truncated, so that a name is never taken for another.
///
/// ```
/// assert!(rowbus::durable::check_durable_name("mailer").is_ok());
/// assert!(rowbus::durable::check_durable_name("").is_err());
/// assert!(rowbus::durable::check_durable_name(&"x".repeat(256)).is_err());
/// ```
pub fn check_durable_name(name: &str) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidDurableName { name: name.to_owned(), reason };
    if name.is_empty() {
        return Err(invalid("the name is empty".to_owned()));
    }
    let chars = name.chars().count();
    if chars > MAX_DURABLE_NAME_CHARS {
        return Err(invalid(format!(
            "{chars} characters, a durable listener's name has at most {MAX_DURABLE_NAME_CHARS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in ["jobs", "app.jobs", "_a1", &"x".repeat(57)] {
            assert!(ok.parse::<QueueTable>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a.b.c",
            "1jobs",
            "jobs;",
            "jo bs",
            "jo`bs",
            "jo\"bs",
            ".jobs",
            "jobs.",
            "é",
            &"x".repeat(58),
        ] {
            assert!(matches!(bad.parse::<QueueTable>(), Err(Error::InvalidName { .. })), "{bad}");
        }
    }

    #[test]
    fn groups_are_checked() {
        assert!(check_group("").is_ok());
        assert!(check_group("tenant-42").is_ok());
        assert!(check_group(&"g".repeat(255)).is_ok());
        assert!(check_group(&"g".repeat(256)).is_err());
        assert!(check_group("a ").is_err());
    }

    #[test]
    fn durable_names_are_validated() {
        assert!(check_durable_name("mailer").is_ok());
        assert!(check_durable_name(" ").is_ok());
        assert!(check_durable_name(&"𝄞".repeat(255)).is_ok());
        for (bad, reason) in [
            ("", "the name is empty"),
            (&*"x".repeat(300), "300 characters"),
            (&*"é".repeat(256), "256 characters"),
        ] {
            match check_durable_name(bad) {
                Err(Error::InvalidDurableName { name, reason: why }) => {
                    assert_eq!(name, bad);
                    assert!(why.contains(reason), "{why}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
