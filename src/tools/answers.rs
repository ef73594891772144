//! The answers file of `fencehook load --answers FILE`: one JSON
//! [`AnswerRecord`] per final answer. `fencehook audit --answers FILE` reads
//! it back and checks that every 2xx (other than `ignored`) is backed by
//! what it promised — the one invariant the database cannot show alone:
//!
//! - `accepted` (inbox mode: stored, booked later) promises a committed
//!   `payments` row in any status and a stored event;
//! - every other 2xx (`processed`, `duplicate`, `stale`, ...) promises a
//!   committed terminal row (`succeeded` / `failed`). In inbox mode a
//!   `duplicate` is answered for an event accepted before, so that promise
//!   holds once the workers have drained the inbox: audit after the drain
//!   (`fencehook load --inbox --database-url` waits for it).
//!
//! A PSP that reads a success in its own words gets one without a `result`
//! (WeChat Pay an empty 200, Alipay `success`, Adyen `[accepted]`): `load`
//! records it as [`UNLABELLED_SUCCESS`], a 2xx like `processed` or
//! `duplicate`, and it promises a terminal row too. In inbox mode it may
//! have been an `accepted`: audit after the drain.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::Path;

use fencehook::store::audit::{self, Check, SHOWN_VIOLATIONS};
use serde::{Deserialize, Serialize};

/// The final answer of one delivery, as `fencehook load --answers` writes it
/// (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerRecord {
    pub provider: String,
    pub transaction_id: String,
    /// HTTP status; `null` when no HTTP answer came (timeout, connection error).
    pub status: Option<u16>,
    /// The result the body named ([`UNLABELLED_SUCCESS`] for a 2xx that
    /// names none), or what went wrong on the way.
    pub result: String,
}

impl AnswerRecord {
    /// Whether this answer told the sender "done": a 2xx other than
    /// `ignored` and `accepted`. Such an answer is a promise that a terminal
    /// row is committed.
    pub fn claims_durable(&self) -> bool {
        self.is_2xx() && self.result != "ignored" && self.result != ACCEPTED
    }

    /// Whether this answer told the sender "stored, will be booked": a 2xx
    /// `accepted`. Such an answer is a promise that the event and a row (in
    /// any status) are committed.
    pub fn claims_accepted(&self) -> bool {
        self.is_2xx() && self.result == ACCEPTED
    }

    fn is_2xx(&self) -> bool {
        matches!(self.status, Some(200..=299))
    }
}

/// The `result` of inbox mode's answer: durably queued, not yet booked.
pub const ACCEPTED: &str = "accepted";

/// What `load` records for a 2xx whose body names no result: the PSP's own
/// word for a success (WeChat Pay's empty 200, Alipay's `success`, Adyen's
/// `[accepted]`). fencehook answers those PSPs so for `processed`,
/// `duplicate`, `stale` and (inbox mode) `accepted` alike.
pub const UNLABELLED_SUCCESS: &str = "success";

/// What an answers file holds that the audit must check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// Lines read.
    pub lines: usize,
    /// Distinct (provider, transaction_id) answered 2xx other than
    /// `ignored` and `accepted`: each must have a terminal row.
    pub durable: Vec<(String, String)>,
    /// Distinct (provider, transaction_id) answered 2xx `accepted`: each
    /// must have a row (any status) and an event. A transaction can be in
    /// both lists (one copy `accepted`, another `duplicate`).
    pub accepted: Vec<(String, String)>,
}

impl Answers {
    /// Distinct transactions answered 2xx (other than `ignored`).
    pub fn transactions_2xx(&self) -> usize {
        let durable: HashSet<&(String, String)> = self.durable.iter().collect();
        durable.len()
            + self
                .accepted
                .iter()
                .filter(|key| !durable.contains(key))
                .count()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnswersError {
    #[error("cannot read {path}")]
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
    let mut seen_accepted = HashSet::new();
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
        } else if record.claims_accepted() {
            let key = (record.provider, record.transaction_id);
            if seen_accepted.insert(key.clone()) {
                out.accepted.push(key);
            }
        }
    }
    Ok(out)
}

/// The two checks of an answers file:
///
/// - every transaction answered 2xx (other than `ignored` and `accepted`)
///   has a `payments` row in a terminal state (`succeeded` or `failed`). A
///   missing row, or one still `processing`, means the service said "done"
///   before the outcome was durable;
/// - every transaction answered `accepted` has a `payments` row (any
///   status) and a stored event: the service said "stored" only after the
///   commit.
pub async fn check(
    url: &str,
    answers: &Answers,
) -> Result<Vec<Check>, fencehook::store::StoreError> {
    let terminal = audit::missing_terminal_rows(url, &answers.durable).await?;
    let accepted = audit::missing_rows_or_events(url, &answers.accepted).await?;
    Ok(vec![
        Check {
            name: "every_2xx_has_a_terminal_row",
            description: "every 2xx answered (other than ignored and accepted) has a committed succeeded/failed row",
            total: terminal.len(),
            violations: terminal.into_iter().take(SHOWN_VIOLATIONS).collect(),
        },
        Check {
            name: "every_accepted_has_a_row_and_an_event",
            description: "every 2xx accepted (inbox mode) has a committed row, in any status, and a stored event",
            total: accepted.len(),
            violations: accepted.into_iter().take(SHOWN_VIOLATIONS).collect(),
        },
    ])
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
        assert!(answers.accepted.is_empty());
        assert_eq!(answers.transactions_2xx(), 2);
    }

    #[test]
    fn accepted_promises_a_stored_event_and_the_other_2xx_a_terminal_row() {
        let text = r#"{"provider":"generic","transaction_id":"a","status":200,"result":"accepted"}
{"provider":"generic","transaction_id":"a","status":200,"result":"accepted"}
{"provider":"generic","transaction_id":"b","status":200,"result":"accepted"}
{"provider":"generic","transaction_id":"b","status":200,"result":"duplicate"}
{"provider":"generic","transaction_id":"c","status":503,"result":"accepted"}
{"provider":"generic","transaction_id":"d","status":200,"result":"processed"}
{"provider":"generic","transaction_id":"e","status":null,"result":"timeout"}
"#;
        let answers = parse(text).expect("valid file");
        assert_eq!(answers.lines, 7);
        assert_eq!(
            answers.accepted,
            vec![
                ("generic".to_owned(), "a".to_owned()),
                ("generic".to_owned(), "b".to_owned())
            ],
            "once per transaction, and only when answered 2xx"
        );
        assert_eq!(
            answers.durable,
            vec![
                ("generic".to_owned(), "b".to_owned()),
                ("generic".to_owned(), "d".to_owned())
            ],
            "a `duplicate` still promises a terminal row"
        );
        assert_eq!(answers.transactions_2xx(), 3, "a, b and d");
    }

    #[test]
    fn each_answer_claims_what_its_status_and_result_promise() {
        let record = |status: Option<u16>, result: &str| AnswerRecord {
            provider: "generic".to_owned(),
            transaction_id: "t".to_owned(),
            status,
            result: result.to_owned(),
        };
        for (status, result, durable, accepted) in [
            (Some(200), "processed", true, false),
            (Some(200), "duplicate", true, false),
            (Some(200), "stale", true, false),
            (Some(200), "accepted", false, true),
            (Some(200), UNLABELLED_SUCCESS, true, false),
            (Some(202), "accepted", false, true),
            (Some(200), "ignored", false, false),
            (Some(409), "in_progress", false, false),
            (Some(503), "accepted", false, false),
            (None, "timeout", false, false),
        ] {
            let r = record(status, result);
            assert_eq!(r.claims_durable(), durable, "{status:?} {result}");
            assert_eq!(r.claims_accepted(), accepted, "{status:?} {result}");
        }
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
