//! The page plan's tests: events, quarantine, index entries, what leaves the buffer.

use super::*;

const T: i64 = 1_795_327_124_000;

fn buffered(id: &str, arrival: i64, buffered_at: i64) -> HashMap<String, AttributeValue> {
    let (data, encoding) = crate::encoding::encode(br#"{"n":1}"#);
    BufferItem {
        id: id.into(),
        event_id: format!("shardId-000000000000:{arrival}"),
        arrival,
        partition_key: "pk".into(),
        data,
        encoding,
        buffered_at: Some(buffered_at),
        count: None,
    }
    .to_item()
}

fn moving() -> Moving {
    Moving { time_unit_ms: 1000, retention_days: None, now_ms: T + 10_000, slot_subkeys: 1, slices: 1 }
}

fn keys(plan: &PagePlan) -> Vec<TableKey> {
    let mut keys: Vec<TableKey> = plan.writes.iter().map(|(k, _)| k.clone()).collect();
    keys.sort();
    keys
}

#[test]
fn a_page_plans_its_events_quarantine_and_one_index_entry_per_new_slot() {
    let broken = HashMap::from([("id".to_string(), AttributeValue::S("broken".into()))]);
    let no_id = HashMap::from([("other".to_string(), AttributeValue::S("x".into()))]);
    let items = vec![buffered("a", T + 10, T + 50), buffered("b", T + 1_500, T + 1_600), broken, no_id];
    let already = BTreeSet::from([T + 1_000]);
    let plan = PagePlan::new(items, moving(), &already);
    let keys = keys(&plan);
    assert_eq!(keys.iter().filter(|k| matches!(k, TableKey::Event { .. })).count(), 2);
    assert!(keys.contains(&TableKey::Quarantine("broken".into())));
    assert!(keys.contains(&TableKey::SlotIndex(T)), "a new slot gets its index entry");
    assert!(!keys.contains(&TableKey::SlotIndex(T + 1_000)), "an indexed slot does not, again");
    assert_eq!((plan.quarantined, plan.stuck.len()), (1, 1));
}

#[test]
fn an_item_that_can_neither_move_nor_be_quarantined_holds_the_watermark_and_is_named() {
    // Too large for the quarantine item (which adds the reason), and no events in it to move.
    let huge = HashMap::from([
        ("id".to_string(), AttributeValue::S("huge".into())),
        ("arrival".to_string(), AttributeValue::N((T + 40).to_string())),
        ("data".to_string(), AttributeValue::S("x".repeat(400_000))),
    ]);
    let no_id = HashMap::from([("other".to_string(), AttributeValue::S("x".into()))]);
    let mut plan = PagePlan::new(vec![buffered("a", T + 10, T + 90), huge], moving(), &BTreeSet::new());
    let settled = plan.settle(&[]);
    let outcome = plan.outcome(settled, &[], None);
    assert_eq!(outcome.moved, 1);
    assert_eq!(outcome.oldest_left, Some(T + 40), "the stuck item's arrival holds the watermark");
    assert_eq!(outcome.stuck, vec!["huge".to_string()]);
    let mut plan = PagePlan::new(vec![no_id], moving(), &BTreeSet::new());
    let settled = plan.settle(&[]);
    let outcome = plan.outcome(settled, &[], None);
    assert_eq!(outcome.oldest_left, Some(UNKNOWN_ARRIVAL), "no arrival to go by: held where it is");
    let mut pass = crate::bookkeeping::watermark::Pass::started_at(T + 60_000, None, T + 59_000);
    pass.saw(outcome.oldest_left);
    assert_eq!(pass.watermark(0), None, "the pass moves no watermark");
    assert!(outcome.stuck[0].contains("without a string id") && outcome.stuck[0].contains("other"));
}

#[test]
fn a_newer_versions_buffer_item_is_not_quarantined_but_waits_holding_the_watermark() {
    let mut newer = buffered("newer", T + 40, T + 90);
    newer.insert("encoding".into(), AttributeValue::S("chunk2".into()));
    let mut plan = PagePlan::new(vec![buffered("a", T + 10, T + 90), newer], moving(), &BTreeSet::new());
    assert_eq!(plan.quarantined, 0);
    let settled = plan.settle(&[]);
    let outcome = plan.outcome(settled, &[], None);
    assert_eq!((outcome.moved, outcome.oldest_left), (1, Some(T + 40)));
    assert!(outcome.stuck[0].starts_with("newer (written by a newer version"), "{:?}", outcome.stuck);
}

#[test]
fn what_is_not_written_or_not_indexed_stays_and_holds_the_watermark_back() {
    let items = vec![buffered("a", T + 10, T + 20), buffered("b", T + 1_500, T + 1_510), buffered("c", T + 20, T + 30)];
    let mut plan = PagePlan::new(items, moving(), &BTreeSet::new());
    // Marked before anything is written: a and c arrived behind a watermark at T+25, b did not.
    assert_eq!(plan.late_slots(Some(T + 25)), BTreeSet::from([T]));
    assert_eq!(plan.late_slots(Some(T + 1_501)), BTreeSet::from([T, T + 1_000]));
    assert!(plan.late_slots(None).is_empty(), "no watermark yet: nothing is late");
    let c = plan.sources.iter().find(|(_, ids)| **ids == ["c".to_string()]).map(|(k, _)| k.clone()).unwrap();
    // c's put failed; slot T+1000's index entry failed, so b stays too.
    let settled = plan.settle(&[c, TableKey::SlotIndex(T + 1_000)]);
    assert_eq!(settled.delete, vec!["a".to_string()]);
    let mut left = settled.left.clone();
    left.sort();
    assert_eq!(left, vec!["b".to_string(), "c".to_string()]);
    assert_eq!(settled.indexed, BTreeSet::from([T]));
    assert_eq!(settled.unindexed, BTreeSet::from([T + 1_000]));

    let outcome = plan.outcome(settled, &[], Some(T + 15));
    assert_eq!((outcome.moved, outcome.failed, outcome.late), (1, 2, 1), "a moved behind the watermark");
    assert_eq!(outcome.first_late_slot, Some(T));
    assert_eq!(outcome.oldest_left, Some(T + 20));
    assert_eq!(outcome.per_minute, BTreeMap::from([(minute_of(T + 10), 1)]), "only what moved is counted");
}

/// A buffer chunk of `arrivals` (one shard's events), as the pump writes it.
fn chunk(arrivals: &[i64]) -> BufferItem {
    let events: Vec<crate::chunk::ChunkEvent> = arrivals
        .iter()
        .map(|&a| crate::chunk::ChunkEvent {
            event_id: format!("shardId-000000000000:{a}"),
            arrival: a,
            partition_key: "pk".into(),
            data: br#"{"n":1}"#.to_vec(),
        })
        .collect();
    let packed = crate::chunk::Packed { bytes: crate::chunk::pack(&events).unwrap(), events };
    BufferItem::chunk("arn", &packed, T).unwrap()
}

#[test]
fn a_chunk_of_one_slot_moves_as_it_is_and_one_across_slots_is_cut_and_leaves_only_whole() {
    let one = chunk(&[T + 1, T + 2, T + 3]);
    let (chunks, places) = event_chunks(&one, moving()).unwrap();
    assert_eq!((chunks.len(), places.len()), (1, 3));
    assert_eq!(chunks[0].bytes, one.data, "the pump's bytes, not packed again");
    assert_eq!(chunks[0].storage_slot, T);

    let across = chunk(&[T + 998, T + 999, T + 1_000, T + 1_001]);
    let eight = Moving { slot_subkeys: 8, ..moving() };
    let (chunks, _) = event_chunks(&across, eight).unwrap();
    let slots: Vec<i64> = chunks.iter().map(|c| c.storage_slot / 1000 * 1000).collect();
    assert_eq!(slots, vec![T, T + 1_000]);
    assert!(chunks.iter().all(|c| c.count == 2 && c.storage_slot % 1000 < 8));

    let mut plan = PagePlan::new(vec![across.to_item()], eight, &BTreeSet::new());
    let keys = keys(&plan);
    assert!(keys.contains(&TableKey::SlotIndex(T)) && keys.contains(&TableKey::SlotIndex(T + 1_000)));
    let index: Vec<String> = plan
        .writes
        .iter()
        .filter(|(k, _)| matches!(k, TableKey::SlotIndex(_)))
        .map(|(_, w)| w.put_request().unwrap().item()["sort_key"].as_s().unwrap().clone())
        .collect();
    assert!(index.iter().all(|k| k.ends_with("#8")), "{index:?}");
    let second = keys.iter().find(|k| matches!(k, TableKey::Event { slot, .. } if *slot >= T + 1_000)).unwrap().clone();
    let settled = plan.settle(&[second]);
    assert!(settled.delete.is_empty(), "half written: the buffer chunk stays");
    assert_eq!(settled.left, vec![across.id.clone()]);
    let outcome = plan.outcome(settled, &[], None);
    assert_eq!((outcome.moved, outcome.failed, outcome.oldest_left), (0, 4, Some(T + 998)));
}

#[test]
fn with_slices_a_pages_events_are_pooled_and_each_item_leaves_only_once_its_chunks_are_written() {
    let a = chunk(&[T + 1, T + 2, T + 3]);
    let mut b = chunk(&[T + 4, T + 1_005]);
    b.id = "b".into();
    let sliced = Moving { slices: 4, ..moving() };
    let mut plan = PagePlan::new(vec![a.to_item(), b.to_item()], sliced, &BTreeSet::new());
    let index: Vec<String> = plan
        .writes
        .iter()
        .filter(|(k, _)| matches!(k, TableKey::SlotIndex(_)))
        .map(|(_, w)| w.put_request().unwrap().item()["sort_key"].as_s().unwrap().clone())
        .collect();
    assert_eq!(index, vec![format!("index#{T:013}#s4"), format!("index#{:013}#s4", T + 1_000)]);
    // All of one key ("pk"): one slice, one chunk per slot, the first behind both items.
    let events: Vec<TableKey> = keys(&plan).into_iter().filter(|k| matches!(k, TableKey::Event { .. })).collect();
    assert_eq!(events.len(), 2);
    let slice = crate::slices::part_of(crate::slices::key_hash("pk"), 4);
    assert!(events.iter().all(|k| matches!(k, TableKey::Event { slot, storage, .. }
        if *storage == crate::slices::storage_key(*slot, 4, slice))));
    let first = events.iter().find(|k| matches!(k, TableKey::Event { slot, .. } if *slot == T)).unwrap().clone();
    let mut behind = plan.sources[&first].clone();
    behind.sort();
    assert_eq!(behind, vec![a.id.clone(), "b".to_string()]);
    let settled = plan.settle(&[first]);
    assert!(settled.delete.is_empty(), "both had events in the chunk that failed: {settled:?}");
    let outcome = plan.outcome(settled, &[], None);
    assert_eq!((outcome.moved, outcome.failed), (0, 5));
}

#[test]
fn a_failed_delete_leaves_the_item_counted_as_failed_not_moved() {
    let mut plan = PagePlan::new(vec![buffered("a", T + 10, T + 20)], moving(), &BTreeSet::new());
    let settled = plan.settle(&[]);
    assert_eq!(settled.delete, vec!["a".to_string()]);
    let outcome = plan.outcome(settled, &["a".to_string()], None);
    assert_eq!((outcome.moved, outcome.failed, outcome.late), (0, 1, 0));
    assert_eq!(outcome.oldest_left, Some(T + 10));
    assert_eq!(buffer_deletes(&["a".to_string()]).len(), 1);
}
