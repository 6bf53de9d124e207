//! Creating what rowbus needs in the database.

use notify_table::Config;
use sqlx::Pool;

use crate::backend::{DbPool, OnPool};
use crate::db::Db;
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
        struct Deploy<'a>(&'a Config);
        impl OnPool for Deploy<'_> {
            type Output = Result<NotifyDeploy, Error>;
            async fn run<DB: Db>(self, pool: Pool<DB>) -> Self::Output {
                DB::deploy_notify(&pool, self.0).await
            }
        }
        self.run(Deploy(config)).await
    }
}
