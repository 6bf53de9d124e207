//! Creating what rowbus needs in the database.

use notify_table::{Config, Dialect, NotifyTable};
use sqlx::Executor;

use crate::backend::DbPool;
use crate::db::sealed::Sealed as _;
use crate::error::Error;

/// What [`DbPool::deploy_notify_table`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyDeploy {
    /// The notify table exists now (it was created, or was there already).
    TableReady {
        /// Its name.
        table: String,
    },
    /// PostgreSQL has LISTEN/NOTIFY built in: nothing to create.
    Native,
}

impl std::fmt::Display for NotifyDeploy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotifyDeploy::TableReady { table } => write!(f, "notify table `{table}` is ready"),
            NotifyDeploy::Native => {
                write!(f, "PostgreSQL has LISTEN/NOTIFY built in: no notify table needed, nothing to do")
            }
        }
    }
}

impl DbPool {
    /// Creates the notify table and its indexes if they do not exist (MySQL/MariaDB,
    /// SQLite); on PostgreSQL does nothing and says so.
    pub async fn deploy_notify_table(&self, config: &Config) -> Result<NotifyDeploy, Error> {
        let ready = || NotifyDeploy::TableReady { table: config.table.clone() };
        match self {
            DbPool::Postgres(_) => {
                config.validate()?;
                Ok(NotifyDeploy::Native)
            }
            DbPool::MySql(pool) => {
                let table = NotifyTable::new(config.clone(), Dialect::MySql)?;
                for stmt in table.create_table_sql() {
                    pool.execute(sqlx::MySql::statement(&stmt)).await?;
                }
                Ok(ready())
            }
            DbPool::Sqlite(pool) => {
                let table = NotifyTable::new(config.clone(), Dialect::Sqlite { pid: std::process::id() })?;
                let mut tx = pool.begin().await?;
                for stmt in table.create_table_sql() {
                    tx.execute(sqlx::Sqlite::statement(&stmt)).await?;
                }
                tx.commit().await?;
                Ok(ready())
            }
        }
    }
}
