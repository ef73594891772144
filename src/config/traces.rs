//! OpenTelemetry trace settings: the standard `OTEL_*` variables (no
//! `FENCEHOOK_` prefix, so that a deployment's usual OpenTelemetry
//! environment works unchanged), read and checked like every other setting.
//! Tracing is off unless an OTLP endpoint is set.

use std::time::Duration;

use clap::Args;

use super::{bad, setting, ConfigError};

/// `OTEL_*` flags and environment of `serve` and `work`.
#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// OTLP/HTTP base URL of the trace collector (http:// or https://);
    /// spans go to `<URL>/v1/traces`. Tracing is off unless this or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set.
    #[arg(
        long = "otel-exporter-otlp-endpoint",
        env = setting::OTEL_EXPORTER_OTLP_ENDPOINT
    )]
    pub endpoint: Option<String>,
    /// Full OTLP/HTTP URL the spans are posted to, used as is; wins over
    /// OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(
        long = "otel-exporter-otlp-traces-endpoint",
        env = setting::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    )]
    pub traces_endpoint: Option<String>,
    /// OTLP encoding: http/protobuf or http/json (gRPC is not offered).
    #[arg(
        long = "otel-exporter-otlp-protocol",
        env = setting::OTEL_EXPORTER_OTLP_PROTOCOL,
        default_value = "http/protobuf"
    )]
    pub protocol: String,
    /// Headers sent with every export, `key=value,key=value` (percent-encoded
    /// values), e.g. a vendor's API key. Never logged.
    #[arg(
        long = "otel-exporter-otlp-headers",
        env = setting::OTEL_EXPORTER_OTLP_HEADERS,
        hide_env_values = true
    )]
    pub headers: Option<String>,
    /// More headers for trace exports, the same form; a name in both
    /// takes this one's value. Never logged.
    #[arg(
        long = "otel-exporter-otlp-traces-headers",
        env = setting::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
        hide_env_values = true
    )]
    pub traces_headers: Option<String>,
    /// Bound on one export (ms), retries included.
    #[arg(
        long = "otel-exporter-otlp-timeout",
        env = setting::OTEL_EXPORTER_OTLP_TIMEOUT,
        default_value_t = 10_000
    )]
    pub timeout_ms: u64,
    /// `service.name` of every span.
    #[arg(
        long = "otel-service-name",
        env = setting::OTEL_SERVICE_NAME,
        default_value = "fencehook"
    )]
    pub service_name: String,
    /// More resource attributes, `key=value,key=value` (percent-encoded
    /// values), e.g. `deployment.environment.name=prod`.
    #[arg(long = "otel-resource-attributes", env = setting::OTEL_RESOURCE_ATTRIBUTES)]
    pub resource_attributes: Option<String>,
    /// always_on, always_off, traceidratio, parentbased_always_on,
    /// parentbased_always_off or parentbased_traceidratio.
    #[arg(
        long = "otel-traces-sampler",
        env = setting::OTEL_TRACES_SAMPLER,
        default_value = "parentbased_always_on"
    )]
    pub sampler: String,
    /// The ratio (0 to 1) of the traceidratio samplers; default 1.
    #[arg(long = "otel-traces-sampler-arg", env = setting::OTEL_TRACES_SAMPLER_ARG)]
    pub sampler_arg: Option<String>,
    /// Finished spans waiting for export; when full, a new span is dropped
    /// (and counted), never waited for. Above the OpenTelemetry default
    /// (2048): one instance at k = 1 ends about 24,000 spans a second, and
    /// 2048 of them were a tenth of a second of a slow collector answer.
    #[arg(
        long = "otel-bsp-max-queue-size",
        env = setting::OTEL_BSP_MAX_QUEUE_SIZE,
        default_value_t = 8192
    )]
    pub max_queue_size: usize,
    /// Most spans in one export. Above the OpenTelemetry default (512): a
    /// collector's cost is much per request, and two exports at most are in
    /// flight.
    #[arg(
        long = "otel-bsp-max-export-batch-size",
        env = setting::OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
        default_value_t = 2048
    )]
    pub max_export_batch_size: usize,
    /// Longest a finished span waits for a batch to fill before it is
    /// exported (ms).
    #[arg(
        long = "otel-bsp-schedule-delay",
        env = setting::OTEL_BSP_SCHEDULE_DELAY,
        default_value_t = 5000
    )]
    pub schedule_delay_ms: u64,
}

/// How spans are encoded on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`, the default.
    Protobuf,
    /// `http/json`.
    Json,
}

/// Which traces are recorded and exported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerRoot {
    AlwaysOn,
    AlwaysOff,
    /// Keeps this share of trace ids (0 to 1).
    Ratio(f64),
}

/// `OTEL_TRACES_SAMPLER` and its argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// The `parentbased_*` samplers follow a sampled/unsampled parent (an
    /// incoming `traceparent`) and apply `root` only to new traces.
    pub parent_based: bool,
    pub root: SamplerRoot,
}

/// Trace settings, validated; present only when tracing is on.
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// Where spans are posted (the traces path included).
    pub endpoint: hyper::Uri,
    pub protocol: OtlpProtocol,
    /// Sent with every export; values are secrets.
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub service_name: String,
    pub resource_attributes: Vec<(String, String)>,
    pub sampler: Sampler,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub schedule_delay: Duration,
}

impl TraceConfig {
    /// The collector, for the start log: scheme, host, port and path, never
    /// a user, password or query.
    pub fn target(&self) -> String {
        super::redacted_url(&self.endpoint)
    }
}

impl TraceArgs {
    /// `None` when tracing is off (no endpoint); the other settings are
    /// checked either way, so a typo is found before tracing is turned on.
    pub fn validate(&self) -> Result<Option<TraceConfig>, ConfigError> {
        let protocol = match self.protocol.trim() {
            "http/protobuf" => OtlpProtocol::Protobuf,
            "http/json" => OtlpProtocol::Json,
            "grpc" => {
                return Err(bad(
                    setting::OTEL_EXPORTER_OTLP_PROTOCOL,
                    "grpc is not offered; use http/protobuf (the default) or http/json",
                ))
            }
            other => {
                return Err(bad(
                    setting::OTEL_EXPORTER_OTLP_PROTOCOL,
                    format!("`{other}` is not http/protobuf or http/json"),
                ))
            }
        };
        let sampler = sampler(&self.sampler, self.sampler_arg.as_deref())?;
        let mut headers =
            header_list(self.headers.as_deref(), setting::OTEL_EXPORTER_OTLP_HEADERS)?;
        for (name, value) in header_list(
            self.traces_headers.as_deref(),
            setting::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
        )? {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
            headers.push((name, value));
        }
        let resource_attributes = match &self.resource_attributes {
            Some(a) => key_values(a).map_err(|e| bad(setting::OTEL_RESOURCE_ATTRIBUTES, e))?,
            None => Vec::new(),
        };
        if self.service_name.trim().is_empty() {
            return Err(bad(setting::OTEL_SERVICE_NAME, "must not be empty"));
        }
        if self.timeout_ms == 0 {
            return Err(bad(setting::OTEL_EXPORTER_OTLP_TIMEOUT, "must be above 0"));
        }
        if self.max_queue_size == 0 {
            return Err(bad(setting::OTEL_BSP_MAX_QUEUE_SIZE, "must be at least 1"));
        }
        if self.max_export_batch_size == 0 || self.max_export_batch_size > self.max_queue_size {
            return Err(bad(
                setting::OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
                format!(
                    "must be between 1 and {otel_bsp_max_queue_size} ({})",
                    self.max_queue_size,
                    otel_bsp_max_queue_size = setting::OTEL_BSP_MAX_QUEUE_SIZE
                ),
            ));
        }
        if self.schedule_delay_ms == 0 {
            return Err(bad(setting::OTEL_BSP_SCHEDULE_DELAY, "must be above 0"));
        }
        let endpoint = match (
            nonempty(self.traces_endpoint.as_deref()),
            nonempty(self.endpoint.as_deref()),
        ) {
            (Some(url), _) => collector_url(setting::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, url)?,
            (None, Some(base)) => {
                // The specification's rule: the signal's path is appended to
                // the base, after its own path (a collector behind a prefix).
                let url = format!("{}/v1/traces", base.trim_end_matches('/'));
                collector_url(setting::OTEL_EXPORTER_OTLP_ENDPOINT, &url)?
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(TraceConfig {
            endpoint,
            protocol,
            headers,
            timeout: Duration::from_millis(self.timeout_ms),
            service_name: self.service_name.trim().to_owned(),
            resource_attributes,
            sampler,
            max_queue_size: self.max_queue_size,
            max_export_batch_size: self.max_export_batch_size,
            schedule_delay: Duration::from_millis(self.schedule_delay_ms),
        }))
    }
}

/// An unset and an empty variable both mean "not set".
fn nonempty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

fn collector_url(setting: &'static str, url: &str) -> Result<hyper::Uri, ConfigError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|_| bad(setting, format!("`{url}` is not a URL")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(bad(
            setting,
            "must be an http:// or https:// URL with a host",
        ));
    }
    Ok(uri)
}

/// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
fn sampler(name: &str, arg: Option<&str>) -> Result<Sampler, ConfigError> {
    let ratio = || -> Result<f64, ConfigError> {
        let Some(arg) = arg.map(str::trim).filter(|a| !a.is_empty()) else {
            return Ok(1.0);
        };
        match arg.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(bad(
                setting::OTEL_TRACES_SAMPLER_ARG,
                format!("`{arg}` is not a ratio between 0 and 1"),
            )),
        }
    };
    let (parent_based, root) = match name.trim() {
        "always_on" => (false, SamplerRoot::AlwaysOn),
        "always_off" => (false, SamplerRoot::AlwaysOff),
        "traceidratio" => (false, SamplerRoot::Ratio(ratio()?)),
        "parentbased_always_on" => (true, SamplerRoot::AlwaysOn),
        "parentbased_always_off" => (true, SamplerRoot::AlwaysOff),
        "parentbased_traceidratio" => (true, SamplerRoot::Ratio(ratio()?)),
        other => {
            return Err(bad(
                setting::OTEL_TRACES_SAMPLER,
                format!("`{other}` is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"),
            ))
        }
    };
    Ok(Sampler { parent_based, root })
}

/// `key=value,key=value` with percent-encoded values (the W3C Baggage form
/// both `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES` use).
/// The headers `text` (of `name`) lists, each a valid HTTP header; an error
/// never shows a value (usually an API key).
fn header_list(
    text: Option<&str>,
    name: &'static str,
) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let headers = key_values(text).map_err(|e| bad(name, e))?;
    for (header, value) in &headers {
        if http::HeaderName::from_bytes(header.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
        {
            return Err(bad(
                name,
                format!("`{header}` is not a valid header name, or its value not a header value"),
            ));
        }
    }
    Ok(headers)
}

/// Errors name the key, never a value (a header's is usually a secret).
fn key_values(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            let key: String = pair.chars().take(40).collect();
            return Err(format!("`{key}…` has no `=value`"));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err("an entry has an empty key".to_owned());
        }
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of `{key}` is not UTF-8 once decoded"))?;
        out.push((key.to_owned(), value.into_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        traces: TraceArgs,
    }

    fn args(flags: &[&str]) -> TraceArgs {
        let mut argv = vec!["t"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).expect("flags parse").traces
    }

    /// The settings `flags` give, tracing on.
    fn valid(flags: &[&str]) -> TraceConfig {
        args(flags)
            .validate()
            .expect("valid settings")
            .expect("tracing on")
    }

    fn refused(flags: &[&str]) -> ConfigError {
        args(flags).validate().expect_err("refused")
    }

    #[test]
    fn tracing_is_off_without_an_endpoint_and_on_with_one() {
        assert!(args(&[]).validate().unwrap().is_none());
        let cfg = valid(&["--otel-exporter-otlp-endpoint", "http://collector:4318/"]);
        assert_eq!(cfg.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(cfg.protocol, OtlpProtocol::Protobuf);
        assert_eq!(cfg.service_name, "fencehook");
        assert_eq!(
            cfg.sampler,
            Sampler {
                parent_based: true,
                root: SamplerRoot::AlwaysOn
            }
        );
        let cfg = valid(&[
            "--otel-exporter-otlp-endpoint",
            "http://ignored:4318",
            "--otel-exporter-otlp-traces-endpoint",
            "https://api.example/otlp/traces",
            "--otel-exporter-otlp-protocol",
            "http/json",
        ]);
        assert_eq!(cfg.endpoint, "https://api.example/otlp/traces");
        assert_eq!(cfg.protocol, OtlpProtocol::Json);
    }

    #[test]
    fn a_bad_protocol_sampler_or_ratio_is_refused_naming_its_setting() {
        let e = refused(&["--otel-exporter-otlp-protocol", "grpc"]);
        assert_eq!(e.setting, "OTEL_EXPORTER_OTLP_PROTOCOL");
        let e = refused(&["--otel-exporter-otlp-protocol", "http/xml"]);
        assert_eq!(e.setting, "OTEL_EXPORTER_OTLP_PROTOCOL");
        let e = refused(&["--otel-traces-sampler", "jaeger_remote"]);
        assert_eq!(e.setting, "OTEL_TRACES_SAMPLER");
        for arg in ["1.5", "-0.1", "half"] {
            let arg_flag = format!("--otel-traces-sampler-arg={arg}");
            let e = refused(&["--otel-traces-sampler", "traceidratio", &arg_flag]);
            assert_eq!(e.setting, "OTEL_TRACES_SAMPLER_ARG", "{arg}");
        }
        let e = refused(&["--otel-exporter-otlp-endpoint", "collector:4318"]);
        assert_eq!(e.setting, "OTEL_EXPORTER_OTLP_ENDPOINT");
        let e = refused(&["--otel-bsp-max-export-batch-size", "16384"]);
        assert_eq!(e.setting, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE");
    }

    #[test]
    fn the_ratio_samplers_take_their_argument() {
        let s = sampler("parentbased_traceidratio", Some("0.25")).unwrap();
        assert_eq!(s.root, SamplerRoot::Ratio(0.25));
        assert!(s.parent_based);
        assert_eq!(
            sampler("traceidratio", None).unwrap().root,
            SamplerRoot::Ratio(1.0)
        );
    }

    #[test]
    fn headers_and_resource_attributes_are_percent_decoded_and_a_bad_one_hides_its_value() {
        let cfg = valid(&[
            "--otel-exporter-otlp-endpoint",
            "http://c:4318",
            "--otel-exporter-otlp-headers",
            "x-api-key=s%3Dcret, x-team=payments",
            "--otel-resource-attributes",
            "deployment.environment.name=prod,service.namespace=pay",
        ]);
        assert_eq!(
            cfg.headers,
            vec![
                ("x-api-key".to_owned(), "s=cret".to_owned()),
                ("x-team".to_owned(), "payments".to_owned())
            ]
        );
        assert_eq!(cfg.resource_attributes.len(), 2);
        let e = refused(&["--otel-exporter-otlp-headers", "bad key=topsecret"]);
        assert_eq!(e.setting, "OTEL_EXPORTER_OTLP_HEADERS");
        assert!(!e.to_string().contains("topsecret"), "{e}");
        let e = refused(&["--otel-resource-attributes", "novalue"]);
        assert_eq!(e.setting, "OTEL_RESOURCE_ATTRIBUTES");
    }

    #[test]
    fn trace_headers_add_to_the_headers_and_win_on_a_name_in_both() {
        let cfg = valid(&[
            "--otel-exporter-otlp-endpoint",
            "http://c:4318",
            "--otel-exporter-otlp-headers",
            "x-api-key=general,x-team=payments",
            "--otel-exporter-otlp-traces-headers",
            "X-Api-Key=for-traces,x-extra=1",
        ]);
        assert_eq!(
            cfg.headers,
            vec![
                ("x-team".to_owned(), "payments".to_owned()),
                ("X-Api-Key".to_owned(), "for-traces".to_owned()),
                ("x-extra".to_owned(), "1".to_owned()),
            ]
        );
        let e = refused(&[
            "--otel-exporter-otlp-traces-headers",
            "x-key=top\nsecret%0A",
        ]);
        assert_eq!(e.setting, "OTEL_EXPORTER_OTLP_TRACES_HEADERS");
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
