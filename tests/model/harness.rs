//! Running a model: the exhaustive search, the shortest counterexample of a
//! broken variant, and their printing. Shared by every model of this crate.

use std::collections::BTreeSet;
use std::fmt::{Display, Write as _};
use std::hash::Hash;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

/// Deepest bound [`shortest_counterexample`] tries; no correct model here is
/// more than 48 steps deep.
const MAX_DEPTH: usize = 64;

/// Explores the whole state space with a single-threaded BFS (the machine's
/// other core is left to the other tests) and prints its size and time.
pub fn check<M: Model + Send + Sync + 'static>(label: &str, model: M) -> impl Checker<M>
where
    M::State: Hash + Send + Sync + Clone + PartialEq + Display + 'static,
    M::Action: Clone + PartialEq + Display,
{
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "model: {label}: {} states ({} generated), depth {}, {:.2} s, exhaustive",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64(),
    );
    assert!(checker.is_done(), "the search did not finish");
    checker
}

/// A shortest counterexample for `name`, printed. Stateright records the
/// *last* violating state it meets (in blocks of 1,500 states), not the
/// first, so this bounds the BFS at depth 1, 2, … and stops at the first
/// bound with a discovery: every violation seen then is a first one.
pub fn shortest_counterexample<M: Model + Send + Sync + 'static>(
    label: &str,
    model: impl Fn() -> M,
    name: &'static str,
) -> M::State
where
    M::State: Hash + Send + Sync + Clone + PartialEq + Display + 'static,
    M::Action: Clone + PartialEq + Display,
{
    let started = Instant::now();
    for depth in 1..=MAX_DEPTH {
        let checker = model()
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])))
            .spawn_bfs()
            .join();
        if let Some(path) = checker.discovery(name) {
            println!(
                "model: {label}: caught, {} states in the last bounded search, {:.2} s\n{}",
                checker.unique_state_count(),
                started.elapsed().as_secs_f64(),
                render(name, &path),
            );
            return path.last_state().clone();
        }
        assert!(
            checker.is_done(),
            "the search at depth {depth} did not finish"
        );
    }
    panic!("{label}: no counterexample for \"{name}\" within {MAX_DEPTH} steps");
}

/// Asserts that none of `invariants` has a counterexample and that each of
/// `reachable` has an example.
pub fn assert_safe<M: Model + Send + Sync + 'static>(
    checker: &impl Checker<M>,
    invariants: &[&'static str],
    reachable: &[&'static str],
) where
    M::State: Hash + Send + Sync + Clone + PartialEq + Display + 'static,
    M::Action: Clone + PartialEq + Display,
{
    for &name in invariants {
        if let Some(path) = checker.discovery(name) {
            panic!("counterexample\n{}", render(name, &path));
        }
    }
    for &name in reachable {
        assert!(
            checker.discovery(name).is_some(),
            "\"{name}\" was never reached: the check would be vacuous"
        );
    }
}

/// Which of `invariants` an exhaustive run found counterexamples for.
pub fn violated<M: Model + Send + Sync + 'static>(
    checker: &impl Checker<M>,
    invariants: &[&'static str],
) -> Vec<&'static str>
where
    M::State: Hash + Send + Sync + Clone + PartialEq + Display + 'static,
    M::Action: Clone + PartialEq + Display,
{
    invariants
        .iter()
        .copied()
        .filter(|&name| checker.discovery(name).is_some())
        .collect()
}

/// One line per step: the action, then the state it led to. Built as one
/// string so that tests running in parallel do not interleave their lines.
pub fn render<S: Display + Clone, A: Display + Clone>(name: &str, path: &Path<S, A>) -> String {
    let steps = path.clone().into_vec();
    let mut out = format!(
        "  counterexample for \"{name}\" ({} steps):",
        steps.len() - 1
    );
    for pair in steps.windows(2) {
        let action = pair[0]
            .1
            .as_ref()
            .expect("every state but the last has an action");
        write!(out, "\n    {:<42} {}", action.to_string(), pair[1].0).unwrap();
    }
    out
}
