//! How long the library's claims take, as a benchmark sees them: the duration of each
//! `rowbus.claim` span (the library opens one around every claim of a subscription), kept
//! while a benchmark asks for them and nowhere else.
//!
//! A tracing layer of the command's subscriber, filtered on its own: the spans are the
//! library's debug ones, which the command's log filter leaves out. While nothing records,
//! the filter refuses them as it always did.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::span::{Attributes, Id};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;

/// The name of the library's claim span.
const CLAIM_SPAN: &str = "rowbus.claim";

/// Whether claims are being timed.
static RECORDING: AtomicBool = AtomicBool::new(false);

/// The durations recorded since the last [`take`].
static TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

/// Starts recording claim durations (until the process ends).
pub(crate) fn record() {
    RECORDING.store(true, Ordering::Relaxed);
}

/// The claim durations recorded since the last call.
pub(crate) fn take() -> Vec<Duration> {
    std::mem::take(&mut *TIMES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The layer to add to the command's subscriber.
pub(crate) fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    ClaimTimes.with_filter(OnlyClaims)
}

/// Times `rowbus.claim` spans from their start to their close.
struct ClaimTimes;

/// When a claim span started.
struct Started(Instant);

impl<S> Layer<S> for ClaimTimes
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Started(Instant::now()));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if let Some(Started(at)) = span.extensions().get::<Started>() {
            TIMES.lock().unwrap_or_else(|e| e.into_inner()).push(at.elapsed());
        }
    }
}

/// Lets through the claim spans while recording, nothing else.
struct OnlyClaims;

impl<S> Filter<S> for OnlyClaims {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        meta.name() == CLAIM_SPAN && RECORDING.load(Ordering::Relaxed)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if meta.name() == CLAIM_SPAN {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}
