//! PostgreSQL: the final arbiter of who processed a payment, and of what
//! happened to its money.
//!
//! # The fencing rule (must stay true)
//!
//! Every write of a processing attempt carries the attempt's fencing token and
//! is conditioned on it in SQL:
//!
//! - the claim (or the one-statement write of the inline path) raises
//!   `payments.fence` to the token only while the row's status is one the
//!   transition starts from (or `processing`: an unfinished claim), its fence
//!   is *lower* than the token, and the fingerprint is the same; otherwise it
//!   changes nothing and the row is re-read;
//! - finalize (status + ledger entry, one statement) applies only where
//!   `fence = token` and the status is still one the transition starts from.
//!
//! So a holder that stalled past its lease and resumes after a newer holder
//! claimed the row cannot change anything: its write matches no row and is
//! reported as [`Finalized::FenceRejected`]. Conflicts are resolved with
//! `ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key`: only that
//! constraint can send a delivery down the "row exists" branch, and that branch
//! always re-reads the row ([`PaymentRow`]) for the processor to decide again.
//! Every other database error is an error ([`StoreError`]), never a duplicate.
//!
//! # The money cap (must stay true)
//!
//! A refund or a dispute takes money out of its payment, whose row keeps the
//! sum taken (`amount_out_minor`, net of reversals). The cap is checked and
//! booked by an `UPDATE` of the payment row inside the transaction that
//! writes the object's own row first: a copy of the same event finds that
//! row settled (or held) and answers as a copy, never as a refusal. The
//! payment row is locked first, without waiting (`NOWAIT`): a payment row
//! held by another transaction — another refund's, finishing in a moment, or
//! one stalled before its commit — is [`ParentRefusal::Busy`], and the
//! processor polls as for a held lease instead of queueing on the lock.
//! Whoever gets the lock checks the condition in a statement started after
//! it, against the committed sums, so two refunds racing on two instances
//! can never together take more than came in.
//!
//! Refunds are capped by the payment's amount, counting refunds alone (a PSP
//! never refunds more than the charge: an excess is a mapping fault or a
//! forgery). Disputes are not capped: a chargeback is money already gone,
//! larger than the charge, or beside a refund. So a refund and a dispute
//! that together exceed the payment are both booked whatever order they
//! arrive in, and the move that takes the payment past its amount is
//! reported as over-returned. The disputes' share of `amount_out_minor` is
//! read from their rows in a statement after the payment row is locked.
//!
//! On the downstream path the money is taken at the claim, before the call
//! (the row is `reserved`), so a step the downstream executed is never
//! refused afterwards; a call the downstream refused gives it back
//! ([`Connection::release`]); a give-back (a reversal) moves the money at the
//! finalize, once the downstream executed it.

pub mod audit;
mod commit;
pub mod console;
pub mod drain;
pub mod erase;
pub mod events;
pub mod history;
pub mod inbox;
pub mod ledger;
pub mod migrate;
pub mod reconcile;
pub mod record;
mod sql;
pub mod transmissions;

use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool, PoolError};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use self::sql::{
    APPLY, APPLY_LEASED, CLAIM, FINALIZE, LOCK_PARENT, MOVE_PARENT_MONEY, QUARANTINE, RELEASE,
    RESERVE, SELECT_PARENT, SELECT_PAYMENT,
};
use crate::config::DbConfig;
use crate::db::{self, PoolBuildError, PoolSpec};
use crate::domain::{CanonicalEvent, Effect, ObjectKind, Rejection, Status, Transition};

/// What the database holds for one (provider, transaction_id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRow {
    pub id: i64,
    pub kind: ObjectKind,
    pub status: Status,
    pub fingerprint: String,
    pub fence: i64,
}

/// Why a refund or a dispute did not take money from its payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentRefusal {
    /// The payment is not `succeeded` here yet (unknown, or in progress).
    NotYet,
    /// Another transaction holds the payment row: poll, as for a held lease.
    Busy,
    Rejected(Rejection),
}

/// Result of [`Connection::apply`], the one-transaction path (no downstream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The transition and its entry are committed; `over_returned` when a
    /// dispute or a refund took its payment past its amount.
    Committed { status: Status, over_returned: bool },
    /// Nothing written: the row, re-read, for the processor to decide again.
    NotWritten(PaymentRow),
    /// Nothing written: the payment cannot give this money (yet).
    Parent(ParentRefusal),
}

/// Result of [`Connection::apply_leased`]: the inline path with the lease
/// taken inside the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeasedApply {
    /// Another holder has the lease (for at most `remaining`): nothing written.
    Held { remaining: Option<Duration> },
    /// Took the lease with `token` and committed the transition and its entry.
    Committed {
        token: i64,
        status: Status,
        over_returned: bool,
    },
    /// Took the lease with `token` but wrote nothing: the row, re-read.
    NotWritten { token: i64, row: PaymentRow },
    /// Nothing written, no lease taken: the payment cannot give this money (yet).
    Parent(ParentRefusal),
}

/// Result of [`Connection::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The row is ours at `fence = token`. `event` is what the row holds (its
    /// first delivery's fields, and the event being applied): the business
    /// step is sent this, so a retry of one event always carries one body.
    Claimed {
        payment_id: i64,
        event: CanonicalEvent,
        reserved: Reserved,
    },
    NotWritten(PaymentRow),
    Parent(ParentRefusal),
}

/// What a claim did with its payment's money.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// This claim reserved the money itself. False when nothing moves, and
    /// when a claim before it (whose call timed out: the step may have been
    /// executed) had reserved it already: that reservation is not this
    /// claim's to give back on a refused call, and stays until the step is
    /// booked or the PSP's failure of it gives it back.
    pub here: bool,
    /// The money this claim reserved took a dispute's payment past its amount.
    pub over_returned: bool,
}

/// Result of [`Connection::finalize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalized {
    Applied(Status),
    /// No row had `fence = token` and a status this transition starts from:
    /// a newer holder owns it.
    FenceRejected,
    /// A give-back could not move its money (the payment row was busy): nothing written.
    Parent(ParentRefusal),
}

/// How a database error is classified. Exhaustive on purpose: adding a kind
/// forces every caller to decide what it means.
///
/// There is no "payment exists" kind: writes resolve conflicts with
/// `ON CONFLICT ON CONSTRAINT payments_provider_transaction_id_key`, so a
/// duplicate never surfaces as an error; a unique violation that does surface
/// is a bug, not a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbErrorKind {
    /// An integrity violation: a bug or a corrupt row, never a duplicate.
    Constraint,
    /// Serialization failure or deadlock: safe to retry.
    Conflict,
    /// statement_timeout / query cancelled.
    Timeout,
    /// Connection lost, server shutting down, cannot connect.
    Connection,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no database connection available")]
    Pool(#[from] PoolError),
    #[error("database error ({kind:?})")]
    Db {
        kind: DbErrorKind,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("unexpected database state: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Build(#[from] PoolBuildError),
    /// This write's commit has not answered within `bound`: it is left to
    /// finish by itself (see the `store::commit` module), the delivery is answered 503.
    #[error("the commit has not answered within {bound:?} (waiting for a synchronous standby?); it is not cancelled")]
    CommitWaiting { bound: Duration },
    /// Writes are refused while commits wait past their bound (see the `store::commit` module).
    #[error("{waiting} commit(s) wait past their bound (for a synchronous standby?); writes are refused until they answer")]
    CommitsWaiting { waiting: usize },
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(source: tokio_postgres::Error) -> StoreError {
        StoreError::Db {
            kind: classify(&source),
            source,
        }
    }
}

/// Classifies by SQLSTATE.
pub fn classify(e: &tokio_postgres::Error) -> DbErrorKind {
    let Some(db) = e.as_db_error() else {
        return DbErrorKind::Connection;
    };
    let code = db.code();
    if code.code().starts_with("23") {
        DbErrorKind::Constraint
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
    {
        DbErrorKind::Conflict
    } else if *code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE {
        DbErrorKind::Timeout
    } else if code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
        // 25006: the node is (or became) read-only — a standby, or a primary
        // demoted in a failover. Nothing was written; another node (or this
        // one, once promoted) takes the retry.
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
    {
        DbErrorKind::Connection
    } else {
        DbErrorKind::Other
    }
}

/// What [`Store::node_state`] found on the node a pooled connection reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// `pg_is_in_recovery()`: a standby.
    pub in_recovery: bool,
    /// `transaction_read_only`: writes are refused here.
    pub read_only: bool,
    pub synchronous_standby_names: String,
    pub synchronous_commit: String,
    /// The newest migration recorded in `refinery_schema_history` (0: none).
    pub schema_version: i32,
}

impl NodeState {
    pub fn writable(&self) -> bool {
        !self.in_recovery && !self.read_only
    }

    /// Whether a commit here returns only once a synchronous standby has it:
    /// a standby is named and the session's `synchronous_commit` waits for it
    /// (`local` and `off` do not wait, even with standbys named).
    pub fn commits_wait_for_a_standby(&self) -> bool {
        !self.synchronous_standby_names.trim().is_empty()
            && matches!(
                self.synchronous_commit.as_str(),
                "on" | "remote_write" | "remote_apply"
            )
    }
}

/// The pooled PostgreSQL store.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// Set by [`Store::node_state`] on a read-only node.
    retire: db::Retire,
    /// The bound on a write's commit, and the commits waiting past it.
    commits: commit::Commits,
}

impl Store {
    /// Builds the pool. Connections are opened lazily, so a database that is
    /// down at start makes requests answer 503 (and `/readyz` say so) instead
    /// of stopping the process.
    pub fn new(cfg: &DbConfig) -> Result<Store, StoreError> {
        Store::build(cfg, None)
    }

    /// [`Store::new`] for the service's writes, whose transactions hold
    /// payment rows from their money move to their commit: a transaction left
    /// idle for a lease TTL (its process frozen, its VM paused, the connection
    /// still up) is ended by the server, so the payment it holds is free
    /// again. Its holder's lease has expired by then anyway.
    pub fn for_service(cfg: &DbConfig, lease_ttl: Duration) -> Result<Store, StoreError> {
        Store::build(cfg, Some(lease_ttl))
    }

    fn build(cfg: &DbConfig, idle_in_transaction: Option<Duration>) -> Result<Store, StoreError> {
        let retire = db::Retire::default();
        let pool = db::pool_with_retire(
            cfg,
            PoolSpec {
                application_name: "fencehook",
                statement_timeout: cfg.statement_timeout,
                size: cfg.pool_size,
                wait: cfg.pool_wait,
                idle_in_transaction,
            },
            &retire,
        )?;
        Ok(Store {
            pool,
            retire,
            commits: commit::Commits::new(cfg.statement_timeout),
        })
    }

    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// Payments left `processing` for longer than `older_than`: claims whose
    /// holder died or whose downstream kept failing, waiting for the PSP's
    /// next retry. A number that stays above zero needs a human.
    pub async fn stuck_processing(&self, older_than: Duration) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT count(*) FROM payments WHERE status = 'processing' \
                 AND updated_at < now() - $1 * interval '1 millisecond'",
            )
            .await?;
        let ms = older_than.as_millis() as f64;
        Ok(client.query_one(&stmt, &[&ms]).await?.get(0))
    }

    /// What a pooled connection finds on its node, for `/readyz` and the
    /// health sampler. A connection to a node that cannot take writes is
    /// dropped, not returned, and so are the idle ones (those in use are
    /// dropped at their next checkout, see [`db::Retire`]): the pool then opens
    /// new connections, which a multi-host `DATABASE_URL` with
    /// `target_session_attrs=read-write` sends to the node that is primary now.
    /// While commits wait past their bound it answers that, without a
    /// round trip: the node takes no write now, whatever it says.
    pub async fn node_state(&self) -> Result<NodeState, StoreError> {
        self.commits.admit()?;
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on', \
                        current_setting('synchronous_standby_names'), \
                        current_setting('synchronous_commit')",
                &[],
            )
            .await?;
        let schema_version = match client
            .query_one(
                "SELECT coalesce(max(version), 0) FROM refinery_schema_history",
                &[],
            )
            .await
        {
            Ok(r) => r.get(0),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => 0,
            Err(e) => return Err(e.into()),
        };
        let state = NodeState {
            in_recovery: row.get(0),
            read_only: row.get(1),
            synchronous_standby_names: row.get(2),
            synchronous_commit: row.get(3),
            schema_version,
        };
        if !state.writable() {
            self.retire.all_open_now();
            drop(deadpool_postgres::Object::take(client));
            self.pool.retain(|_, _| false);
        }
        Ok(state)
    }

    pub async fn lookup(
        &self,
        provider: &str,
        transaction_id: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(SELECT_PAYMENT).await?;
        let row = client
            .query_opt(&stmt, &[&provider, &transaction_id])
            .await?;
        row.map(|r| to_payment(&r)).transpose()
    }

    /// Records a batch item that cannot be booked, with its reason; returns
    /// how often an item of this `key` has been seen (the first one is kept).
    /// A write like a booking: its commit is bounded, and it is refused while
    /// a commit waits past its bound.
    pub async fn quarantine(
        &self,
        provider: &str,
        transaction_id: Option<&str>,
        reason: &str,
        item: &str,
        key: &str,
    ) -> Result<i64, StoreError> {
        let client = self.writer().await?;
        let stmt = client.prepare_cached(QUARANTINE).await?;
        let row = client
            .watch()
            .statement(client.query_one(&stmt, &[&provider, &transaction_id, &reason, &item, &key]))
            .await?;
        Ok(row.get(0))
    }

    /// A pooled connection for the fenced writes of one attempt. Waiting
    /// for it may take up to the pool wait: the caller checks its lease
    /// *after* this returns and before it writes.
    /// Refused at once while a commit waits past its bound (see the `store::commit` module).
    pub async fn connection(&self) -> Result<Connection, StoreError> {
        Ok(Connection(self.writer().await?))
    }

    /// A pooled connection for a write whose commits are bounded. Every
    /// statement that writes goes through one (a booking, an accept, a
    /// quarantine row, a PayPal binding, each of the inbox's lock renewals,
    /// settles, rescues, replays and prunes, its NOTIFY, which takes a
    /// transaction id too), and awaits its commit with [`commit::Watch`]: a
    /// write on a plain pooled connection would wait for a missing
    /// synchronous standby without bound and hold its connection meanwhile.
    async fn writer(&self) -> Result<commit::Pooled, StoreError> {
        self.commits.admit()?;
        Ok(self.commits.pooled(self.pool.get().await?))
    }
}

/// A connection taken from the pool for the fenced writes of one attempt.
pub struct Connection(commit::Pooled);

impl Connection {
    /// Claim, transition and entry in one transaction (the inline path): one
    /// statement, or — when the entry moves a payment's money out or back —
    /// the payment's cap update after it, in the same transaction.
    pub async fn apply(
        &mut self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        token: i64,
        t: Transition,
    ) -> Result<Applied, StoreError> {
        let w = Write::new(ev, fingerprint, token, t);
        Ok(match self.inline(&w, APPLY, |row| row.is_some()).await? {
            Err(refusal) => Applied::Parent(refusal),
            Ok((Some(_), over_returned)) => Applied::Committed {
                status: t.to,
                over_returned,
            },
            Ok((None, _)) => Applied::NotWritten(reread(&*self.0, ev).await?),
        })
    }

    /// [`Connection::apply`] for the PostgreSQL lease backend: the lease is
    /// taken, used and given back inside the write's own transaction
    /// (`APPLY_LEASED`), so a new payment costs one statement instead of
    /// three (acquire, write, release). `fence_floor` is the payment's fence
    /// as last read (0 when there was no row): the token taken is above it.
    /// When it writes nothing (and moves no money), what it commits is the
    /// counter raised and the lease given back.
    pub async fn apply_leased(
        &mut self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        fence_floor: i64,
        t: Transition,
    ) -> Result<LeasedApply, StoreError> {
        let w = Write::new(ev, fingerprint, fence_floor, t);
        // The statement always answers one row; column 1 is the payment id.
        let wrote = |row: &Option<tokio_postgres::Row>| {
            row.as_ref()
                .is_some_and(|r| matches!(r.try_get::<_, Option<i64>>(1), Ok(Some(_))))
        };
        let (row, over_returned) = match self.inline(&w, APPLY_LEASED, wrote).await? {
            Err(refusal) => return Ok(LeasedApply::Parent(refusal)),
            Ok((row, over)) => (
                row.ok_or_else(|| {
                    StoreError::Corrupt("the leased write answered no row".to_owned())
                })?,
                over,
            ),
        };
        Ok(match leased(&row, t, over_returned)? {
            Leased::NotWritten(token) => LeasedApply::NotWritten {
                token,
                row: reread(&*self.0, ev).await?,
            },
            Leased::Answer(answer) => answer,
        })
    }

    /// Runs one inline write (`sql` with [`Write::apply_params`]): alone, or,
    /// when the write moves its payment's money, in one transaction with the
    /// cap update after it, committed only if `wrote` says the statement
    /// wrote and the money moved (the money moves only with the entry that
    /// takes it). The object's own row comes first: a copy of an event
    /// already applied writes nothing and is answered from the row, without
    /// asking the payment (whose cap the first copy has used). Also answers
    /// whether a dispute took its payment past its amount.
    async fn inline(
        &mut self,
        w: &Write<'_>,
        sql: &str,
        wrote: impl Fn(&Option<tokio_postgres::Row>) -> bool,
    ) -> Result<Result<(Option<tokio_postgres::Row>, bool), ParentRefusal>, StoreError> {
        let watch = self.0.watch();
        let Some(amount) = w.parent_move() else {
            let stmt = self.0.prepare_cached(sql).await?;
            let row = watch
                .statement(self.0.query_opt(&stmt, &w.apply_params()))
                .await?;
            return Ok(Ok((row, false)));
        };
        let tx = self.0.transaction().await?;
        let stmt = tx.prepare_cached(sql).await?;
        let row = tx.query_opt(&stmt, &w.apply_params()).await?;
        if !wrote(&row) {
            tx.rollback().await?;
            return Ok(Ok((row, false)));
        }
        match move_parent_money(&tx, w.ev, amount, w.uncapped()).await? {
            Ok(over_returned) => {
                failpoint_before_money_commit();
                watch.commit(tx.commit()).await?;
                Ok(Ok((row, over_returned)))
            }
            Err(refusal) => {
                tx.rollback().await?;
                Ok(Err(refusal))
            }
        }
    }

    /// Fenced claim (the downstream path: the claim must be durable before
    /// the downstream call). A new row is `processing`; an existing one keeps
    /// its status until the finalize. A refund or dispute takes its money
    /// from its payment in the claim's transaction (the row is `reserved`),
    /// so the downstream is called only for money the payment gave, and the
    /// finalize of a step the downstream executed cannot be refused. A row
    /// that is `reserved` already (a claim taken over) keeps its reservation.
    pub async fn claim(
        &mut self,
        ev: &CanonicalEvent,
        fingerprint: &str,
        token: i64,
        t: Transition,
    ) -> Result<Claimed, StoreError> {
        let w = Write::new(ev, fingerprint, token, t);
        let claimed = |row: &tokio_postgres::Row, reserved| Claimed::Claimed {
            payment_id: row.get(0),
            event: CanonicalEvent {
                provider: ev.provider.clone(),
                transaction_id: ev.transaction_id.clone(),
                event_type: ev.event_type,
                amount_minor: row.get(1),
                currency: row.get(2),
                parent_transaction_id: ev.parent_transaction_id.clone(),
                occurred_at: row.get(3),
                merchant_reference: ev.merchant_reference.clone(),
                metadata: ev.metadata.clone(),
            },
            reserved,
        };
        let watch = self.0.watch();
        let Some(amount) = w.parent_move().filter(|&amount| amount > 0) else {
            let stmt = self.0.prepare_cached(CLAIM).await?;
            let row = watch
                .statement(self.0.query_opt(&stmt, &w.claim_params()))
                .await?;
            return Ok(match row {
                Some(row) => claimed(&row, Reserved::default()),
                None => Claimed::NotWritten(reread(&*self.0, ev).await?),
            });
        };
        let tx = self.0.transaction().await?;
        let stmt = tx.prepare_cached(CLAIM).await?;
        let Some(row) = tx.query_opt(&stmt, &w.claim_params()).await? else {
            tx.rollback().await?;
            return Ok(Claimed::NotWritten(reread(&*self.0, ev).await?));
        };
        let mut reserved = Reserved::default();
        if !row.get::<_, bool>(4) {
            match move_parent_money(&tx, ev, amount, w.uncapped()).await? {
                Ok(over) => {
                    reserved = Reserved {
                        here: true,
                        over_returned: over,
                    }
                }
                Err(refusal) => {
                    tx.rollback().await?;
                    return Ok(Claimed::Parent(refusal));
                }
            }
            let stmt = tx.prepare_cached(RESERVE).await?;
            tx.execute(&stmt, &[&row.get::<_, i64>(0)]).await?;
        }
        watch.commit(tx.commit()).await?;
        Ok(claimed(&row, reserved))
    }

    /// Gives back the money the claim of `payment_id` at `token` reserved
    /// itself ([`Reserved::here`]), when the downstream refused the step (it
    /// did not execute it): another
    /// refund may have it, and the next delivery of this one takes it again.
    /// True when given back; false when there was nothing to give back, the
    /// row is no longer ours, or the payment row was busy (the reservation
    /// then stays, and the next claim keeps it).
    pub async fn release(
        &mut self,
        payment_id: i64,
        ev: &CanonicalEvent,
        token: i64,
        t: Transition,
    ) -> Result<bool, StoreError> {
        let Some(amount) = Write::new(ev, "", token, t)
            .parent_move()
            .filter(|&amount| amount > 0)
        else {
            return Ok(false);
        };
        let watch = self.0.watch();
        let tx = self.0.transaction().await?;
        let stmt = tx.prepare_cached(RELEASE).await?;
        if tx.query_opt(&stmt, &[&payment_id, &token]).await?.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
        if move_parent_money(&tx, ev, -amount, false).await?.is_err() {
            tx.rollback().await?;
            return Ok(false);
        }
        watch.commit(tx.commit()).await?;
        Ok(true)
    }

    /// Fenced finalize: the transition and its entry in one statement; a
    /// give-back (a reversal) moves its money back into the payment in the
    /// same transaction. Money taken out was reserved by the claim.
    pub async fn finalize(
        &mut self,
        payment_id: i64,
        ev: &CanonicalEvent,
        token: i64,
        t: Transition,
    ) -> Result<Finalized, StoreError> {
        let from = t.from_statuses();
        let effect = t.effect.map(|e| e.as_str());
        let sign = t.effect.map_or(0, |e| e.sign());
        let params: [&(dyn ToSql + Sync); 7] = [
            &payment_id,
            &token,
            &t.to.as_str(),
            &ev.event_type.as_str(),
            &from,
            &effect,
            &sign,
        ];
        let give_back = Write::new(ev, "", token, t)
            .parent_move()
            .filter(|&amount| amount < 0);
        // A first settlement that books nothing (a refund that failed before
        // it succeeded) may find money an earlier claim of the row reserved
        // for a success (its call timed out): it goes back.
        let unreserve =
            t.from.is_none() && t.effect.is_none() && ev.parent_transaction_id.is_some();
        let watch = self.0.watch();
        let tx = self.0.transaction().await?;
        if unreserve {
            let stmt = tx.prepare_cached(RELEASE).await?;
            if tx.query_opt(&stmt, &[&payment_id, &token]).await?.is_some() {
                if let Err(refusal) = move_parent_money(&tx, ev, -ev.amount_minor, false).await? {
                    tx.rollback().await?;
                    return Ok(Finalized::Parent(refusal));
                }
            }
        }
        let stmt = tx.prepare_cached(FINALIZE).await?;
        if tx.query_opt(&stmt, &params).await?.is_none() {
            tx.rollback().await?;
            return Ok(Finalized::FenceRejected);
        }
        if let Some(amount) = give_back {
            if let Err(refusal) = move_parent_money(&tx, ev, amount, false).await? {
                tx.rollback().await?;
                return Ok(Finalized::Parent(refusal));
            }
        }
        watch.commit(tx.commit()).await?;
        Ok(Finalized::Applied(t.to))
    }
}

/// Failpoint for process-level fault tests (compiled in only with the
/// `test-support` feature): `FAILPOINTS=before_money_commit=1*return(sigstop)`
/// makes the process SIGSTOP itself once an inline write moved its payment's
/// money, before its COMMIT: a frozen process whose transaction holds the
/// payment row, its connection still up.
fn failpoint_before_money_commit() {
    fail::fail_point!("before_money_commit", |arg: Option<String>| {
        if arg.as_deref() == Some("sigstop") {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
            // The stop reaches every thread asynchronously: make sure this
            // one is frozen before it can send the COMMIT.
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    });
}

/// The parameters of one fenced write.
struct Write<'a> {
    ev: &'a CanonicalEvent,
    kind: &'static str,
    event_type: &'static str,
    fingerprint: &'a str,
    token: i64,
    from: Vec<&'static str>,
    to: &'static str,
    /// What an existing row is set to (the inline path); the claim sets `None`.
    set_status: Option<&'static str>,
    set_event_type: Option<&'static str>,
    effect: Option<&'static str>,
    sign: i64,
    t: Transition,
}

impl<'a> Write<'a> {
    fn new(ev: &'a CanonicalEvent, fingerprint: &'a str, token: i64, t: Transition) -> Write<'a> {
        Write {
            ev,
            kind: ev.event_type.object().as_str(),
            event_type: ev.event_type.as_str(),
            fingerprint,
            token,
            from: t.from_statuses(),
            to: t.to.as_str(),
            set_status: Some(t.to.as_str()),
            set_event_type: Some(ev.event_type.as_str()),
            effect: t.effect.map(|e| e.as_str()),
            sign: t.effect.map_or(0, |e| e.sign()),
            t,
        }
    }

    /// The money this write moves out of its parent payment (negative: back
    /// in), when it moves any. Refunds booked before refunds named their
    /// payment have no parent: their reversal moves nothing.
    fn parent_move(&self) -> Option<i64> {
        let delta = self.t.effect?.parent_delta();
        (delta != 0 && self.ev.parent_transaction_id.is_some())
            .then_some(delta * self.ev.amount_minor)
    }

    /// Whether the money may go past the payment's amount: a dispute's may
    /// (money already gone), a refund's only beside disputes (refunds alone
    /// stay within it).
    fn uncapped(&self) -> bool {
        self.t.effect == Some(Effect::Dispute)
    }

    /// [`APPLY`]: a new row is written in its final status at once.
    fn apply_params(&'a self) -> [&'a (dyn ToSql + Sync); 16] {
        [
            &self.ev.provider,
            &self.ev.transaction_id,
            &self.kind,
            &self.ev.parent_transaction_id,
            &self.event_type,
            &self.ev.amount_minor,
            &self.ev.currency,
            &self.fingerprint,
            &self.to,
            &self.token,
            &self.ev.occurred_at,
            &self.from,
            &self.set_status,
            &self.set_event_type,
            &self.effect,
            &self.sign,
        ]
    }

    /// [`CLAIM`]: a new row is `processing`; an existing row keeps its status.
    fn claim_params(&'a self) -> [&'a (dyn ToSql + Sync); 14] {
        [
            &self.ev.provider,
            &self.ev.transaction_id,
            &self.kind,
            &self.ev.parent_transaction_id,
            &self.event_type,
            &self.ev.amount_minor,
            &self.ev.currency,
            &self.fingerprint,
            &PROCESSING,
            &self.token,
            &self.ev.occurred_at,
            &self.from,
            &NONE,
            &NONE,
        ]
    }
}

const PROCESSING: &str = "processing";
const NONE: Option<&str> = None;

/// What one [`APPLY_LEASED`] answered, before a not-written row is re-read.
enum Leased {
    Answer(LeasedApply),
    NotWritten(i64),
}

fn leased(
    row: &tokio_postgres::Row,
    t: Transition,
    over_returned: bool,
) -> Result<Leased, StoreError> {
    let token: Option<i64> = row.try_get(0)?;
    let id: Option<i64> = row.try_get(1)?;
    Ok(match (token, id) {
        (None, _) => {
            let ms: Option<i64> = row.try_get(2)?;
            Leased::Answer(LeasedApply::Held {
                remaining: ms.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            })
        }
        (Some(token), None) => Leased::NotWritten(token),
        (Some(token), Some(_)) => Leased::Answer(LeasedApply::Committed {
            token,
            status: t.to,
            over_returned,
        }),
    })
}

/// Takes `amount` out of (or, negative, back into) the event's parent
/// payment, refunds alone within its amount unless `uncapped`; `Ok(over_returned)` when
/// done, else why not. A payment row another transaction holds is
/// [`ParentRefusal::Busy`] at once (the transaction is then aborted: the
/// caller rolls it back).
async fn move_parent_money<C: GenericClient>(
    client: &C,
    ev: &CanonicalEvent,
    amount: i64,
    uncapped: bool,
) -> Result<Result<bool, ParentRefusal>, StoreError> {
    let parent = ev
        .parent_transaction_id
        .as_deref()
        .expect("only events with a parent move its money");
    let lock = client.prepare_cached(LOCK_PARENT).await?;
    let stmt = client.prepare_cached(MOVE_PARENT_MONEY).await?;
    // The lock sees the payment as of its start; a payment committed just
    // after (the refund raced its own payment) is seen by the re-read, and
    // the lock and the update are tried again.
    for _ in 0..3 {
        let locked = match client.query_opt(&lock, &[&ev.provider, &parent]).await {
            Ok(locked) => locked.is_some(),
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                return Ok(Err(ParentRefusal::Busy))
            }
            Err(e) => return Err(e.into()),
        };
        if locked {
            let moved = client
                .query_opt(
                    &stmt,
                    &[&ev.provider, &parent, &ev.currency, &amount, &uncapped],
                )
                .await?;
            if let Some(row) = moved {
                return Ok(Ok(row.try_get(0)?));
            }
        }
        if let Some(refusal) = parent_refusal(client, ev, amount, uncapped).await? {
            return Ok(Err(refusal));
        }
    }
    // The payment keeps changing under us: let the PSP come back.
    Ok(Err(ParentRefusal::NotYet))
}

/// Why the event's parent payment cannot give `amount` (negative: take it
/// back), or `None` when it can, as the payment stands now.
async fn parent_refusal<C: GenericClient>(
    client: &C,
    ev: &CanonicalEvent,
    amount: i64,
    uncapped: bool,
) -> Result<Option<ParentRefusal>, StoreError> {
    let parent = ev.parent_transaction_id.as_deref().unwrap_or_default();
    let stmt = client.prepare_cached(SELECT_PARENT).await?;
    let Some(row) = client.query_opt(&stmt, &[&ev.provider, &parent]).await? else {
        return Ok(Some(ParentRefusal::NotYet));
    };
    let kind: &str = row.get(0);
    let status: &str = row.get(1);
    let currency: &str = row.get(2);
    let (total, out, disputed): (i64, i64, i64) = (row.get(3), row.get(4), row.get(5));
    Ok(if kind != ObjectKind::Payment.as_str() {
        Some(ParentRefusal::Rejected(Rejection::NotAPayment))
    } else if status == Status::Failed.as_str() {
        Some(ParentRefusal::Rejected(Rejection::PaymentFailed))
    } else if status != Status::Succeeded.as_str() {
        Some(ParentRefusal::NotYet)
    } else if currency != ev.currency {
        Some(ParentRefusal::Rejected(Rejection::CurrencyMismatch))
    } else if amount > 0 && !uncapped && out - disputed + amount > total {
        // The refunds alone would exceed it.
        Some(ParentRefusal::Rejected(Rejection::ExceedsPayment))
    } else if out + amount < 0 {
        // The object's own row was written first in this transaction, so
        // this is not a copy of a reversal already applied.
        return Err(StoreError::Corrupt(format!(
            "payment {parent}: giving back {} would leave less than nothing out",
            -amount
        )));
    } else {
        None
    })
}

/// The conflict branch: the row as it is now, for the processor to decide again.
async fn reread<C: GenericClient>(
    client: &C,
    ev: &CanonicalEvent,
) -> Result<PaymentRow, StoreError> {
    let stmt = client.prepare_cached(SELECT_PAYMENT).await?;
    let row = client
        .query_opt(&stmt, &[&ev.provider, &ev.transaction_id])
        .await?
        .ok_or_else(|| {
            StoreError::Corrupt("a fenced write conflicted but no row exists".to_owned())
        })?;
    to_payment(&row)
}

fn to_payment(row: &tokio_postgres::Row) -> Result<PaymentRow, StoreError> {
    payment_at(row, 0)?.ok_or_else(|| StoreError::Corrupt("a payments row without id".to_owned()))
}

/// The payments row in the five columns from `at` (id, kind, status,
/// fingerprint, fence, as [`SELECT_PAYMENT`] returns them); `None` when its
/// id is NULL (an outer join found none).
pub(crate) fn payment_at(
    row: &tokio_postgres::Row,
    at: usize,
) -> Result<Option<PaymentRow>, StoreError> {
    let Some(id) = row.try_get::<_, Option<i64>>(at)? else {
        return Ok(None);
    };
    let kind: &str = row.try_get(at + 1)?;
    let status: &str = row.try_get(at + 2)?;
    Ok(Some(PaymentRow {
        id,
        kind: ObjectKind::parse(kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown payment kind `{kind}`")))?,
        status: Status::parse(status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown payment status `{status}`")))?,
        fingerprint: row.try_get(at + 3)?,
        fence: row.try_get(at + 4)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `make bench` measures the PostgreSQL ceiling with pgbench running the
    /// same per-delivery SQL as the service: `scripts/bench-delivery.sql` is
    /// this module's fast-path lookup and one-statement claim with pgbench
    /// variables for the parameters. It must not drift from the code.
    #[test]
    fn the_pgbench_script_runs_the_stores_own_sql() {
        let params: [(&str, &str); 16] = [
            ("$16", "1"),
            ("$15", "'credit'"),
            ("$14", "'payment.succeeded'"),
            ("$13", "'succeeded'"),
            ("$12", "'{processing}'"),
            ("$11", "NULL"),
            ("$10", "1"),
            ("$9", "'succeeded'"),
            ("$8", "md5('pg-' || :tx)"),
            ("$7", "'EUR'"),
            ("$6", ":amount"),
            ("$5", "'payment.succeeded'"),
            ("$4", "NULL"),
            ("$3", "'payment'"),
            ("$2", "'pg-' || :tx"),
            ("$1", "'pgbench'"),
        ];
        let render = |sql: &str| {
            params
                .iter()
                .fold(sql.to_owned(), |sql, (p, v)| sql.replace(p, v))
        };
        let expected = format!(
            "\\set tx random(1, 1000000000000)\n\\set amount random(1, 100000)\n{};\n{};\n",
            render(SELECT_PAYMENT),
            render(APPLY)
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench-delivery.sql");
        if std::env::var_os("BLESS").is_some() {
            std::fs::write(path, &expected).unwrap();
        }
        let script = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            script, expected,
            "scripts/bench-delivery.sql is out of step with the store's SQL (BLESS=1 rewrites it)"
        );
    }
}
