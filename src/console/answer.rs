//! The console's answers: a page, its JSON, a redirect, an error page in the
//! console's layout (or `{"error": …}` for JSON), each with the status it
//! means.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use maud::Markup;
use serde::Serialize;
use serde_json::json;

use super::auth::Session;
use super::{views, Ask};
use crate::http::Body;

pub type Answer = Result<Response<Body>, Response<Body>>;

pub fn html(status: StatusCode, page: Markup) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(page.into_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp
}

pub fn json_answer(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    match serde_json::to_value(value) {
        Ok(v) => crate::http::json(status, v),
        Err(e) => crate::http::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": format!("could not encode the page: {e}")}),
        ),
    }
}

/// The view as JSON, or rendered.
pub fn show<T: Serialize>(
    ask: &Ask,
    view: &T,
    render: impl FnOnce(&T) -> Markup,
) -> Response<Body> {
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
pub fn failure(
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

pub fn bad_request(ask: &Ask, session: &Session, message: &str) -> Response<Body> {
    failure(ask, Some(session), StatusCode::BAD_REQUEST, message)
}

pub fn unavailable(ask: &Ask, session: &Session, e: &crate::store::StoreError) -> Response<Body> {
    tracing::error!(error = %crate::report::chain(e), path = %ask.path, "console: database error");
    failure(
        ask,
        Some(session),
        StatusCode::SERVICE_UNAVAILABLE,
        "the database did not answer; try again",
    )
}
