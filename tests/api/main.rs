//! One integration binary: real PostgreSQL, real Redis, a database and a key
//! prefix per test. Test names are sentences.

mod helpers;

mod audit;
mod chaos;
mod cluster;
mod console;
mod console_browser;
mod console_edges;
mod container;
mod deploy;
mod docs;
mod downstream_trust;
mod edge;
mod exactly_once;
mod faults;
mod finance;
mod hardening;
mod inbox;
mod inbox_liveness;
mod inline_lease;
mod input;
mod kubernetes;
mod lease;
mod lifecycle;
mod load;
mod merchant_reference;
mod money;
mod operations;
mod patroni;
mod pg_tls;
mod process;
mod providers;
mod psp_checkout;
mod psp_paddle;
mod psp_razorpay;
mod psp_square;
mod redis_ha;
mod rsa_providers;
mod schema;
mod shutdown;
mod startup;
mod sync_commit;
mod tools;
mod topology;
mod traces;
