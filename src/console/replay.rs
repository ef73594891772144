//! The console's one write: dead events re-queued, one by one or every one
//! matching a filter (a dry run counts them first). Operators only, each
//! logged with who asked and counted.
//!
//! A replay of many is bounded by its dry run: the dry run counts up to
//! [`REPLAY_MAX`] and its confirmation form carries that count and the
//! database's time of it, so the confirmation re-queues at most what was
//! counted, of the events dead by then (not those that died since). The
//! store re-queues them [`crate::store::events::REPLAY_BATCH`] per statement;
//! the answer lists the first [`EVENTS_SHOWN`].

use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::answer::{bad_request, failure, json_answer, redirect, show, unavailable, Answer};
use super::auth::{Role, Session};
use super::model::{encode_segment, ReplayFilter, ReplayView};
use super::when::parse_when;
use super::{may_write, views, Ask, Console, ReplayScope};
use crate::store::events::Replay;
use hyper::StatusCode;

/// Most dead events one replay of many re-queues (and its dry run counts):
/// more ask for a second replay.
pub const REPLAY_MAX: i64 = 10_000;

/// Re-queued events listed in a replay's JSON answer.
pub const EVENTS_SHOWN: usize = 100;

/// A console path to go back to after a write (never another site's).
fn back(ask: &Ask, default: String) -> String {
    match ask.form.get("back") {
        Some(b) if b.starts_with("/console") && !b.contains("//") && !b.contains('\\') => b.clone(),
        _ => default,
    }
}

fn with_replayed(path: &str, n: usize) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}replayed={n}")
}

pub async fn replay_one(console: &Console, ask: &Ask, session: &Session, id: &str) -> Answer {
    may_write(ask, session, Some(Role::Operator))?;
    let Ok(id) = id.parse::<i64>() else {
        return Err(bad_request(ask, session, "the event id is not a number"));
    };
    let Some(event) = console
        .store
        .event(id)
        .await
        .map_err(|e| unavailable(ask, session, &e))?
    else {
        return Err(failure(
            ask,
            Some(session),
            StatusCode::NOT_FOUND,
            &format!("no event #{id}"),
        ));
    };
    let again = console
        .store
        .replay_in_batches(
            &Replay {
                event_id: Some(id),
                ..Replay::default()
            },
            Some(1),
            1,
        )
        .await
        .map_err(|e| unavailable(ask, session, &e))?
        .events;
    console.count_replay(ReplayScope::Event);
    tracing::info!(role = session.role.as_str(), peer = ?ask.peer.map(|p| p.ip()), event_id = id,
        provider = %event.provider, transaction_id = %event.transaction_id, replayed = again.len(),
        was = %event.status, "console: replay of one event");
    if ask.json {
        return Ok(json_answer(
            StatusCode::OK,
            &json!({"event_id": id, "was": event.status, "replayed": again.len(), "events": again}),
        ));
    }
    let page = format!(
        "/console/payments/{}/{}",
        encode_segment(&event.provider),
        encode_segment(&event.transaction_id)
    );
    Ok(redirect(&with_replayed(&back(ask, page), again.len())))
}

pub async fn replay_matching(console: &Console, ask: &Ask, session: &Session) -> Answer {
    may_write(ask, session, Some(Role::Operator))?;
    let f = &ask.form;
    let filter = ReplayFilter {
        provider: f.get("provider").cloned(),
        last_error: f.get("last_error").cloned(),
        since: f.get("since").cloned(),
    };
    let since = match &filter.since {
        Some(s) => Some(
            parse_when(s, OffsetDateTime::now_utc())
                .map_err(|e| bad_request(ask, session, &format!("since: {e}")))?,
        ),
        None => None,
    };
    // A dry run unless `dry_run=false` is said: the count comes first.
    let dry_run = f.get("dry_run").map(String::as_str) != Some("false");
    let mut which = Replay {
        provider: filter.provider.clone(),
        since,
        last_error: filter.last_error.clone(),
        ..Replay::default()
    };
    if dry_run {
        let (counted, as_of) = console
            .store
            .replay_count(&which, REPLAY_MAX)
            .await
            .map_err(|e| unavailable(ask, session, &e))?;
        let view = ReplayView {
            dry_run,
            filter,
            matching: counted.min(REPLAY_MAX),
            more: counted > REPLAY_MAX,
            as_of: as_of.format(&Rfc3339).ok(),
            batches: 0,
            events: Vec::new(),
        };
        return Ok(show(ask, &view, |v| views::replay_confirm(session, v)));
    }
    // The dry run's bound, when the confirmation carries it (its form
    // does); a script that skips the dry run replays up to REPLAY_MAX.
    let at_most = match f.get("count") {
        Some(n) => n
            .parse::<i64>()
            .ok()
            .filter(|n| (0..=REPLAY_MAX).contains(n))
            .ok_or_else(|| {
                bad_request(
                    ask,
                    session,
                    &format!("count: a number from 0 to {REPLAY_MAX}"),
                )
            })?,
        None => REPLAY_MAX,
    };
    if let Some(t) = f.get("as_of") {
        which.died_by = Some(
            OffsetDateTime::parse(t, &Rfc3339)
                .map_err(|_| bad_request(ask, session, "as_of: not an RFC 3339 time"))?,
        );
    }
    let again = console
        .store
        .replay_in_batches(&which, Some(at_most), EVENTS_SHOWN)
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
    console.count_replay(ReplayScope::Filter);
    tracing::info!(role = session.role.as_str(), peer = ?ask.peer.map(|p| p.ip()),
        provider = filter.provider.as_deref().unwrap_or("*"), last_error = filter.last_error.as_deref().unwrap_or("*"),
        since = filter.since.as_deref().unwrap_or("*"), at_most, as_of = f.get("as_of").map(String::as_str).unwrap_or("*"),
        replayed = again.count, batches = again.batches, "console: replay of dead events matching a filter");
    if ask.json {
        let view = ReplayView {
            dry_run,
            filter,
            matching: again.count,
            more: false,
            as_of: None,
            batches: again.batches,
            events: again.events,
        };
        return Ok(json_answer(StatusCode::OK, &view));
    }
    Ok(redirect(&with_replayed(
        &back(ask, "/console/events?status=queued".to_owned()),
        again.count as usize,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_ids_in_paths_are_encoded_and_back_links_stay_in_the_console() {
        assert_eq!(encode_segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
        assert_eq!(encode_segment("pi_3Nx-1.2~"), "pi_3Nx-1.2~");
        assert_eq!(
            with_replayed("/console/events?status=dead", 2),
            "/console/events?status=dead&replayed=2"
        );
    }
}
