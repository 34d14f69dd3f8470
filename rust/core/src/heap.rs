//! An indexed binary min-heap over backlogged clients.
//!
//! Each entry carries its key inline (`counter`, `head_seq`) so comparisons
//! never chase a pointer, and each client record carries its own position in
//! the heap (as in dmclock's `ClientRec::heap_data`), so a key change is an
//! O(log C) `adjust` instead of a search. The heap never allocates once it has
//! grown to the number of backlogged clients.

/// Sentinel position of a client that is not in the heap.
pub const NOT_IN_HEAP: u32 = u32::MAX;

/// Where the heap writes back the position of each id it moves.
pub trait Positions {
    fn set_pos(&mut self, id: u32, pos: u32);
    fn pos(&self, id: u32) -> u32;
    /// What `id`'s key is read from (`set_counters_unordered`): the id itself
    /// unless the ids are grouped under owners (a band's entities, each of one
    /// client). Fixed while `id` is in the heap.
    #[inline(always)]
    fn owner(&self, id: u32) -> u32 {
        id
    }
}

/// The ordering key. Counters are always finite (they are sums of finite,
/// non-negative charges), so the partial order on `f64` is total here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Key {
    pub counter: f64,
    pub seq: u64,
}

impl Key {
    #[inline(always)]
    pub fn less(&self, other: &Key) -> bool {
        self.counter < other.counter || (self.counter == other.counter && self.seq < other.seq)
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: Key,
    id: u32,
    /// `Positions::owner(id)`, kept beside the key (in what was padding).
    owner: u32,
}

#[derive(Debug, Default, Clone)]
pub struct IndexedHeap {
    entries: Vec<Entry>,
}

impl IndexedHeap {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The id and key with the least key.
    #[inline]
    pub fn top(&self) -> Option<(u32, Key)> {
        self.entries.first().map(|e| (e.id, e.key))
    }

    /// The key of the entry at `pos` (which must be valid).
    #[inline]
    pub fn key_at(&self, pos: u32) -> Key {
        self.entries[pos as usize].key
    }

    /// The ids of every entry whose counter is at most `edge`, appended to
    /// `out` (cleared first) in breadth-first heap order: a walk that stops
    /// below any entry past `edge` (its children's keys are no smaller), so
    /// it visits only the entries it returns and their children. `out` is
    /// the caller's scratch: no allocation once it has grown.
    pub fn collect_within(&self, edge: f64, out: &mut Vec<u32>) {
        out.clear();
        if self.entries.first().is_none_or(|e| e.key.counter > edge) {
            return;
        }
        out.push(0);
        let mut i = 0;
        while i < out.len() {
            let pos = out[i] as usize;
            for child in [2 * pos + 1, 2 * pos + 2] {
                if child < self.entries.len() && self.entries[child].key.counter <= edge {
                    out.push(child as u32);
                }
            }
            i += 1;
        }
        for x in out.iter_mut() {
            *x = self.entries[*x as usize].id;
        }
    }

    pub fn push<P: Positions + ?Sized>(&mut self, id: u32, key: Key, p: &mut P) {
        debug_assert_eq!(p.pos(id), NOT_IN_HEAP, "client {id} pushed twice");
        let pos = self.entries.len();
        self.entries.push(Entry {
            key,
            id,
            owner: p.owner(id),
        });
        p.set_pos(id, pos as u32);
        self.sift_up(pos, p);
    }

    /// Remove `id`, wherever it is.
    pub fn remove<P: Positions + ?Sized>(&mut self, id: u32, p: &mut P) {
        let pos = p.pos(id) as usize;
        debug_assert!(pos < self.entries.len() && self.entries[pos].id == id);
        let last = self.entries.len() - 1;
        self.entries.swap(pos, last);
        self.entries.pop();
        p.set_pos(id, NOT_IN_HEAP);
        if pos < last {
            p.set_pos(self.entries[pos].id, pos as u32);
            self.adjust_at(pos, p);
        }
    }

    /// Set a new key for `id` and restore the heap order.
    #[inline]
    pub fn update<P: Positions + ?Sized>(&mut self, id: u32, key: Key, p: &mut P) {
        let pos = p.pos(id) as usize;
        debug_assert!(pos < self.entries.len() && self.entries[pos].id == id);
        let old = self.entries[pos].key;
        self.entries[pos].key = key;
        if key.less(&old) {
            self.sift_up(pos, p);
        } else {
            self.sift_down(pos, p);
        }
    }

    /// Set every entry's counter to `counter(owner)` (its seq kept), without
    /// restoring order; call [`rebuild`](Self::rebuild) before the next
    /// query. Reads no id's record: the owner is in the entry.
    #[inline]
    pub fn set_counters_unordered(&mut self, counter: impl Fn(u32) -> f64) {
        for e in &mut self.entries {
            e.key.counter = counter(e.owner);
        }
    }

    /// Restore heap order after `set_counters_unordered`: O(n)
    /// (Floyd), cheaper than one O(log n) sift per changed key once a
    /// sizeable share of the heap changed.
    pub fn rebuild<P: Positions + ?Sized>(&mut self, p: &mut P) {
        for pos in (0..self.entries.len() / 2).rev() {
            self.sift_down(pos, p);
        }
    }

    fn adjust_at<P: Positions + ?Sized>(&mut self, pos: usize, p: &mut P) {
        if pos > 0 && self.entries[pos].key.less(&self.entries[(pos - 1) / 2].key) {
            self.sift_up(pos, p);
        } else {
            self.sift_down(pos, p);
        }
    }

    fn sift_up<P: Positions + ?Sized>(&mut self, mut pos: usize, p: &mut P) {
        let e = self.entries[pos];
        while pos > 0 {
            let parent = (pos - 1) / 2;
            let pe = self.entries[parent];
            if !e.key.less(&pe.key) {
                break;
            }
            self.entries[pos] = pe;
            p.set_pos(pe.id, pos as u32);
            pos = parent;
        }
        self.entries[pos] = e;
        p.set_pos(e.id, pos as u32);
    }

    fn sift_down<P: Positions + ?Sized>(&mut self, mut pos: usize, p: &mut P) {
        let n = self.entries.len();
        let e = self.entries[pos];
        loop {
            let l = 2 * pos + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.entries[r].key.less(&self.entries[l].key) {
                r
            } else {
                l
            };
            let ce = self.entries[c];
            if !ce.key.less(&e.key) {
                break;
            }
            self.entries[pos] = ce;
            p.set_pos(ce.id, pos as u32);
            pos = c;
        }
        self.entries[pos] = e;
        p.set_pos(e.id, pos as u32);
    }

    /// Check the heap order and the position back-links (tests and fuzzing).
    pub fn check<P: Positions + ?Sized>(&self, p: &P) -> std::result::Result<(), String> {
        for (i, e) in self.entries.iter().enumerate() {
            if p.pos(e.id) as usize != i {
                return Err(format!(
                    "client {} at {i} records position {}",
                    e.id,
                    p.pos(e.id)
                ));
            }
            if i > 0 && e.key.less(&self.entries[(i - 1) / 2].key) {
                return Err(format!("heap order broken at {i}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Positions for Vec<u32> {
        fn set_pos(&mut self, id: u32, pos: u32) {
            self[id as usize] = pos;
        }
        fn pos(&self, id: u32) -> u32 {
            self[id as usize]
        }
    }

    /// A tiny deterministic generator so the tests need no dependency.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    fn key(c: u64, s: u64) -> Key {
        Key {
            counter: c as f64,
            seq: s,
        }
    }

    #[test]
    fn collect_within_returns_exactly_the_entries_up_to_the_edge() {
        let n = 300u32;
        let mut pos = vec![NOT_IN_HEAP; n as usize];
        let mut h = IndexedHeap::new();
        let mut rng = Lcg(11);
        let mut keys = Vec::new();
        for id in 0..n {
            let k = key(rng.next() % 60, id as u64);
            h.push(id, k, &mut pos);
            keys.push(k);
        }
        let mut out = Vec::new();
        for edge in [-1.0, 0.0, 3.0, 17.5, 30.0, 59.0, 1e9] {
            h.collect_within(edge, &mut out);
            let mut got = out.clone();
            got.sort_unstable();
            let want: Vec<u32> = (0..n)
                .filter(|&i| keys[i as usize].counter <= edge)
                .collect();
            assert_eq!(got, want, "edge {edge}");
        }
        IndexedHeap::new().collect_within(1e9, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn pops_in_key_order_with_seq_tiebreak() {
        let mut pos = vec![NOT_IN_HEAP; 4];
        let mut h = IndexedHeap::new();
        h.push(0, key(5, 1), &mut pos);
        h.push(1, key(3, 9), &mut pos);
        h.push(2, key(3, 2), &mut pos);
        h.push(3, key(7, 0), &mut pos);
        let mut order = vec![];
        while let Some((id, _)) = h.top() {
            order.push(id);
            h.remove(id, &mut pos);
            h.check(&pos).unwrap();
        }
        assert_eq!(order, vec![2, 1, 0, 3]);
        assert!(pos.iter().all(|&p| p == NOT_IN_HEAP));
    }

    #[test]
    fn bulk_key_changes_then_rebuild() {
        let n = 500u32;
        let mut pos = vec![NOT_IN_HEAP; n as usize];
        let mut h = IndexedHeap::new();
        let mut rng = Lcg(3);
        for id in 0..n {
            h.push(id, key(rng.next() % 100, id as u64), &mut pos);
        }
        let counters: Vec<f64> = (0..n).map(|_| (rng.next() % 100) as f64).collect();
        h.set_counters_unordered(|id| counters[id as usize]);
        h.rebuild(&mut pos);
        h.check(&pos).unwrap();
        let mut last = None;
        while let Some((id, k)) = h.top() {
            assert_eq!(k.counter, counters[id as usize]);
            if let Some(l) = last {
                assert!(!k.less(&l));
            }
            last = Some(k);
            h.remove(id, &mut pos);
        }
    }

    /// Ids grouped under owners (a band's entities under their clients).
    struct Owned {
        pos: Vec<u32>,
        owner: Vec<u32>,
    }

    impl Positions for Owned {
        fn set_pos(&mut self, id: u32, pos: u32) {
            self.pos[id as usize] = pos;
        }
        fn pos(&self, id: u32) -> u32 {
            self.pos[id as usize]
        }
        fn owner(&self, id: u32) -> u32 {
            self.owner[id as usize]
        }
    }

    #[test]
    fn counters_set_by_owner_keep_each_seq_then_rebuild() {
        let n = 400u32;
        let mut p = Owned {
            pos: vec![NOT_IN_HEAP; n as usize],
            owner: (0..n).map(|id| (id * 7) % 37).collect(),
        };
        let mut h = IndexedHeap::new();
        let mut rng = Lcg(5);
        let seqs: Vec<u64> = (0..n).map(|_| rng.next() % 1000).collect();
        for id in 0..n {
            h.push(id, key(rng.next() % 100, seqs[id as usize]), &mut p);
        }
        // removals and re-pushes move entries; each keeps its owner
        for id in (0..n).step_by(3) {
            h.remove(id, &mut p);
            h.push(id, key(rng.next() % 100, seqs[id as usize]), &mut p);
        }
        let by_owner: Vec<f64> = (0..37).map(|o| 1000.0 + ((o * 13) % 37) as f64).collect();
        h.set_counters_unordered(|o| by_owner[o as usize]);
        h.rebuild(&mut p);
        h.check(&p).unwrap();
        let mut last: Option<Key> = None;
        let mut popped = 0;
        while let Some((id, k)) = h.top() {
            assert_eq!(k.counter, by_owner[p.owner[id as usize] as usize]);
            assert_eq!(k.seq, seqs[id as usize]);
            if let Some(l) = last {
                assert!(!k.less(&l));
            }
            last = Some(k);
            h.remove(id, &mut p);
            popped += 1;
        }
        assert_eq!(popped, n);
    }

    #[test]
    fn random_updates_and_removals_keep_order_and_positions() {
        let n = 200u32;
        let mut pos = vec![NOT_IN_HEAP; n as usize];
        let mut keys: Vec<Option<Key>> = vec![None; n as usize];
        let mut h = IndexedHeap::new();
        let mut rng = Lcg(7);
        for step in 0..20_000u64 {
            let id = (rng.next() % n as u64) as u32;
            match (rng.next() % 3, keys[id as usize]) {
                (0, None) | (1, None) => {
                    let k = key(rng.next() % 50, step);
                    h.push(id, k, &mut pos);
                    keys[id as usize] = Some(k);
                }
                (0, Some(_)) | (1, Some(_)) => {
                    let k = key(rng.next() % 50, step);
                    h.update(id, k, &mut pos);
                    keys[id as usize] = Some(k);
                }
                (_, Some(_)) => {
                    h.remove(id, &mut pos);
                    keys[id as usize] = None;
                }
                (_, None) => {}
            }
            if step % 97 == 0 {
                h.check(&pos).unwrap();
            }
            // The top is always the least live key.
            let best = keys
                .iter()
                .enumerate()
                .filter_map(|(i, k)| k.map(|k| (i as u32, k)))
                .fold(None::<(u32, Key)>, |acc, (i, k)| match acc {
                    Some((_, bk)) if !k.less(&bk) => acc,
                    _ => Some((i, k)),
                });
            assert_eq!(h.top().map(|t| t.1), best.map(|b| b.1));
            assert_eq!(h.len(), keys.iter().filter(|k| k.is_some()).count());
        }
        h.check(&pos).unwrap();
    }
}
