//! One handler per console page: each checks its input (a bad value is a
//! 400 naming it), reads what it shows, and answers the view as HTML
//! ([`super::views`]) or, for `Accept: application/json`, as JSON.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Response, StatusCode};
use time::OffsetDateTime;

use super::answer::{
    bad_request, failure, forbidden, html, redirect, show, throttled, unauthorized, unavailable,
    Answer,
};
use super::auth::{Role, Session};
use super::model::{
    AuditView, EventsView, Overview, PaymentView, RefusalsView, SearchForm, SearchView,
};
use super::timeline::timeline;
use super::when::parse_when;
use super::{
    authenticate, may_write, now_unix, replay, session_cookie, views, Ask, Console, Shared, SignIn,
};
use crate::http::Body;
use crate::store::console::{Cursor, EventList, PaymentSearch, EVENT_STATUSES, PAYMENT_STATUSES};

/// Rows of a page unless `limit` says otherwise (at most
/// [`crate::store::console::MAX_PAGE`]).
const PAGE: i64 = 50;

/// Stored bodies shown on a payment page, and the bytes shown of each.
const BODIES_SHOWN: usize = 50;
const BODY_BYTES: i32 = 64 * 1024;

/// Where a request goes. Who asks is known before any body is read: a POST's form is read only
/// for a signed-in user (or a sign-in, under its own bound), so a client
/// nobody signed in cannot hold a connection with a slow body.
pub async fn route(
    state: Shared<'_>,
    console: &Console,
    mut ask: Ask,
    body: Incoming,
) -> Response<Body> {
    let path = ask.path.trim_end_matches('/').to_owned();
    let segments: Vec<&str> = path.split('/').skip(2).collect();
    let method = ask.method.clone();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["style.css"]) => stylesheet(),
        (&Method::GET, ["login"]) => html(StatusCode::OK, views::login(None)),
        (&Method::POST, ["login"]) => sign_in(console, ask, body).await,
        (method, rest) => {
            let session = match authenticate(console, &ask) {
                Ok(s) => s,
                Err(resp) => return resp,
            };
            if let Err(resp) = ask.read_form(body, &console.form_reads).await {
                return resp;
            }
            let out = match (method, rest) {
                (&Method::GET, []) => overview(state, console, &ask, &session).await,
                (&Method::GET, ["payments"]) => search(console, &ask, &session).await,
                (&Method::GET, ["payments", provider, transaction_id]) => {
                    payment(console, &ask, &session, provider, transaction_id).await
                }
                (&Method::GET, ["events"]) => events(console, &ask, &session).await,
                (&Method::GET, ["refusals"]) => Ok(refusals(state, &ask, &session)),
                (&Method::GET, ["reconcile"]) => {
                    super::reconcile::page(console, &ask, &session).await
                }
                (&Method::POST, ["events", id, "replay"]) => {
                    replay::replay_one(console, &ask, &session, id).await
                }
                (&Method::POST, ["events", "replay"]) => {
                    replay::replay_matching(console, &ask, &session).await
                }
                (&Method::POST, ["logout"]) => sign_out(console, &ask, &session),
                _ => Err(failure(
                    &ask,
                    Some(&session),
                    StatusCode::NOT_FOUND,
                    "no such console page",
                )),
            };
            out.unwrap_or_else(|resp| resp)
        }
    }
}

fn stylesheet() -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(views::STYLE.as_bytes())));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    resp
}

/// A sign-in: the throttle and the Origin are checked on the head, then the
/// form is read under [`super::SIGNIN_READS`].
async fn sign_in(console: &Console, mut ask: Ask, body: Incoming) -> Response<Body> {
    if let Some(wait) = ask.peer.and_then(|p| console.throttle.blocked(p.ip())) {
        console.count_signin(SignIn::Throttled);
        return throttled(&ask, wait);
    }
    if !ask.same_origin() {
        return forbidden(&ask, "the request comes from another origin");
    }
    if let Err(resp) = ask.read_form(body, &console.signin_reads).await {
        return resp;
    }
    let ask = &ask;
    let presented = ask.form.get("token").map(String::as_str).unwrap_or("");
    let Some(role) = console.tokens.role_of(presented.as_bytes()) else {
        console.count_signin(SignIn::WrongToken);
        if let Some(peer) = ask.peer {
            console.throttle.failed(peer.ip());
        }
        tracing::warn!(peer = ?ask.peer.map(|p| p.ip()), "console: wrong token at sign-in; answered 401");
        return unauthorized(ask, "wrong token");
    };
    let Some(cookie) = console.tokens.mint(role, now_unix()) else {
        return unauthorized(ask, "wrong token");
    };
    console.count_signin(SignIn::Ok);
    tracing::info!(role = role.as_str(), peer = ?ask.peer.map(|p| p.ip()), "console: signed in");
    let mut resp = redirect("/console");
    resp.headers_mut().insert(
        hyper::header::SET_COOKIE,
        session_cookie(Some(&cookie), console.secure_cookie),
    );
    resp
}

fn sign_out(console: &Console, ask: &Ask, session: &Session) -> Answer {
    may_write(ask, session, None)?;
    let mut resp = redirect("/console/login");
    resp.headers_mut().insert(
        hyper::header::SET_COOKIE,
        session_cookie(None, console.secure_cookie),
    );
    Ok(resp)
}

async fn overview(state: Shared<'_>, console: &Console, ask: &Ask, session: &Session) -> Answer {
    // Kept beside their series whenever there is a console to show them.
    let figures = state.metrics.figures().unwrap_or_default();
    let inbox = console
        .store
        .inbox_counts_capped()
        .await
        .map_err(|e| unavailable(ask, session, &e))?
        .into();
    let quarantine = console
        .store
        .quarantine_summary()
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
    let latest = console
        .store
        .search_payments(&PaymentSearch {
            limit: 10,
            ..PaymentSearch::default()
        })
        .await
        .map_err(|e| unavailable(ask, session, &e))?
        .rows;
    // The audit's record is one panel of the overview: if it cannot be read
    // (a row written by hand that does not parse), the rest is still shown.
    let audit = match console.store.last_audit().await {
        Ok(last) => last.into(),
        Err(e) => {
            tracing::error!(error = %crate::report::chain(&e), "console: the last audit run could not be read");
            AuditView::unreadable()
        }
    };
    let refusals = state.recent.refusals();
    let view = Overview {
        role: session.role,
        mode: if console.inbox_mode { "inbox" } else { "sync" },
        answers: state.recent.answers(super::recent::MINUTES),
        answers_minutes: super::recent::MINUTES,
        leases_held: figures.leases_held,
        leases_lost: figures.lease_lost as f64,
        fence_rejected: figures.fence_rejected as f64,
        stale_events: figures.stale_events as f64,
        inbox_lag_mean_seconds: figures.inbox_lag_mean(),
        inbox,
        refusals_kept: refusals.len(),
        recent_refusals: refusals.into_iter().take(5).collect(),
        quarantine,
        refund_rejections: figures
            .refund_rejected
            .iter()
            .map(|(reason, n)| (reason.as_str().to_owned(), *n as f64))
            .collect(),
        over_returned: figures.over_returned as f64,
        audit,
        latest,
    };
    Ok(show(ask, &view, |v| views::overview(session, v)))
}

/// `after=<unix nanoseconds>.<id>`: where the page before ended.
fn parse_cursor(text: &str) -> Option<(OffsetDateTime, i64)> {
    let (at, id) = text.split_once('.')?;
    let at = OffsetDateTime::from_unix_timestamp_nanos(at.parse().ok()?).ok()?;
    Some((at, id.parse().ok()?))
}

pub fn cursor_text(c: &Cursor) -> String {
    format!("{}.{}", c.at.unix_timestamp_nanos(), c.id)
}

fn limit(ask: &Ask) -> Result<i64, String> {
    match ask.query.get("limit") {
        None => Ok(PAGE),
        Some(l) => match l.parse::<i64>() {
            Ok(n) if (1..=crate::store::console::MAX_PAGE).contains(&n) => Ok(n),
            _ => Err(format!(
                "limit must be between 1 and {}",
                crate::store::console::MAX_PAGE
            )),
        },
    }
}

async fn search(console: &Console, ask: &Ask, session: &Session) -> Answer {
    let now = OffsetDateTime::now_utc();
    let q = &ask.query;
    let time = |name: &str| -> Result<Option<OffsetDateTime>, String> {
        q.get(name)
            .map(|t| parse_when(t, now).map_err(|e| format!("{name}: {e}")))
            .transpose()
    };
    let checked = (|| -> Result<PaymentSearch, String> {
        let status = q.get("status").cloned();
        if let Some(s) = &status {
            if !PAYMENT_STATUSES.contains(&s.as_str()) {
                return Err(format!(
                    "status must be one of {}",
                    PAYMENT_STATUSES.join(", ")
                ));
            }
        }
        let transaction_id = q.get("transaction_id").cloned();
        if let Some(t) = &transaction_id {
            if crate::store::console::prefix_end(t).is_none() || t.len() > 255 {
                return Err("transaction_id: a transaction id or a prefix of it is 1 to 255 printable ASCII characters".to_owned());
            }
        }
        let after = match q.get("after") {
            Some(a) => Some(parse_cursor(a).ok_or("after: not a page cursor")?),
            None => None,
        };
        Ok(PaymentSearch {
            provider: q.get("provider").cloned(),
            transaction_id,
            status,
            since: time("since")?,
            until: time("until")?,
            after,
            limit: limit(ask)?,
        })
    })();
    let search = checked.map_err(|e| bad_request(ask, session, &e))?;
    let page = console
        .store
        .search_payments(&search)
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
    let form = SearchForm {
        provider: q.get("provider").cloned(),
        transaction_id: q.get("transaction_id").cloned(),
        status: q.get("status").cloned(),
        since: q.get("since").cloned(),
        until: q.get("until").cloned(),
    };
    let next_page = page.next.map(|c| {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("provider", &form.provider),
            ("transaction_id", &form.transaction_id),
            ("status", &form.status),
            ("since", &form.since),
            ("until", &form.until),
        ] {
            if let Some(v) = v {
                s.append_pair(k, v);
            }
        }
        s.append_pair("after", &cursor_text(&c));
        if let Some(l) = q.get("limit") {
            s.append_pair("limit", l);
        }
        s.finish()
    });
    let view = SearchView {
        form,
        page,
        next_page,
    };
    Ok(show(ask, &view, |v| views::search(session, v)))
}

async fn payment(
    console: &Console,
    ask: &Ask,
    session: &Session,
    provider: &str,
    tx: &str,
) -> Answer {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
    };
    let (Ok(provider), Ok(tx)) = (decode(provider), decode(tx)) else {
        return Err(bad_request(ask, session, "the path is not UTF-8"));
    };
    let found = console
        .store
        .inspect(&provider, &tx)
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
    if !found.is_known() {
        return Err(failure(
            ask,
            Some(session),
            StatusCode::NOT_FOUND,
            &format!("no payment and no event of {provider}:{tx}"),
        ));
    }
    let bodies = match session.role {
        Role::Operator => {
            let ids: Vec<i64> = found
                .events
                .iter()
                .take(BODIES_SHOWN)
                .map(|e| e.id)
                .collect();
            Some(
                console
                    .store
                    .event_bodies(&ids, BODY_BYTES)
                    .await
                    .map_err(|e| unavailable(ask, session, &e))?,
            )
        }
        Role::Viewer => None,
    };
    let view = PaymentView {
        provider,
        transaction_id: tx,
        timeline: timeline(&found),
        found,
        bodies,
        replayed: ask.query.get("replayed").and_then(|n| n.parse().ok()),
    };
    Ok(show(ask, &view, |v| views::payment(session, v)))
}

async fn events(console: &Console, ask: &Ask, session: &Session) -> Answer {
    let q = &ask.query;
    let status = q.get("status").cloned();
    if let Some(s) = &status {
        if !EVENT_STATUSES.contains(&s.as_str()) {
            return Err(bad_request(
                ask,
                session,
                &format!("status must be one of {}", EVENT_STATUSES.join(", ")),
            ));
        }
    }
    let after = match q.get("after") {
        Some(a) => Some(
            parse_cursor(a).ok_or_else(|| bad_request(ask, session, "after: not a page cursor"))?,
        ),
        None => None,
    };
    let limit = limit(ask).map_err(|e| bad_request(ask, session, &e))?;
    let provider = q.get("provider").cloned();
    let store = &console.store;
    let counts = store
        .inbox_counts_capped()
        .await
        .map_err(|e| unavailable(ask, session, &e))?
        .into();
    let dead_groups = match status.as_deref() {
        None | Some("dead") => store
            .dead_groups(provider.as_deref())
            .await
            .map_err(|e| unavailable(ask, session, &e))?,
        _ => Vec::new(),
    };
    let page = store
        .list_events(&EventList {
            status: status.clone(),
            provider: provider.clone(),
            after,
            limit,
        })
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
    let next_page = page.next.map(|c| {
        let mut s = form_urlencoded::Serializer::new(String::new());
        if let Some(v) = &status {
            s.append_pair("status", v);
        }
        if let Some(v) = &provider {
            s.append_pair("provider", v);
        }
        s.append_pair("after", &cursor_text(&c));
        s.finish()
    });
    let view = EventsView {
        status,
        provider,
        counts,
        dead_groups,
        page,
        next_page,
        replayed: q.get("replayed").and_then(|n| n.parse().ok()),
    };
    Ok(show(ask, &view, |v| views::events(session, v)))
}

fn refusals(state: Shared<'_>, ask: &Ask, session: &Session) -> Response<Body> {
    let view = RefusalsView {
        kept_at_most: super::recent::MAX_REFUSALS,
        refusals: state.recent.refusals(),
    };
    show(ask, &view, |v| views::refusals(session, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::format_description::well_known::Rfc3339;

    #[test]
    fn a_page_cursor_reads_back_what_was_written() {
        let c = Cursor {
            at: OffsetDateTime::parse("2026-01-31T12:00:00.123456Z", &Rfc3339).unwrap(),
            id: 42,
        };
        assert_eq!(parse_cursor(&cursor_text(&c)), Some((c.at, 42)));
        assert_eq!(parse_cursor("x.1"), None);
    }
}
