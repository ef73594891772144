//! A small OTLP/HTTP trace receiver (an outside party, so a stand-in is
//! fair): decodes `http/protobuf` and `http/json` exports into the
//! protocol's own types and keeps the spans; or, throttling, answers every
//! export 429 with `Retry-After`; or, stalled, takes connections and never
//! answers, as a collector that hangs does.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::net::TcpListener;

/// One span as the collector received it; ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP's SpanKind: 1 internal, 2 server, 3 client.
    pub kind: i32,
    pub attributes: HashMap<String, String>,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    /// The resource's attributes (`service.name`, …).
    pub resource: HashMap<String, String>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// When it started and ended, ns since the Unix epoch.
    pub start: u64,
    pub end: u64,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Content types of the exports received.
    content_types: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// A collector that answers every export 200.
    pub async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let content_types = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        let (addr, task) = serve(content_types.clone(), move |content_type, body| {
            let status = match decode(content_type, &body) {
                Some(request) => {
                    kept.lock().unwrap().extend(flatten(request));
                    200
                }
                None => 400,
            };
            hyper::Response::builder()
                .status(status)
                .body(Full::new(Bytes::new()))
                .unwrap()
        })
        .await;
        Collector {
            addr,
            spans,
            content_types,
            task,
        }
    }

    /// A collector that answers every export 429 with `Retry-After: 8` (a
    /// throttling one: the exporter waits 8 s before it retries, then
    /// longer); each export's content type is recorded, no span.
    pub async fn throttling() -> Collector {
        let content_types = Arc::new(Mutex::new(Vec::new()));
        let (addr, task) = serve(content_types.clone(), |_, _| {
            hyper::Response::builder()
                .status(429)
                .header("retry-after", "8")
                .body(Full::new(Bytes::new()))
                .unwrap()
        })
        .await;
        Collector {
            addr,
            spans: Default::default(),
            content_types,
            task,
        }
    }

    /// A collector that accepts connections and never reads or answers.
    pub async fn stalled() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Collector {
            addr,
            spans: Default::default(),
            content_types: Default::default(),
            task,
        }
    }

    /// The base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    pub fn content_types(&self) -> Vec<String> {
        self.content_types.lock().unwrap().clone()
    }

    /// Waits (up to `deadline`) until the received spans satisfy `cond`.
    pub async fn wait_for(
        &self,
        what: &str,
        deadline: Duration,
        cond: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let spans = self.spans();
            if cond(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}; received: {:#?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers every request on a new local port with `answer(content type,
/// body)`, after recording its content type in `types` (for a decoded
/// export only: see [`Collector::start`]).
async fn serve<A>(
    types: Arc<Mutex<Vec<String>>>,
    answer: A,
) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    A: Fn(&str, Bytes) -> hyper::Response<Full<Bytes>> + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (types, answer) = (types.clone(), answer.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (types, answer) = (types.clone(), answer.clone());
                    async move {
                        let content_type = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let resp = answer(&content_type, body);
                        if resp.status() != 400 {
                            types.lock().unwrap().push(content_type);
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, task)
}

fn decode(content_type: &str, body: &[u8]) -> Option<ExportTraceServiceRequest> {
    if content_type.starts_with("application/x-protobuf") {
        ExportTraceServiceRequest::decode(body).ok()
    } else if content_type.starts_with("application/json") {
        serde_json::from_slice(body).ok()
    } else {
        None
    }
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let resource = rs
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(ReceivedSpan {
                    name: s.name,
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent_span_id: hex::encode(&s.parent_span_id),
                    kind: s.kind,
                    attributes: attributes(&s.attributes),
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                        .collect(),
                    resource: resource.clone(),
                    status: s.status.map_or(0, |st| st.code),
                    start: s.start_time_unix_nano,
                    end: s.end_time_unix_nano,
                });
            }
        }
    }
    out
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}
