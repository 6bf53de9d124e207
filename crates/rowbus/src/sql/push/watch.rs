//! SQLite: a watch on the database's files (inotify on Linux, through the `notify`
//! crate). Another process's commit writes the write-ahead log (the database file itself
//! in rollback-journal mode); the watch reports the write, and the session then reads
//! `PRAGMA data_version`, which changes when another connection committed and costs no
//! page read, and polls the notify table only when it did.
//!
//! The write comes a moment before the commit is visible (the WAL's index, shared through
//! memory, is updated after the frames are written, and a memory write is no file event):
//! the session reads `data_version` again a few milliseconds later when it had not changed
//! yet.

use std::path::{Path, PathBuf};

use fs_notify::{EventKindMask, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::task::{Pushed, Refusal, Source};

/// An open watch, and the writes it reported.
pub struct FileWatch {
    /// Held: dropping it ends the watch.
    _watcher: fs_notify::RecommendedWatcher,
    writes: mpsc::UnboundedReceiver<()>,
}

/// Whether `path` is one of the files a commit to `database` writes.
fn written_by_commits(path: &Path, database: &Path) -> bool {
    let (Some(name), Some(db)) = (path.file_name(), database.file_name()) else { return false };
    let (name, db) = (name.to_string_lossy(), db.to_string_lossy());
    name == db || name.strip_prefix(&*db).is_some_and(|rest| rest == "-wal" || rest == "-journal")
}

impl Source for FileWatch {
    /// The database file.
    type Target = PathBuf;

    async fn open(database: &PathBuf) -> Result<Self, Refusal> {
        if database.as_os_str().is_empty() || database.as_os_str() == ":memory:" {
            return Err(Refusal::Refused("an in-memory database has no file to watch".into()));
        }
        let database = std::fs::canonicalize(database).map_err(|e| {
            Refusal::Refused(format!("the database file {} cannot be found: {e}", database.display()))
        })?;
        let Some(directory) = database.parent().map(Path::to_owned) else {
            return Err(Refusal::Refused("the database file has no directory".into()));
        };
        let (tx, writes) = mpsc::unbounded_channel();
        let watched = database.clone();
        let handler = move |event: fs_notify::Result<fs_notify::Event>| {
            if let Ok(event) = event
                && event.paths.iter().any(|p| written_by_commits(p, &watched))
            {
                let _ = tx.send(());
            }
        };
        // Writes and new files only: the listener's own reads must not wake it.
        let config =
            fs_notify::Config::default().with_event_kinds(EventKindMask::MODIFY_DATA | EventKindMask::CREATE);
        let mut watcher = fs_notify::RecommendedWatcher::new(handler, config)
            .map_err(|e| Refusal::Refused(format!("the database's directory cannot be watched: {e}")))?;
        watcher
            .watch(&directory, RecursiveMode::NonRecursive)
            .map_err(|e| Refusal::Refused(format!("the database's directory cannot be watched: {e}")))?;
        Ok(FileWatch { _watcher: watcher, writes })
    }

    async fn next(&mut self) -> Result<Pushed, String> {
        self.writes.recv().await.ok_or_else(|| "the watch on the database's files ended".to_owned())?;
        while self.writes.try_recv().is_ok() {}
        Ok(Pushed::unknown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_its_log_and_its_journal_are_watched() {
        let db = Path::new("/tmp/x/app.sqlite");
        assert!(written_by_commits(Path::new("/tmp/x/app.sqlite"), db));
        assert!(written_by_commits(Path::new("/tmp/x/app.sqlite-wal"), db));
        assert!(written_by_commits(Path::new("/tmp/x/app.sqlite-journal"), db));
        assert!(!written_by_commits(Path::new("/tmp/x/app.sqlite-shm"), db));
        assert!(!written_by_commits(Path::new("/tmp/x/other.sqlite"), db));
    }
}
