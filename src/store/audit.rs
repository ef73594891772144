//! `fencehook audit`: checks the invariants of SPEC §6 against the database.
//! Each check is one query returning the offending rows; zero rows is clean.
//!
//! Invariant 3 (every 2xx corresponds to a committed terminal row) cannot be
//! seen in the database alone: it needs the answers the service gave. A
//! `fencehook load --answers FILE` run records them, one [`AnswerRecord`] per
//! line, and [`check_answers`] holds them against the `payments` table.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tokio_postgres::NoTls;

/// One invariant and what violated it.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub description: &'static str,
    /// The first offenders (at most [`SHOWN_VIOLATIONS`]).
    pub violations: Vec<String>,
    /// How many offenders there are in all, when the check counts them
    /// (the answers check); otherwise `violations.len()`.
    pub total: usize,
}

/// Offending rows printed per check: enough to start digging, not a flood.
pub const SHOWN_VIOLATIONS: usize = 20;

const CHECKS: &[(&str, &str, &str)] = &[
    (
        "one_row_per_transaction",
        "at most one payments row per (provider, transaction_id)",
        "SELECT provider || ':' || transaction_id FROM payments GROUP BY provider, transaction_id HAVING count(*) > 1",
    ),
    (
        "one_entry_per_effect",
        "at most one ledger entry per payment and effect",
        "SELECT payment_id::text || ':' || effect FROM ledger_entries GROUP BY payment_id, effect HAVING count(*) > 1",
    ),
    (
        "succeeded_has_exactly_its_entry",
        "a succeeded payment has exactly one entry: +amount credit, or -amount debit for a refund",
        "SELECT p.provider || ':' || p.transaction_id FROM payments p
          WHERE p.status = 'succeeded'
            AND (SELECT count(*) FROM ledger_entries l WHERE l.payment_id = p.id) <> 1
             OR p.status = 'succeeded' AND NOT EXISTS (
                SELECT 1 FROM ledger_entries l
                 WHERE l.payment_id = p.id AND l.currency = p.currency
                   AND ((p.event_type = 'payment.succeeded' AND l.effect = 'credit' AND l.amount_minor = p.amount_minor)
                     OR (p.event_type = 'refund.succeeded' AND l.effect = 'debit' AND l.amount_minor = -p.amount_minor)))",
    ),
    (
        "unfinished_or_failed_have_no_entries",
        "processing and failed payments have no ledger entries",
        "SELECT p.provider || ':' || p.transaction_id FROM payments p
          WHERE p.status IN ('processing', 'failed')
            AND EXISTS (SELECT 1 FROM ledger_entries l WHERE l.payment_id = p.id)",
    ),
    (
        "status_fits_event_type",
        "payment.failed ends failed, the others end succeeded",
        "SELECT provider || ':' || transaction_id FROM payments
          WHERE (status = 'failed' AND event_type <> 'payment.failed')
             OR (status = 'succeeded' AND event_type = 'payment.failed')",
    ),
    (
        "entries_written_by_the_current_holder",
        "every ledger entry carries the payment's fence: no stale holder's write took effect",
        "SELECT p.provider || ':' || p.transaction_id || ' entry fence ' || l.fence || ' row fence ' || p.fence
           FROM ledger_entries l JOIN payments p ON p.id = l.payment_id
          WHERE l.fence <> p.fence",
    ),
];

/// Runs every check. A connection or query failure is an error, not "clean".
pub async fn run(url: &str) -> Result<Vec<Check>, tokio_postgres::Error> {
    let cfg: tokio_postgres::Config = url.parse()?;
    let (client, conn) = cfg.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // One snapshot for every check, so they agree with each other.
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let mut out = Vec::new();
    for (name, description, sql) in CHECKS {
        let rows = client
            .query(&format!("{sql} LIMIT {SHOWN_VIOLATIONS}"), &[])
            .await?;
        let violations: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        out.push(Check {
            name,
            description,
            total: violations.len(),
            violations,
        });
    }
    client.batch_execute("COMMIT").await?;
    Ok(out)
}

/// Payments and entries counted, for the audit summary.
pub async fn totals(url: &str) -> Result<(i64, i64), tokio_postgres::Error> {
    let cfg: tokio_postgres::Config = url.parse()?;
    let (client, conn) = cfg.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM ledger_entries)",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The final answer of one delivery, as `fencehook load --answers` writes it
/// (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerRecord {
    pub provider: String,
    pub transaction_id: String,
    /// HTTP status; `null` when no HTTP answer came (timeout, connection error).
    pub status: Option<u16>,
    /// The `result` field of the JSON body, or what went wrong on the way.
    pub result: String,
}

impl AnswerRecord {
    /// Whether this answer told the sender "done": a 2xx other than
    /// `ignored` (SPEC §6, invariant 3). Such an answer is a promise that a
    /// terminal row is committed.
    pub fn claims_durable(&self) -> bool {
        matches!(self.status, Some(200..=299)) && self.result != "ignored"
    }
}

/// What an answers file holds that the audit must check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// Lines read.
    pub lines: usize,
    /// Distinct (provider, transaction_id) that were answered 2xx (not `ignored`).
    pub durable: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum AnswersError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A line that is not an answer record: the file is not what the audit
    /// thinks it is, so no verdict can be given.
    #[error("{path} line {line}: not an answer record ({reason})")]
    Malformed {
        path: String,
        line: usize,
        reason: String,
    },
}

/// Reads an answers file. Blank lines are skipped; any other line that does
/// not parse is an error, never silently ignored.
pub fn read_answers(path: &Path) -> Result<Answers, AnswersError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| AnswersError::Io {
        path: shown.clone(),
        source,
    })?;
    parse_answers(std::io::BufReader::new(file), &shown)
}

fn parse_answers(reader: impl BufRead, shown: &str) -> Result<Answers, AnswersError> {
    let mut seen = HashSet::new();
    let mut out = Answers::default();
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| AnswersError::Io {
            path: shown.to_owned(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        out.lines += 1;
        let record: AnswerRecord =
            serde_json::from_str(&line).map_err(|e| AnswersError::Malformed {
                path: shown.to_owned(),
                line: n + 1,
                reason: e.to_string(),
            })?;
        if record.claims_durable() {
            let key = (record.provider, record.transaction_id);
            if seen.insert(key.clone()) {
                out.durable.push(key);
            }
        }
    }
    Ok(out)
}

/// Transactions looked up per query: keeps each statement's arrays small.
const ANSWERS_BATCH: usize = 5_000;

/// Invariant 3: every transaction answered 2xx (other than `ignored`) has a
/// `payments` row in a terminal state (`succeeded` or `failed`). A missing
/// row, or one still `processing`, means the service said "done" before the
/// outcome was durable.
pub async fn check_answers(url: &str, answers: &Answers) -> Result<Check, tokio_postgres::Error> {
    let cfg: tokio_postgres::Config = url.parse()?;
    let (client, conn) = cfg.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let stmt = client
        .prepare(
            "SELECT a.provider || ':' || a.transaction_id || ' answered 2xx, but '
                    || COALESCE('its row is ' || p.status, 'there is no row')
               FROM unnest($1::text[], $2::text[]) AS a(provider, transaction_id)
               LEFT JOIN payments p
                 ON p.provider = a.provider AND p.transaction_id = a.transaction_id
              WHERE p.status IS NULL OR p.status NOT IN ('succeeded', 'failed')",
        )
        .await?;
    let mut violations = Vec::new();
    let mut total = 0;
    for batch in answers.durable.chunks(ANSWERS_BATCH) {
        let providers: Vec<&str> = batch.iter().map(|(p, _)| p.as_str()).collect();
        let ids: Vec<&str> = batch.iter().map(|(_, t)| t.as_str()).collect();
        let rows = client.query(&stmt, &[&providers, &ids]).await?;
        total += rows.len();
        for row in rows {
            if violations.len() < SHOWN_VIOLATIONS {
                violations.push(row.get::<_, String>(0));
            }
        }
    }
    Ok(Check {
        name: "every_2xx_has_a_terminal_row",
        description: "every 2xx answered (other than ignored) has a committed succeeded/failed row",
        violations,
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Answers, AnswersError> {
        parse_answers(std::io::Cursor::new(text), "answers.jsonl")
    }

    #[test]
    fn only_2xx_answers_other_than_ignored_claim_a_durable_outcome() {
        let text = r#"{"provider":"generic","transaction_id":"a","status":200,"result":"processed"}
{"provider":"generic","transaction_id":"a","status":200,"result":"duplicate"}
{"provider":"generic","transaction_id":"b","status":409,"result":"in_progress"}
{"provider":"generic","transaction_id":"c","status":null,"result":"timeout"}
{"provider":"generic","transaction_id":"d","status":200,"result":"ignored"}

{"provider":"other","transaction_id":"a","status":200,"result":"duplicate"}
"#;
        let answers = parse(text).expect("valid file");
        assert_eq!(answers.lines, 6);
        assert_eq!(
            answers.durable,
            vec![
                ("generic".to_owned(), "a".to_owned()),
                ("other".to_owned(), "a".to_owned())
            ]
        );
    }

    #[test]
    fn a_malformed_line_is_an_error_that_names_the_line() {
        let text = "{\"provider\":\"generic\",\"transaction_id\":\"a\",\"status\":200,\"result\":\"processed\"}\nnot json\n";
        let err = parse(text).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn an_answer_record_round_trips_through_json() {
        let record = AnswerRecord {
            provider: "generic".to_owned(),
            transaction_id: "load-x-1".to_owned(),
            status: None,
            result: "transport_error".to_owned(),
        };
        let line = serde_json::to_string(&record).expect("serializes");
        assert_eq!(
            line,
            r#"{"provider":"generic","transaction_id":"load-x-1","status":null,"result":"transport_error"}"#
        );
        let back: AnswerRecord = serde_json::from_str(&line).expect("parses");
        assert_eq!(back, record);
    }
}
