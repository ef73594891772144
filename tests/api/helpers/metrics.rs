//! The one Prometheus text parser of the tests: what an instance's
//! `/metrics` (or an app's registry) says.

/// Sums the samples named `name` (exactly, no suffix) in a Prometheus text
/// exposition whose label set contains every `labels` pair.
pub fn sum(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(exposition)
        .filter(|(metric, label_text, _)| {
            *metric == name
                && labels
                    .iter()
                    .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, _, value)| value)
        .sum()
}

/// Whether any sample is named exactly `name`.
pub fn exposed(exposition: &str, name: &str) -> bool {
    samples(exposition).any(|(metric, _, _)| metric == name)
}

/// (name, label text, value) of every sample line.
fn samples(exposition: &str) -> impl Iterator<Item = (&str, &str, f64)> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.find('{') {
                Some(i) => (&series[..i], &series[i..]),
                None => (series, ""),
            };
            Some((metric, labels, value.parse().ok()?))
        })
}

#[test]
fn sums_only_the_series_that_match_name_and_labels() {
    let text = "# HELP x_total A counter.\n\
                x_total{provider=\"a\",result=\"ok\"} 2\n\
                x_total{provider=\"b\",result=\"ok\"} 3\n\
                x_total_other 7\n\
                y 1\n";
    assert_eq!(sum(text, "x_total", &[("result", "ok")]), 5.0);
    assert_eq!(sum(text, "x_total", &[("provider", "a")]), 2.0);
    assert_eq!(sum(text, "x_total", &[]), 5.0);
    assert!(exposed(text, "y") && !exposed(text, "x"));
}
