//! `fencehook load` against three real instances, and the answers check of
//! `fencehook audit` that goes with it.

use std::time::Duration;

use clap::Parser;
use fencehook::load::{self, LoadArgs, Plan, StopReason};
use fencehook::store::audit;

use crate::helpers::{TestContext, SECRET};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_load_run_with_racing_copies_gets_one_processed_per_transaction_and_every_200_is_backed_by_a_row(
) {
    let ctx = TestContext::new().await;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(ctx.spawn(ctx.config()).await);
    }
    let dir = std::env::temp_dir().join(format!("fencehook-load-{}", ctx.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let answers = dir.join("answers.jsonl");
    let mut argv = vec![
        "load".to_owned(),
        "--secret".to_owned(),
        SECRET.to_owned(),
        "--transactions".to_owned(),
        "150".to_owned(),
        "--duplicates".to_owned(),
        "3".to_owned(),
        "--concurrency".to_owned(),
        "24".to_owned(),
        "--failed-share".to_owned(),
        "0.2".to_owned(),
        "--answers".to_owned(),
        answers.display().to_string(),
    ];
    for app in &apps {
        argv.push("--target".to_owned());
        argv.push(app.base.clone());
    }
    let plan = Plan::from_args(&Cli::try_parse_from(argv).unwrap().load).unwrap();

    // Spawned: a run is Send, so it can live on any worker.
    let run = tokio::spawn(load::run(plan, std::future::pending(), false));
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("a bounded run ends")
        .expect("the run does not panic")
        .expect("the run starts");

    assert_eq!(report.stopped_by, StopReason::Transactions);
    assert_eq!(report.transactions, 150);
    assert_eq!(report.deliveries, 450);
    assert_eq!(report.payments, 150, "{}", report.render());
    assert_eq!(report.processed_twice, 0);
    assert!(report.problems().is_empty(), "{:?}", report.problems());
    let processed: u64 = report
        .answers
        .iter()
        .filter(|a| a.status == Some(200) && a.result == "processed")
        .map(|a| a.count)
        .sum();
    assert_eq!(processed, 150, "exactly one copy of each is `processed`");
    assert!(
        report.requests_per_target.iter().all(|t| t.requests >= 150),
        "every instance got its share: {:?}",
        report.requests_per_target
    );
    assert_eq!(ctx.payments().await, 150);

    let read = audit::read_answers(&answers).unwrap();
    assert_eq!(read.lines, 450);
    assert_eq!(read.durable.len(), 150);
    let check = audit::check_answers(&ctx.database_url, &read)
        .await
        .unwrap();
    assert_eq!(check.total, 0, "{:?}", check.violations);
    ctx.assert_audit_clean().await;

    // The check does catch a 200 without a terminal row: one that never
    // reached the database, and one left `processing`.
    ctx.db()
        .await
        .batch_execute(
            "UPDATE payments SET status = 'processing'
              WHERE id = (SELECT id FROM payments WHERE status = 'failed' LIMIT 1)",
        )
        .await
        .unwrap();
    let mut forged = read.clone();
    forged
        .durable
        .push(("generic".to_owned(), "never-delivered".to_owned()));
    let check = audit::check_answers(&ctx.database_url, &forged)
        .await
        .unwrap();
    assert_eq!(check.total, 2, "{:?}", check.violations);
    assert!(check.violations.iter().any(|v| v.contains("no row")));
    assert!(check.violations.iter().any(|v| v.contains("is processing")));
    std::fs::remove_dir_all(&dir).unwrap();
}
