//! What the benchmarks share: their scale (`TEND_BENCH=quick` makes every
//! workload small, so `scripts/bench.sh quick` runs in seconds and a test
//! keeps the script from rotting), and the figures they print for the
//! script's table.

use std::fmt::Display;
use std::time::Duration;

/// The size of a benchmark's workloads.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub quick: bool,
}

impl Scale {
    pub fn from_env() -> Self {
        Scale {
            quick: std::env::var("TEND_BENCH").as_deref() == Ok("quick"),
        }
    }

    /// `full`, or `quick` in quick mode.
    pub fn n(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }
}

/// One figure for `scripts/bench.sh`: `FIGURE|key|value|detail`.
pub fn figure(key: &str, value: impl Display, detail: &str) {
    println!("FIGURE|{key}|{value}|{detail}");
}

/// Median and spread of `samples` (milliseconds): `(median, "min–max over
/// N runs")`.
pub fn spread(samples: &[f64]) -> (String, String) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    (
        format!("{:.1} ms", median(&s)),
        format!(
            "median of {} runs, {:.1}-{:.1} ms",
            s.len(),
            s[0],
            s[s.len() - 1]
        ),
    )
}

/// The median of `samples` (the upper of the two middle ones).
pub fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Seconds since start of a `TEND_LOG=debug` line starting with `message`.
pub fn mark(stderr: &str, message: &str) -> Option<f64> {
    stderr.lines().find_map(|l| {
        let (time, rest) = l.trim_start().split_once("s DEBUG ")?;
        rest.starts_with(message).then(|| time.parse().ok())?
    })
}

/// The durations (ms) of `TEND_LOG=debug` lines containing `message` and
/// ending in a `Debug` duration.
pub fn durations(log: &str, message: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains(message))
        .filter_map(|l| {
            let text = l.split(message).nth(1)?.split_whitespace().next()?;
            let (n, scale) = [("ms", 1.0), ("µs", 1e-3), ("ns", 1e-6), ("s", 1e3)]
                .into_iter()
                .find_map(|(u, s)| text.strip_suffix(u).map(|n| (n, s)))?;
            Some(n.parse::<f64>().ok()? * scale)
        })
        .collect()
}

/// The counts of `tend apply`'s `N operations, M done` line on stderr (the
/// whole line, so `10 operations` never passes for `0 operations`). The
/// benchmarks time the command as an operator runs it, with the text
/// report; the tests read `--format json` (`support::applied`).
pub fn operation_counts(stderr: &str) -> Option<(usize, usize)> {
    stderr.lines().find_map(|line| {
        let (total, rest) = line.trim().split_once(" operations, ")?;
        let done = rest.strip_suffix(" done")?;
        Some((total.parse().ok()?, done.parse().ok()?))
    })
}
