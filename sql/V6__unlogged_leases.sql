-- The PostgreSQL lease backend's table needs no durability: every write to it
-- was a durable commit (a WAL flush) twice per delivery, for rows whose loss
-- is already safe. A lease is a liveness hint; what stops a stale holder is
-- the fence on `payments`, and a counter that starts again below the stored
-- fence is raised past it by the resync (the same path that covers a pruned
-- row or an expired Redis key). After a crash PostgreSQL empties an unlogged
-- table; standbys do not have its rows, so after a failover it starts empty
-- too. Both are the "counter lost" case, exercised by the tests.
ALTER TABLE leases SET UNLOGGED;
