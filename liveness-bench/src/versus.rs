//! Ratios between two series measured alternately in one run (the build under test and its
//! baseline, or a tool and the raw tracer on the same deaths), with their spread: the same
//! ratio within each part of the run. On a shared 2-core machine whose speed wanders by
//! tens of per cent, a ratio taken this way is what stays comparable; the parts say how
//! much it moves between consecutive minutes.

use serde_json::{Value, json};

use crate::{Dist, round};

/// How many parts a latency series is cut into, in the order it was taken.
const QUARTERS: usize = 4;

/// `value` = a / b over the whole run; `parts`: the same ratio within each part of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ratio {
    pub value: f64,
    pub parts: Vec<f64>,
}

impl Ratio {
    /// The ratio of a quantile (`at`, of a [`Dist`]) of two latency series in nanoseconds,
    /// each in the order it was taken; the parts are its quarters.
    pub fn of_latencies(a: &[u64], b: &[u64], at: fn(&Dist) -> f64) -> Ratio {
        let (a, b): (Vec<&[u64]>, Vec<&[u64]>) = (quarters(a).collect(), quarters(b).collect());
        Ratio::of_parts(&a, &b, at)
    }

    /// The same for two series already cut into parts (blocks taken alternately, say): the
    /// ratio over all of each, and part by part, pairing the n-th parts (a part empty on
    /// either side has no ratio).
    pub fn of_parts<P: AsRef<[u64]>>(a: &[P], b: &[P], at: fn(&Dist) -> f64) -> Ratio {
        let ratio = |a: &[u64], b: &[u64]| at(&Dist::of_ns(a)) / at(&Dist::of_ns(b));
        let all =
            |parts: &[P]| -> Vec<u64> { parts.iter().flat_map(|p| p.as_ref()).copied().collect() };
        let (all_a, all_b) = (all(a), all(b));
        if all_a.is_empty() || all_b.is_empty() {
            return Ratio::default();
        }
        Ratio {
            value: ratio(&all_a, &all_b),
            parts: a
                .iter()
                .zip(b)
                .map(|(a, b)| (a.as_ref(), b.as_ref()))
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .map(|(a, b)| ratio(a, b))
                .collect(),
        }
    }

    /// The ratio of the mean cost per item of two series of measurements taken alternately,
    /// each a `(cost, items)` pair; the parts are the ratios of the pairs taken side by side.
    pub fn of_costs(a: &[(f64, usize)], b: &[(f64, usize)]) -> Ratio {
        let mean = |series: &[(f64, usize)]| {
            let (cost, items) = series
                .iter()
                .fold((0.0, 0), |(c, n), &(cost, items)| (c + cost, n + items));
            cost / items.max(1) as f64
        };
        Ratio {
            value: mean(a) / mean(b),
            parts: a
                .iter()
                .zip(b)
                .map(|(a, b)| mean(std::slice::from_ref(a)) / mean(std::slice::from_ref(b)))
                .collect(),
        }
    }

    /// The smallest and largest part (the value itself without parts).
    pub fn spread(&self) -> (f64, f64) {
        if self.parts.is_empty() {
            return (self.value, self.value);
        }
        self.parts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), &p| {
                (low.min(p), high.max(p))
            })
    }

    pub fn json(&self) -> Value {
        let (low, high) = self.spread();
        json!({
            "ratio": round(self.value),
            "min": round(low),
            "max": round(high),
            "parts": self.parts.iter().map(|&p| round(p)).collect::<Vec<_>>(),
        })
    }

    /// `0.93 (0.85..1.02)`.
    pub fn show(&self) -> String {
        let (low, high) = self.spread();
        format!("{:.2} ({low:.2}..{high:.2})", self.value)
    }
}

/// A series cut into [`QUARTERS`] consecutive parts.
pub fn quarters<T>(series: &[T]) -> std::slice::Chunks<'_, T> {
    series.chunks(series.len().div_ceil(QUARTERS).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_ratios_take_the_quantile_of_each_quarter() {
        let a: Vec<u64> = (1..=8).map(|i| i * 2_000).collect();
        let b: Vec<u64> = (1..=8).map(|i| i * 1_000).collect();
        let ratio = Ratio::of_latencies(&a, &b, |d| d.p50);
        assert_eq!(ratio.value, 2.0, "p50 8 us against 4 us");
        assert_eq!(ratio.parts, vec![2.0; 4], "each quarter's p50 doubles too");
        assert_eq!(ratio.spread(), (2.0, 2.0));
        assert_eq!(
            Ratio::of_latencies(&a, &[], |d| d.p50),
            Ratio::default(),
            "no figure, no ratio"
        );
    }

    #[test]
    fn part_ratios_pair_the_nth_parts_and_skip_empty_ones() {
        let a = [vec![2_000, 2_000], vec![], vec![9_000]];
        let b = [vec![1_000], vec![5_000], vec![3_000]];
        let ratio = Ratio::of_parts(&a, &b, |d| d.p50);
        assert_eq!(
            ratio.value,
            2.0 / 3.0,
            "p50 of all of a (2 us) against all of b (3 us)"
        );
        assert_eq!(
            ratio.parts,
            vec![2.0, 3.0],
            "the empty second block has no ratio"
        );
    }

    #[test]
    fn cost_ratios_are_of_means_per_item_and_pairwise() {
        let new = [(100.0, 10), (300.0, 10)];
        let base = [(400.0, 10), (400.0, 10)];
        let ratio = Ratio::of_costs(&new, &base);
        assert_eq!(ratio.value, 0.5, "20 per item against 40");
        assert_eq!(ratio.parts, vec![0.25, 0.75]);
        assert_eq!(ratio.spread(), (0.25, 0.75));
        assert_eq!(ratio.show(), "0.50 (0.25..0.75)");
    }
}
