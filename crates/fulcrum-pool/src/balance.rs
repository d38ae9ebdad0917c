//! Read-balancing policies, as pure choices over a handful of candidates:
//! round robin, smooth weighted round robin (nginx's: weights 1:3 give 25 %
//! and 75 %, evenly interleaved), least connections (fewest checked-out
//! server connections, ties broken by rotation), and uniform random.

/// The policy a cluster uses to spread reads (`balance` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    Weighted,
    LeastConnections,
    Random,
    /// Power of two choices on an exponentially weighted latency average.
    P2c,
}

/// Exponentially weighted moving average in microseconds: each new sample
/// counts for a fifth, so a node that slows down loses reads within a few
/// transactions and wins them back as it recovers.
pub fn ewma_update(old_us: u64, sample_us: u64) -> u64 {
    if old_us == 0 {
        return sample_us.max(1);
    }
    ((old_us * 4 + sample_us) / 5).max(1)
}

/// Of two candidates, the one with the lower expected cost: latency times
/// (connections in use + 1), so an idle slow node and a busy fast node compare.
pub fn p2c_choose(a: (u64, usize), b: (u64, usize)) -> bool {
    let cost = |(lat, load): (u64, usize)| lat.max(1).saturating_mul(load as u64 + 1);
    cost(a) <= cost(b)
}

/// Smooth weighted round robin: every candidate gains its weight, the one
/// with the most current weight wins and pays the total back.
/// `current` is the per-candidate state, kept between picks.
pub fn smooth_weighted(current: &mut [i64], weights: &[u32]) -> Option<usize> {
    let total: i64 = weights.iter().map(|&w| w as i64).sum();
    if total == 0 {
        return None;
    }
    let mut best: Option<usize> = None;
    for (i, &w) in weights.iter().enumerate() {
        if w == 0 {
            continue;
        }
        current[i] += w as i64;
        if best.is_none_or(|b| current[i] > current[b]) {
            best = Some(i);
        }
    }
    let b = best?;
    current[b] -= total;
    Some(b)
}

/// The candidate with the fewest connections in use, looking from `start`
/// on so that ties rotate.
pub fn least_loaded(loads: &[usize], start: usize) -> Option<usize> {
    let n = loads.len();
    (0..n).map(|i| (start + i) % n).min_by_key(|&i| loads[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_one_to_three_give_a_quarter_and_three_quarters_interleaved() {
        let mut current = vec![0; 2];
        let picks: Vec<usize> = (0..8)
            .map(|_| smooth_weighted(&mut current, &[1, 3]).unwrap())
            .collect();
        assert_eq!(picks.iter().filter(|&&p| p == 0).count(), 2);
        assert_eq!(picks.iter().filter(|&&p| p == 1).count(), 6);
        // Evenly interleaved: never two picks of the light backend in a row.
        assert!(
            picks.windows(2).all(|w| !(w[0] == 0 && w[1] == 0)),
            "{picks:?}"
        );
        assert_eq!(&picks[..4], &[1, 0, 1, 1]);
    }

    #[test]
    fn zero_weights_get_nothing() {
        let mut current = vec![0; 3];
        for _ in 0..10 {
            assert_ne!(smooth_weighted(&mut current, &[0, 1, 2]), Some(0));
        }
        assert_eq!(smooth_weighted(&mut [0, 0], &[0, 0]), None);
    }

    #[test]
    fn ewma_moves_a_fifth_of_the_way() {
        assert_eq!(ewma_update(0, 500), 500);
        assert_eq!(ewma_update(500, 1500), 700);
        let mut v = 100;
        for _ in 0..20 {
            v = ewma_update(v, 10_000);
        }
        assert!(v > 9_000, "{v}");
    }

    #[test]
    fn p2c_prefers_the_cheaper_node() {
        assert!(p2c_choose((100, 0), (1000, 0)));
        assert!(!p2c_choose((1000, 0), (100, 0)));
        // A fast node with many connections in use can lose to an idle slower one.
        assert!(!p2c_choose((100, 20), (1000, 0)));
    }

    #[test]
    fn least_loaded_prefers_idle_and_rotates_ties() {
        assert_eq!(least_loaded(&[3, 1, 2], 0), Some(1));
        assert_eq!(least_loaded(&[1, 1, 1], 0), Some(0));
        assert_eq!(least_loaded(&[1, 1, 1], 1), Some(1));
        assert_eq!(least_loaded(&[1, 1, 1], 5), Some(2));
        assert_eq!(least_loaded(&[], 0), None);
    }
}
