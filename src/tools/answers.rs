//! The answers file of `fencehook load --answers FILE`: one JSON
//! [`AnswerRecord`] per final answer. `fencehook audit --answers FILE` reads
//! it back and checks that every 2xx (other than `ignored`) has a committed
//! terminal row — the one invariant the database cannot show alone.

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
    /// The `result` field of the JSON body, or what went wrong on the way.
    pub result: String,
}

impl AnswerRecord {
    /// Whether this answer told the sender "done": a 2xx other than
    /// `ignored`. Such an answer is a promise that a terminal row is committed.
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

/// Every transaction answered 2xx (other than `ignored`) has a `payments`
/// row in a terminal state (`succeeded` or `failed`). A missing row, or one
/// still `processing`, means the service said "done" before the outcome was
/// durable.
pub async fn check(url: &str, answers: &Answers) -> Result<Check, tokio_postgres::Error> {
    let offenders = audit::missing_terminal_rows(url, &answers.durable).await?;
    Ok(Check {
        name: "every_2xx_has_a_terminal_row",
        description: "every 2xx answered (other than ignored) has a committed succeeded/failed row",
        total: offenders.len(),
        violations: offenders.into_iter().take(SHOWN_VIOLATIONS).collect(),
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
