//! What a command fails with: the library's errors and the CLI's own.

use std::fmt;

/// A command's failure, printed as one `rowbus: error: ...` line.
#[derive(Debug)]
pub(crate) enum CliError {
    /// The library refused or failed.
    Rowbus(rowbus::Error),
    /// The CLI's own message (a missing queue table, stdin that cannot be read, ...).
    Message(String),
    /// Whatever read stdout went away (`| head`): the command stops, quietly.
    OutputClosed,
}

impl CliError {
    /// The error and its causes, on one line.
    pub(crate) fn line(&self) -> String {
        match self {
            CliError::Rowbus(error) => crate::one_line(error),
            // (A message may quote a library error, a failed claim's say.)
            CliError::Message(message) => in_cli_words(&message.replace('\n', " ")),
            CliError::OutputClosed => "stdout was closed".to_owned(),
        }
    }
}

/// What the library's messages offer a program beside the command (its functions), and
/// what a user of the command reads instead: nothing, the command being named already.
const LIBRARY_WORDS: &[&str] = &[
    " (or connect with DbPool::connect_creating)",
    ", or DbPool::deploy_notify_table (deploy_durable_notify_table), which makes it beside the notify table",
    ", or DbPool::deploy_notify_table (deploy_durable_notify_table)",
    " (or Queue::deploy)",
    "BrokerOptions::listen_url; the CLI's ",
];

/// `line`, a library error's, in the command's words: the commands it names and not the
/// library functions a program would call instead.
pub(crate) fn in_cli_words(line: &str) -> String {
    let mut line = line.to_owned();
    for words in LIBRARY_WORDS {
        line = line.replace(words, "");
    }
    line
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

impl From<rowbus::Error> for CliError {
    fn from(error: rowbus::Error) -> Self {
        CliError::Rowbus(error)
    }
}

impl From<rowbus::sqlx::Error> for CliError {
    fn from(error: rowbus::sqlx::Error) -> Self {
        CliError::Rowbus(rowbus::Error::from(error))
    }
}

#[cfg(test)]
mod tests {
    use rowbus::Error;

    use super::*;

    /// Every library error that tells how to make what is missing says the command, and no
    /// library function, to a user of the command.
    #[test]
    fn missing_things_are_made_with_commands() {
        let table = || "jobs".to_owned();
        for error in [
            Error::MissingDatabase { path: "/tmp/x.sqlite".into() },
            Error::MissingNotifyTable { table: table() },
            Error::MissingPositionsTable { table: table() },
            Error::MissingQueueTable { table: table() },
            Error::MissingPauseTable { table: table() },
            Error::MissingLimitsTable { table: table() },
            Error::MissingScheduleTable { table: table() },
            Error::MissingHistoryTable { table: table() },
            Error::NotAQueueTable { table: table(), missing: vec!["id"] },
        ] {
            let raw = error.one_line();
            let line = CliError::from(error).line();
            assert!(line.contains("`rowbus deploy"), "{line}");
            for library in ["::", "connect_creating", "deploy_notify_table", "deploy_durable_notify_table"] {
                assert!(!line.contains(library), "{line}");
            }
            assert_eq!(CliError::Message(raw).line(), line);
        }
    }
}
