//! What happens to a verified delivery's items, between the edge that
//! received them and the processor (or the inbox) that books them.
//!
//! [`Deliveries::book`] takes items already verified and mapped to canonical
//! events ([`Item`]), whoever verified them: the webhook handler, or a
//! runner that lists a PSP's events through its API. For each item it
//! decides:
//!
//! - an item fencehook does not act on is `ignored`, nothing written;
//! - a batch item that cannot be mapped, or a batch's refund its payment
//!   cannot give, is quarantined (`quarantined_items`, once per key) and
//!   does not hold up the other items of its batch;
//! - a refund its PSP may have meant as a cancel (Adyen's
//!   `CANCEL_OR_REFUND`) is decided by the ledger
//!   ([`crate::domain::cancelled`]): against a payment
//!   recorded `failed` now it is ignored; otherwise it is booked as a
//!   refund, or in inbox mode stored marked, and decided again by the
//!   worker that books it, when the payment's failure may have been booked;
//! - while shutting down, or while commits do not wait for a required
//!   synchronous standby, no event is booked (retry);
//! - otherwise the event is stored for the inbox workers (inbox mode) or
//!   booked by the processor now (sync mode).
//!
//! Items of one delivery are booked side by side, each under its own lease;
//! a refund or dispute whose payment is another item of the same delivery
//! (a Mollie payment fetched with its refunds) is booked after it, so that
//! it finds its payment booked rather than waiting for a retry.
//!
//! [`Deliveries::admit`] is the webhook's own step before that, for a
//! scheme whose signature does not cover the body well (PayPal's covers its
//! CRC-32): the delivery's transmission id is bound to its body, and with
//! `confirm = "api"` a new event is confirmed with the PSP's API.
//!
//! What must stay true: nothing is answered durable (an item's [`Fate`])
//! unless what it says was committed; every failure is [`Fate::Unavailable`],
//! which the PSP retries.

use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use tracing::Instrument;

use crate::domain::{self, CanonicalEvent};
use crate::error::Error;
use crate::health::Health;
use crate::inbox::Inbox;
use crate::metrics::{Metrics, QuarantineReason, RejectReason};
use crate::processor::{Outcome, Processor};
use crate::providers::{Item, Provider, Reject, TransmissionKey};
use crate::store::inbox::Accepted;
use crate::store::transmissions::Transmission;
use crate::store::Store;
use crate::telemetry::spans;

/// Items of one delivery processed at once: enough that a batch is not
/// serialised, few enough that one large batch cannot take the whole database
/// pool from other deliveries.
const BATCH_CONCURRENCY: usize = 8;

/// The delivery room: where verified items go to be booked.
pub struct Deliveries {
    store: Store,
    processor: Processor,
    /// Inbox mode: events are stored here for the workers instead of booked.
    inbox: Option<Arc<Inbox>>,
    metrics: Metrics,
    health: Arc<Health>,
}

/// What the items were received with, kept beside each event in inbox mode.
pub struct Received<'a> {
    /// The PSP's own id of the delivery, where it has one (searching only,
    /// never deduplication).
    pub psp_event_id: Option<&'a str>,
    /// The delivery as received (inbox mode; empty in sync mode, which
    /// does not keep it).
    pub body: &'a str,
    /// Shutdown was asked for: no new event is booked.
    pub draining: bool,
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Not acted on: nothing written.
    Ignored,
    /// Recorded, not booked; durable.
    Quarantined,
    /// Inbox mode: what storing it for the workers found.
    Stored(Accepted),
    /// Sync mode: what the processor did.
    Processed(Outcome),
    /// Not brought to a durable outcome now: the PSP should retry.
    Unavailable,
}

/// One item's fate, and the transaction it is about when it is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub fate: Fate,
    pub transaction_id: Option<String>,
}

impl Handled {
    fn of(fate: Fate, transaction_id: Option<String>) -> Handled {
        Handled {
            fate,
            transaction_id,
        }
    }
}

/// Why a verified delivery is not booked after all ([`Deliveries::admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its transmission id was seen with another body, or the PSP's API
    /// knows the event otherwise: a forgery (401; counted here).
    Forged { why: String },
    /// What the check needs could not be had now (logged here): retry.
    Unavailable,
    /// The PSP's API could not confirm it for another reason.
    Rejected(Reject),
}

impl Deliveries {
    pub fn new(
        store: Store,
        processor: Processor,
        inbox: Option<Arc<Inbox>>,
        metrics: Metrics,
        health: Arc<Health>,
    ) -> Deliveries {
        Deliveries {
            store,
            processor,
            inbox,
            metrics,
            health,
        }
    }

    /// Whether events are stored for the inbox workers (what they were
    /// received with is then kept: see [`Received`]).
    pub fn stores_events(&self) -> bool {
        self.inbox.is_some()
    }

    /// Books every item, side by side, each under its own lease; the fates
    /// come in the items' order.
    pub async fn book(
        &self,
        provider: &Provider,
        mut items: Vec<Item>,
        received: Received<'_>,
    ) -> Vec<Handled> {
        let received = &received;
        if items.len() == 1 {
            // Nearly every delivery is one event: booked on this task, with
            // no stream of futures to allocate and order around it. Boxed:
            // the item's future (the processor's whole state machine) is a
            // few KB, and inline it made every future around it as large,
            // copied whole at each await and by hyper (callgrind: 13,000
            // instructions of memcpy a delivery, against one allocation).
            let item = items.pop().expect("one item");
            return vec![Box::pin(self.one(provider, item, received)).await];
        }
        let after = after_their_payment(&items);
        if !after.contains(&true) {
            return self.side_by_side(provider, items, received).await;
        }
        let count = items.len();
        let (mut first, mut then) = (Vec::new(), Vec::new());
        for (item, later) in items.into_iter().enumerate().zip(after) {
            if later {
                then.push(item);
            } else {
                first.push(item);
            }
        }
        let mut fates: Vec<Option<Handled>> = vec![None; count];
        for wave in [first, then] {
            let (places, items): (Vec<usize>, Vec<Item>) = wave.into_iter().unzip();
            let handled = self.side_by_side(provider, items, received).await;
            for (place, handled) in places.into_iter().zip(handled) {
                fates[place] = Some(handled);
            }
        }
        fates
            .into_iter()
            .map(|f| f.expect("every item was booked in one wave"))
            .collect()
    }

    /// Books `items` side by side; the fates come in the items' order.
    async fn side_by_side(
        &self,
        provider: &Provider,
        items: Vec<Item>,
        received: &Received<'_>,
    ) -> Vec<Handled> {
        stream::iter(
            items
                .into_iter()
                .map(|item| self.one(provider, item, received)),
        )
        .buffered(BATCH_CONCURRENCY)
        .collect()
        .await
    }

    async fn one(&self, provider: &Provider, item: Item, received: &Received<'_>) -> Handled {
        let (ev, may_cancel) = match item {
            Item::Event(ev) => (ev, false),
            Item::CancelOrRefund(ev) => (ev, true),
            Item::Ignored { event_type } => {
                tracing::debug!(provider = %provider.name, %event_type, "event type not acted on");
                return Handled::of(Fate::Ignored, None);
            }
            Item::Unmappable {
                reason,
                key,
                transaction_id,
                raw,
            } => {
                let reason = format!("unmappable: {reason}");
                let item = Quarantined {
                    raw: &raw,
                    key: &key,
                };
                let kind = QuarantineReason::Unmappable;
                return self
                    .quarantine(provider, transaction_id, &reason, item, kind)
                    .await;
            }
        };
        if may_cancel {
            match self.cancelled(&ev).await {
                Ok(true) => return Handled::of(Fate::Ignored, None),
                Ok(false) => {}
                Err(e) => {
                    self.failed(
                        &ev,
                        &e,
                        "could not look up the payment of a CANCEL_OR_REFUND",
                    );
                    return Handled::of(Fate::Unavailable, Some(ev.transaction_id));
                }
            }
        }
        // FENCEHOOK_REQUIRE_SYNC_REPLICATION and the last sample found
        // commits not waiting for a standby: an acknowledgement could be
        // lost in a failover, so none is given.
        if received.draining || self.health.refuses_bookings() {
            return Handled::of(Fate::Unavailable, Some(ev.transaction_id));
        }
        match &self.inbox {
            Some(inbox) => {
                let accepting = spans::inbox_accept(&ev);
                let accepted = inbox
                    .accept(&ev, may_cancel, received.psp_event_id, received.body)
                    .instrument(accepting)
                    .await;
                match accepted {
                    Ok(accepted) => Handled::of(Fate::Stored(accepted), Some(ev.transaction_id)),
                    Err(e) => {
                        self.failed(&ev, &e, "could not accept");
                        Handled::of(Fate::Unavailable, Some(ev.transaction_id))
                    }
                }
            }
            None => self.process(provider, ev).await,
        }
    }

    /// Books one event now (sync mode).
    async fn process(&self, provider: &Provider, ev: CanonicalEvent) -> Handled {
        let processed = self
            .processor
            .process(&ev)
            .instrument(spans::process(&ev))
            .await;
        match processed {
            // In a batch, a refund its payment cannot give must not hold
            // up the other items: it is recorded, and the batch goes on.
            Ok(Outcome::RefundRejected(why)) if provider.is_batch() => {
                let raw = serde_json::to_string(&ev).unwrap_or_default();
                // The event's identity and kind, not its JSON: that
                // carries `occurred_at`, which no PSP need sign.
                let key = format!("{}:{}", ev.fingerprint(), ev.event_type.as_str());
                let reason = format!("refund_rejected: {}", why.as_str());
                let item = Quarantined {
                    raw: &raw,
                    key: &key,
                };
                let kind = QuarantineReason::RefundRejected;
                self.quarantine(provider, Some(ev.transaction_id), &reason, item, kind)
                    .await
            }
            Ok(outcome) => Handled::of(Fate::Processed(outcome), Some(ev.transaction_id)),
            Err(e) => {
                self.failed(&ev, &e, "item failed");
                Handled::of(Fate::Unavailable, Some(ev.transaction_id))
            }
        }
    }

    /// Whether a refund its PSP may have meant as a cancel was one: its
    /// payment, as the ledger holds it now, decides.
    async fn cancelled(&self, ev: &CanonicalEvent) -> Result<bool, Error> {
        let parent = ev.parent_transaction_id.as_deref().unwrap_or_default();
        let payment = self.store.lookup(&ev.provider, parent).await?;
        Ok(payment.is_some_and(|p| domain::cancelled(p.kind, p.status)))
    }

    /// Logs why an event is answered "retry", and probes the database at
    /// once when it was the database.
    fn failed(&self, ev: &CanonicalEvent, e: &Error, what: &str) {
        if matches!(e, Error::Store(_)) {
            self.health.nudge();
        }
        tracing::error!(provider = %ev.provider, transaction_id = %ev.transaction_id,
            kind = e.kind(), error = %crate::report::chain(e), "{what}; answered 503");
    }

    /// Records a batch item that cannot be booked, once per key; durable
    /// once written (the batch may be acknowledged), unavailable when the
    /// write fails.
    async fn quarantine(
        &self,
        provider: &Provider,
        transaction_id: Option<String>,
        reason: &str,
        item: Quarantined<'_>,
        kind: QuarantineReason,
    ) -> Handled {
        let written = self
            .store
            .quarantine(
                &provider.name,
                transaction_id.as_deref(),
                reason,
                item.raw,
                item.key,
            )
            .await;
        match written {
            Ok(seen) => {
                // A PSP re-sends the batch: the item is counted (and logged) once.
                if seen == 1 {
                    self.metrics.quarantined(kind).increment(1);
                    tracing::warn!(provider = %provider.name, transaction_id = transaction_id.as_deref().unwrap_or("-"),
                        %reason, "batch item quarantined: recorded, not booked");
                }
                Handled::of(Fate::Quarantined, transaction_id)
            }
            Err(e) => {
                tracing::error!(provider = %provider.name, error = %crate::report::chain(&e),
                    "could not quarantine a batch item; answered 503");
                Handled::of(Fate::Unavailable, transaction_id)
            }
        }
    }

    /// For a scheme whose signature does not cover the body well (PayPal
    /// signs only the CRC-32 of the body, which any body can be made to
    /// match): a verified delivery's transmission id is bound to the first
    /// body seen with it before anything is booked (also when the body does
    /// not map, a 400 after the signature verified, so those headers cannot
    /// carry another body later), and when the provider confirms with the
    /// PSP's API, a new event is fetched and must be what was delivered.
    /// Nothing for other schemes, and nothing for a delivery refused before.
    pub async fn admit(
        &self,
        provider: &Provider,
        headers: &http::HeaderMap,
        body: &[u8],
        accepted: &Result<Vec<Item>, Reject>,
    ) -> Result<(), Refusal> {
        if !matches!(accepted, Ok(_) | Err(Reject::Invalid(_))) {
            return Ok(());
        }
        let Some(key) = provider.transmission(headers, body) else {
            return Ok(());
        };
        // Boxed: its statements and the PSP's API call make a future of a few
        // KB, which every delivery's future would carry (and copy at each
        // await) for the few schemes that bind a transmission.
        Box::pin(self.bind(provider, key, body, accepted)).await
    }

    /// [`Deliveries::admit`] for a delivery with a transmission id.
    async fn bind(
        &self,
        provider: &Provider,
        key: TransmissionKey,
        body: &[u8],
        accepted: &Result<Vec<Item>, Reject>,
    ) -> Result<(), Refusal> {
        let unavailable = |e: crate::store::StoreError, what: &str| {
            let e = Error::from(e);
            tracing::error!(provider = %provider.name, kind = e.kind(),
                error = %crate::report::chain(&e), "could not {what}; answered 503");
            Refusal::Unavailable
        };
        let forged = |reason: RejectReason, why: String| {
            self.metrics.request_rejected(reason).increment(1);
            Refusal::Forged { why }
        };
        let bound = self
            .store
            .bind_transmission(&provider.name, &key.id, &key.body_sha256, key.expires_at)
            .await;
        let confirmed = match bound {
            Ok(Transmission::New) => false,
            Ok(Transmission::SameBody { confirmed }) => confirmed,
            Ok(Transmission::OtherBody) => {
                return Err(forged(
                    RejectReason::TransmissionReused,
                    format!(
                        "a transmission id seen before with another body (transmission id {})",
                        key.id
                    ),
                ))
            }
            Err(e) => return Err(unavailable(e, "record the transmission id")),
        };
        // Only an event that would be booked is worth the PSP's API's time.
        let item = match accepted {
            Ok(items) => match items.as_slice() {
                [item @ Item::Event(_)] => item,
                _ => return Ok(()),
            },
            Err(_) => return Ok(()),
        };
        if confirmed || !provider.confirms() {
            return Ok(());
        }
        match provider.confirm(body, item).await {
            Ok(()) => self
                .store
                .confirm_transmission(&provider.name, &key.id, &key.body_sha256)
                .await
                .map_err(|e| unavailable(e, "record the confirmation")),
            Err(Reject::Unauthorized(why)) => {
                // Dropped, so that the genuine body can still take the id.
                self.store
                    .unbind_transmission(&provider.name, &key.id, &key.body_sha256)
                    .await
                    .map_err(|e| unavailable(e, "drop a contradicted transmission id"))?;
                Err(forged(
                    RejectReason::EventUnconfirmed,
                    format!("{why} (transmission id {})", key.id),
                ))
            }
            Err(reject) => Err(Refusal::Rejected(reject)),
        }
    }
}

/// For each item, whether it takes money from a payment that another item of
/// the same delivery books (and so must be booked after it).
fn after_their_payment(items: &[Item]) -> Vec<bool> {
    fn event(item: &Item) -> Option<&CanonicalEvent> {
        match item {
            Item::Event(ev) | Item::CancelOrRefund(ev) => Some(ev),
            Item::Ignored { .. } | Item::Unmappable { .. } => None,
        }
    }
    let payments: Vec<&str> = items
        .iter()
        .filter_map(event)
        .filter(|ev| ev.parent_transaction_id.is_none())
        .map(|ev| ev.transaction_id.as_str())
        .collect();
    items
        .iter()
        .map(|item| {
            event(item)
                .and_then(|ev| ev.parent_transaction_id.as_deref())
                .is_some_and(|parent| payments.contains(&parent))
        })
        .collect()
}

/// A batch item to quarantine: as received, and what identifies it.
struct Quarantined<'a> {
    raw: &'a str,
    key: &'a str,
}
