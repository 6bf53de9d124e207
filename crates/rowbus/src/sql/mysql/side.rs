//! What the MySQL/MariaDB side tables (deduplication ids, ordering keys) share: their
//! text column's type, and the move of an older queue's index into a table of its own.

use sqlx::MySql;

use crate::names::QueueTable;
use crate::sql::{Naming, quoted};

/// A group name, an ordering key or a deduplication id: compared byte for byte.
pub(super) const SHORT_TEXT: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

/// The [`index_upgrades`](crate::sql::Schema::index_upgrades) entry that moves what the index
/// `<table><suffix>` held into a table of its own: whether the index is there (a query
/// returning how many columns it has, and its binds: schema if any, table, index), then
/// `create` (the table), `copy` (its rows from the queue table) and the index dropped.
pub(super) fn index_to_table(
    table: &QueueTable,
    suffix: &str,
    create: String,
    copy: String,
) -> (String, Vec<String>, Vec<String>) {
    let (in_schema, mut binds) = match table.schema() {
        Some(schema) => ("?", vec![schema.to_owned()]),
        None => ("DATABASE()", vec![]),
    };
    let index = format!("{}{suffix}", table.name());
    let drop = format!("ALTER TABLE {} DROP INDEX {}", quoted::<MySql>(table, ""), MySql::quote(&index));
    binds.extend([table.name().to_owned(), index]);
    let check = format!(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.statistics \
         WHERE table_schema = {in_schema} AND table_name = ? AND index_name = ?"
    );
    (check, binds, vec![create, copy, drop])
}
