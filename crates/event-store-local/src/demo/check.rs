//! The demo's check: what was stored against what came back (lost, duplicated, out of order).

use std::collections::{HashMap, HashSet};

use super::report::Report;

/// Compares what was stored with what was played: lost events, duplicate
/// deliveries, and first deliveries out of time order per partition key (a
/// consumer that takes the first copy of each event must see each key in order).
pub fn check(
    stored: &HashMap<String, (String, String)>,
    played: &HashMap<String, Vec<String>>,
    accepted: usize,
) -> Report {
    let mut report = Report { stored: stored.len(), ..Default::default() };
    let mut seen = HashSet::new();
    for (partition_key, ids) in played {
        report.played_back += ids.len();
        let mut last: Option<&str> = None;
        for id in ids {
            if !seen.insert(id.as_str()) {
                report.duplicates += 1;
                report.duplicate_ids.push(id.clone());
                continue;
            }
            let Some((stored_key, sort_key)) = stored.get(id) else {
                continue;
            };
            if stored_key != partition_key || last.is_some_and(|l| sort_key.as_str() < l) {
                report.out_of_order += 1;
            }
            last = Some(sort_key);
        }
    }
    let not_played = stored.keys().filter(|id| !seen.contains(id.as_str())).count();
    report.lost = accepted.saturating_sub(stored.len()) + not_played;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(entries: &[(&str, &str, &str)]) -> HashMap<String, (String, String)> {
        entries.iter().map(|(id, pk, sk)| (id.to_string(), (pk.to_string(), sk.to_string()))).collect()
    }

    fn played(entries: &[(&str, &[&str])]) -> HashMap<String, Vec<String>> {
        entries.iter().map(|(pk, ids)| (pk.to_string(), ids.iter().map(|s| s.to_string()).collect())).collect()
    }

    #[test]
    fn a_complete_ordered_playback_passes() {
        let s = stored(&[("a", "k", "1"), ("b", "k", "2"), ("c", "j", "1")]);
        let report = check(&s, &played(&[("k", &["a", "b"]), ("j", &["c"])]), 3);
        assert_eq!((report.lost, report.out_of_order, report.duplicates, report.played_back), (0, 0, 0, 3));
    }

    #[test]
    fn losses_reorders_and_duplicates_are_counted() {
        let s = stored(&[("a", "k", "1"), ("b", "k", "2"), ("c", "k", "3")]);
        let report = check(&s, &played(&[("k", &["b", "a"])]), 4);
        assert_eq!(report.out_of_order, 1, "a after b");
        assert_eq!(report.lost, 2, "c not played, one accepted hit never stored");
        assert!(!report.ok());
    }

    #[test]
    fn order_is_judged_on_first_delivery_and_copies_are_counted() {
        let s = stored(&[("a", "k", "1"), ("b", "k", "2"), ("c", "k", "3")]);
        // An ambiguous failure after a and b were applied: both sent again.
        let report = check(&s, &played(&[("k", &["a", "b", "a", "b", "c"])]), 3);
        assert_eq!((report.out_of_order, report.duplicates, report.lost, report.played_back), (0, 2, 0, 5));
        assert_eq!(report.duplicate_ids, vec!["a".to_string(), "b".to_string()]);
        // The old resend-from-the-first-failure: c stored before b on first delivery.
        let reordered = check(&s, &played(&[("k", &["a", "c", "b", "c"])]), 3);
        assert_eq!(reordered.out_of_order, 1, "b first delivered after c");
    }
}
