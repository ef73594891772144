//! One handler per console page: each checks its input (a bad value is a
//! 400 naming it), reads what it shows, and answers the view as HTML
//! ([`super::views`]) or, for `Accept: application/json`, as JSON.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::HeaderValue;
use hyper::{Method, Response, StatusCode};
use maud::Markup;
use serde::Serialize;
use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, PrimitiveDateTime};

use super::auth::{Role, Session};
use super::recent::{AnswerCount, Refusal};
use super::{
    authenticate, may_write, now_unix, session_cookie, views, Ask, Console, ReplayScope, Shared,
    SignIn,
};
use crate::domain::amount::major_units;
use crate::http::Body;
use crate::store::audit::{AuditRun, LastAudit};
use crate::store::console::{
    Cursor, DeadGroup, EventList, Page, PaymentLine, PaymentSearch, QuarantineSummary,
    EVENT_STATUSES, PAYMENT_STATUSES,
};
use crate::store::inbox::{Counts, EventRow, Inspection, Replay};

/// Rows of a page unless `limit` says otherwise (at most
/// [`crate::store::console::MAX_PAGE`]).
const PAGE: i64 = 50;

/// Stored bodies shown on a payment page, and the bytes shown of each.
const BODIES_SHOWN: usize = 50;
const BODY_BYTES: i32 = 64 * 1024;

/// Where a request goes.
pub async fn route(state: Shared<'_>, console: &Console, ask: Ask) -> Response<Body> {
    let path = ask.path.trim_end_matches('/').to_owned();
    let segments: Vec<&str> = path.split('/').skip(2).collect();
    match (&ask.method, segments.as_slice()) {
        (&Method::GET, ["style.css"]) => stylesheet(),
        (&Method::GET, ["login"]) => html(StatusCode::OK, views::login(None)),
        (&Method::POST, ["login"]) => sign_in(console, &ask),
        (method, rest) => {
            let session = match authenticate(console, &ask) {
                Ok(s) => s,
                Err(resp) => return resp,
            };
            let out = match (method, rest) {
                (&Method::GET, []) => overview(state, console, &ask, &session).await,
                (&Method::GET, ["payments"]) => search(console, &ask, &session).await,
                (&Method::GET, ["payments", provider, transaction_id]) => {
                    payment(console, &ask, &session, provider, transaction_id).await
                }
                (&Method::GET, ["events"]) => events(console, &ask, &session).await,
                (&Method::GET, ["refusals"]) => Ok(refusals(state, &ask, &session)),
                (&Method::POST, ["events", id, "replay"]) => {
                    replay_one(console, &ask, &session, id).await
                }
                (&Method::POST, ["events", "replay"]) => {
                    replay_matching(console, &ask, &session).await
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

type Answer = Result<Response<Body>, Response<Body>>;

pub fn html(status: StatusCode, page: Markup) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(page.into_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp
}

fn json_answer(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    match serde_json::to_value(value) {
        Ok(v) => crate::http::json(status, v),
        Err(e) => crate::http::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": format!("could not encode the page: {e}")}),
        ),
    }
}

/// The view as JSON, or rendered.
fn show<T: Serialize>(ask: &Ask, view: &T, render: impl FnOnce(&T) -> Markup) -> Response<Body> {
    if ask.json {
        json_answer(StatusCode::OK, view)
    } else {
        html(StatusCode::OK, render(view))
    }
}

pub fn redirect(to: &str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(to) {
        resp.headers_mut().insert(hyper::header::LOCATION, v);
    }
    resp
}

/// An error page (or `{"error": …}`), with the navigation when signed in.
fn failure(
    ask: &Ask,
    session: Option<&Session>,
    status: StatusCode,
    message: &str,
) -> Response<Body> {
    if ask.json {
        return crate::http::json(status, json!({"error": message}));
    }
    html(status, views::failure(session, status, message))
}

pub fn unauthorized(ask: &Ask, message: &str) -> Response<Body> {
    let mut resp = if ask.json {
        crate::http::json(StatusCode::UNAUTHORIZED, json!({"error": message}))
    } else {
        html(StatusCode::UNAUTHORIZED, views::login(Some(message)))
    };
    resp.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"fencehook console\""),
    );
    resp
}

pub fn forbidden(ask: &Ask, message: &str) -> Response<Body> {
    failure(ask, None, StatusCode::FORBIDDEN, message)
}

pub fn throttled(ask: &Ask, wait: Duration) -> Response<Body> {
    let secs = wait.as_secs().max(1);
    let message = format!("too many failed sign-ins from this address: try again in {secs} s");
    let mut resp = if ask.json {
        crate::http::json(StatusCode::TOO_MANY_REQUESTS, json!({"error": message}))
    } else {
        html(StatusCode::TOO_MANY_REQUESTS, views::login(Some(&message)))
    };
    resp.headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from(secs));
    resp
}

fn bad_request(ask: &Ask, session: &Session, message: &str) -> Response<Body> {
    failure(ask, Some(session), StatusCode::BAD_REQUEST, message)
}

fn unavailable(ask: &Ask, session: &Session, e: &crate::store::StoreError) -> Response<Body> {
    tracing::error!(error = %crate::report::chain(e), path = %ask.path, "console: database error");
    failure(
        ask,
        Some(session),
        StatusCode::SERVICE_UNAVAILABLE,
        "the database did not answer; try again",
    )
}

fn stylesheet() -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(views::STYLE.as_bytes())));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    resp
}

fn sign_in(console: &Console, ask: &Ask) -> Response<Body> {
    if let Some(wait) = ask.peer.and_then(|p| console.throttle.blocked(p.ip())) {
        console.count_signin(SignIn::Throttled);
        return throttled(ask, wait);
    }
    if !ask.same_origin() {
        return forbidden(ask, "the request comes from another origin");
    }
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

/// Inbox events by status (every instance's: from the database).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InboxCounts {
    pub queued: i64,
    pub processing: i64,
    pub dead: i64,
}

impl From<Counts> for InboxCounts {
    fn from(c: Counts) -> InboxCounts {
        InboxCounts {
            queued: c.queued,
            processing: c.processing,
            dead: c.dead,
        }
    }
}

/// What the overview shows.
#[derive(Debug, Serialize)]
pub struct Overview {
    pub role: Role,
    /// `sync` or `inbox`.
    pub mode: &'static str,
    /// This instance's answers per provider and result, last 15 minutes.
    pub answers: Vec<AnswerCount>,
    pub answers_minutes: u64,
    /// From this instance's metrics.
    pub leases_held: f64,
    pub leases_lost: f64,
    pub fence_rejected: f64,
    pub stale_events: f64,
    /// Mean time from acceptance to booking, since start (inbox mode).
    pub inbox_lag_mean_seconds: Option<f64>,
    /// Inbox events by status (from the database: every instance's).
    pub inbox: InboxCounts,
    pub refusals_kept: usize,
    pub recent_refusals: Vec<Refusal>,
    pub quarantine: QuarantineSummary,
    pub refund_rejections: Vec<(String, f64)>,
    pub over_returned: f64,
    /// The last run `fencehook audit` recorded.
    pub audit: AuditView,
    pub latest: Vec<PaymentLine>,
}

/// A recorded audit older than this is shown as stale: the timer that runs
/// it (docs/operations.md) has stopped, or never started.
pub const AUDIT_STALE_AFTER_SECS: i64 = 24 * 3600;

/// The audit's last result, as the overview shows it.
#[derive(Debug, Serialize)]
pub struct AuditView {
    /// `recorded` (see `last_run`), `never` (no run recorded yet),
    /// `not_migrated` (the schema is before V14: nowhere to record one), or
    /// `unreadable` (the record could not be read).
    pub state: &'static str,
    pub last_run: Option<AuditRun>,
    /// The last run is older than [`AUDIT_STALE_AFTER_SECS`].
    pub stale: bool,
    /// What an operator does about it, when there is anything to do.
    pub note: Option<&'static str>,
}

impl AuditView {
    fn unreadable() -> AuditView {
        AuditView {
            state: "unreadable",
            last_run: None,
            stale: false,
            note: Some("the last recorded audit could not be read (the log says why)"),
        }
    }
}

impl From<LastAudit> for AuditView {
    fn from(last: LastAudit) -> AuditView {
        match last {
            LastAudit::Ran(run) => AuditView {
                state: "recorded",
                stale: run.age_seconds > AUDIT_STALE_AFTER_SECS,
                note: (run.age_seconds > AUDIT_STALE_AFTER_SECS).then_some(
                    "older than a day: is the timer that runs `fencehook audit` still running?",
                ),
                last_run: Some(*run),
            },
            LastAudit::Never => AuditView {
                state: "never",
                last_run: None,
                stale: false,
                note: Some("no audit has been recorded: `fencehook audit` records each run; run it periodically (a systemd timer or cron) to keep this fresh"),
            },
            LastAudit::BeforeMigration => AuditView {
                state: "not_migrated",
                last_run: None,
                stale: false,
                note: Some("no audit can be recorded: the schema is before migration V14 (run `fencehook migrate`)"),
            },
        }
    }
}

/// The samples of one metric in a Prometheus exposition: (labels, value).
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (metric == name).then(|| (labels.to_owned(), value.parse().unwrap_or(0.0)))
        })
        .collect()
}

fn total(text: &str, name: &str) -> f64 {
    samples(text, name).iter().map(|(_, v)| v).sum()
}

/// A label's value in a sample's label text (`reason="currency"`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.trim_matches('"'))
    })
}

async fn overview(state: Shared<'_>, console: &Console, ask: &Ask, session: &Session) -> Answer {
    use crate::metrics as m;
    let text = state.metrics.render();
    let inbox = console
        .store
        .inbox_counts()
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
    let lag_sum = total(&text, &format!("{}_sum", m::INBOX_LAG_SECONDS));
    let lag_count = total(&text, &format!("{}_count", m::INBOX_LAG_SECONDS));
    let refusals = state.recent.refusals();
    let view = Overview {
        role: session.role,
        mode: if console.inbox_mode { "inbox" } else { "sync" },
        answers: state.recent.answers(super::recent::MINUTES),
        answers_minutes: super::recent::MINUTES,
        leases_held: total(&text, m::LEASES_HELD),
        leases_lost: total(&text, m::LEASE_LOST_TOTAL),
        fence_rejected: total(&text, m::FENCE_REJECTED_TOTAL),
        stale_events: total(&text, m::STALE_EVENTS_TOTAL),
        inbox_lag_mean_seconds: (lag_count > 0.0).then(|| lag_sum / lag_count),
        inbox,
        refusals_kept: refusals.len(),
        recent_refusals: refusals.into_iter().take(5).collect(),
        quarantine,
        refund_rejections: samples(&text, m::REFUND_REJECTED_TOTAL)
            .into_iter()
            .filter_map(|(labels, v)| Some((label(&labels, "reason")?.to_owned(), v)))
            .collect(),
        over_returned: total(&text, m::PAYMENTS_OVER_RETURNED_TOTAL),
        audit,
        latest,
    };
    Ok(show(ask, &view, |v| views::overview(session, v)))
}

/// A time filter: RFC 3339, a date and time as a browser's
/// `datetime-local` field sends it (UTC), a date, or an age (`15m`, `2h`,
/// `3d`) counted back from now.
pub fn parse_when(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    let text = text.trim();
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t);
    }
    let local = [
        "[year]-[month]-[day]T[hour]:[minute]",
        "[year]-[month]-[day]T[hour]:[minute]:[second]",
        "[year]-[month]-[day] [hour]:[minute]",
        "[year]-[month]-[day] [hour]:[minute]:[second]",
    ];
    for format in local {
        let format = time::format_description::parse_borrowed::<2>(format)
            .expect("a valid format description");
        if let Ok(t) = PrimitiveDateTime::parse(text, &format) {
            return Ok(t.assume_utc());
        }
    }
    let date = time::format_description::parse_borrowed::<2>("[year]-[month]-[day]")
        .expect("a valid format description");
    if let Ok(d) = time::Date::parse(text, &date) {
        return Ok(d.midnight().assume_utc());
    }
    let unit = text.chars().last().unwrap_or(' ');
    let secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    let number = text[..text.len() - unit.len_utf8().min(text.len())]
        .parse::<i64>()
        .ok();
    match number {
        Some(n) if secs > 0 && (0..=36_500 * 86_400 / secs).contains(&n) => Ok(now - time::Duration::seconds(n * secs)),
        _ => Err(format!(
            "`{text}` is not a time: use RFC 3339 (2026-01-31T12:00:00Z), a date and time in UTC (2026-01-31T12:00), a date, or an age (15m, 2h, 3d)"
        )),
    }
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

/// The search form's values, as asked (to fill the form again).
#[derive(Debug, Default, Serialize)]
pub struct SearchForm {
    pub provider: Option<String>,
    pub transaction_id: Option<String>,
    pub status: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SearchView {
    pub form: SearchForm,
    #[serde(flatten)]
    pub page: Page<PaymentLine>,
    /// The query string of the next page, when there is one.
    pub next_page: Option<String>,
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

/// One line of a payment's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Moment {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// `created`, `updated`, `received`, `attempt_failed`, `replayed`,
    /// `done`, `dead`, `ledger`.
    pub what: &'static str,
    pub transaction_id: String,
    pub text: String,
    /// The lease token (fence) that wrote it, for ledger entries.
    pub token: Option<i64>,
    /// The event this is about, for event lines.
    pub event_id: Option<i64>,
    /// After a ledger entry that moves money out of a payment (or back): the
    /// money out so far (refunds and disputes, net of reversals), in major units.
    pub out_so_far: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PaymentView {
    pub provider: String,
    pub transaction_id: String,
    #[serde(flatten)]
    pub found: Inspection,
    /// Every event, row and ledger entry in arrival order.
    pub timeline: Vec<Moment>,
    /// Operators only: the stored bodies, as received (cut at 64 KiB).
    pub bodies: Option<Vec<(i64, String)>>,
    /// Dead events re-queued by the request that led here.
    pub replayed: Option<i64>,
}

/// The timeline of an inspection: rows created and changed, events received
/// and their attempts, ledger entries with the token that wrote them and the
/// running amount out, sorted by time (ties in that order).
pub fn timeline(found: &Inspection) -> Vec<Moment> {
    let mut out: Vec<(OffsetDateTime, u8, Moment)> = Vec::new();
    let moment = |at, what, tx: &str, text: String| Moment {
        at,
        what,
        transaction_id: tx.to_owned(),
        text,
        token: None,
        event_id: None,
        out_so_far: None,
    };
    for row in found.row.iter().chain(&found.children) {
        let created = format!(
            "{} {} of {} recorded",
            row.kind,
            row.transaction_id,
            major_units(row.amount_minor, &row.currency)
        );
        out.push((
            row.created_at,
            0,
            moment(row.created_at, "created", &row.transaction_id, created),
        ));
        if row.updated_at > row.created_at {
            let text = format!(
                "{} is {} (last change, fence {})",
                row.transaction_id,
                views::row_status(&row.kind, &row.status),
                row.fence
            );
            out.push((
                row.updated_at,
                5,
                moment(row.updated_at, "updated", &row.transaction_id, text),
            ));
        }
    }
    for ev in &found.events {
        let mut m = moment(
            ev.received_at,
            "received",
            &ev.transaction_id,
            format!(
                "event #{} {} received{}",
                ev.id,
                ev.event_type,
                ev.psp_event_id
                    .as_deref()
                    .map(|p| format!(" (PSP id {p})"))
                    .unwrap_or_default()
            ),
        );
        m.event_id = Some(ev.id);
        out.push((ev.received_at, 1, m));
        for entry in ev.errors.as_array().into_iter().flatten() {
            let Some(at) = entry
                .get("at")
                .and_then(|a| a.as_str())
                .and_then(|a| OffsetDateTime::parse(a, &Rfc3339).ok())
            else {
                continue;
            };
            let (what, text) = match (entry.get("replay"), entry.get("error")) {
                (Some(n), _) => (
                    "replayed",
                    format!("event #{} replayed (replay {n})", ev.id),
                ),
                (None, Some(e)) => (
                    "attempt_failed",
                    format!(
                        "event #{} attempt {} failed: {}",
                        ev.id,
                        entry
                            .get("attempt")
                            .map(|a| a.to_string())
                            .unwrap_or_default(),
                        e.as_str().unwrap_or_default()
                    ),
                ),
                _ => continue,
            };
            let mut m = moment(at, what, &ev.transaction_id, text);
            m.event_id = Some(ev.id);
            out.push((at, 2, m));
        }
        if let Some(at) = ev.finished_at {
            let text = match &ev.last_error {
                Some(e) if ev.status == "dead" => format!("event #{} dead: {e}", ev.id),
                _ => format!("event #{} {}", ev.id, ev.status),
            };
            let what = if ev.status == "dead" { "dead" } else { "done" };
            let mut m = moment(at, what, &ev.transaction_id, text);
            m.event_id = Some(ev.id);
            out.push((at, 4, m));
        }
    }
    let mut ledger: Vec<_> = found.entries.iter().collect();
    ledger.sort_by_key(|e| e.created_at);
    let mut money_out: i64 = 0;
    let payment = found.row.as_ref().filter(|r| r.kind == "payment");
    for e in ledger {
        let mut m = moment(
            e.created_at,
            "ledger",
            &e.transaction_id,
            format!(
                "{} {} booked",
                e.effect,
                major_units(e.amount_minor, &e.currency)
            ),
        );
        m.token = Some(e.fence);
        if let Some(p) = payment.filter(|_| e.effect != "credit") {
            money_out -= e.amount_minor;
            m.out_so_far = Some(format!(
                "{} of {}",
                major_units(money_out, &p.currency),
                major_units(p.amount_minor, &p.currency)
            ));
        }
        out.push((e.created_at, 3, m));
    }
    out.sort_by_key(|a| (a.0, a.1));
    out.into_iter().map(|(_, _, m)| m).collect()
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
    if found.row.is_none() && found.events.is_empty() {
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

#[derive(Debug, Serialize)]
pub struct EventsView {
    pub status: Option<String>,
    pub provider: Option<String>,
    pub counts: InboxCounts,
    pub dead_groups: Vec<DeadGroup>,
    #[serde(flatten)]
    pub page: Page<EventRow>,
    pub next_page: Option<String>,
    /// Dead events re-queued by the request that led here.
    pub replayed: Option<i64>,
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
        .inbox_counts()
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

#[derive(Debug, Serialize)]
pub struct RefusalsView {
    pub kept_at_most: usize,
    pub refusals: Vec<Refusal>,
}

fn refusals(state: Shared<'_>, ask: &Ask, session: &Session) -> Response<Body> {
    let view = RefusalsView {
        kept_at_most: super::recent::MAX_REFUSALS,
        refusals: state.recent.refusals(),
    };
    show(ask, &view, |v| views::refusals(session, v))
}

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

async fn replay_one(console: &Console, ask: &Ask, session: &Session, id: &str) -> Answer {
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
        .replay(&Replay {
            event_id: Some(id),
            ..Replay::default()
        })
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
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

/// A path segment, percent-encoded (transaction ids may hold `/`, `?`, `#`, …).
pub fn encode_segment(s: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

/// The filter of a replay of many, as asked (also the confirmation's form).
#[derive(Debug, Default, Serialize)]
pub struct ReplayFilter {
    pub provider: Option<String>,
    pub last_error: Option<String>,
    pub since: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ReplayView {
    pub dry_run: bool,
    pub filter: ReplayFilter,
    /// Dead events matching now (dry run) or re-queued.
    pub matching: i64,
    pub events: Vec<EventRow>,
}

async fn replay_matching(console: &Console, ask: &Ask, session: &Session) -> Answer {
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
    let which = Replay {
        provider: filter.provider.clone(),
        since,
        last_error: filter.last_error.clone(),
        ..Replay::default()
    };
    if dry_run {
        let matching = console
            .store
            .replay_count(&which)
            .await
            .map_err(|e| unavailable(ask, session, &e))?;
        let view = ReplayView {
            dry_run,
            filter,
            matching,
            events: Vec::new(),
        };
        return Ok(show(ask, &view, |v| views::replay_confirm(session, v)));
    }
    let again = console
        .store
        .replay(&which)
        .await
        .map_err(|e| unavailable(ask, session, &e))?;
    console.count_replay(ReplayScope::Filter);
    tracing::info!(role = session.role.as_str(), peer = ?ask.peer.map(|p| p.ip()),
        provider = filter.provider.as_deref().unwrap_or("*"), last_error = filter.last_error.as_deref().unwrap_or("*"),
        since = filter.since.as_deref().unwrap_or("*"), replayed = again.len(), "console: replay of dead events matching a filter");
    if ask.json {
        let view = ReplayView {
            dry_run,
            filter,
            matching: again.len() as i64,
            events: again,
        };
        return Ok(json_answer(StatusCode::OK, &view));
    }
    Ok(redirect(&with_replayed(
        &back(ask, "/console/events?status=queued".to_owned()),
        again.len(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_rfc_3339_browser_fields_dates_or_ages() {
        let now = OffsetDateTime::parse("2026-01-31T12:00:00Z", &Rfc3339).unwrap();
        let at = |t: &str| {
            let t = parse_when(t, now).unwrap().to_offset(time::UtcOffset::UTC);
            t.format(&Rfc3339).unwrap()
        };
        assert_eq!(at("2026-01-30T10:00:00+01:00"), "2026-01-30T09:00:00Z");
        assert_eq!(at("2026-01-30T10:15"), "2026-01-30T10:15:00Z");
        assert_eq!(at("2026-01-30"), "2026-01-30T00:00:00Z");
        assert_eq!(at("15m"), "2026-01-31T11:45:00Z");
        assert_eq!(at("2d"), "2026-01-29T12:00:00Z");
        for bad in ["yesterday", "5x", "-3h", "", "99999999999d"] {
            assert!(parse_when(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_timeline_runs_the_money_out_through_refunds_reversals_and_disputes_in_time_order() {
        use crate::store::inbox::{EntryView, RowView};
        let t =
            |s: &str| OffsetDateTime::parse(&format!("2026-01-31T12:00:{s}Z"), &Rfc3339).unwrap();
        let row = RowView {
            id: 1,
            provider: "generic".into(),
            transaction_id: "pay".into(),
            kind: "payment".into(),
            parent_transaction_id: None,
            status: "succeeded".into(),
            event_type: "payment.succeeded".into(),
            amount_minor: 10000,
            amount: None,
            currency: "EUR".into(),
            amount_out_minor: 0,
            amount_out: None,
            fence: 4,
            created_at: t("00"),
            updated_at: t("00"),
        };
        let entry = |tx: &str, effect: &str, minor: i64, at: &str, fence: i64| EntryView {
            transaction_id: tx.into(),
            effect: effect.into(),
            amount_minor: minor,
            amount: None,
            currency: "EUR".into(),
            fence,
            created_at: t(at),
        };
        let found = Inspection {
            row: Some(row),
            children: vec![],
            // Listed out of time order: the timeline sorts them.
            entries: vec![
                entry("dp", "dispute", -5000, "04", 2),
                entry("pay", "credit", 10000, "01", 1),
                entry("re", "debit", -2050, "02", 1),
                entry("re", "refund_reversal", 2050, "03", 2),
            ],
            events: vec![],
        };
        let ledger: Vec<(String, Option<i64>, Option<String>)> = timeline(&found)
            .into_iter()
            .filter(|m| m.what == "ledger")
            .map(|m| (m.text, m.token, m.out_so_far))
            .collect();
        let out = |s: &str| Some(format!("{s} EUR of 100.00 EUR"));
        assert_eq!(
            ledger,
            [
                ("credit 100.00 EUR booked".to_owned(), Some(1), None),
                ("debit -20.50 EUR booked".to_owned(), Some(1), out("20.50")),
                (
                    "refund_reversal 20.50 EUR booked".to_owned(),
                    Some(2),
                    out("0.00")
                ),
                (
                    "dispute -50.00 EUR booked".to_owned(),
                    Some(2),
                    out("50.00")
                ),
            ]
        );
    }

    #[test]
    fn a_page_cursor_reads_back_what_was_written() {
        let c = Cursor {
            at: OffsetDateTime::parse("2026-01-31T12:00:00.123456Z", &Rfc3339).unwrap(),
            id: 42,
        };
        assert_eq!(parse_cursor(&cursor_text(&c)), Some((c.at, 42)));
        assert_eq!(parse_cursor("x.1"), None);
    }

    #[test]
    fn transaction_ids_in_paths_are_encoded_and_back_links_stay_in_the_console() {
        assert_eq!(encode_segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
        assert_eq!(encode_segment("pi_3Nx-1.2~"), "pi_3Nx-1.2~");
        assert_eq!(
            with_replayed("/console/events?status=dead", 2),
            "/console/events?status=dead&replayed=2"
        );
    }

    #[test]
    fn metric_samples_are_read_from_the_exposition() {
        let text = "# HELP x\nfencehook_refund_rejected_total{reason=\"currency\"} 2\nfencehook_refund_rejected_total{reason=\"exceeds\"} 1\nfencehook_leases_held 3\n";
        assert_eq!(total(text, "fencehook_refund_rejected_total"), 3.0);
        assert_eq!(total(text, "fencehook_leases_held"), 3.0);
        let s = samples(text, "fencehook_refund_rejected_total");
        assert_eq!(label(&s[0].0, "reason"), Some("currency"));
    }
}
