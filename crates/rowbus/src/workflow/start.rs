//! Starting and ending workflows, for [`Workflows`](super::Workflows) and for a
//! [`Context`](super::Context) that starts children: a workflow's row and the message
//! that runs it in one transaction; its end recorded, and told to its parent (an event
//! `rowbus.child:<id>` in the same transaction, the parent made due at once).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::store::{self, opt};
use super::{Status, WorkflowError, now_us};
use crate::broker::{BrokerTx, Message, Queue};
use crate::driver::Arg;
use crate::sql::{Db, WorkflowSql, begin};

/// The prefix of the event a child's end is told to its parent under (then its id).
pub(crate) const CHILD_EVENT: &str = "rowbus.child:";

/// The longest workflow name, version, idempotency key or event name, in characters (what
/// a MySQL/MariaDB key column of the workflow tables holds).
pub const MAX_NAME_CHARS: usize = 255;

/// Refuses a name over [`MAX_NAME_CHARS`] characters.
pub(crate) fn check_len(what: &'static str, name: &str) -> Result<(), WorkflowError> {
    match name.chars().count() > MAX_NAME_CHARS {
        true => Err(WorkflowError::TooLong { what, max: MAX_NAME_CHARS }),
        false => Ok(()),
    }
}

/// How a child ended, as its parent's event carries it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ChildEnd {
    /// Its output.
    Ok(serde_json::Value),
    /// Its error.
    Err(String),
}

/// What starts and ends the workflows of one queue.
pub(crate) struct Starter<DB: Db> {
    pub queue: Queue<DB>,
    pub sql: Arc<WorkflowSql>,
    pub group: String,
    /// The version registered under each name.
    pub versions: RwLock<HashMap<String, String>>,
    ids: AtomicU64,
    id_keys: std::hash::RandomState,
}

impl<DB: Db> Starter<DB> {
    pub fn new(queue: Queue<DB>, sql: Arc<WorkflowSql>, group: &str) -> Self {
        Starter {
            queue,
            sql,
            group: group.to_owned(),
            versions: RwLock::default(),
            ids: AtomicU64::new(0),
            id_keys: std::hash::RandomState::new(),
        }
    }

    /// A fresh workflow id: 32 hexadecimal digits no other start has.
    fn fresh_id(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let keys = &self.id_keys;
        let at = now_us();
        format!("{:016x}{:016x}", keys.hash_one((n, at, std::process::id())), keys.hash_one((at, n, 1u8)))
    }

    /// Starts workflow `name` with `input` (JSON) inside `tx`, with idempotency key `key`
    /// and parent `parent`: its id, or the id of the workflow `key` started first.
    pub async fn start_in(
        &self,
        tx: &mut BrokerTx<DB>,
        name: &str,
        input: &str,
        key: Option<&str>,
        parent: Option<&str>,
    ) -> Result<String, WorkflowError> {
        check_len("workflow name", name)?;
        if let Some(key) = key {
            check_len("idempotency key", key)?;
        }
        let version =
            self.versions.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).cloned();
        let version = version.unwrap_or_default();
        check_len("workflow version", &version)?;
        let sql = &self.sql;
        let id = self.fresh_id();
        let now = now_us();
        let args = [
            Arg::Text(&id),
            Arg::Text(name),
            Arg::Text(&version),
            opt(key),
            Arg::Text(Status::Running.as_str()),
            Arg::Text(input),
            opt(parent),
            Arg::Int(now),
            Arg::Int(now),
        ];
        if DB::execute(&mut *tx, &sql.insert, &args).await? == 0 {
            let Some(key) = key else {
                return Err(WorkflowError::failed(format!("workflow id `{id}` is taken")));
            };
            let rows = DB::fetch_rows(&mut *tx, &sql.by_key, &[Arg::Text(key)], 1).await?;
            return rows.first().map(|row| row.text(0).to_owned()).ok_or_else(|| {
                WorkflowError::failed(format!("idempotency key `{key}` is taken and its workflow not found"))
            });
        }
        let message = Message::text(id.clone()).group(self.group.clone());
        let message_id = tx.publish_with_id(&self.queue, message).await?;
        if let Some(message_id) = message_id {
            DB::execute(&mut *tx, &sql.set_message, &[Arg::Int(message_id), Arg::Text(&id)]).await?;
        }
        Ok(id)
    }

    /// Ends running workflow `id` as `status` says, and tells its parent, if it has one,
    /// in the same transaction (then makes the parent due): whether it was running.
    pub async fn finish(
        &self,
        id: &str,
        status: Status,
        output: Option<&str>,
        error: Option<&str>,
    ) -> Result<bool, WorkflowError> {
        let sql = &self.sql;
        let mut tx = begin(self.queue.broker().pool(), DB::WRITE_BEGIN).await?;
        let args = [Arg::Text(status.as_str()), opt(output), opt(error), Arg::Int(now_us()), Arg::Text(id)];
        if DB::execute(&mut tx, &sql.finish, &args).await? != 1 {
            tx.rollback().await?;
            return Ok(false);
        }
        let parent = match store::load::<DB>(&mut tx, sql, id).await?.and_then(|info| info.parent) {
            Some(parent) => {
                let end = match (status, output) {
                    (Status::Succeeded, Some(output)) => ChildEnd::Ok(serde_json::from_str(output)?),
                    (Status::Succeeded, None) => ChildEnd::Ok(serde_json::Value::Null),
                    _ => ChildEnd::Err(error.unwrap_or(status.as_str()).to_owned()),
                };
                let payload = serde_json::to_string(&end)?;
                let name = format!("{CHILD_EVENT}{id}");
                DB::execute(&mut tx, &sql.emit, &[Arg::Text(&parent), Arg::Text(&name), Arg::Text(&payload)])
                    .await?;
                store::load::<DB>(&mut tx, sql, &parent).await?
            }
            None => None,
        };
        tx.commit().await?;
        if let Some(parent) = parent
            && let (Some(message), false) = (parent.message_id, parent.status.is_end())
        {
            self.queue.make_due_now(message, &self.group).await?;
        }
        Ok(true)
    }
}
