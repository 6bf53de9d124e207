//! Benchmarks of the notify-table core's hot paths: folding a poll's rows (`polled`, per
//! row) and building the poll statement (`poll_sql`, per statement).
//!
//! The rows are built outside the timed routine; each measurement folds 10,000 rows, so
//! criterion's elements/s gives the cost per row.

use std::cell::{Cell, RefCell};
use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_main};
use notify_table::{Config, Dialect, NotifyTable, PollToken, Row};

const WINDOW: u64 = 10_000;
const CUTOFF: &str = "2026-11-29 12:00:00.000000";

fn channel_name(i: u64) -> String {
    format!("channel-{i:04}")
}

/// A listener subscribed to `channels` channels, each with mark 0 and nothing seen.
fn listener(channels: u64) -> NotifyTable {
    let mut nt = NotifyTable::new(Config::default(), Dialect::MySql).expect("default config");
    for c in 0..channels {
        nt.subscribed(&channel_name(c), vec![Row::cutoff(0, CUTOFF)]).expect("subscribed");
    }
    nt
}

/// A poll's rows: the cutoff row, then `WINDOW` rows with ids `first..first + WINDOW`
/// spread round-robin over `channels` channels and grouped by channel, as the statement's
/// UNION ALL returns them.
fn poll_rows(channels: u64, first: u64) -> Vec<Row> {
    let mut rows = Vec::with_capacity(WINDOW as usize + 1);
    rows.push(Row::cutoff(0, CUTOFF));
    let names: Vec<String> = (0..channels).map(channel_name).collect();
    for c in 0..channels {
        for id in (first..first + WINDOW).filter(|id| id % channels == c) {
            rows.push(Row::notification(id, names[c as usize].clone(), "a payload of some bytes", 42));
        }
    }
    rows
}

fn bench_polled(c: &mut Criterion) {
    let mut group = c.benchmark_group("polled_10k_rows");
    group.throughput(Throughput::Elements(WINDOW));
    for channels in [1u64, 100] {
        let label = format!("{channels}ch");

        // Every poll returns the same rows, all of them read already (a core that re-reads
        // its whole window on every poll, or probes joined over rows read before).
        let nt = RefCell::new(listener(channels));
        let rows = poll_rows(channels, 1);
        {
            let mut nt = nt.borrow_mut();
            let (_, token) = nt.poll_sql().expect("subscribed");
            assert_eq!(nt.polled(token, rows.clone()).expect("folds").len(), WINDOW as usize);
        }
        group.bench_function(format!("all_seen/{label}"), |b| {
            b.iter_batched(
                || -> (PollToken, Vec<Row>) {
                    (nt.borrow_mut().poll_sql().expect("subscribed").1, rows.clone())
                },
                |(token, rows)| {
                    let out = nt.borrow_mut().polled(token, rows).expect("folds");
                    assert!(out.is_empty());
                    out
                },
                BatchSize::LargeInput,
            )
        });

        // Every poll brings a whole window of new ids (and forgets the previous one).
        let nt = RefCell::new(listener(channels));
        let next = Cell::new(1u64);
        group.bench_function(format!("all_new/{label}"), |b| {
            b.iter_batched(
                || -> (PollToken, Vec<Row>) {
                    let first = next.replace(next.get() + WINDOW);
                    (nt.borrow_mut().poll_sql().expect("subscribed").1, poll_rows(channels, first))
                },
                |(token, rows)| {
                    let out = nt.borrow_mut().polled(token, rows).expect("folds");
                    assert_eq!(out.len(), WINDOW as usize);
                    out
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn bench_poll_sql(c: &mut Criterion) {
    const CHANNELS: u64 = 1_000;
    let mut group = c.benchmark_group("poll_sql_1000_channels");
    group.throughput(Throughput::Elements(1));

    // Steady state: the statement text is cached, only the binds are built.
    let mut nt = listener(CHANNELS);
    let _ = nt.poll_sql();
    // (Batched like the other, so that dropping the statement is not timed in either.)
    group.bench_function("cached_text", |b| {
        b.iter_batched(|| (), |()| black_box(nt.poll_sql()), BatchSize::SmallInput)
    });

    // The first build after the channel count changed: the text is built too.
    let nt = RefCell::new(listener(CHANNELS));
    let extra = channel_name(CHANNELS);
    group.bench_function("first_build", |b| {
        b.iter_batched(
            || {
                let mut nt = nt.borrow_mut();
                nt.subscribed(&extra, vec![Row::cutoff(0, CUTOFF)]).expect("subscribed");
                let _ = nt.poll_sql(); // caches the text for 1,001 channels
                nt.unsubscribe(&extra);
            },
            |()| nt.borrow_mut().poll_sql(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

/// Runs every benchmark of this file (what `criterion_group!` would generate, documented).
pub fn benches() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_polled(&mut criterion);
    bench_poll_sql(&mut criterion);
}

criterion_main!(benches);
