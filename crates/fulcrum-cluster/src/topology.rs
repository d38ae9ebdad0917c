//! Which backend takes writes, decided from what the last probes saw, and
//! which writable backends are fenced. The one rule that never bends: at most
//! one write target. Pure, so every case is a unit test.
//!
//! - The current primary stays the primary while it is reachable and
//!   writable; any other writable node is fenced (`Stale`).
//! - When it is lost (unreachable, or now read-only), `none` waits for that
//!   same node to come back; `follow` and `promote` take a writable node if
//!   there is one (the one on the newest timeline, then the configured
//!   primary, then the first in the file).
//! - Fencing needs a primary that answered its last probe: while the
//!   primary is failing, a node promoted by someone else is not fenced.
//! - A fenced node stays fenced while it is writable; once it reports
//!   read-only (re-joined as a replica) it is a replica like any other. A
//!   fenced node may still become the primary if it is on a newer timeline
//!   than the lost primary (it was promoted after it, by an external tool).

use fulcrum_config::Failover;
use fulcrum_pool::BackendId;

/// One backend as the topology sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeView {
    pub reachable: bool,
    /// From its last probe; `None` before the first answer.
    pub writable: Option<bool>,
    /// Its timeline (PostgreSQL) when writable; higher is newer.
    pub timeline: u64,
    pub configured_primary: bool,
    /// Fenced by an earlier decision.
    pub fenced: bool,
    /// Its last probe succeeded (not just "not down yet").
    pub fresh: bool,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub primary: Option<BackendId>,
    pub fenced: Vec<bool>,
}

/// Decides the write target. `current` is the primary now (None while there
/// is none), `last` the last one there was (the one `none` waits for).
pub fn decide(
    current: Option<BackendId>,
    last: Option<BackendId>,
    last_timeline: u64,
    nodes: &[NodeView],
    mode: Failover,
) -> Topology {
    let writable = |b: BackendId| nodes[b].reachable && nodes[b].writable == Some(true);
    // Fencing lifts once the node says it is read-only.
    let mut fenced: Vec<bool> = nodes
        .iter()
        .map(|n| n.fenced && n.writable != Some(false))
        .collect();
    let keep = current.filter(|&p| p < nodes.len() && writable(p));
    let primary = match keep {
        Some(p) => Some(p),
        None => match (mode, last) {
            (Failover::None, Some(l)) => Some(l).filter(|&l| l < nodes.len() && writable(l)),
            _ => best_writable(nodes, &fenced, last, last_timeline),
        },
    };
    if primary.is_some_and(|p| nodes[p].fresh) {
        for (b, f) in fenced.iter_mut().enumerate() {
            if Some(b) != primary && writable(b) {
                *f = true;
            }
        }
    }
    if let Some(p) = primary {
        fenced[p] = false;
    }
    Topology { primary, fenced }
}

/// The writable, unfenced node on the newest timeline; ties go to the last
/// primary, then the configured primary, then the first in the file.
fn best_writable(
    nodes: &[NodeView],
    fenced: &[bool],
    last: Option<BackendId>,
    last_timeline: u64,
) -> Option<BackendId> {
    (0..nodes.len())
        .filter(|&b| nodes[b].reachable && nodes[b].writable == Some(true))
        .filter(|&b| !fenced[b] || nodes[b].timeline > last_timeline)
        .max_by_key(|&b| {
            (
                nodes[b].timeline,
                Some(b) == last,
                nodes[b].configured_primary,
                std::cmp::Reverse(b),
            )
        })
}

/// The replica to promote: reachable, read-only, not fenced, with the most
/// advanced position (ties: the first in the file). `positions` are what
/// each backend has received (or replayed, if more).
pub fn promotion_candidate(nodes: &[NodeView], positions: &[Option<u64>]) -> Option<BackendId> {
    (0..nodes.len())
        .filter(|&b| nodes[b].reachable && nodes[b].writable == Some(false) && !nodes[b].fenced)
        .filter_map(|b| positions.get(b).copied().flatten().map(|p| (b, p)))
        .max_by_key(|&(b, p)| (p, std::cmp::Reverse(b)))
        .map(|(b, _)| b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(reachable: bool, writable: Option<bool>, timeline: u64) -> NodeView {
        NodeView {
            reachable,
            writable,
            timeline,
            configured_primary: false,
            fenced: false,
            fresh: reachable,
        }
    }
    const W: Option<bool> = Some(true);
    const R: Option<bool> = Some(false);

    #[test]
    fn a_healthy_primary_stays_and_a_second_writable_node_is_fenced() {
        let nodes = [node(true, W, 1), node(true, R, 1), node(true, W, 2)];
        for mode in [Failover::None, Failover::Follow, Failover::Promote] {
            let t = decide(Some(0), Some(0), 1, &nodes, mode);
            assert_eq!(t.primary, Some(0), "{mode:?}");
            assert_eq!(t.fenced, vec![false, false, true], "{mode:?}");
        }
    }

    #[test]
    fn none_waits_for_the_lost_primary_then_fences_any_other() {
        let down = [node(false, W, 1), node(true, R, 1), node(true, W, 2)];
        let t = decide(Some(0), Some(0), 1, &down, Failover::None);
        assert_eq!(t.primary, None, "none never switches");
        assert_eq!(
            t.fenced,
            vec![false; 3],
            "no fencing without a healthy primary"
        );
        let mut back = down;
        back[0].reachable = true;
        back[0].fresh = true;
        let t = decide(None, Some(0), 1, &back, Failover::None);
        assert_eq!(t.primary, Some(0));
        assert_eq!(
            t.fenced,
            vec![false, false, true],
            "the other writer is fenced"
        );
        let back = [node(true, W, 1), node(true, R, 1), node(true, R, 2)];
        let t = decide(None, Some(0), 1, &back, Failover::None);
        assert_eq!(t.primary, Some(0));
    }

    #[test]
    fn follow_takes_the_node_an_external_tool_promoted() {
        let nodes = [node(false, W, 1), node(true, R, 1), node(true, W, 2)];
        let t = decide(Some(0), Some(0), 1, &nodes, Failover::Follow);
        assert_eq!(t.primary, Some(2));
        assert_eq!(t.fenced, vec![false; 3]);
        // The old primary returns, still writable on the old timeline: fenced.
        let back = [node(true, W, 1), node(true, R, 2), node(true, W, 2)];
        let t = decide(Some(2), Some(2), 2, &back, Failover::Follow);
        assert_eq!(t.primary, Some(2));
        assert_eq!(t.fenced, vec![true, false, false]);
        // Fenced it stays, even with the new primary briefly unreachable...
        let mut gone = back;
        gone[0].fenced = true;
        gone[2].reachable = false;
        let t = decide(Some(2), Some(2), 2, &gone, Failover::Follow);
        assert_eq!(t.primary, None, "a fenced node is never chosen");
        assert!(t.fenced[0]);
        // ...until it re-joins as a replica.
        let mut rejoined = gone;
        rejoined[0].writable = R;
        rejoined[2].reachable = true;
        let t = decide(Some(2), Some(2), 2, &rejoined, Failover::Follow);
        assert_eq!(t.primary, Some(2));
        assert_eq!(t.fenced, vec![false; 3]);
    }

    #[test]
    fn a_node_promoted_while_the_primary_fails_is_not_fenced_and_takes_over() {
        let mut nodes = [node(true, W, 1), node(true, W, 2)];
        nodes[0].fresh = false; // one failed probe, not down yet
        let t = decide(Some(0), Some(0), 1, &nodes, Failover::Follow);
        assert_eq!(t.primary, Some(0));
        assert_eq!(
            t.fenced,
            vec![false, false],
            "no fencing on a failing primary's word"
        );
        // Fenced earlier all the same: its newer timeline lets it take over.
        nodes[0].reachable = false;
        nodes[1].fenced = true;
        let t = decide(Some(0), Some(0), 1, &nodes, Failover::Follow);
        assert_eq!(t.primary, Some(1));
        assert_eq!(t.fenced, vec![false, false]);
    }

    #[test]
    fn a_demoted_primary_is_no_longer_the_write_target() {
        let nodes = [node(true, R, 2), node(true, W, 3)];
        let t = decide(Some(0), Some(0), 1, &nodes, Failover::Follow);
        assert_eq!(t.primary, Some(1));
        assert_eq!(t.fenced, vec![false, false]);
    }

    #[test]
    fn at_start_the_newest_timeline_wins_then_the_configured_primary() {
        let mut nodes = [node(true, W, 1), node(true, W, 1), node(true, R, 1)];
        nodes[1].configured_primary = true;
        let t = decide(None, None, 0, &nodes, Failover::Follow);
        assert_eq!(t.primary, Some(1));
        assert_eq!(t.fenced, vec![true, false, false]);
        nodes[0].timeline = 4;
        assert_eq!(
            decide(None, None, 0, &nodes, Failover::Follow).primary,
            Some(0)
        );
        let unknown = [node(true, None, 0), node(true, None, 0)];
        assert_eq!(
            decide(None, None, 0, &unknown, Failover::Follow).primary,
            None
        );
    }

    #[test]
    fn the_most_advanced_reachable_replica_is_promoted() {
        let mut nodes = [
            node(false, W, 1),
            node(true, R, 1),
            node(true, R, 1),
            node(false, R, 1),
        ];
        let positions = [Some(900), Some(500), Some(700), Some(800)];
        assert_eq!(promotion_candidate(&nodes, &positions), Some(2));
        nodes[2].fenced = true;
        assert_eq!(promotion_candidate(&nodes, &positions), Some(1));
        assert_eq!(promotion_candidate(&nodes, &[None; 4]), None);
        let tie = [node(true, R, 1), node(true, R, 1)];
        assert_eq!(promotion_candidate(&tie, &[Some(5), Some(5)]), Some(0));
    }
}
