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
            CliError::Message(message) => message.replace('\n', " "),
            CliError::OutputClosed => "stdout was closed".to_owned(),
        }
    }
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
