//! The operator's side: deploying and reading how a queue stands ([`admin`]), dead
//! letters ([`dead`]), pausing ([`pause`]), limits ([`limits`]), kept history ([`history`]), schedules
//! ([`schedule`], run by [`scheduler`], due ticks by [`ticks`]), published totals
//! ([`published`]), the counters a user reads ([`stats`]) and those kept in the database
//! ([`counts`]), what holds the database's horizon ([`horizon`]), and a waiting message
//! made due at once ([`due`]).
//!
//! Entered through `Queue` and `Broker` methods (`deploy`, `dead_letters`, `pause`,
//! `history`, `schedule`, `stats`...), as `rowbus stats`, `dead`, `pause`, `history`,
//! `schedule` and the dashboard use them.

pub(crate) mod admin;
pub(crate) mod cancel;
pub(crate) mod counts;
pub(crate) mod dead;
pub(crate) mod due;
pub(crate) mod history;
pub(crate) mod horizon;
pub(crate) mod keeping;
pub(crate) mod limits;
pub(crate) mod messages;
pub(crate) mod pause;
pub(crate) mod published;
pub(crate) mod schedule;
pub(crate) mod scheduler;
pub(crate) mod schedulers;
pub(crate) mod stats;
pub(crate) mod ticks;
