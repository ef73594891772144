//! The `send` and `audit` subcommands.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::DbArgs;
use crate::providers::standard;
use crate::store::audit;

/// `fencehook audit`: the database invariants, and optionally the answers a
/// load run received.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// A `fencehook load --answers` file: every 2xx in it (other than
    /// `ignored`) must have a committed succeeded/failed payments row.
    #[arg(long, value_name = "FILE")]
    pub answers: Option<PathBuf>,
}

/// `fencehook send`: sign one generic delivery and send it.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    /// Base URL of the public listener.
    #[arg(long, env = "FENCEHOOK_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Provider name in /webhooks/{provider}.
    #[arg(long, default_value = "generic")]
    pub provider: String,
    /// Signing secret (whsec_<base64>).
    #[arg(long, env = "FENCEHOOK_GENERIC_SECRET", hide_env_values = true)]
    pub secret: String,
    #[arg(long)]
    pub transaction_id: String,
    /// Amount in minor units (cents).
    #[arg(long, default_value_t = 1000)]
    pub amount: i64,
    #[arg(long, default_value = "EUR")]
    pub currency: String,
    #[arg(long, default_value = "payment.succeeded")]
    pub event_type: String,
    /// Send this raw JSON body instead of building one from the flags.
    #[arg(long)]
    pub body: Option<String>,
    /// webhook-id header (default: a new one per call).
    #[arg(long)]
    pub webhook_id: Option<String>,
}

/// Sends the delivery; returns the HTTP status and body text.
pub async fn send(args: &SendArgs) -> Result<(u16, String), String> {
    let body = match &args.body {
        Some(b) => b.clone(),
        None => serde_json::json!({
            "transaction_id": args.transaction_id,
            "amount": args.amount,
            "currency": args.currency,
            "event_type": args.event_type,
        })
        .to_string(),
    };
    let id = args
        .webhook_id
        .clone()
        .unwrap_or_else(|| format!("msg_{}", uuid::Uuid::new_v4().simple()));
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let signature = standard::sign(&args.secret, &id, ts, body.as_bytes())?;
    let uri = format!(
        "{}/webhooks/{}",
        args.url.trim_end_matches('/'),
        args.provider
    );
    let req = hyper::Request::post(&uri)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad request for {uri}: {e}"))?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("POST {uri}: {e}"))?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let mut out = String::from_utf8_lossy(&text).into_owned();
    if let Some(r) = retry_after {
        out.push_str(&format!(" (Retry-After: {r})"));
    }
    Ok((status, out))
}

/// Runs the audit and prints one line per check; `Ok(true)` when clean.
/// With `answers`, the answers file is read first, so a bad file stops the
/// audit before anything is printed as "clean".
pub async fn audit(database_url: &str, answers: Option<&Path>) -> Result<bool, String> {
    let answers = answers
        .map(audit::read_answers)
        .transpose()
        .map_err(|e| e.to_string())?;
    let mut checks = audit::run(database_url)
        .await
        .map_err(|e| format!("audit could not read the database: {e}"))?;
    if let Some(answers) = &answers {
        let check = audit::check_answers(database_url, answers)
            .await
            .map_err(|e| format!("audit could not read the database: {e}"))?;
        checks.push(check);
    }
    let (payments, entries) = audit::totals(database_url)
        .await
        .map_err(|e| e.to_string())?;
    println!("audit: {payments} payments, {entries} ledger entries");
    if let Some(answers) = &answers {
        println!(
            "audit: {} answers read, {} transactions answered 2xx to check",
            answers.lines,
            answers.durable.len()
        );
    }
    let mut clean = true;
    for c in &checks {
        let verdict = if c.total == 0 {
            "ok".to_owned()
        } else {
            format!("VIOLATED ({})", c.total)
        };
        println!("  {:<40} {verdict:<14} {}", c.name, c.description);
        for v in &c.violations {
            println!("      {v}");
        }
        clean &= c.total == 0;
    }
    println!(
        "audit: {}",
        if clean { "clean" } else { "VIOLATIONS FOUND" }
    );
    Ok(clean)
}
