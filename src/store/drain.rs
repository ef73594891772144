//! What the inbox did with the events of one `fencehook load` run: read by
//! `fencehook load --inbox --database-url` after the load, to wait until the
//! workers have finished every event of the run and to report how fast they
//! did. Read-only, one connection of its own (not the service's pool).
//!
//! A run's events are those of one provider whose transaction id starts with
//! the run's prefix (`load-<run-id>-`). The figures are computed in SQL from
//! the events' own timestamps (`received_at`: the accepting commit,
//! `finished_at`: done or dead), so they do not depend on the load tool's
//! clock or on when it looked.

use crate::db::tls::Target;
use crate::db::PoolBuildError;
use crate::store::StoreError;

/// The run's events: "of this provider, transaction id starting with $2".
/// `starts_with`, not `LIKE`: a run id may hold `_`, a `LIKE` wildcard.
const OF_RUN: &str = "provider = $1 AND starts_with(transaction_id, $2)";

/// The figures of a run's events. `lag_*` are of `finished_at - received_at`
/// over the finished (done or dead) events, interpolated percentiles
/// (`percentile_cont`), in seconds.
const FIGURES: &str = "\
SELECT count(*),
       count(DISTINCT transaction_id),
       count(*) FILTER (WHERE status = 'queued'),
       count(*) FILTER (WHERE status = 'processing'),
       count(*) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'dead'),
       extract(epoch FROM max(finished_at) - min(received_at))::float8,
       percentile_cont(ARRAY[0.5, 0.9, 0.99]::float8[]) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - received_at)::float8),
       extract(epoch FROM max(finished_at - received_at))::float8
  FROM events WHERE ";

/// What the events of one run came to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFigures {
    /// Events of the run (each load transaction is one event).
    pub events: i64,
    /// Distinct transactions among them.
    pub transactions: i64,
    pub queued: i64,
    pub processing: i64,
    pub done: i64,
    pub dead: i64,
    /// From the first acceptance (`received_at`) to the last finish
    /// (`finished_at`) of the run's events; `None` before any finished.
    pub span_secs: Option<f64>,
    /// Lag of the finished events, `finished_at - received_at`.
    pub lag: Option<LagSecs>,
}

impl RunFigures {
    /// Events done or dead.
    pub fn finished(&self) -> i64 {
        self.done + self.dead
    }

    /// Events still queued or being processed.
    pub fn unfinished(&self) -> i64 {
        self.queued + self.processing
    }
}

/// Percentiles of the lag, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagSecs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// A connection that reads one run's events.
pub struct RunEvents {
    client: tokio_postgres::Client,
    provider: String,
    prefix: String,
}

impl RunEvents {
    /// Connects to `url`; the run's events are `provider`'s whose
    /// transaction id starts with `prefix`.
    pub async fn connect(url: &str, provider: &str, prefix: &str) -> Result<RunEvents, StoreError> {
        let mut cfg = Target::parse(url).map_err(PoolBuildError::Url)?;
        cfg.config.application_name("fencehook-load-drain");
        let (client, conn) = cfg.config.connect(cfg.tls).await?;
        // Ends when `client` is dropped.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(RunEvents {
            client,
            provider: provider.to_owned(),
            prefix: prefix.to_owned(),
        })
    }

    /// Events of the run still queued or being processed.
    pub async fn unfinished(&self) -> Result<i64, tokio_postgres::Error> {
        let sql = format!(
            "SELECT count(*) FROM events WHERE status IN ('queued', 'processing') AND {OF_RUN}"
        );
        let row = self
            .client
            .query_one(&sql, &[&self.provider, &self.prefix])
            .await?;
        Ok(row.get(0))
    }

    /// Every figure of the run's events, as they are now.
    pub async fn figures(&self) -> Result<RunFigures, tokio_postgres::Error> {
        let sql = format!("{FIGURES}{OF_RUN}");
        let row = self
            .client
            .query_one(&sql, &[&self.provider, &self.prefix])
            .await?;
        let percentiles: Option<Vec<Option<f64>>> = row.get(7);
        let max: Option<f64> = row.get(8);
        let lag = match (percentiles.as_deref(), max) {
            (Some([Some(p50), Some(p90), Some(p99)]), Some(max)) => Some(LagSecs {
                p50: *p50,
                p90: *p90,
                p99: *p99,
                max,
            }),
            _ => None,
        };
        Ok(RunFigures {
            events: row.get(0),
            transactions: row.get(1),
            queued: row.get(2),
            processing: row.get(3),
            done: row.get(4),
            dead: row.get(5),
            span_secs: row.get(6),
            lag,
        })
    }
}
