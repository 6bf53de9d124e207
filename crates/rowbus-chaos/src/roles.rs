//! Least privilege: the chaos scenarios connect as notifier, listener, publisher and
//! consumer, created and granted by the very SQL `scripts/roles.sh` applies.

use std::str::FromStr;

use rowbus::{Backend, DbPool};
use sqlx::ConnectOptions as _;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;

use super::BoxError;
use super::sql::{self, Tables};

const POSTGRES: &str = include_str!("../roles/postgres.sql");
const MARIADB: &str = include_str!("../roles/mariadb.sql");

/// The harness's roles are `rowbus_chaos_notifier` and so on: its own, so that killing
/// every session of its consumer role touches nobody else.
pub(crate) const PREFIX: &str = "rowbus_chaos_";
const PASSWORD: &str = "rowbus_chaos";

/// The roles of scripts/roles.sh the scenarios run under (its read-only monitor runs none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Notifier,
    Listener,
    Publisher,
    Consumer,
}

impl Role {
    /// The role's database user.
    pub(crate) fn user(self) -> String {
        let name = match self {
            Role::Notifier => "notifier",
            Role::Listener => "listener",
            Role::Publisher => "publisher",
            Role::Consumer => "consumer",
        };
        format!("{PREFIX}{name}")
    }
}

/// The statements of one `-- @section NAME` of a roles file.
fn section<'a>(file: &'a str, name: &str) -> Vec<&'a str> {
    let mut on = false;
    let mut lines = Vec::new();
    for line in file.lines() {
        if let Some(header) = line.strip_prefix("-- @section ") {
            on = header.trim() == name;
        } else if on {
            lines.push(line);
        }
    }
    lines
}

fn render(file: &str, name: &str, subs: &[(&str, &str)]) -> String {
    let mut text = section(file, name).join("\n");
    for (placeholder, value) in subs {
        text = text.replace(placeholder, value);
    }
    text
}

/// The URL `admin_url` with a role's user and password instead (SQLite: unchanged).
pub(crate) fn url(admin_url: &str, backend: Backend, role: Role) -> Result<String, BoxError> {
    Ok(match backend {
        Backend::Postgres => PgConnectOptions::from_str(admin_url)?
            .username(&role.user())
            .password(PASSWORD)
            .to_url_lossy()
            .to_string(),
        // sqlx parses one host: a several-host URL (a Galera cluster's) gets its user here.
        Backend::MySql if super::galera::several_hosts(admin_url) => {
            super::galera::with_user(admin_url, &role.user(), PASSWORD)?
        }
        Backend::MySql => {
            let url = match admin_url.strip_prefix("mariadb:") {
                Some(rest) => format!("mysql:{rest}"),
                None => admin_url.to_owned(),
            };
            MySqlConnectOptions::from_str(&url)?
                .username(&role.user())
                .password(PASSWORD)
                .to_url_lossy()
                .to_string()
        }
        Backend::Sqlite => admin_url.to_owned(),
    })
}

/// Creates the roles and grants them their privileges on the run's tables, as
/// scripts/roles.sh does; then the application's own grants: the consumer writes the
/// harness's records. Nothing on SQLite, which has no roles.
pub(crate) async fn apply(admin: &DbPool, tables: &Tables) -> Result<(), BoxError> {
    let (file, schema, database) = match admin {
        DbPool::Postgres(pool) => {
            let database: String = sqlx::query_scalar("SELECT current_database()").fetch_one(pool).await?;
            (POSTGRES, "public".to_owned(), database)
        }
        DbPool::MySql(pool) => {
            let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()").fetch_one(pool).await?;
            let database = database.ok_or("the MySQL/MariaDB URL must name a database")?;
            (MARIADB, database.clone(), database)
        }
        DbPool::Sqlite(_) => return Ok(()),
    };
    let subs = |notify: &str| {
        [
            ("@PREFIX@", PREFIX.to_owned()),
            ("@PASSWORD@", PASSWORD.to_owned()),
            ("@DATABASE@", database.clone()),
            ("@SCHEMA@", schema.clone()),
            ("@QUEUE@", tables.queue.clone()),
            ("@NOTIFY@", notify.to_owned()),
        ]
    };
    let run = |name: &str, notify: &str| {
        let subs = subs(notify);
        let subs: Vec<(&str, &str)> = subs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        render(file, name, &subs)
    };
    for (name, notify) in [
        ("roles", ""),
        ("notify", tables.notify.as_str()),
        ("queue", ""),
        ("queue-listen-notify", tables.wake.as_str()),
    ] {
        sql::batch(admin, &run(name, notify))
            .await
            .map_err(|e| format!("applying section `{name}` of crates/rowbus-chaos/roles/*.sql: {e}"))?;
    }
    let consumer = match admin.backend() {
        Backend::Postgres => format!("\"{}\"", Role::Consumer.user()),
        _ => format!("'{}'@'%'", Role::Consumer.user()),
    };
    for table in [&tables.handled, &tables.effects, &tables.dups] {
        sql::batch(admin, &format!("GRANT INSERT ON {table} TO {consumer}")).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_placeholders() {
        let queue =
            render(MARIADB, "queue", &[("@SCHEMA@", "test"), ("@QUEUE@", "jobs"), ("@PREFIX@", "p_")]);
        assert!(queue.contains("GRANT INSERT ON `test`.`jobs` TO 'p_publisher'@'%';"), "{queue}");
        assert!(queue.contains("GRANT INSERT ON `test`.`jobs_dead` TO 'p_consumer'@'%';"), "{queue}");
        assert!(!queue.contains("CREATE USER"), "{queue}");
        let roles = render(POSTGRES, "roles", &[("@PREFIX@", "p_")]);
        assert!(
            roles.contains("ARRAY['notifier', 'listener', 'publisher', 'consumer', 'monitor']"),
            "{roles}"
        );
        for file in [POSTGRES, MARIADB] {
            for name in ["roles", "notify", "queue", "queue-listen-notify"] {
                assert!(!section(file, name).is_empty(), "{name}");
            }
        }
    }

    #[test]
    fn role_urls_keep_host_and_database() {
        let pg = url("postgres://postgres@127.0.0.1:5432/test", Backend::Postgres, Role::Consumer).unwrap();
        // The password is percent-encoded (`_` as `%5F`).
        assert!(pg.starts_with("postgres://rowbus_chaos_consumer:rowbus"), "{pg}");
        assert!(pg.contains("chaos@127.0.0.1:5432/test"), "{pg}");
        let my = url("mariadb://root@127.0.0.1:3306/test", Backend::MySql, Role::Listener).unwrap();
        assert!(my.starts_with("mysql://rowbus_chaos_listener:rowbus"), "{my}");
        assert!(my.contains("chaos@127.0.0.1:3306/test"), "{my}");
    }
}
