//! The archive's manifest: one entry per archive object, in the order the
//! objects were written, each naming the object's content (count, first and
//! last sort key, SHA-256 of its bytes) and the hash of the entry before it.
//! The archive is then one hash chain: altering, removing or reordering an
//! object or an entry breaks it at that place, and [`verify`] says where.
//! Pure: the chain's rules, tested without a network.

use serde::{Deserialize, Serialize};

pub(crate) use super::cut::sha256_hex;
use super::cut::Cut;

/// The `prev` of the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One archive object, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// 0, 1, 2, … in the order the objects were written.
    pub seq: u64,
    /// The object's S3 key.
    pub key: String,
    /// The slots it holds: `[start, end)`, ms.
    pub start: i64,
    pub end: i64,
    pub count: u64,
    pub first_sort_key: String,
    pub last_sort_key: String,
    /// SHA-256 of the object's bytes, hex.
    pub sha256: String,
    pub bytes: u64,
    /// Where each slice's row groups and the footer lie, with their hashes
    /// (`None`: an object written before objects were cut by slice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
    /// The previous entry's `hash` ([`GENESIS`] for the first).
    pub prev: String,
    /// SHA-256 over every field above: see [`Entry::content_hash`].
    pub hash: String,
}

/// What an archive object holds, as read back from S3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub sha256: String,
    pub bytes: u64,
    pub count: u64,
    pub first_sort_key: String,
    pub last_sort_key: String,
    /// How it is cut by slice ([`super::columns::Object::facts`] says).
    pub cut: Option<Cut>,
}

impl Facts {
    /// The facts of an object's bytes and the sort keys of its rows, in
    /// order, not cut by slice.
    pub(crate) fn of(object: &[u8], sort_keys: &[&str]) -> Self {
        Facts {
            sha256: sha256_hex(object),
            bytes: object.len() as u64,
            count: sort_keys.len() as u64,
            first_sort_key: sort_keys.first().map(|k| (*k).to_owned()).unwrap_or_default(),
            last_sort_key: sort_keys.last().map(|k| (*k).to_owned()).unwrap_or_default(),
            cut: None,
        }
    }
}

impl Entry {
    /// The entry after `prev` (or the first) for an object at `key` with these `facts`.
    pub fn next(prev: Option<&Entry>, key: String, start: i64, end: i64, facts: &Facts) -> Entry {
        let mut entry = Entry {
            seq: prev.map_or(0, |p| p.seq + 1),
            key,
            start,
            end,
            count: facts.count,
            first_sort_key: facts.first_sort_key.clone(),
            last_sort_key: facts.last_sort_key.clone(),
            sha256: facts.sha256.clone(),
            bytes: facts.bytes,
            cut: facts.cut.clone(),
            prev: prev.map_or_else(|| GENESIS.to_owned(), |p| p.hash.clone()),
            hash: String::new(),
        };
        entry.hash = entry.content_hash();
        entry
    }

    /// SHA-256 of the entry's fields but `hash`, one per line in a fixed
    /// order (names and values cannot run into each other: no field holds a
    /// newline); an entry with a cut is v2, its cut's lines last.
    pub(crate) fn content_hash(&self) -> String {
        let mut text = format!(
            "event-store archive entry v{}\nseq {}\nkey {}\nstart {}\nend {}\ncount {}\nfirst {}\nlast {}\nsha256 {}\nbytes {}\nprev {}\n",
            if self.cut.is_some() { 2 } else { 1 },
            self.seq,
            self.key,
            self.start,
            self.end,
            self.count,
            self.first_sort_key,
            self.last_sort_key,
            self.sha256,
            self.bytes,
            self.prev
        );
        if let Some(cut) = &self.cut {
            text.push_str(&cut.hash_text());
        }
        sha256_hex(text.as_bytes())
    }

    /// Whether `facts` are what this entry recorded.
    pub(crate) fn matches(&self, facts: &Facts) -> bool {
        self.sha256 == facts.sha256
            && self.bytes == facts.bytes
            && self.count == facts.count
            && self.first_sort_key == facts.first_sort_key
            && self.last_sort_key == facts.last_sort_key
            && self.cut == facts.cut
    }
}

/// The first place the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Break {
    #[error("entry {seq}: expected entry {expected} here (an entry removed or reordered)")]
    Sequence { seq: u64, expected: u64 },
    #[error("entry {seq}: its hash does not match its fields (the entry was altered)")]
    EntryAltered { seq: u64 },
    #[error("entry {seq}: it does not follow entry {previous} (an entry removed, reordered or replaced)")]
    Link { seq: u64, previous: u64 },
    #[error("entry {seq}: its slots [{start}, {end}) are empty or overlap the entry before (ending {previous_end})")]
    Range { seq: u64, start: i64, end: i64, previous_end: i64 },
    #[error("entry {seq}: object {key} is missing")]
    ObjectMissing { seq: u64, key: String },
    #[error("entry {seq}: object {key} is not what was archived ({what})")]
    ObjectAltered { seq: u64, key: String, what: String },
    #[error("entry {seq}: its anchor {key} is missing")]
    AnchorMissing { seq: u64, key: String },
    #[error(
        "entry {seq}: it is not the entry its anchor {key} holds (the entry, or the chain from it on, was rewritten)"
    )]
    AnchorDiffers { seq: u64, key: String },
}

impl Break {
    /// The entry where the chain breaks.
    pub(crate) fn seq(&self) -> u64 {
        match self {
            Break::Sequence { seq, .. }
            | Break::EntryAltered { seq }
            | Break::Link { seq, .. }
            | Break::Range { seq, .. }
            | Break::ObjectMissing { seq, .. }
            | Break::ObjectAltered { seq, .. }
            | Break::AnchorMissing { seq, .. }
            | Break::AnchorDiffers { seq, .. } => *seq,
        }
    }
}

/// Checks `entries` (in `seq` order, from `first`, the one before it
/// `previous`, when verifying from the middle) against the objects' facts
/// (`None`: the object is missing). Returns how many entries it checked.
pub fn verify<'a>(
    previous: Option<&Entry>,
    entries: impl IntoIterator<Item = (&'a Entry, Option<Facts>)>,
) -> Result<u64, Break> {
    let mut before = previous.cloned();
    let mut checked = 0;
    for (entry, facts) in entries {
        let expected = before.as_ref().map_or(0, |b| b.seq + 1);
        if entry.seq != expected {
            return Err(Break::Sequence { seq: entry.seq, expected });
        }
        if entry.content_hash() != entry.hash {
            return Err(Break::EntryAltered { seq: entry.seq });
        }
        let link = before.as_ref().map_or(GENESIS, |b| b.hash.as_str());
        if entry.prev != link {
            return Err(Break::Link { seq: entry.seq, previous: before.as_ref().map_or(0, |b| b.seq) });
        }
        let previous_end = before.as_ref().map_or(i64::MIN, |b| b.end);
        if entry.start >= entry.end || entry.start < previous_end {
            return Err(Break::Range { seq: entry.seq, start: entry.start, end: entry.end, previous_end });
        }
        let Some(facts) = facts else {
            return Err(Break::ObjectMissing { seq: entry.seq, key: entry.key.clone() });
        };
        if !entry.matches(&facts) {
            let what = if facts.sha256 != entry.sha256 {
                "its SHA-256 differs"
            } else if facts.cut != entry.cut {
                "its row groups differ"
            } else {
                "its rows differ"
            };
            return Err(Break::ObjectAltered { seq: entry.seq, key: entry.key.clone(), what: what.to_owned() });
        }
        before = Some(entry.clone());
        checked += 1;
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(n: u8) -> Facts {
        Facts::of(&[n; 10], &["a", "b"])
    }

    fn chain(n: u8) -> Vec<Entry> {
        let mut entries: Vec<Entry> = Vec::new();
        for i in 0..n {
            let entry =
                Entry::next(entries.last(), format!("events/{i}.parquet"), i64::from(i), i64::from(i) + 1, &facts(i));
            entries.push(entry);
        }
        entries
    }

    fn check(entries: &[Entry], objects: &[Option<Facts>]) -> Result<u64, Break> {
        verify(None, entries.iter().zip(objects.iter().cloned()))
    }

    #[test]
    fn an_intact_chain_verifies_and_each_kind_of_tampering_is_found_where_it_is() {
        let entries = chain(4);
        let objects: Vec<Option<Facts>> = (0..4).map(|i| Some(facts(i))).collect();
        assert_eq!(check(&entries, &objects), Ok(4));
        assert_eq!(entries[1].prev, entries[0].hash);

        // An object altered: its bytes' hash differs.
        let mut altered = objects.clone();
        altered[2] = Some(Facts::of(&[99; 10], &["a", "b"]));
        assert!(matches!(check(&entries, &altered), Err(Break::ObjectAltered { seq: 2, .. })));
        // An object removed.
        let mut removed = objects.clone();
        removed[1] = None;
        assert_eq!(check(&entries, &removed), Err(Break::ObjectMissing { seq: 1, key: "events/1.parquet".into() }));
        // Two objects swapped under their keys: the first of them no longer matches.
        let mut swapped = objects.clone();
        swapped.swap(1, 2);
        assert!(matches!(check(&entries, &swapped), Err(Break::ObjectAltered { seq: 1, .. })));
        // Entries reordered, or one removed from the chain.
        let mut reordered = entries.clone();
        reordered.swap(1, 2);
        let reordered_objects = vec![objects[0].clone(), objects[2].clone(), objects[1].clone(), objects[3].clone()];
        assert_eq!(check(&reordered, &reordered_objects), Err(Break::Sequence { seq: 2, expected: 1 }));
        let dropped: Vec<Entry> = entries.iter().filter(|e| e.seq != 1).cloned().collect();
        let dropped_objects: Vec<Option<Facts>> = vec![objects[0].clone(), objects[2].clone(), objects[3].clone()];
        assert_eq!(check(&dropped, &dropped_objects), Err(Break::Sequence { seq: 2, expected: 1 }));
        // An entry edited to match an altered object, renumbered or not: its hash, or the next link, gives it away.
        let mut edited = entries.clone();
        edited[2].sha256 = altered[2].as_ref().unwrap().sha256.clone();
        assert_eq!(check(&edited, &altered), Err(Break::EntryAltered { seq: 2 }));
        edited[2].hash = edited[2].content_hash();
        assert_eq!(check(&edited, &altered), Err(Break::Link { seq: 3, previous: 2 }));
        // An entry (rehashed, and the chain after it) claiming slots its predecessor holds.
        let mut overlapping = entries.clone();
        overlapping[2].start = overlapping[1].start;
        for i in 2..overlapping.len() {
            overlapping[i].prev = overlapping[i - 1].hash.clone();
            overlapping[i].hash = overlapping[i].content_hash();
        }
        assert!(matches!(check(&overlapping, &objects), Err(Break::Range { seq: 2, .. })));
    }

    #[test]
    fn an_entry_hashes_its_cut_and_an_object_cut_otherwise_is_altered() {
        use crate::archive::cut::{Group, Span};
        let span = |offset, bytes: &[u8]| Span { offset, length: bytes.len() as u64, sha256: sha256_hex(bytes) };
        let cut = Cut {
            slices: 2,
            footer: span(8, b"ff"),
            groups: vec![Group { slice: 1, rows: 2, span: span(4, b"abcd") }],
        };
        let cut_facts = Facts { cut: Some(cut), ..facts(1) };
        let entry = Entry::next(None, "events/0.parquet".into(), 0, 1, &cut_facts);
        let plain = Entry::next(None, "events/0.parquet".into(), 0, 1, &facts(1));
        assert_ne!(entry.hash, plain.hash);
        assert_eq!(verify(None, [(&entry, Some(cut_facts.clone()))]), Ok(1));
        let mut altered = entry.clone();
        altered.cut.as_mut().unwrap().groups[0].span.sha256 = sha256_hex(b"abcD");
        assert_eq!(verify(None, [(&altered, Some(cut_facts.clone()))]), Err(Break::EntryAltered { seq: 0 }));
        let uncut = verify(None, [(&entry, Some(facts(1)))]);
        assert!(matches!(uncut, Err(Break::ObjectAltered { what, .. }) if what == "its row groups differ"));
        // An entry stored before cuts reads and hashes as it did: no `cut` field.
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("cut").is_none() && json.get("prev").is_some());
        assert_eq!(serde_json::from_value::<Entry>(json).unwrap(), plain);
    }

    #[test]
    fn a_chain_verifies_from_the_middle_given_the_entry_before() {
        let entries = chain(5);
        let objects: Vec<Option<Facts>> = (0..5).map(|i| Some(facts(i))).collect();
        let from_two = entries[2..].iter().zip(objects[2..].iter().cloned());
        assert_eq!(verify(Some(&entries[1]), from_two), Ok(3));
        let wrong_start = entries[2..].iter().zip(objects[2..].iter().cloned());
        assert_eq!(verify(Some(&entries[0]), wrong_start), Err(Break::Sequence { seq: 2, expected: 1 }));
    }
}
