//! The operator console: `/console` on the admin listener, never the public
//! one. What a payments SRE opens at 3 a.m.: find a payment and everything
//! that happened to it, see what is stuck or dead, replay it.
//!
//! Server-rendered HTML that works without JavaScript (the pages carry
//! none, and the Content-Security-Policy allows none), and the same data as
//! JSON for `Accept: application/json`.
//!
//! - [`crate::config::console`]: the token files (off unless one is set) and
//!   the cookie flag; settings, so they live in the config room.
//! - [`auth`]: roles, sessions (MACed cookies), CSRF tokens, the throttle of
//!   failed sign-ins.
//! - [`recent`]: the answers and refusals this instance gave lately (memory,
//!   bounded), fed by the webhook handler.
//! - [`pages`]: one handler per page, each building a view (serialisable:
//!   the JSON) and rendering it ([`views`]: maud, escaped by construction).
//!
//! # What must stay true
//!
//! - Off unless a token file is configured: then `/console` is 404, like any
//!   unknown path of the admin listener.
//! - Every answer under `/console` carries [`SECURITY_HEADERS`], whatever it
//!   is (a page, a redirect, a 401, a 404).
//! - Writes (replays, sign-out) are POSTs of an operator (sign-out: anyone)
//!   whose `csrf` field is their session's and whose `Origin`, when sent, is
//!   the console's own; anything else is 403 and changes nothing. A replay
//!   is the CLI's ([`crate::store::Store::replay`]): only dead events are
//!   re-queued, so however often it is asked, an event is booked once.
//! - Raw stored bodies are shown to operators only; secrets never (no page
//!   reads a provider's secret or a token).

// A handler's `Err` is the answer to send (a redirect, a 401, a 403),
// returned once, one frame up, per request (in this module and the pages):
// boxing it would only add an allocation to every refusal.
#![allow(clippy::result_large_err)]

pub mod answer;
pub mod auth;
pub mod model;
pub mod pages;
pub mod recent;
pub mod reconcile;
pub mod replay;
pub mod timeline;
pub mod views;
pub mod when;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use metrics::Counter;
use tokio::sync::Semaphore;

use self::auth::{Role, Session, Throttle, Tokens, COOKIE, SESSION_LIFETIME};
use self::recent::Recent;
use crate::config::console::{
    read_tokens, ConsoleConfig, MIN_TOKEN_BYTES, OPERATOR_SETTING, VIEWER_SETTING,
};
use crate::http::{Body, PeerAddr};
use crate::metrics::{label_values, Family, Metrics, CONSOLE_REPLAYS_TOTAL, CONSOLE_SIGNINS_TOTAL};
use crate::store::Store;

/// The headers of every console answer: no script may run (the pages have
/// none), no other site may frame a page, nothing is cached (a shared
/// machine's browser keeps no payment), no type sniffing, and no referrer
/// to another origin. (Not `no-referrer`: under it a browser's form posts
/// say `Origin: null`, which the Origin check must refuse.)
pub const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "same-origin"),
];

/// Largest form body read (a sign-in, a replay filter).
const MAX_FORM_BYTES: usize = 16 * 1024;

/// Longest a form body may take to arrive (a form is a few hundred bytes:
/// a browser sends it with the head).
const FORM_TIMEOUT: Duration = Duration::from_secs(2);

/// Sign-in bodies read at once: the one body read before anyone is known.
/// Beyond it a sign-in is answered 503 at once, unread.
pub const SIGNIN_READS: usize = 8;

/// Form bodies of signed-in users read at once; beyond it 503 at once.
/// With [`SIGNIN_READS`], the console can keep at most 24 of the admin
/// listener's connections busy, so probes and scrapes always find a slot.
pub const FORM_READS: usize = 16;

/// [`CONSOLE_SIGNINS_TOTAL`]`{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignIn {
    Ok,
    WrongToken,
    Throttled,
}

impl SignIn {
    pub const ALL: [SignIn; 3] = [SignIn::Ok, SignIn::WrongToken, SignIn::Throttled];

    pub fn as_str(self) -> &'static str {
        match self {
            SignIn::Ok => "ok",
            SignIn::WrongToken => "wrong_token",
            SignIn::Throttled => "throttled",
        }
    }
}

/// [`CONSOLE_REPLAYS_TOTAL`]`{scope}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayScope {
    /// One event (its replay button).
    Event,
    /// Every dead event matching a filter.
    Filter,
}

impl ReplayScope {
    pub const ALL: [ReplayScope; 2] = [ReplayScope::Event, ReplayScope::Filter];

    pub fn as_str(self) -> &'static str {
        match self {
            ReplayScope::Event => "event",
            ReplayScope::Filter => "filter",
        }
    }
}

label_values!(SignIn, ReplayScope);

/// The console of one app: its tokens, its store handle, its counters.
pub struct Console {
    tokens: Tokens,
    viewer_file: Option<PathBuf>,
    operator_file: Option<PathBuf>,
    secure_cookie: bool,
    throttle: Throttle,
    store: Store,
    inbox_mode: bool,
    signins: Family<SignIn, Counter>,
    replays: Family<ReplayScope, Counter>,
    /// [`SIGNIN_READS`].
    signin_reads: Semaphore,
    /// [`FORM_READS`].
    form_reads: Semaphore,
}

impl Console {
    /// The console of this configuration, or `None` when it is off. Its
    /// counters are registered (at zero) either way, so dashboards and
    /// alerts see them from start.
    pub fn new(
        cfg: &ConsoleConfig,
        store: Store,
        metrics: &Metrics,
        inbox_mode: bool,
    ) -> Option<Console> {
        let signins = metrics.family(CONSOLE_SIGNINS_TOTAL);
        let replays = metrics.family(CONSOLE_REPLAYS_TOTAL);
        if !cfg.enabled() {
            return None;
        }
        Some(Console {
            tokens: Tokens::new(cfg),
            viewer_file: cfg.viewer.as_ref().map(|t| t.file.clone()),
            operator_file: cfg.operator.as_ref().map(|t| t.file.clone()),
            secure_cookie: cfg.secure_cookie,
            throttle: Throttle::default(),
            store,
            inbox_mode,
            signins,
            replays,
            signin_reads: Semaphore::new(SIGNIN_READS),
            form_reads: Semaphore::new(FORM_READS),
        })
    }

    /// SIGHUP: reads both token files again. A file that fails the start's
    /// checks leaves the tokens in force and says why; new tokens sign out
    /// every session made with the old ones.
    pub fn reload_tokens(&self) {
        match read_tokens(self.viewer_file.as_deref(), self.operator_file.as_deref()) {
            Ok((viewer, operator)) => {
                self.tokens.replace(viewer, operator);
                tracing::info!("SIGHUP: console token files re-read; sessions of replaced tokens are signed out");
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: a console token file is not usable; the tokens in force are kept");
            }
        }
    }

    pub(crate) fn count_signin(&self, result: SignIn) {
        self.signins.get(result).increment(1);
    }

    pub(crate) fn count_replay(&self, scope: ReplayScope) {
        self.replays.get(scope).increment(1);
    }
}

/// Whether `path` is the console's (`/console` and below).
pub fn is_console_path(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

/// What the console reads of the listener's shared state, handed in by the
/// admin route: the console does not import the edge's `State`, which holds
/// the console.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    /// The console, when it is served (`None`: `/console` is 404).
    pub console: Option<&'a Console>,
    /// The app's registry (the overview reads its figures).
    pub metrics: &'a Metrics,
    /// The answers and refusals of late, fed by the webhook handler.
    pub recent: &'a Recent,
}

/// Serves a request under `/console` (the admin route sends them here).
pub async fn handle(state: Shared<'_>, req: Request<Incoming>) -> Response<Body> {
    let Some(console) = state.console else {
        return off(&req);
    };
    let (ask, body) = Ask::head(req, console.secure_cookie);
    let mut resp = pages::route(state, console, ask, body).await;
    let headers = resp.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    resp
}

/// Why `/console` is 404: it is off until a token file is set.
pub fn off_reason() -> String {
    format!(
        "the console is off: set {VIEWER_SETTING} and/or {OPERATOR_SETTING} (files holding a token of at least {MIN_TOKEN_BYTES} bytes, mode 0600) to turn it on; for development, `make run CONSOLE=1`"
    )
}

/// The console's answer while it is off: 404 and the line that says how to
/// turn it on (as JSON to a client that asks for it).
fn off(req: &Request<Incoming>) -> Response<Body> {
    let wants_json = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if wants_json {
        return crate::http::json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"result": "not_found", "reason": off_reason()}),
        );
    }
    let mut resp = Response::new(Body::from(format!("{}\n", off_reason())));
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// One request, read: what the pages need of it.
pub struct Ask {
    pub method: Method,
    pub path: String,
    /// The query string's fields (empty values dropped).
    pub query: HashMap<String, String>,
    /// The form's fields, for a POST.
    pub form: HashMap<String, String>,
    /// The client asked for JSON (`Accept: application/json`, not HTML).
    pub json: bool,
    pub peer: Option<SocketAddr>,
    bearer: Option<String>,
    cookie: Option<String>,
    origin: Option<String>,
    host: Option<String>,
    secure: bool,
}

fn fields(text: &str) -> HashMap<String, String> {
    form_urlencoded::parse(text.as_bytes())
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| (k.into_owned(), v.trim().to_owned()))
        .collect()
}

impl Ask {
    /// The request's head; its body is read later ([`Ask::read_form`]), and
    /// only once who asks is known (or for a sign-in).
    fn head(req: Request<Incoming>, secure: bool) -> (Ask, Incoming) {
        let (parts, body) = req.into_parts();
        let header = |name: hyper::header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let accept = header(hyper::header::ACCEPT).unwrap_or_default();
        let json = accept.contains("application/json") && !accept.contains("text/html");
        let bearer = header(hyper::header::AUTHORIZATION)
            .and_then(|v| v.strip_prefix("Bearer ").map(|t| t.trim().to_owned()));
        let cookie = parts
            .headers
            .get_all(hyper::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .find(|(name, _)| *name == COOKIE)
            .map(|(_, value)| value.to_owned());
        let ask = Ask {
            path: parts.uri.path().to_owned(),
            query: fields(parts.uri.query().unwrap_or("")),
            form: HashMap::new(),
            json,
            peer: parts.extensions.get::<PeerAddr>().map(|p| p.0),
            bearer,
            cookie,
            origin: header(hyper::header::ORIGIN),
            host: header(hyper::header::HOST),
            secure,
            method: parts.method,
        };
        (ask, body)
    }

    /// Reads the form of a POST into [`Ask::form`], holding one of `reads`
    /// while it arrives (none free: 503 at once, the body unread), for
    /// [`FORM_TIMEOUT`] at most.
    async fn read_form(&mut self, body: Incoming, reads: &Semaphore) -> Result<(), Response<Body>> {
        if self.method != Method::POST {
            return Ok(());
        }
        let Ok(_reading) = reads.try_acquire() else {
            let mut resp = plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many console forms arriving at once; try again",
            );
            resp.headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(resp);
        };
        let read =
            tokio::time::timeout(FORM_TIMEOUT, Limited::new(body, MAX_FORM_BYTES).collect()).await;
        let bytes = match read {
            Ok(Ok(c)) => c.to_bytes(),
            _ => {
                return Err(plain(
                    StatusCode::BAD_REQUEST,
                    "the form could not be read (too large, or too slow)",
                ))
            }
        };
        self.form = fields(&String::from_utf8_lossy(&bytes));
        Ok(())
    }

    /// Whether the request's `Origin`, when it has one, is the console's
    /// own: this listener's `Host`, over https when the cookie is `Secure`
    /// (behind a TLS front), http otherwise. Browsers send `Origin` with
    /// every POST; a request without one (a script) is judged by its CSRF
    /// token or Bearer token alone.
    fn same_origin(&self) -> bool {
        match (&self.origin, &self.host) {
            (None, _) => true,
            (Some(origin), Some(host)) => {
                let scheme = if self.secure { "https" } else { "http" };
                origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
            }
            (Some(_), None) => false,
        }
    }
}

/// A plain-text answer (before anything else is known of the request).
fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// Who asks, or the answer for someone who cannot be told (a redirect to
/// the sign-in page, 401, 429).
fn authenticate(console: &Console, ask: &Ask) -> Result<Session, Response<Body>> {
    if let Some(token) = &ask.bearer {
        if let Some(wait) = ask.peer.and_then(|p| console.throttle.blocked(p.ip())) {
            console.count_signin(SignIn::Throttled);
            return Err(answer::throttled(ask, wait));
        }
        return match console.tokens.role_of(token.as_bytes()) {
            Some(role) => Ok(Session {
                role,
                id: None,
                csrf: None,
            }),
            None => {
                console.count_signin(SignIn::WrongToken);
                if let Some(peer) = ask.peer {
                    console.throttle.failed(peer.ip());
                }
                tracing::warn!(peer = ?ask.peer.map(|p| p.ip()), "console: wrong Bearer token; answered 401");
                Err(answer::unauthorized(ask, "wrong token"))
            }
        };
    }
    match ask
        .cookie
        .as_deref()
        .and_then(|c| console.tokens.check(c, now_unix()))
    {
        Some(session) => Ok(session),
        None if ask.json => Err(answer::unauthorized(
            ask,
            "sign in: a session cookie or Authorization: Bearer <token>",
        )),
        None => Err(answer::redirect("/console/login")),
    }
}

/// The `Set-Cookie` of a new session (or, with `None`, of signing out).
fn session_cookie(value: Option<&str>, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let text = match value {
        Some(v) => format!(
            "{COOKIE}={v}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            SESSION_LIFETIME.as_secs()
        ),
        None => format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    };
    HeaderValue::from_str(&text).expect("a cookie of hex, digits and dots is a header value")
}

/// The role a write needs and the CSRF and Origin checks every write passes.
fn may_write(ask: &Ask, session: &Session, need: Option<Role>) -> Result<(), Response<Body>> {
    if need.is_some_and(|r| session.role != r) {
        return Err(answer::forbidden(ask, "operators only"));
    }
    if !ask.same_origin() {
        return Err(answer::forbidden(
            ask,
            "the request comes from another origin",
        ));
    }
    if !session.csrf_ok(ask.form.get("csrf").map(String::as_str)) {
        return Err(answer::forbidden(
            ask,
            "missing or wrong csrf field: reload the page and try again",
        ));
    }
    Ok(())
}
