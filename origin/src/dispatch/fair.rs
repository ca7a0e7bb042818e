//! Weighted fair sharing of the dispatcher's in-flight budget between customers (pure).
//!
//! Each customer with due work is a [`Group`] of its subscribers (subscribers with no customer
//! form one more group of weight 1). Free slots go one at a time to the group with the fewest
//! deliveries in flight per unit of weight, counting what this call has already granted, so
//! under contention each group holds in-flight slots in proportion to its weight (a weight-4
//! customer four times a weight-1 one), and a group with nothing in flight is always first in
//! line: no group with due work gets nothing while a slot is free. Within a group, slots go
//! round-robin between its subscribers. What each subscriber may take (`wants`) already holds
//! its own limits (rate, in-flight cap, pause, breaker); a group's `cap` is its customer's
//! `max_in_flight`. This module does not know what a subscriber, a lane or the ledger is.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// At least 1.
    pub weight: u32,
    /// The group's deliveries in flight now.
    pub in_flight: usize,
    /// The most the group may have in flight (`None`: no cap of its own).
    pub cap: Option<usize>,
    /// What each of its subscribers may take now.
    pub wants: Vec<usize>,
}

/// A group's place in line: fewest in flight per unit of weight first, then by rotation.
#[derive(Debug, PartialEq, Eq)]
struct Turn {
    used: usize,
    weight: u64,
    /// Position after rotating by `start` (ties go to the lowest).
    order: usize,
    group: usize,
}

impl Ord for Turn {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the smallest ratio must compare greatest.
        let mine = self.used as u128 * u128::from(other.weight);
        let theirs = other.used as u128 * u128::from(self.weight);
        theirs.cmp(&mine).then_with(|| other.order.cmp(&self.order))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Share `budget` free slots: the grant of each subscriber of each group, in the input's shape.
/// `start` rotates who goes first among equals (groups, and subscribers within a group), so
/// successive calls do not always favour the same ones.
pub fn fair_share(groups: &[Group], budget: usize, start: usize) -> Vec<Vec<usize>> {
    let mut grants: Vec<Vec<usize>> = groups.iter().map(|g| vec![0; g.wants.len()]).collect();
    // Next subscriber to serve in each group (round-robin).
    let mut cursor: Vec<usize> = groups
        .iter()
        .map(|g| {
            if g.wants.is_empty() {
                0
            } else {
                start % g.wants.len()
            }
        })
        .collect();
    let mut left_in_group: Vec<usize> = groups
        .iter()
        .map(|g| {
            let want: usize = g.wants.iter().sum();
            let room = g.cap.map_or(usize::MAX, |c| c.saturating_sub(g.in_flight));
            want.min(room)
        })
        .collect();
    let n = groups.len();
    let mut heap: BinaryHeap<Turn> = groups
        .iter()
        .enumerate()
        .filter(|(i, _)| left_in_group[*i] > 0)
        .map(|(i, g)| Turn {
            used: g.in_flight,
            weight: u64::from(g.weight.max(1)),
            order: (i + n - start % n.max(1)) % n.max(1),
            group: i,
        })
        .collect();
    let mut budget = budget;
    while budget > 0 {
        let Some(mut turn) = heap.pop() else { break };
        let g = turn.group;
        let wants = &groups[g].wants;
        // The next subscriber of the group with room left (there is one: left_in_group > 0).
        let k = (0..wants.len())
            .map(|j| (cursor[g] + j) % wants.len())
            .find(|&s| grants[g][s] < wants[s]);
        let Some(s) = k else { continue };
        grants[g][s] += 1;
        cursor[g] = (s + 1) % wants.len();
        left_in_group[g] -= 1;
        budget -= 1;
        turn.used += 1;
        if left_in_group[g] > 0 {
            heap.push(turn);
        }
    }
    grants
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, groups, budget, start, expected grants)
    type Case = (&'static str, Vec<Group>, usize, usize, Vec<Vec<usize>>);

    fn group(weight: u32, in_flight: usize, wants: &[usize]) -> Group {
        Group {
            weight,
            in_flight,
            cap: None,
            wants: wants.to_vec(),
        }
    }

    fn totals(g: &[Vec<usize>]) -> Vec<usize> {
        g.iter().map(|v| v.iter().sum()).collect()
    }

    #[test]
    fn share_table() {
        // (name, groups, budget, start, expected grants)
        let cases: Vec<Case> = vec![
            (
                "nothing to share",
                vec![group(1, 0, &[5])],
                0,
                0,
                vec![vec![0]],
            ),
            ("no groups", vec![], 5, 0, vec![]),
            (
                "enough for everyone",
                vec![group(1, 0, &[2, 1]), group(4, 0, &[3])],
                100,
                0,
                vec![vec![2, 1], vec![3]],
            ),
            (
                "4:1 under contention, from idle",
                vec![group(4, 0, &[50, 50]), group(1, 0, &[50, 50])],
                10,
                0,
                vec![vec![4, 4], vec![1, 1]],
            ),
            (
                "4:1 counts what is already in flight",
                vec![group(4, 4, &[50]), group(1, 1, &[50])],
                10,
                0,
                vec![vec![8], vec![2]],
            ),
            (
                "a freed slot goes to the group furthest under its share",
                vec![group(4, 7, &[50]), group(1, 2, &[50])],
                1,
                0,
                vec![vec![1], vec![0]],
            ),
            (
                "round-robin within a group",
                vec![group(1, 0, &[9, 9, 9])],
                7,
                0,
                vec![vec![3, 2, 2]],
            ),
            (
                "rotation starts elsewhere",
                vec![group(1, 0, &[9, 9, 9])],
                7,
                1,
                vec![vec![2, 3, 2]],
            ),
            (
                "a subscriber's own limit holds; the rest goes to its siblings",
                vec![group(1, 0, &[1, 9])],
                6,
                0,
                vec![vec![1, 5]],
            ),
            (
                "a group that cannot use its share leaves it to others",
                vec![group(4, 0, &[2]), group(1, 0, &[50])],
                10,
                0,
                vec![vec![2], vec![8]],
            ),
            (
                "a customer's own cap",
                vec![
                    Group {
                        cap: Some(5),
                        ..group(4, 3, &[50])
                    },
                    group(1, 0, &[50]),
                ],
                10,
                0,
                vec![vec![2], vec![8]],
            ),
            (
                "a customer at its cap gets nothing more",
                vec![
                    Group {
                        cap: Some(3),
                        ..group(4, 3, &[50])
                    },
                    group(1, 0, &[1]),
                ],
                10,
                0,
                vec![vec![0], vec![1]],
            ),
        ];
        for (name, groups, budget, start, expected) in cases {
            assert_eq!(fair_share(&groups, budget, start), expected, "{name}");
        }
    }

    /// Every group with due work gets at least one slot when there are as many free slots as
    /// groups, however heavy the others are.
    #[test]
    fn nobody_with_due_work_gets_nothing() {
        for weights in [vec![1000, 1], vec![1, 1000, 1, 1], vec![7, 3, 1, 1, 1000]] {
            let groups: Vec<Group> = weights.iter().map(|&w| group(w, 0, &[100, 100])).collect();
            for start in 0..weights.len() {
                let got = totals(&fair_share(&groups, groups.len(), start));
                assert!(
                    got.iter().all(|&g| g >= 1),
                    "{weights:?} start {start}: {got:?}"
                );
            }
        }
        // Even when a heavy group already holds many slots, an idle one is first in line.
        let groups = vec![group(1000, 500, &[100]), group(1, 0, &[100])];
        assert_eq!(totals(&fair_share(&groups, 1, 0)), vec![0, 1]);
    }

    /// Steady state: slots freed one by one (oldest first) go where the weights say; over many
    /// turns the in-flight split is 4:1.
    #[test]
    fn steady_state_is_proportional() {
        let total = 20;
        let mut held = [0usize; 2];
        let mut served = [0usize; 2];
        let mut log: std::collections::VecDeque<usize> = Default::default();
        let mut full = [0usize; 2];
        for turn in 0..2000 {
            let groups = vec![
                group(4, held[0], &[100, 100]),
                group(1, held[1], &[100, 100]),
            ];
            let free = total - held[0] - held[1];
            for (g, n) in totals(&fair_share(&groups, free, turn))
                .into_iter()
                .enumerate()
            {
                held[g] += n;
                served[g] += n;
                log.extend(std::iter::repeat_n(g, n));
            }
            full = held;
            // One delivery completes per turn.
            if let Some(g) = log.pop_front() {
                held[g] -= 1;
            }
        }
        assert_eq!(full, [16, 4], "the budget full, split by weight");
        let ratio = served[0] as f64 / served[1] as f64;
        assert!((3.8..4.2).contains(&ratio), "{served:?}");
    }
}
