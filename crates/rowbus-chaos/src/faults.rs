//! The faults the harness injects into the database: killed sessions.

use rowbus::DbPool;

/// Terminates every session of database user `user` (but the caller's own): PostgreSQL's
/// `pg_terminate_backend`, MySQL/MariaDB's `KILL CONNECTION`. Returns how many were killed.
pub(crate) async fn kill_user_sessions(admin: &DbPool, user: &str) -> Result<u64, sqlx::Error> {
    match admin {
        DbPool::Postgres(pool) => {
            let killed: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity \
                 WHERE usename = $1 AND pid <> pg_backend_pid()) AS t WHERE done",
            )
            .bind(user)
            .fetch_one(pool)
            .await?;
            Ok(u64::try_from(killed).unwrap_or(0))
        }
        DbPool::MySql(pool) => {
            // information_schema.PROCESSLIST.ID is a signed BIGINT.
            let ids: Vec<i64> =
                sqlx::query_scalar("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?")
                    .bind(user)
                    .fetch_all(pool)
                    .await?;
            let mut killed = 0;
            for id in ids {
                if kill_session(admin, u64::try_from(id).unwrap_or(0)).await? {
                    killed += 1;
                }
            }
            Ok(killed)
        }
        DbPool::Sqlite(_) => Ok(0),
    }
}

/// Terminates one session by its server id; `false` when it was gone already.
pub(crate) async fn kill_session(admin: &DbPool, id: u64) -> Result<bool, sqlx::Error> {
    match admin {
        DbPool::Postgres(pool) => {
            let pid = i32::try_from(id).unwrap_or(i32::MAX);
            sqlx::query_scalar("SELECT pg_terminate_backend($1)").bind(pid).fetch_one(pool).await
        }
        DbPool::MySql(pool) => match sqlx::query("KILL CONNECTION ?").bind(id).execute(pool).await {
            Ok(_) => Ok(true),
            // 1094: unknown thread id (it ended meanwhile).
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == 1094) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        },
        DbPool::Sqlite(_) => Ok(false),
    }
}
