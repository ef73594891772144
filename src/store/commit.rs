//! How long a delivery waits for its commit, without ever cancelling one.
//!
//! With synchronous replication PostgreSQL answers a commit only once a
//! standby has it; after a promotion, until a standby streams from the new
//! primary, that can take seconds, or forever. `statement_timeout` does not
//! end that wait: PostgreSQL disarms it before it commits. And nothing may
//! end it: a commit whose wait is cancelled (a query cancel, the session
//! terminated, the client's socket found closed) is already committed
//! locally and becomes visible unreplicated — an acknowledged-looking
//! payment a failover can lose, exactly what the wait was for.
//!
//! So the wait is bounded on our side only, and the commit is left alone:
//!
//! - a commit (an explicit `COMMIT`, or a statement that commits by itself)
//!   that has not answered within the bound is answered to its delivery as
//!   [`StoreError::CommitWaiting`] (503); its connection leaves the pool
//!   ([`Pooled`]'s drop) and is kept by a task of its own until the commit
//!   answers, then closed. Nothing is sent to PostgreSQL that could cancel
//!   it, and the pool has its slot back at once;
//! - while any commit waits past its bound, new writes are refused at once
//!   ([`Commits::admit`], [`StoreError::CommitsWaiting`]) instead of each
//!   taking a connection, waiting the bound and leaving one more backend
//!   waiting. A commit that completes is the sign that commits complete
//!   again: the refusal ends when the last waiting one answers (or its
//!   connection breaks). So at most the writes in flight when the first
//!   commit passed its bound wait at once, and reads (duplicates are answered
//!   from the row), `/readyz` and the health probes keep their connections.
//!
//! The bound is the statement timeout: a statement that commits by itself
//! gets it twice (once for the statement, which the server cancels past it,
//! once for its commit), a `COMMIT` once. A retry of the delivery finds the
//! waiting commit's row once it completes (`duplicate`), or books it then:
//! the commit is either there once or not at all, never twice. A commit slow
//! for another reason (a stalled disk or network) is treated alike, which
//! suits it too: the node cannot take writes now, and the first write that
//! completes says it can again.
//!
//! Why not the simpler ways: cancelling at the bound (a client-side
//! timeout that sends a cancel, or `statement_timeout` if it applied) makes
//! the commit visible unreplicated; awaiting the commit on the delivery's own
//! task holds a pooled connection per waiting delivery, and a few of them
//! take the whole pool (then `/readyz` and every read time out too); taking
//! waiting connections out of the pool but letting new writes go on would
//! leave one more backend waiting per PSP retry, until the server's
//! `max_connections` is reached.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Object;
use futures_util::FutureExt;

use super::StoreError;

/// The bound and the count of commits waiting past it, shared by every
/// connection of one store.
#[derive(Clone)]
pub(crate) struct Commits(Arc<Shared>);

struct Shared {
    bound: Duration,
    waiting: AtomicUsize,
}

impl Commits {
    pub(crate) fn new(bound: Duration) -> Commits {
        Commits(Arc::new(Shared {
            bound,
            waiting: AtomicUsize::new(0),
        }))
    }

    /// How many commits wait past their bound now.
    pub(crate) fn waiting(&self) -> usize {
        self.0.waiting.load(Ordering::Acquire)
    }

    /// Refuses a new write while a commit waits past its bound.
    pub(crate) fn admit(&self) -> Result<(), StoreError> {
        match self.waiting() {
            0 => Ok(()),
            waiting => Err(StoreError::CommitsWaiting { waiting }),
        }
    }

    /// `obj`, watched: see [`Pooled`].
    pub(crate) fn pooled(&self, obj: Object) -> Pooled {
        Pooled {
            obj: Some(obj),
            watch: Watch {
                commits: self.clone(),
                waited: Arc::new(AtomicBool::new(false)),
            },
        }
    }
}

/// A pooled connection for writes. When one of its commits passed the bound,
/// dropping it takes it out of the pool and keeps it open, on a task of its
/// own, until that commit answered; otherwise it goes back to the pool.
pub struct Pooled {
    obj: Option<Object>,
    watch: Watch,
}

impl Pooled {
    /// What bounds this connection's commits; a handle of its own, so a
    /// transaction borrowing the connection can be committed through it.
    pub(crate) fn watch(&self) -> Watch {
        self.watch.clone()
    }
}

impl Deref for Pooled {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.obj.as_ref().expect("present until dropped")
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Object {
        self.obj.as_mut().expect("present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(obj) = self.obj.take() else { return };
        if !self.watch.waited.load(Ordering::Acquire) {
            return; // back to the pool
        }
        let commits = self.watch.commits.clone();
        // Out of the pool: no delivery may queue behind the waiting commit,
        // and the pool may open another connection in its place.
        let client = Object::take(obj);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            commits.0.waiting.fetch_sub(1, Ordering::AcqRel);
            return;
        };
        runtime.spawn(async move {
            let started = Instant::now();
            // Sent behind the waiting commit on the same connection, so it is
            // answered once the commit is: no cancel, no close before then.
            let after = client.simple_query("").await;
            drop(client);
            let left = commits.0.waiting.fetch_sub(1, Ordering::AcqRel) - 1;
            tracing::info!(
                waited_more_ms = started.elapsed().as_millis() as u64,
                connection_ok = after.is_ok(),
                commits_still_waiting = left,
                "a commit that waited past its bound has answered; {}",
                if left == 0 {
                    "writes are taken again"
                } else {
                    "writes stay refused until the others answer"
                }
            );
        });
    }
}

/// Bounds the commits of one pooled connection.
#[derive(Clone)]
pub(crate) struct Watch {
    commits: Commits,
    /// Set when a commit on this connection passed its bound.
    waited: Arc<AtomicBool>,
}

impl Watch {
    // These build the bounded future from combinators, not as `async fn`s:
    // an `async fn` that awaits a future it was given keeps that future
    // twice in its state (the argument, and the awaited copy), and these
    // wrap every statement of a delivery, so a few KB were added to each
    // future around them and copied whole at every await.

    /// Awaits an explicit `COMMIT` for at most the bound.
    pub(crate) fn commit<'a, T: 'a>(
        &'a self,
        commit: impl Future<Output = Result<T, tokio_postgres::Error>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        self.within(self.commits.0.bound, commit)
    }

    /// Awaits a statement that commits by itself (outside a transaction) for
    /// at most twice the bound: the server cancels the statement past its
    /// timeout, never its commit.
    pub(crate) fn statement<'a, T: 'a>(
        &'a self,
        statement: impl Future<Output = Result<T, tokio_postgres::Error>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        self.within(self.commits.0.bound * 2, statement)
    }

    fn within<'a, T: 'a>(
        &'a self,
        bound: Duration,
        commit: impl Future<Output = Result<T, tokio_postgres::Error>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        tokio::time::timeout(bound, commit).map(move |answered| match answered {
            Ok(answered) => Ok(answered?),
            Err(_) => Err(self.passed(bound)),
        })
    }

    /// A commit has not answered within `bound`: the future is dropped, the
    /// commit is not (it was sent, and the connection's task reads its
    /// answer whenever it comes).
    fn passed(&self, bound: Duration) -> StoreError {
        if !self.waited.swap(true, Ordering::AcqRel) {
            let before = self.commits.0.waiting.fetch_add(1, Ordering::AcqRel);
            if before == 0 {
                tracing::warn!(
                    bound_ms = bound.as_millis() as u64,
                    "a commit has not answered within its bound (PostgreSQL waits for a \
                     synchronous standby, or cannot write): its delivery is answered 503 and \
                     new writes are refused until it answers; it is not cancelled"
                );
            }
        }
        StoreError::CommitWaiting { bound }
    }
}
