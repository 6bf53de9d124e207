//! One scenario per behaviour the notify-table contract names, with hand-written rows.
//!
//! Most scenarios run against [`Db`], a few lines that evaluate the MySQL statements the
//! way the server does (PAD SPACE channel comparison, visibility at COMMIT, the server
//! clock), so that what a poll returns follows from its bind values; the rest hand the
//! core rows directly.

use std::sync::Arc;
use std::time::Duration;

use notify_table::{
    Config, Dialect, Error, Gap, MAX_CHANNELS, MAX_PAYLOAD_BYTES, Notification, NotifyTable, Row, Statement,
    Value,
};

// ---------------------------------------------------------------------------------------
// A hand-driven MySQL notify table
// ---------------------------------------------------------------------------------------

const SEC: u64 = 1_000_000;
const PID: u64 = 7;

/// `2026-11-29 HH:MM:SS.ffffff` for `us` microseconds after midnight, as MySQL's
/// `DATE_FORMAT(..., '%Y-%m-%d %H:%i:%s.%f')` writes it.
fn ts(us: u64) -> String {
    let s = us / SEC;
    format!("2026-11-29 {:02}:{:02}:{:02}.{:06}", s / 3600, s / 60 % 60, s % 60, us % SEC)
}

/// 12:00:00 plus `secs`.
fn noon(secs: u64) -> u64 {
    12 * 3600 * SEC + secs * SEC
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Open,
    Committed,
    RolledBack,
}

struct DbRow {
    id: u64,
    channel: String,
    created_at: u64,
    state: State,
}

/// The notify table on a MySQL server: each row is its own transaction.
struct Db {
    now: u64,
    rows: Vec<DbRow>,
}

fn text(v: &Value) -> &str {
    v.as_text().expect("text bind")
}

fn int(v: &Value) -> u64 {
    u64::try_from(v.as_int().expect("integer bind")).unwrap()
}

impl Db {
    fn at(now: u64) -> Self {
        Db { now, rows: Vec::new() }
    }

    fn advance(&mut self, secs: u64) {
        self.now += secs * SEC;
    }

    /// INSERT with an explicit AUTO_INCREMENT id, in a transaction left open.
    fn insert(&mut self, id: u64, channel: &str) {
        self.rows.push(DbRow { id, channel: channel.into(), created_at: self.now, state: State::Open });
    }

    fn end(&mut self, id: u64, state: State) {
        let row = self.rows.iter_mut().find(|r| r.id == id).expect("inserted");
        assert_eq!(row.state, State::Open);
        row.state = state;
    }

    fn commit(&mut self, id: u64) {
        self.end(id, State::Committed);
    }

    fn rollback(&mut self, id: u64) {
        self.end(id, State::RolledBack);
    }

    /// INSERT and COMMIT at once.
    fn notify(&mut self, id: u64, channel: &str) {
        self.insert(id, channel);
        self.commit(id);
    }

    fn visible(&self) -> impl Iterator<Item = &DbRow> {
        self.rows.iter().filter(|r| r.state == State::Committed)
    }

    fn subscribe(&self, stmt: &Statement) -> Vec<Row> {
        let [ch, ch2, lookback, seed, seed2] = &stmt.binds[..] else { panic!("subscribe binds {stmt:?}") };
        assert!(text(ch) == text(ch2) && seed == seed2 && int(seed) > int(lookback));
        let mark = self.visible().filter(|r| r.channel == text(ch)).map(|r| r.id).max().unwrap_or(0);
        let mut rows = vec![Row::head(mark, ts(self.now - int(lookback)), ts(self.now))];
        // The floor: the last row inserted before the window (of ties, the highest id).
        let since = self.now - int(seed);
        let floor = self.visible().filter(|r| r.created_at < since).max_by_key(|r| (r.created_at, r.id));
        rows.push(Row { id: floor.map_or(0, |r| r.id), ..Row::default() });
        // The window's ids, of every channel.
        rows.extend(
            self.visible().filter(|r| r.created_at >= since).map(|r| Row { id: r.id, ..Row::default() }),
        );
        rows
    }

    fn poll(&self, stmt: &Statement) -> Vec<Row> {
        let row = |r: &DbRow| Row::notification(r.id, r.channel.clone(), format!("p{}", r.id), PID);
        let mut rows = vec![Row::head(0, ts(self.now - int(&stmt.binds[0])), ts(self.now))];
        let slots = stmt.sql.matches("BETWEEN").count();
        let (gaps, groups) = stmt.binds[1..].split_at(2 * slots);
        for range in gaps.chunks_exact(2) {
            // The probes: primary-key ranges, any channel, with `created_at`.
            let (first, last) = (int(&range[0]), int(&range[1]));
            rows.extend(
                self.visible()
                    .filter(|r| (first..=last).contains(&r.id))
                    .map(|r| Row { at: Some(ts(r.created_at)), ..row(r) }),
            );
        }
        for group in groups.chunks_exact(3) {
            let [ch, ch_bin, mark] = group else { unreachable!() };
            assert!(ch == ch_bin);
            let (ch, mark) = (text(ch), int(mark));
            // `channel = ? AND channel = CAST(? AS BINARY)`: an exact match.
            rows.extend(self.visible().filter(|r| r.channel == ch && r.id > mark).map(row));
        }
        rows
    }
}

fn mysql() -> NotifyTable {
    NotifyTable::new(Config::default(), Dialect::MySql).unwrap()
}

fn listen(nt: &mut NotifyTable, db: &Db, channel: &str) {
    let stmt = nt.subscribe_sql(channel).unwrap();
    nt.subscribed(channel, db.subscribe(&stmt)).unwrap();
}

/// One poll, evaluated and folded at once.
fn tick(nt: &mut NotifyTable, db: &Db) -> Vec<Notification> {
    let (stmt, token) = nt.poll_sql().expect("something subscribed");
    nt.polled(token, db.poll(&stmt)).unwrap()
}

/// Advances the clock one second and polls, `n` times; returns everything delivered.
fn tick_for(nt: &mut NotifyTable, db: &mut Db, n: u64) -> Vec<Notification> {
    let mut all = Vec::new();
    for _ in 0..n {
        db.advance(1);
        all.extend(tick(nt, db));
    }
    all
}

/// What the notification for row `id` of `channel` is.
fn note(id: u64, channel: &str) -> Notification {
    Notification { channel: channel.into(), payload: format!("p{id}"), pid: PID }
}

fn mark_of(nt: &NotifyTable, channel: &str) -> (u64, String) {
    let p = nt.position(channel).expect("subscribed");
    (p.mark, p.cutoff)
}

// ---------------------------------------------------------------------------------------
// Delivery
// ---------------------------------------------------------------------------------------

#[test]
fn delivered_on_commit_not_before() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.notify(9, "jobs");
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs");
    assert_eq!(tick_for(&mut nt, &mut db, 3), vec![], "open transaction: invisible");
    db.commit(10);
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(10, "jobs")]);
    assert_eq!(tick_for(&mut nt, &mut db, 5), vec![]);
}

#[test]
fn rolled_back_notification_is_never_delivered() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs");
    db.insert(11, "jobs");
    db.advance(1);
    db.rollback(10);
    db.commit(11);
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(11, "jobs")]);
    assert_eq!(tick_for(&mut nt, &mut db, 120), vec![]);
}

#[test]
fn no_history_before_the_subscription() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    for id in 1..=5 {
        db.notify(id, "jobs"); // ids 1..=5 at 12:00:00..12:00:40, all inside the window at 12:01
        db.advance(10);
    }
    db.advance(10);
    listen(&mut nt, &db, "jobs");
    assert_eq!(mark_of(&nt, "jobs"), (5, ts(noon(0))), "mark 5; cutoff 12:01:00 - 60 s");
    assert_eq!(nt.position("jobs").unwrap().first_window, None, "1..=5 read at subscribe: no id to watch");
    assert_eq!(tick_for(&mut nt, &mut db, 3), vec![], "rows 1..=5 are history");
    db.notify(6, "jobs");
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(6, "jobs")]);
}

#[test]
fn transaction_open_at_subscribe_is_delivered_once_it_commits() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.insert(6, "jobs"); // open while 7 commits and the channel is subscribed
    db.notify(7, "jobs");
    db.insert(8, "jobs"); // open, and no higher id will ever be delivered before it
    listen(&mut nt, &db, "jobs");
    assert_eq!(mark_of(&nt, "jobs").0, 7);
    db.advance(30);
    db.commit(6); // 30 s after its INSERT: inside the lookback, below the mark
    assert_eq!(tick(&mut nt, &db), vec![note(6, "jobs")]);
    db.advance(300);
    db.commit(8); // five minutes after its INSERT: above the mark
    assert_eq!(tick(&mut nt, &db), vec![note(8, "jobs")]);
    assert_eq!(tick_for(&mut nt, &mut db, 70), vec![]);
}

#[test]
fn out_of_order_commit_is_delivered_exactly_once() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.notify(9, "jobs");
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs"); // transaction A takes id 10
    db.insert(11, "jobs"); // transaction B takes id 11 and commits first
    db.advance(1);
    db.commit(11);
    assert_eq!(tick(&mut nt, &db), vec![note(11, "jobs")]);
    assert_eq!(mark_of(&nt, "jobs").0, 11, "a poll asking only for id > 11 would never see 10");
    db.advance(5);
    db.commit(10);
    assert_eq!(tick(&mut nt, &db), vec![note(10, "jobs")], "caught by the lookback window");
    assert_eq!(tick_for(&mut nt, &mut db, 120), vec![], "never delivered again");
}

#[test]
fn documented_loss_commit_after_lookback_behind_a_delivered_higher_id() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs"); // 12:00:00
    db.advance(1);
    db.notify(11, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(11, "jobs")]);
    assert_eq!(tick_for(&mut nt, &mut db, 63), vec![]);
    // The window now starts after 10's INSERT and the mark is above it.
    let (mark, cutoff) = mark_of(&nt, "jobs");
    assert_eq!((mark, cutoff.as_str()), (11, ts(noon(4)).as_str()));
    db.advance(1);
    db.commit(10); // 65 s after its INSERT, lookback is 60 s
    assert_eq!(tick_for(&mut nt, &mut db, 120), vec![], "the one documented loss");
}

#[test]
fn late_commit_without_a_higher_id_delivered_is_delivered_however_late() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.notify(9, "jobs");
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs");
    db.notify(11, "mail"); // a higher id on another channel does not count
    db.notify(12, "jobs "); // nor on a channel equal to it only under PAD SPACE
    assert_eq!(tick_for(&mut nt, &mut db, 600), vec![]);
    assert_eq!(mark_of(&nt, "jobs").0, 9);
    db.commit(10); // ten minutes after its INSERT
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(10, "jobs")]);
}

#[test]
fn late_commit_within_lookback_is_delivered_after_a_higher_id() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs");
    db.notify(11, "jobs");
    assert_eq!(tick_for(&mut nt, &mut db, 59), vec![note(11, "jobs")]);
    db.commit(10); // 59 s after its INSERT
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(10, "jobs")]);
}

/// Rows each poll reads, besides its head row.
fn rows_read(nt: &mut NotifyTable, db: &mut Db, polls: u64) -> usize {
    let mut read = 0;
    for _ in 0..polls {
        db.advance(1);
        let (stmt, token) = nt.poll_sql().unwrap();
        let rows = db.poll(&stmt);
        read += rows.len() - 1;
        assert_eq!(nt.polled(token, rows).unwrap(), vec![]);
    }
    read
}

#[test]
fn a_poll_reads_what_is_new_not_the_window() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs"); // mark 0: nothing below it, no first window
    assert_eq!(nt.position("jobs").unwrap().first_window, None);
    db.notify(1, "jobs");
    db.notify(2, "jobs");
    db.advance(20);
    db.notify(3, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(1, "jobs"), note(2, "jobs"), note(3, "jobs")]);
    // A core that re-read its whole window would read 1 and 2 again in 41 more polls
    // and 3 in 61 (143 rows).
    assert_eq!(rows_read(&mut nt, &mut db, 100), 0);
}

#[test]
fn the_first_window_watches_only_the_ids_the_subscribe_did_not_read() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    for id in 1..=60 {
        db.notify(id, if id % 3 == 0 { "mail" } else { "jobs" }); // a minute of traffic, 1/s
        db.advance(1);
    }
    db.insert(61, "jobs"); // open at subscribe, at 12:01:00
    db.notify(62, "jobs");
    listen(&mut nt, &db, "jobs"); // mark 62; floor 0 (nothing before 11:59:59)
    let window = nt.position("jobs").unwrap().first_window.expect("an id below the mark was not read");
    assert_eq!((window.upto, window.until, window.missing), (62, Some(ts(noon(60))), vec![61..=61]));
    let (stmt, _) = nt.poll_sql().unwrap();
    assert_eq!(stmt.sql.matches("BETWEEN").count(), 1, "one probe: id 61");
    // A poll reads what is new and the probe; the window's 60 rows are not read again.
    assert_eq!(rows_read(&mut nt, &mut db, 20), 0);
    // Nor after a reconnect: the resumed position watches the same id.
    let stored: notify_table::Position = nt.position("jobs").unwrap().to_string().parse().unwrap();
    let mut nt = mysql();
    assert!(!nt.resumed("jobs", stored, resume_rows(&nt, &db)).unwrap());
    assert_eq!(nt.position("jobs").unwrap().first_window.unwrap().missing, vec![61..=61]);
    assert_eq!(rows_read(&mut nt, &mut db, 10), 0);
    db.notify(63, "jobs");
    db.commit(61);
    assert_eq!(tick(&mut nt, &db), vec![note(61, "jobs"), note(63, "jobs")]);
    assert_eq!(nt.position("jobs").unwrap().first_window, None, "nothing left to watch");
    assert_eq!(rows_read(&mut nt, &mut db, 30), 0);
}

#[test]
fn the_first_window_ends_a_lookback_after_the_subscribe() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.insert(1, "jobs");
    db.notify(2, "jobs");
    db.advance(10);
    listen(&mut nt, &db, "jobs"); // mark 2 at 12:00:10: window until 12:00:10
    assert_eq!(rows_read(&mut nt, &mut db, 60), 0);
    assert!(nt.position("jobs").unwrap().first_window.is_some(), "not over before 12:01:10");
    assert_eq!(rows_read(&mut nt, &mut db, 1), 0);
    assert_eq!(nt.position("jobs").unwrap().first_window, None, "its cutoff passed the subscribe");
    db.commit(1); // 71 s after its INSERT, below the mark: the loss case
    db.notify(3, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(3, "jobs")]);
}

/// A row open at subscribe below the mark is delivered exactly when a poll re-reading the
/// window from the cutoff it was built with (`created_at >= cutoff`) would have read it.
#[test]
fn a_row_open_at_subscribe_is_delivered_as_a_reread_window_would_read_it() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.insert(1, "jobs"); // 12:00:00
    db.insert(2, "jobs");
    db.insert(3, "jobs");
    db.advance(50);
    db.notify(4, "jobs");
    listen(&mut nt, &db, "jobs"); // 12:00:50: mark 4, cutoff 11:59:50
    assert_eq!(nt.position("jobs").unwrap().first_window.unwrap().missing, vec![1..=3]);
    assert_eq!(tick_for(&mut nt, &mut db, 5), vec![]); // polls at 12:00:51..=55
    db.commit(1);
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(1, "jobs")], "from 11:59:55 on: 12:00:00 is in");
    assert_eq!(tick_for(&mut nt, &mut db, 10), vec![]); // to 12:01:06
    db.commit(2);
    assert_eq!(
        tick_for(&mut nt, &mut db, 1),
        vec![],
        "from 12:00:06: inserted at 12:00:00, 67 s before this poll, behind mark 4: let go"
    );
    // A listener that stopped polling for a while reads from the cutoff of its last poll.
    db.advance(3);
    db.commit(3);
    let mut stalled = mysql();
    let mut late_db = Db::at(noon(50));
    late_db.insert(1, "jobs");
    late_db.rows[0].created_at = noon(0);
    late_db.notify(4, "jobs");
    listen(&mut stalled, &late_db, "jobs");
    late_db.advance(15);
    late_db.commit(1); // 65 s after its INSERT, but the last statement's cutoff is 11:59:50
    assert_eq!(tick(&mut stalled, &late_db), vec![note(1, "jobs")]);
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![], "3 let go as 2 was");
}

/// A position stored by a rowbus whose first window listed the ids it had read resumes
/// with the ids it had not, and delivers what that window would have.
#[test]
fn a_position_with_an_older_first_window_resumes_as_that_window_would_go_on() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.insert(2, "jobs"); // 12:00:00, open
    db.notify(1, "jobs");
    db.advance(10);
    db.notify(3, "mail");
    db.notify(4, "jobs");
    db.insert(5, "jobs"); // open
    db.notify(6, "jobs");
    // Mark 6 at 12:00:20, cutoff 11:59:20; its window had read 1, 4 and 6.
    db.advance(10);
    let old = format!("1|6|{}|||6@{}#1,4,6", ts(noon(20) - 60 * SEC), ts(noon(20)));
    let position: notify_table::Position = old.parse().unwrap();
    assert_eq!(position.first_window.as_ref().unwrap().missing, vec![2..=3, 5..=5]);
    db.advance(5);
    db.commit(2);
    db.commit(5);
    assert!(!nt.resumed("jobs", position, resume_rows(&nt, &db)).unwrap());
    assert_eq!(tick(&mut nt, &db), vec![note(2, "jobs"), note(5, "jobs")]);
    assert_eq!(nt.position("jobs").unwrap().first_window, None, "3 is `mail`'s: nothing left to watch");
    assert_eq!(tick_for(&mut nt, &mut db, 5), vec![]);
}

#[test]
fn id_order_within_a_poll_across_channels() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "mail");
    listen(&mut nt, &db, "jobs");
    for (id, channel) in [(5, "mail"), (6, "jobs"), (7, "mail"), (8, "jobs"), (9, "jobs")] {
        db.insert(id, channel);
    }
    for id in [9, 7, 5, 8, 6] {
        db.commit(id);
    }
    let (stmt, token) = nt.poll_sql().unwrap();
    let mut rows = db.poll(&stmt);
    rows[1..].reverse(); // the statement returns them grouped and in no particular order
    let expected = [note(5, "mail"), note(6, "jobs"), note(7, "mail"), note(8, "jobs"), note(9, "jobs")];
    assert_eq!(nt.polled(token, rows).unwrap(), expected);
}

// ---------------------------------------------------------------------------------------
// Channels and subscriptions
// ---------------------------------------------------------------------------------------

#[test]
fn trailing_space_channel_is_not_delivered_to_jobs() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.notify(9, "jobs");
    listen(&mut nt, &db, "jobs");
    db.insert(10, "jobs");
    db.notify(11, "jobs ");
    let (stmt, token) = nt.poll_sql().unwrap();
    let mut rows = db.poll(&stmt);
    assert!(rows.iter().all(|r| r.channel != "jobs "), "the statement compares channels exactly");
    // Were the server to pad anyway, the fold matches channels exactly too.
    rows.push(Row::notification(11, "jobs ", "p11", PID));
    assert_eq!(nt.polled(token, rows).unwrap(), vec![]);
    assert_eq!(mark_of(&nt, "jobs").0, 9, "nor does its id raise the mark of `jobs`");
    db.advance(120);
    db.commit(10);
    assert_eq!(tick(&mut nt, &db), vec![note(10, "jobs")]);
}

#[test]
fn unsubscribe_while_a_poll_is_in_flight_drops_that_polls_rows() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    listen(&mut nt, &db, "mail");
    db.notify(1, "jobs");
    db.notify(2, "mail");
    let (stmt, token) = nt.poll_sql().unwrap();
    let rows = db.poll(&stmt);
    assert_eq!(rows.len(), 3);
    assert!(nt.unsubscribe("jobs"));
    assert!(!nt.unsubscribe("jobs"));
    assert_eq!(nt.polled(token, rows).unwrap(), vec![note(2, "mail")]);
    assert_eq!(nt.channels(), ["mail"]);
    nt.unsubscribe_all();
    assert!(nt.poll_sql().is_none());
}

#[test]
fn resubscribe_while_a_poll_is_in_flight_drops_its_rows_and_keeps_the_new_state() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.notify(9, "jobs");
    listen(&mut nt, &db, "jobs");
    let (stmt, token) = nt.poll_sql().unwrap();
    db.advance(5);
    db.notify(10, "jobs");
    assert!(nt.unsubscribe("jobs"));
    listen(&mut nt, &db, "jobs"); // mark 10, read {9, 10}, cutoff 12:00:05 - 60 s
    let new_state = (10, ts(noon(5) - 60 * SEC));
    assert_eq!(mark_of(&nt, "jobs"), new_state);
    // The old statement reaches the server only now, after 11 committed.
    db.advance(5);
    db.notify(11, "jobs");
    let rows = db.poll(&stmt);
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [0, 10, 11]);
    assert_eq!(nt.polled(token, rows).unwrap(), vec![], "rows of the old subscription's statement");
    assert_eq!(mark_of(&nt, "jobs"), new_state, "neither its mark nor its cutoff moved");
    // Its first window (ids 1..=8, never used here) is intact too: 10 is not delivered, 11 is.
    assert_eq!(nt.position("jobs").unwrap().first_window.unwrap().missing, vec![1..=8]);
    assert_eq!(tick(&mut nt, &db), vec![note(11, "jobs")]);
}

#[test]
fn subscribe_again_replaces_the_subscription() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.notify(1, "jobs");
    listen(&mut nt, &db, "jobs"); // a new mark: 1 is now history
    assert_eq!(nt.channels(), ["jobs"]);
    assert_eq!(tick(&mut nt, &db), vec![]);
}

#[test]
fn channels_are_sorted() {
    let (mut nt, db) = (mysql(), Db::at(noon(0)));
    for channel in ["mail", "jobs ", "b", "jobs", "A"] {
        listen(&mut nt, &db, channel);
    }
    assert_eq!(nt.channels(), ["A", "b", "jobs", "jobs ", "mail"]);
    assert!(nt.is_subscribed("jobs ") && !nt.is_subscribed("job"));
}

#[test]
fn poll_sql_is_none_with_nothing_subscribed() {
    let (mut nt, db) = (mysql(), Db::at(noon(0)));
    assert!(nt.poll_sql().is_none());
    listen(&mut nt, &db, "jobs");
    assert!(nt.poll_sql().is_some());
    nt.unsubscribe("jobs");
    assert!(nt.poll_sql().is_none());
    assert_eq!(nt.cleanup_sql(), None, "no poll, no cleanup");
}

#[test]
fn too_many_channels_are_refused() {
    let mut nt = mysql();
    for i in 0..MAX_CHANNELS {
        nt.subscribed(&format!("c{i}"), vec![Row::cutoff(0, ts(noon(0)))]).unwrap();
    }
    assert_eq!(nt.subscribe_sql("one more"), Err(Error::TooManyChannels { max: MAX_CHANNELS }));
    assert_eq!(
        nt.subscribed("one more", vec![Row::cutoff(0, ts(noon(0)))]),
        Err(Error::TooManyChannels { max: MAX_CHANNELS })
    );
    assert!(nt.subscribe_sql("c17").is_ok(), "subscribing a subscribed channel again takes no room");
    let (stmt, _) = nt.poll_sql().unwrap();
    assert_eq!(stmt.binds.len(), 1 + 3 * MAX_CHANNELS);
    assert!(stmt.binds.len() <= 65_535, "within MySQL's placeholder limit");
}

// ---------------------------------------------------------------------------------------
// State: mark, cutoff, remembered set
// ---------------------------------------------------------------------------------------

#[test]
fn mark_and_cutoff_only_rise() {
    let mut nt = mysql();
    nt.subscribed("jobs", vec![Row::cutoff(9, ts(noon(0)))]).unwrap();
    let (_, token) = nt.poll_sql().unwrap();
    let rows = vec![Row::cutoff(0, ts(noon(2))), Row::notification(11, "jobs", "p11", PID)];
    assert_eq!(nt.polled(token, rows).unwrap(), vec![note(11, "jobs")]);
    assert_eq!(mark_of(&nt, "jobs"), (11, ts(noon(2))));
    // A poll whose cutoff is older and whose rows are all below the mark lowers neither.
    let (_, token) = nt.poll_sql().unwrap();
    let rows = vec![Row::notification(10, "jobs", "p10", PID), Row::cutoff(0, ts(noon(1)))];
    assert_eq!(nt.polled(token, rows).unwrap(), vec![note(10, "jobs")]);
    assert_eq!(mark_of(&nt, "jobs"), (11, ts(noon(2))));
    // A subscription's own mark row is taken as it is: a re-subscribe may start lower.
    nt.subscribed("jobs", vec![Row::cutoff(3, ts(noon(1)))]).unwrap();
    assert_eq!(mark_of(&nt, "jobs"), (3, ts(noon(1))));
}

#[test]
fn a_gap_is_probed_until_it_ages_out_a_lookback_after_it_was_noticed() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    for id in 1..=9 {
        db.notify(id, "jobs");
    }
    listen(&mut nt, &db, "jobs"); // every id up to the mark read: no first window
    db.insert(10, "jobs"); // open
    db.notify(11, "jobs");
    db.advance(1);
    assert_eq!(tick(&mut nt, &db), vec![note(11, "jobs")]);
    let gap = Gap { first: 10, last: 10, noticed: Some(ts(noon(1))) };
    assert_eq!(nt.position("jobs").unwrap().gaps, vec![gap]);
    let (stmt, _) = nt.poll_sql().unwrap();
    assert_eq!(stmt.sql.matches("BETWEEN").count(), 1, "one probe slot");
    assert_eq!((int(&stmt.binds[1]), int(&stmt.binds[2])), (10, 10));
    // Probed while the cutoff is at or before 12:00:01: until the poll at 12:01:01.
    for _ in 0..60 {
        assert_eq!(tick_for(&mut nt, &mut db, 1), vec![]);
        assert_eq!(nt.position("jobs").unwrap().gaps.len(), 1);
    }
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![]);
    assert_eq!(nt.position("jobs").unwrap().gaps, vec![], "aged out");
    let (stmt, _) = nt.poll_sql().unwrap();
    assert!(!stmt.sql.contains("BETWEEN"));
}

#[test]
fn a_row_of_another_channel_closes_the_gap_it_sits_in() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.notify(1, "jobs");
    db.notify(2, "mail");
    db.notify(3, "jobs ");
    db.notify(4, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(1, "jobs"), note(4, "jobs")]);
    assert_eq!(nt.position("jobs").unwrap().gaps.len(), 1, "2..=3: not read by the poll of `jobs`");
    assert_eq!(tick(&mut nt, &db), vec![], "read by the probe, not ours");
    assert_eq!(nt.position("jobs").unwrap().gaps, vec![]);
    // Rows of two subscribed channels close each other's gaps in the same poll.
    listen(&mut nt, &db, "mail");
    db.notify(5, "mail");
    db.notify(6, "jobs");
    db.notify(7, "mail");
    db.notify(8, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(5, "mail"), note(6, "jobs"), note(7, "mail"), note(8, "jobs")]);
    assert_eq!(nt.position("jobs").unwrap().gaps, vec![]);
    assert_eq!(nt.position("mail").unwrap().gaps.len(), 1, "3..=4, below the first row `mail` read");
    assert_eq!(tick(&mut nt, &db), vec![]);
    assert_eq!(nt.open_gaps(), 0);
}

#[test]
fn at_the_gap_bound_the_mark_waits_and_nothing_is_lost_or_repeated() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    nt.set_max_gaps(1);
    listen(&mut nt, &db, "jobs");
    db.insert(2, "jobs");
    db.insert(4, "jobs");
    for id in [1, 3, 5] {
        db.notify(id, "jobs");
    }
    assert_eq!(tick(&mut nt, &db), vec![note(1, "jobs"), note(3, "jobs"), note(5, "jobs")]);
    let p = nt.position("jobs").unwrap();
    let ahead: Vec<u64> = p.ahead.iter().map(|a| a.id).collect();
    assert_eq!((p.mark, p.gaps.len(), ahead), (3, 1, vec![5]), "gap 2 fits, gap 4 does not");
    assert_eq!(tick_for(&mut nt, &mut db, 3), vec![], "5 is read again, not delivered again");
    db.commit(4);
    assert_eq!(tick(&mut nt, &db), vec![note(4, "jobs")]);
    let p = nt.position("jobs").unwrap();
    assert_eq!((p.mark, p.ahead.len()), (5, 0));
    db.commit(2);
    assert_eq!(tick(&mut nt, &db), vec![note(2, "jobs")]);
    assert_eq!(nt.open_gaps(), 0);
    // No gaps at all: every run of missing ids leaves the mark behind it until it fills.
    nt.set_max_gaps(0);
    db.insert(6, "jobs");
    db.notify(7, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(7, "jobs")]);
    db.advance(600);
    db.commit(6);
    assert_eq!(tick(&mut nt, &db), vec![note(6, "jobs")], "above the mark: however late");
    assert_eq!(tick_for(&mut nt, &mut db, 3), vec![]);
    // A run that never fills (rolled back) holds the mark one lookback, no longer.
    db.insert(8, "jobs");
    db.rollback(8);
    db.notify(9, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(9, "jobs")]);
    assert_eq!(mark_of(&nt, "jobs").0, 7);
    assert_eq!(tick_for(&mut nt, &mut db, 60), vec![]);
    assert_eq!(mark_of(&nt, "jobs").0, 7, "9 was first read at 12:10:04; the cutoff is there now");
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![]);
    let p = nt.position("jobs").unwrap();
    assert_eq!((p.mark, p.ahead.len(), p.gaps.len()), (9, 0, 0), "8 let go without a gap");
}

#[test]
fn ids_a_server_never_uses_age_out_and_late_commits_in_between_arrive() {
    // auto_increment_increment = 3 (a Galera node): ids 1, 4, 7, ... 2 and 3 never exist.
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.insert(13, "jobs");
    for id in [1, 4, 7, 10, 16] {
        db.notify(id, "jobs");
    }
    db.advance(1);
    let got = tick(&mut nt, &db);
    assert_eq!(got, [1, 4, 7, 10, 16].map(|id| note(id, "jobs")));
    assert_eq!(nt.position("jobs").unwrap().gaps.len(), 4, "2..=3, 5..=6, 8..=9, 11..=15");
    db.advance(30);
    db.commit(13);
    assert_eq!(tick(&mut nt, &db), vec![note(13, "jobs")]);
    assert_eq!(nt.open_gaps(), 5, "13 split its gap in two");
    assert_eq!(tick_for(&mut nt, &mut db, 40), vec![]);
    assert_eq!(nt.open_gaps(), 0, "aged out a lookback after they were noticed");
}

// ---------------------------------------------------------------------------------------
// Errors and tokens
// ---------------------------------------------------------------------------------------

#[test]
fn missing_mark_row_is_refused_and_changes_nothing() {
    let mut nt = mysql();
    let window_only = vec![Row { id: 5, ..Row::default() }];
    assert_eq!(nt.subscribed("jobs", window_only), Err(Error::MissingMarkRow { channel: "jobs".into() }));
    assert_eq!(nt.subscribed("jobs", vec![]), Err(Error::MissingMarkRow { channel: "jobs".into() }));
    assert!(!nt.is_subscribed("jobs"));
    assert!(nt.poll_sql().is_none());
    // An existing subscription survives a failed re-subscribe.
    nt.subscribed("jobs", vec![Row::cutoff(9, ts(noon(0)))]).unwrap();
    assert!(nt.subscribed("jobs", vec![]).is_err());
    assert_eq!(mark_of(&nt, "jobs"), (9, ts(noon(0))));
}

#[test]
fn missing_cutoff_row_is_refused_and_changes_nothing() {
    let mut nt = mysql();
    nt.subscribed("jobs", vec![Row::cutoff(9, ts(noon(0)))]).unwrap();
    let (_, token) = nt.poll_sql().unwrap();
    let rows = vec![Row::notification(10, "jobs", "p10", PID)];
    assert_eq!(nt.polled(token, rows.clone()), Err(Error::MissingCutoffRow));
    assert_eq!(nt.polled(token, vec![]), Err(Error::MissingCutoffRow));
    assert_eq!(mark_of(&nt, "jobs"), (9, ts(noon(0))));
    assert_eq!(nt.cleanup_sql(), None, "a refused poll does not count towards the cleanup");
    // The same token still folds: nothing was consumed.
    let mut rows = rows;
    rows.push(Row::cutoff(0, ts(noon(1))));
    assert_eq!(nt.polled(token, rows).unwrap(), vec![note(10, "jobs")]);
    assert!(nt.cleanup_sql().is_some());
}

#[test]
fn stale_token_is_refused_and_changes_nothing() {
    let mut nt = mysql();
    nt.subscribed("jobs", vec![Row::cutoff(9, ts(noon(0)))]).unwrap();
    let (_, first) = nt.poll_sql().unwrap();
    let (_, second) = nt.poll_sql().unwrap();
    let rows = |ids: &[u64]| {
        let mut rows = vec![Row::cutoff(0, ts(noon(1)))];
        rows.extend(ids.iter().map(|&id| Row::notification(id, "jobs", format!("p{id}"), PID)));
        rows
    };
    assert_eq!(nt.polled(second, rows(&[10])).unwrap(), vec![note(10, "jobs")]);
    assert_eq!(nt.polled(first, rows(&[10, 11])), Err(Error::StaleToken { token: 1, last: 2 }));
    assert_eq!(nt.polled(second, rows(&[10, 11])), Err(Error::StaleToken { token: 2, last: 2 }));
    assert_eq!(mark_of(&nt, "jobs").0, 10, "11 was not taken in");
    let (_, third) = nt.poll_sql().unwrap();
    let (_, fourth) = nt.poll_sql().unwrap();
    assert_eq!(nt.polled(fourth, rows(&[10, 11])).unwrap(), vec![note(11, "jobs")]);
    assert_eq!(nt.polled(third, rows(&[])), Err(Error::StaleToken { token: 3, last: 4 }));
}

// ---------------------------------------------------------------------------------------
// Limits and statements
// ---------------------------------------------------------------------------------------

#[test]
fn channel_and_payload_limits_are_refused_never_truncated() {
    let nt = mysql();
    let long = "a".repeat(256);
    let big = "x".repeat(MAX_PAYLOAD_BYTES + 1);
    assert_eq!(nt.notify_sql("", "p"), Err(Error::EmptyChannel));
    assert_eq!(nt.notify_sql(&long, "p"), Err(Error::ChannelTooLong { chars: 256 }));
    assert_eq!(nt.notify_sql("jobs", &big), Err(Error::PayloadTooLarge { bytes: 65_536 }));
    assert_eq!(nt.subscribe_sql(""), Err(Error::EmptyChannel));
    assert_eq!(nt.subscribe_sql(&long), Err(Error::ChannelTooLong { chars: 256 }));
    let mut listener = mysql();
    assert_eq!(
        listener.subscribed(&long, vec![Row::cutoff(0, "")]),
        Err(Error::ChannelTooLong { chars: 256 })
    );
    assert_eq!(listener.subscribed("", vec![Row::cutoff(0, "")]), Err(Error::EmptyChannel));

    // At the limits, sent whole.
    let channel = "𝄞".repeat(255); // 255 characters, 1,020 bytes
    let payload = "€".repeat(21_845); // 65,535 bytes
    let stmt = nt.notify_sql(&channel, &payload).unwrap();
    assert_eq!(
        stmt.binds,
        [Value::Text(Arc::from(channel.as_str())), Value::Text(Arc::from(payload.as_str()))]
    );
    let stmt = nt.subscribe_sql(&channel).unwrap();
    assert_eq!(text(&stmt.binds[0]), channel);
    assert_eq!(nt.notify_sql("jobs", &format!("{payload}x")), Err(Error::PayloadTooLarge { bytes: 65_536 }));
    assert_eq!(nt.notify_sql(&format!("{channel}a"), ""), Err(Error::ChannelTooLong { chars: 256 }));
}

#[test]
fn notify_binds_in_both_dialects() {
    let stmt = mysql().notify_sql("jobs", "wake up").unwrap();
    assert_eq!(
        &*stmt.sql,
        "INSERT INTO `rowbus_notify` (`channel`, `payload`, `pid`, `created_at`) \
         VALUES (?, ?, CONNECTION_ID(), UTC_TIMESTAMP(6))"
    );
    assert_eq!(stmt.binds, [Value::Text(Arc::from("jobs")), Value::Text(Arc::from("wake up"))]);

    let sqlite = NotifyTable::new(Config::default(), Dialect::Sqlite { pid: 4242 }).unwrap();
    let stmt = sqlite.notify_sql("jobs", "").unwrap();
    assert_eq!(
        &*stmt.sql,
        "INSERT INTO `rowbus_notify` (`channel`, `payload`, `pid`, `created_at`) \
         VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'))"
    );
    assert_eq!(stmt.binds, [Value::Text(Arc::from("jobs")), Value::Text(Arc::from("")), Value::Int(4242)]);
}

#[test]
fn subscribe_and_poll_binds_in_both_dialects() {
    let config = Config { lookback: Duration::from_millis(60_250), ..Config::default() };
    let mut my = NotifyTable::new(config.clone(), Dialect::MySql).unwrap();
    let stmt = my.subscribe_sql("jobs").unwrap();
    let jobs = Value::Text(Arc::from("jobs"));
    let lookback = Value::Int(60_250_000);
    let seed = Value::Int(61_250_000);
    assert_eq!(stmt.binds, [jobs.clone(), jobs.clone(), lookback.clone(), seed.clone(), seed]);
    // The mark row alone: no id read, so every id up to the mark is watched.
    my.subscribed("jobs", vec![Row::cutoff(9, "2026-11-29 11:59:00.000000")]).unwrap();
    let (stmt, _) = my.poll_sql().unwrap();
    assert_eq!(
        stmt.binds,
        [lookback, Value::Int(1), Value::Int(9), jobs.clone(), jobs.clone(), Value::Int(9)],
        "the first window's ids 1..=9 probed; mark 9"
    );

    let mut lite = NotifyTable::new(config, Dialect::Sqlite { pid: 1 }).unwrap();
    let modifier = Value::Text(Arc::from("-60.250000 seconds"));
    let stmt = lite.subscribe_sql("jobs").unwrap();
    assert_eq!(stmt.binds, [jobs.clone(), modifier.clone()]);
    lite.subscribed("jobs", vec![Row::cutoff(9, "2026-11-29 11:59:00.000000")]).unwrap();
    assert_eq!(lite.position("jobs").unwrap().first_window, None, "ids visible in commit order");
    let (stmt, _) = lite.poll_sql().unwrap();
    assert_eq!(stmt.binds, [modifier, jobs, Value::Int(9)]);
}

#[test]
fn poll_sql_text_is_the_same_for_the_same_channel_count() {
    let (mut nt, db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "a");
    listen(&mut nt, &db, "b");
    let (two, _) = nt.poll_sql().unwrap();
    nt.unsubscribe("b");
    listen(&mut nt, &db, "c");
    let (again, _) = nt.poll_sql().unwrap();
    assert_eq!(again.sql, two.sql, "other channels, same count: same text");
    assert_ne!(again.binds, two.binds);
    listen(&mut nt, &db, "d");
    let (three, _) = nt.poll_sql().unwrap();
    assert_ne!(three.sql, two.sql);
    assert_eq!(three.sql.matches('?').count(), 1 + 3 * 3);
    nt.unsubscribe("d");
    let (back, _) = nt.poll_sql().unwrap();
    assert_eq!(back.sql, two.sql);
}

// ---------------------------------------------------------------------------------------
// Cleanup cadence
// ---------------------------------------------------------------------------------------

fn with_interval(poll_interval: Duration, retention: Duration) -> NotifyTable {
    let config = Config { poll_interval, retention, ..Config::default() };
    let mut nt = NotifyTable::new(config, Dialect::MySql).unwrap();
    nt.subscribed("jobs", vec![Row::cutoff(0, ts(noon(0)))]).unwrap();
    nt
}

fn empty_poll(nt: &mut NotifyTable) {
    let (_, token) = nt.poll_sql().unwrap();
    nt.polled(token, vec![Row::cutoff(0, ts(noon(0)))]).unwrap();
}

/// Polls until a cleanup is due; returns how many polls that took (`None` past `limit`).
fn polls_until_due(nt: &mut NotifyTable, limit: u64) -> Option<u64> {
    (1..=limit).find(|_| {
        empty_poll(nt);
        nt.cleanup_sql().is_some()
    })
}

#[test]
fn cleanup_is_due_after_the_first_poll_then_once_a_minute_of_polling() {
    let mut nt = with_interval(Duration::from_secs(1), Config::DEFAULT_RETENTION);
    assert_eq!(nt.cleanup_sql(), None);
    empty_poll(&mut nt);
    let select = nt.cleanup_sql().expect("due after the first poll");
    assert_eq!(
        &*select.sql,
        "SELECT `id` FROM `rowbus_notify` WHERE `created_at` < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
         ORDER BY `created_at` LIMIT ?"
    );
    assert_eq!(select.binds, [Value::Int(3_600_000_000), Value::Int(1000)]);
    assert_eq!(nt.cleanup_sql(), Some(select), "stays due until it is reported");
    let delete = nt.delete_sql(&[3, 4, 17]).expect("ids to delete");
    assert_eq!(&*delete.sql, "DELETE FROM `rowbus_notify` WHERE `id` IN (?, ?, ?)");
    assert_eq!(delete.binds, [Value::Int(3), Value::Int(4), Value::Int(17)]);
    assert_eq!(nt.delete_sql(&[]), None, "nothing expired: report Some(0)");
    nt.cleaned(Some(3));
    assert_eq!(nt.cleanup_sql(), None);
    assert_eq!(polls_until_due(&mut nt, 10_000), Some(60));
    nt.cleaned(Some(0));
    assert_eq!(polls_until_due(&mut nt, 10_000), Some(60));

    let mut fast = with_interval(Duration::from_millis(50), Config::DEFAULT_RETENTION);
    assert_eq!(polls_until_due(&mut fast, 10), Some(1));
    fast.cleaned(Some(1));
    assert_eq!(polls_until_due(&mut fast, 10_000), Some(1200));
}

#[test]
fn cleanup_after_a_full_batch_is_due_on_the_very_next_poll() {
    let mut nt = with_interval(Duration::from_secs(1), Config::DEFAULT_RETENTION);
    empty_poll(&mut nt);
    nt.cleaned(Some(1000));
    assert_eq!(nt.cleanup_sql(), None, "not before the next poll");
    assert!(nt.cleanup_due_next_poll(), "a whole batch: the next poll cleans again");
    assert_eq!(polls_until_due(&mut nt, 10_000), Some(1));
    nt.cleaned(Some(1000));
    assert_eq!(polls_until_due(&mut nt, 10_000), Some(1));
    nt.cleaned(Some(999));
    assert!(!nt.cleanup_due_next_poll(), "less than a batch: a period of polls first");
    assert_eq!(polls_until_due(&mut nt, 59), None);
    assert!(nt.cleanup_due_next_poll(), "the period's last poll is next");
    assert_eq!(polls_until_due(&mut nt, 1), Some(1));
    let off = with_interval(Duration::from_secs(1), Duration::ZERO);
    assert!(!off.cleanup_due_next_poll(), "retention 0: never");
}

#[test]
fn failed_cleanup_waits_a_whole_period() {
    let mut nt = with_interval(Duration::from_secs(1), Config::DEFAULT_RETENTION);
    empty_poll(&mut nt);
    nt.cleaned(None);
    assert_eq!(nt.cleanup_sql(), None);
    assert_eq!(polls_until_due(&mut nt, 10_000), Some(60));
}

#[test]
fn retention_zero_never_cleans_up() {
    let mut nt = with_interval(Duration::from_secs(1), Duration::ZERO);
    assert_eq!(polls_until_due(&mut nt, 5_000), None);
    nt.cleaned(Some(1000));
    assert_eq!(polls_until_due(&mut nt, 100), None);
}

#[test]
fn sqlite_cleanup_binds_a_time_modifier() {
    let config = Config { retention: Duration::from_millis(90_500), ..Config::default() };
    let mut nt = NotifyTable::new(config, Dialect::Sqlite { pid: 1 }).unwrap();
    nt.subscribed("jobs", vec![Row::cutoff(0, "2026-11-29 12:00:00.000")]).unwrap();
    empty_poll(&mut nt);
    let stmt = nt.cleanup_sql().unwrap();
    assert_eq!(stmt.binds, [Value::Text(Arc::from("-90.500000 seconds")), Value::Int(1000)]);
}

// ---------------------------------------------------------------------------------------
// Known defect
// ---------------------------------------------------------------------------------------

/// Two subscribed channels equal under PAD SPACE (`jobs` and `jobs `): on MySQL each
/// one's poll group returns the other's rows, outside the other's own mark and window,
/// and the core cannot tell, so it delivers history. Needs an exact channel predicate in
/// the poll statement; see the test report.
#[test]
fn pad_equal_channels_subscribed_together_get_no_history() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    db.notify(1, "jobs");
    db.advance(61);
    listen(&mut nt, &db, "jobs"); // mark 1; row 1 is history, outside the window
    listen(&mut nt, &db, "jobs "); // mark 0: its group returns every `jobs` row with id > 0
    assert_eq!(tick(&mut nt, &db), vec![], "history delivered to `jobs`");
}

/// The same defect as a second delivery: `jobs ` subscribed after a `jobs` row left the
/// window of `jobs` returns it again, through its own group.
#[test]
fn pad_equal_channels_subscribed_together_deliver_once() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.notify(1, "jobs");
    assert_eq!(tick(&mut nt, &db), vec![note(1, "jobs")]);
    assert_eq!(tick_for(&mut nt, &mut db, 62), vec![]);
    listen(&mut nt, &db, "jobs ");
    assert_eq!(tick(&mut nt, &db), vec![], "1 delivered to `jobs` a second time");
}

// ---------------------------------------------------------------------------------------
// Resuming from a stored position
// ---------------------------------------------------------------------------------------

/// The head row of the resume statement: the server's time minus `retention`.
fn resume_rows(nt: &NotifyTable, db: &Db) -> Vec<Row> {
    let stmt = nt.resume_sql();
    let [retention] = &stmt.binds[..] else { panic!("resume binds {stmt:?}") };
    vec![Row::head(0, ts(db.now - int(retention)), ts(db.now))]
}

/// A listener away for a while (its connection lost, its process restarted) resumes on a
/// new core from the position the old one reported: what was committed meanwhile, and an
/// open gap's late commit, are delivered once; what it delivered before is not again.
#[test]
fn resuming_delivers_what_was_committed_while_away_and_nothing_twice() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    db.advance(61); // past the first window
    db.insert(1, "jobs");
    db.notify(2, "jobs");
    assert_eq!(tick_for(&mut nt, &mut db, 1), vec![note(2, "jobs")]);
    let stored: notify_table::Position = nt.position("jobs").unwrap().to_string().parse().unwrap();
    assert_eq!(stored.gaps.len(), 1, "id 1 is a gap: {stored:?}");
    assert_eq!(stored.first_unread(), 1);
    drop(nt);

    db.notify(3, "jobs");
    db.advance(20);
    db.commit(1);
    db.notify(4, "mail");
    let mut resumed = mysql();
    assert!(!resumed.resumed("jobs", stored.clone(), resume_rows(&resumed, &db)).unwrap());
    assert_eq!(resumed.position("jobs"), Some(stored));
    assert_eq!(tick_for(&mut resumed, &mut db, 1), vec![note(1, "jobs"), note(3, "jobs")]);
    assert_eq!(tick_for(&mut resumed, &mut db, 5), vec![]);
}

/// Away longer than the retention, rows it had not read may have been cleaned up: the
/// resume says so, and still delivers what is there.
#[test]
fn resuming_past_the_retention_says_rows_may_be_gone() {
    let config = Config { retention: Duration::from_secs(120), ..Config::default() };
    let mut nt = NotifyTable::new(config.clone(), Dialect::MySql).unwrap();
    let mut db = Db::at(noon(0));
    listen(&mut nt, &db, "jobs");
    db.advance(61);
    tick_for(&mut nt, &mut db, 1);
    let stored = nt.position("jobs").unwrap();
    db.notify(5, "jobs");
    db.advance(200);
    let mut resumed = NotifyTable::new(config, Dialect::MySql).unwrap();
    assert!(resumed.resumed("jobs", stored, resume_rows(&resumed, &db)).unwrap());
    assert_eq!(tick_for(&mut resumed, &mut db, 1), vec![note(5, "jobs")]);
}

#[test]
fn a_position_no_subscription_can_be_in_is_refused() {
    let db = Db::at(noon(0));
    let mut nt = mysql();
    let gap = |first, last| Gap { first, last, noticed: None };
    let position = |mark, gaps| notify_table::Position {
        mark,
        cutoff: ts(noon(0)),
        gaps,
        ahead: Vec::new(),
        first_window: None,
    };
    for bad in
        [position(5, vec![gap(5, 5)]), position(9, vec![gap(3, 4), gap(4, 6)]), position(9, vec![gap(4, 3)])]
    {
        let rows = resume_rows(&nt, &db);
        assert!(matches!(nt.resumed("jobs", bad, rows), Err(Error::InvalidPosition { .. })));
    }
    let mut sqlite = NotifyTable::new(Config::default(), Dialect::Sqlite { pid: 1 }).unwrap();
    let rows = resume_rows(&nt, &db);
    let refused = sqlite.resumed("jobs", position(9, vec![gap(3, 4)]), rows);
    assert!(matches!(refused, Err(Error::InvalidPosition { .. })), "{refused:?}");
    assert!(!nt.is_subscribed("jobs") && !sqlite.is_subscribed("jobs"));
}

#[test]
fn the_cleanup_below_a_floor_binds_it_before_the_limit() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    tick_for(&mut nt, &mut db, 1);
    let plain = nt.cleanup_sql().unwrap();
    assert_eq!(nt.cleanup_sql_below(None), Some(plain.clone()));
    let below = nt.cleanup_sql_below(Some(42)).unwrap();
    assert!(below.sql.contains("`id` < ? ORDER BY"), "{}", below.sql);
    assert_eq!(below.binds, [plain.binds[0].clone(), Value::Int(42), plain.binds[1].clone()]);
}

#[test]
fn the_cleanup_holds_each_channel_from_its_own_id() {
    let (mut nt, mut db) = (mysql(), Db::at(noon(0)));
    listen(&mut nt, &db, "jobs");
    tick_for(&mut nt, &mut db, 1);
    let plain = nt.cleanup_sql().unwrap();
    assert_eq!(nt.cleanup_sql_holding(&[]), Some(plain.clone()));
    let held = nt.cleanup_sql_holding(&[("jobs", 42), ("mail", 7)]).unwrap();
    assert!(
        held.sql
            .contains("AND NOT (`channel` = ? AND `id` >= ?) AND NOT (`channel` = ? AND `id` >= ?) ORDER BY"),
        "{}",
        held.sql
    );
    let text = |s: &str| Value::Text(s.into());
    assert_eq!(
        held.binds,
        [
            plain.binds[0].clone(),
            text("jobs"),
            Value::Int(42),
            text("mail"),
            Value::Int(7),
            plain.binds[1].clone()
        ]
    );
    // Past the bound the statement keeps everything from the lowest id on.
    let many: Vec<String> = (0..=notify_table::MAX_HELD_CHANNELS).map(|i| format!("c{i}")).collect();
    let many: Vec<(&str, u64)> = many.iter().enumerate().map(|(i, c)| (c.as_str(), 100 + i as u64)).collect();
    assert_eq!(nt.cleanup_sql_holding(&many), nt.cleanup_sql_below(Some(100)));
}
