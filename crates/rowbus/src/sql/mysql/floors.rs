//! Where a MySQL/MariaDB claim starts: the floors' statements (see `sql::rotation`).

use sqlx::MySql;

use crate::names::QueueTable;
use crate::sql::{Naming as _, quoted};

/// No partitions: claims start at their floor, which is what a held snapshot slowed (see
/// [`claim_sql`](crate::sql::Claiming::claim_sql)); the space the churn keeps meanwhile is the purge's
/// to give back once the snapshot ends (docs/performance.md).
impl crate::sql::Rotating for MySql {
    /// The floor's priority's oldest row from the floor on, and whether rows wait at a more
    /// urgent priority (read backwards from the floor's priority, away from its
    /// delete-marked records) or a less urgent one: a few records each where the whole
    /// computation reads the group.
    fn floor_step_sql(table: &QueueTable) -> Option<String> {
        let t = quoted::<Self>(table, "");
        let group = "group_name >= ? AND group_name <= ?";
        let waiting = "(lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6))";
        let order = |dir: &str| {
            format!("ORDER BY group_name {dir}, priority {dir}, visible_at {dir}, id {dir} LIMIT 1")
        };
        Some(format!(
            "SELECT (SELECT {} FROM {t} WHERE {group} AND priority = ? AND visible_at >= {} AND {waiting} {}), \
             (SELECT 1 FROM {t} WHERE {group} AND priority < ? AND {waiting} {}), \
             (SELECT 1 FROM {t} WHERE {group} AND priority > ? AND {waiting} {}), {}",
            Self::micros_of("visible_at"),
            Self::from_micros("?"),
            order("ASC"),
            order("DESC"),
            order("ASC"),
            Self::micros_of("UTC_TIMESTAMP(6)")
        ))
    }

    /// With each priority's earliest lease end, since a step moves the floor over held
    /// rows, which it finds again only when the floor is computed whole.
    fn floor_sql(table: &QueueTable) -> Option<String> {
        let waiting = "(lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6))";
        Some(format!(
            "SELECT CAST(priority AS SIGNED), CAST(SUM({waiting} AND visible_at <= UTC_TIMESTAMP(6)) AS SIGNED), \
             {}, {} FROM {} WHERE group_name = ? GROUP BY priority \
             UNION ALL SELECT NULL, NULL, {}, NULL",
            Self::micros_of(&format!("MIN(CASE WHEN {waiting} THEN visible_at END)")),
            Self::micros_of(&format!("MIN(CASE WHEN NOT {waiting} THEN lease_until END)")),
            quoted::<Self>(table, ""),
            Self::micros_of("UTC_TIMESTAMP(6)")
        ))
    }

    fn floor_leases_sql(table: &QueueTable) -> Option<String> {
        Some(format!(
            "SELECT {} FROM {} WHERE group_name >= ? AND group_name <= ? AND priority = ? \
             AND visible_at >= {} AND visible_at < {} AND lease_until > UTC_TIMESTAMP(6)",
            Self::micros_of("MIN(lease_until)"),
            quoted::<Self>(table, ""),
            Self::from_micros("?"),
            Self::from_micros("?")
        ))
    }
}
