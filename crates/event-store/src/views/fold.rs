//! A batch of a partition's events folded into view writes, cut into
//! transactions that fit DynamoDB's limits. Pure: the items' states come in,
//! the writes and the events each transaction covers go out.
//!
//! Each transaction is the position's write plus at most
//! [`MAX_ITEM_WRITES`] item writes (one per key: DynamoDB refuses two
//! actions on one item), at most [`MAX_TRANSACTION_BYTES`] in all, and
//! covers whole events: an event's writes never straddle two.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use serde_json::Value;

use super::{Change, Projection, ViewEvent};
use crate::position::Position;

/// Item writes per transaction: DynamoDB's 100 actions, less the position's.
pub const MAX_ITEM_WRITES: usize = 99;
/// A transaction's size, with room under DynamoDB's 4 MB for names and numbers.
pub const MAX_TRANSACTION_BYTES: usize = 3_500_000;
/// A state's JSON, with room under DynamoDB's 400 KB item for its other attributes.
pub const MAX_STATE_BYTES: usize = 390_000;
/// Bytes an item write takes besides its key and state (attribute names, numbers, the position).
const WRITE_OVERHEAD: usize = 200;
/// The longest key: DynamoDB's range key limit.
pub const MAX_KEY_BYTES: usize = 1024;

/// An item as read before the batch: its state and revision (0: no item).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    pub state: Option<Value>,
    pub rev: u64,
}

/// One item's write in a transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub key: String,
    /// The state's change, and the revision the item must have for it (0: no item).
    pub state: Option<(Change, u64)>,
    /// Added to the item's counter.
    pub add: i64,
    /// The last event that changed it, and its stream version when that is an entity event.
    pub at: Position,
    pub stream_version: Option<u64>,
}

/// One transaction: the events it covers (indices into the batch), its writes, and the position after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transaction {
    pub events: Range<usize>,
    pub writes: Vec<Write>,
    pub last: Position,
}

/// A batch's transactions, in order, and the event that could not be applied, if one could not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub transactions: Vec<Transaction>,
    /// The index of the event `apply` refused (or whose state is too large), and why: the plan stops before it.
    pub failed: Option<(usize, String)>,
}

/// The transactions that apply `events` (in log order) to items now in
/// `stored` (every key the events name; a key missing there has no item).
pub fn plan(projection: &dyn Projection, events: &[ViewEvent], stored: &HashMap<String, Stored>) -> Plan {
    let mut out = Plan::default();
    // Each key's state and revision as the transactions so far leave them.
    let mut current: HashMap<String, Stored> = HashMap::new();
    let mut open = Open::new(0);
    for (i, event) in events.iter().enumerate() {
        let mut state_change = None;
        if let Some(key) = projection.key(event) {
            let now = open
                .state_of(&key)
                .or_else(|| current.get(&key).or_else(|| stored.get(&key)).cloned())
                .unwrap_or_default();
            let change = match projection.apply(now.state.as_ref(), event) {
                Ok(change) => change,
                Err(error) => {
                    out.failed = Some((i, error));
                    break;
                }
            };
            if let Change::Put(state) = &change {
                let bytes = state.to_string().len();
                if bytes > MAX_STATE_BYTES {
                    out.failed =
                        Some((i, format!("the state of {key:?} would be {bytes} bytes, over {MAX_STATE_BYTES}")));
                    break;
                }
            }
            if change != Change::Keep {
                state_change = Some((key, change));
            }
        }
        let tallies = projection.tallies(event);
        let keys: Vec<&str> =
            state_change.iter().map(|(k, _)| k.as_str()).chain(tallies.iter().map(|(k, _)| k.as_str())).collect();
        if let Some(error) = refused_keys(&keys) {
            out.failed = Some((i, error));
            break;
        }
        if !open.fits(&keys, state_bytes(&state_change)) {
            open.close(i, &mut out.transactions, &mut current);
            open = Open::new(i);
        }
        let stream_version = event.entity().map(|e| e.version);
        if let Some((key, change)) = state_change {
            // The revision the item has when this transaction starts: the condition of its write.
            let before = current.get(&key).or_else(|| stored.get(&key)).map_or(0, |s| s.rev);
            let write = open.write(&key, &event.position, stream_version);
            let rev = write.state.as_ref().map_or(before, |(_, rev)| *rev);
            write.state = Some((change, rev));
        }
        for (key, amount) in tallies {
            open.write(&key, &event.position, stream_version).add += amount;
        }
        open.last = Some(event.position.clone());
        open.bytes = open.size();
    }
    let end = out.failed.as_ref().map_or(events.len(), |(i, _)| *i);
    open.close(end, &mut out.transactions, &mut current);
    out
}

/// Why an event's keys cannot be written, if they cannot: one empty or over [`MAX_KEY_BYTES`]
/// (DynamoDB refuses the transaction), or more than one transaction's worth.
fn refused_keys(keys: &[&str]) -> Option<String> {
    if let Some(key) = keys.iter().find(|k| k.is_empty() || k.len() > MAX_KEY_BYTES) {
        return Some(format!("a key of {} bytes: keys are 1 to {MAX_KEY_BYTES}", key.len()));
    }
    // One fewer than a transaction's item writes: a redriven event's transaction also puts its marker.
    let distinct: std::collections::BTreeSet<&&str> = keys.iter().collect();
    let most = MAX_ITEM_WRITES - 1;
    (distinct.len() > most).then(|| format!("{} keys: an event writes at most {most}", distinct.len()))
}

fn state_bytes(change: &Option<(String, Change)>) -> usize {
    match change {
        Some((_, Change::Put(state))) => state.to_string().len(),
        _ => 0,
    }
}

/// The transaction being filled.
struct Open {
    start: usize,
    writes: BTreeMap<String, Write>,
    last: Option<Position>,
    bytes: usize,
}

impl Open {
    fn new(start: usize) -> Self {
        Self { start, writes: BTreeMap::new(), last: None, bytes: 0 }
    }

    /// Whether an event writing `keys` (one state of `state_bytes`) still fits; an empty transaction takes any event.
    fn fits(&self, keys: &[&str], state_bytes: usize) -> bool {
        let new: Vec<&&str> = keys.iter().filter(|k| !self.writes.contains_key(**k)).collect();
        let added = state_bytes + keys.iter().map(|k| 2 * k.len() + WRITE_OVERHEAD).sum::<usize>();
        self.last.is_none()
            || (self.writes.len() + new.len() <= MAX_ITEM_WRITES && self.bytes + added <= MAX_TRANSACTION_BYTES)
    }

    /// A key's state as this transaction leaves it so far, if it changes it.
    fn state_of(&self, key: &str) -> Option<Stored> {
        let (change, rev) = self.writes.get(key)?.state.as_ref()?;
        let state = match change {
            Change::Put(state) => Some(state.clone()),
            _ => None,
        };
        Some(Stored { state, rev: *rev })
    }

    fn write(&mut self, key: &str, at: &Position, stream_version: Option<u64>) -> &mut Write {
        let write = self.writes.entry(key.to_owned()).or_insert_with(|| Write {
            key: key.to_owned(),
            state: None,
            add: 0,
            at: at.clone(),
            stream_version: None,
        });
        write.at = at.clone();
        if stream_version.is_some() {
            write.stream_version = stream_version;
        }
        write
    }

    fn size(&self) -> usize {
        let state = |w: &Write| match &w.state {
            Some((Change::Put(state), _)) => state.to_string().len(),
            _ => 0,
        };
        self.writes.values().map(|w| 2 * w.key.len() + WRITE_OVERHEAD + state(w)).sum()
    }

    /// Ends the transaction before event `end`, and records what it leaves in `current`.
    fn close(&mut self, end: usize, done: &mut Vec<Transaction>, current: &mut HashMap<String, Stored>) {
        let Some(last) = self.last.take() else { return };
        let writes: Vec<Write> = std::mem::take(&mut self.writes).into_values().collect();
        for write in &writes {
            match &write.state {
                Some((Change::Put(state), rev)) => {
                    current.insert(write.key.clone(), Stored { state: Some(state.clone()), rev: rev + 1 });
                }
                Some((Change::Delete, _)) => {
                    current.insert(write.key.clone(), Stored::default());
                }
                _ => {}
            }
        }
        done.push(Transaction { events: self.start..end, writes, last });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::tests::event;
    use serde_json::json;

    /// Sets `{"n": <event number>}` on key `k<n % keys>`, refuses an event with `"bad": true`, and tallies `all`.
    struct Every(usize);

    impl Projection for Every {
        fn key(&self, event: &ViewEvent) -> Option<String> {
            Some(format!("k{}", event.event_ms as usize % self.0))
        }
        fn apply(&self, state: Option<&Value>, event: &ViewEvent) -> std::result::Result<Change, String> {
            if event.data.as_ref().is_some_and(|d| d["bad"] == true) {
                return Err("bad event".into());
            }
            let seen = state.and_then(|s| s["seen"].as_i64()).unwrap_or(0);
            Ok(Change::Put(
                json!({"n": event.event_ms, "seen": seen + 1, "pad": event.data.as_ref().map(|d| d["pad"].clone())}),
            ))
        }
        fn tallies(&self, _: &ViewEvent) -> Vec<(String, i64)> {
            vec![("all".into(), 1)]
        }
    }

    #[test]
    fn events_of_one_key_in_one_transaction_fold_on_each_other() {
        let batch = events(9);
        let plan = plan(&Every(3), &batch, &HashMap::new());
        assert_eq!(plan.transactions.len(), 1);
        let k0 = plan.transactions[0].writes.iter().find(|w| w.key == "k0").unwrap();
        assert_eq!(k0.state, Some((Change::Put(json!({"n": 6, "seen": 3, "pad": null})), 0)), "events 0, 3 and 6");
        assert_eq!(k0.at, batch[6].position);
    }

    fn events(n: i64) -> Vec<ViewEvent> {
        (0..n).map(|i| event("k", i, json!({}))).collect()
    }

    #[test]
    fn a_batch_folds_per_key_and_cuts_at_the_item_limit() {
        let batch = events(250);
        let stored = HashMap::from([("k3".to_string(), Stored { state: Some(json!({"seen": 10})), rev: 4 })]);
        let plan = plan(&Every(150), &batch, &stored);
        assert_eq!(plan.failed, None);
        let ranges: Vec<Range<usize>> = plan.transactions.iter().map(|t| t.events.clone()).collect();
        // 98 keys and `all` fill the first; keys repeat from 150 on.
        assert_eq!(ranges, vec![0..98, 98..196, 196..250]);
        for t in &plan.transactions {
            assert!(t.writes.len() <= MAX_ITEM_WRITES);
            assert_eq!(t.last, batch[t.events.end - 1].position);
            assert_eq!(t.writes.iter().find(|w| w.key == "all").map(|w| w.add), Some(t.events.len() as i64));
        }
        let k3: Vec<&(Change, u64)> = plan
            .transactions
            .iter()
            .flat_map(|t| t.writes.iter().filter(|w| w.key == "k3"))
            .filter_map(|w| w.state.as_ref())
            .collect();
        assert_eq!(k3.len(), 2, "events 3 and 153");
        assert_eq!(k3[0].1, 4, "conditioned on the revision read");
        assert_eq!(k3[1].1, 5, "the next transaction expects the one before's");
        assert_eq!(k3[1].0, Change::Put(json!({"n": 153, "seen": 12, "pad": null})), "folded on the state left before");
    }

    #[test]
    fn a_refused_event_ends_the_plan_after_the_events_before_it() {
        let mut batch = events(10);
        batch[6].data = Some(json!({"bad": true}));
        let plan = plan(&Every(3), &batch, &HashMap::new());
        assert_eq!(plan.failed, Some((6, "bad event".into())));
        assert_eq!(plan.transactions.len(), 1);
        assert_eq!(plan.transactions[0].events, 0..6);
        batch[0].data = Some(json!({"bad": true}));
        let first = plan_of(&batch);
        assert!(first.transactions.is_empty() && first.failed.is_some_and(|(i, _)| i == 0));
    }

    fn plan_of(batch: &[ViewEvent]) -> Plan {
        plan(&Every(3), batch, &HashMap::new())
    }

    #[test]
    fn large_states_cut_transactions_by_bytes_and_one_too_large_is_refused() {
        let pad = "x".repeat(300_000);
        let batch: Vec<ViewEvent> = (0..30).map(|i| event("k", i, json!({"pad": pad}))).collect();
        let plan = plan(&Every(30), &batch, &HashMap::new());
        assert!(plan.transactions.len() >= 3, "30 states of 300 KB do not fit one transaction");
        for t in &plan.transactions {
            let bytes: usize = t
                .writes
                .iter()
                .filter_map(|w| w.state.as_ref())
                .map(|(c, _)| match c {
                    Change::Put(v) => v.to_string().len(),
                    _ => 0,
                })
                .sum();
            assert!(bytes <= MAX_TRANSACTION_BYTES);
        }
        assert_eq!(plan.transactions.last().map(|t| t.events.end), Some(30));
        let huge = vec![event("k", 0, json!({"pad": "y".repeat(400_000)}))];
        assert!(plan_of(&huge).failed.is_some_and(|(i, e)| i == 0 && e.contains("over")));
        assert!(refused_keys(&["a", &"k".repeat(1025)]).is_some_and(|e| e.contains("1025 bytes")));
        assert!(refused_keys(&[""]).is_some());
        let many: Vec<String> = (0..99).map(|i| format!("k{i}")).collect();
        assert!(
            refused_keys(&many.iter().map(String::as_str).collect::<Vec<_>>()).is_some_and(|e| e.contains("99 keys"))
        );
        assert_eq!(refused_keys(&["a", "a", &"k".repeat(1024)]), None);
    }
}
