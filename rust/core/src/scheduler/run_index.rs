//! The index of running requests: request id -> slot, consulted once per id
//! by `decode` (and by `finish`/`preempt`), so it is laid out for that probe.
//!
//! Open addressing with linear probing in one array of `(rid, slot)` entries
//! (a free entry has slot [`FREE`]), under half full: a probe hashes the
//! id (one multiply), then reads consecutive 16-byte entries, usually one,
//! from one cache line. (hashbrown's map, used before, read a control group
//! and then the bucket: two lines and ~3x the instructions per probe;
//! bench/README.md, optimisation 15.) Removal shifts the entries after the
//! removed one back (no tombstones), so a probe stops at the first free
//! entry. The array grows by doubling, never shrinks: no allocation once it
//! has held the most requests that run at once.
//!
//! Invariant (checked by `invariants`): exactly the running requests' ids are
//! present, each once, at or after its home position with no free entry
//! between; `len` counts them.

/// A free entry's slot (a request slot is an index below `u32::MAX`).
const FREE: u32 = u32::MAX;

/// Smallest table: 16 entries (256 bytes).
const MIN_BITS: u32 = 4;

#[derive(Debug, Clone, Copy)]
struct Entry {
    rid: u64,
    slot: u32,
}

const EMPTY: Entry = Entry { rid: 0, slot: FREE };

#[derive(Debug, Clone)]
pub(super) struct RunIndex {
    /// `1 << bits` entries.
    table: Vec<Entry>,
    /// `64 - bits`: a home position is the top `bits` bits of the hash.
    shift: u32,
    len: usize,
}

impl Default for RunIndex {
    fn default() -> Self {
        RunIndex {
            table: vec![EMPTY; 1 << MIN_BITS],
            shift: 64 - MIN_BITS,
            len: 0,
        }
    }
}

impl RunIndex {
    /// Fibonacci hashing of the id with its high half folded in first.
    #[inline(always)]
    fn home(&self, rid: u64) -> usize {
        ((rid ^ (rid >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.table.len() - 1
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slot of running request `rid`.
    #[inline]
    pub(super) fn get(&self, rid: u64) -> Option<u32> {
        let mask = self.mask();
        let mut i = self.home(rid);
        loop {
            let e = self.table[i & mask];
            if e.slot == FREE {
                return None;
            }
            if e.rid == rid {
                return Some(e.slot);
            }
            i = (i & mask) + 1;
        }
    }

    /// Add running request `rid` at `slot` (or move it there).
    pub(super) fn insert(&mut self, rid: u64, slot: u32) {
        assert!(slot != FREE, "request slot {slot} is out of range");
        if (self.len + 1) * 2 >= self.table.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(rid) & mask;
        loop {
            let e = &mut self.table[i];
            if e.slot == FREE {
                *e = Entry { rid, slot };
                self.len += 1;
                return;
            }
            if e.rid == rid {
                e.slot = slot;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Take `rid` out, if present.
    pub(super) fn remove(&mut self, rid: u64) {
        let mask = self.mask();
        let mut i = self.home(rid) & mask;
        loop {
            let e = self.table[i];
            if e.slot == FREE {
                return;
            }
            if e.rid == rid {
                break;
            }
            i = (i + 1) & mask;
        }
        // Shift back every later entry of the run that may sit in the hole:
        // one whose home is not cyclically within (hole, j].
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let e = self.table[j];
            if e.slot == FREE {
                break;
            }
            let home = self.home(e.rid) & mask;
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.table[hole] = e;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.table[hole] = EMPTY;
        self.len -= 1;
    }

    #[cold]
    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(&mut self.table, vec![EMPTY; 1 << bits]);
        self.shift = 64 - bits;
        self.len = 0;
        for e in old {
            if e.slot != FREE {
                self.insert(e.rid, e.slot);
            }
        }
    }

    /// The invariant above (for `invariants`).
    pub(super) fn check(&self) -> Result<(), String> {
        let mask = self.mask();
        let mut n = 0;
        for (j, e) in self.table.iter().enumerate() {
            if e.slot == FREE {
                continue;
            }
            n += 1;
            let mut i = self.home(e.rid) & mask;
            while i != j {
                if self.table[i].slot == FREE {
                    return Err(format!(
                        "running index: id {} is cut off from its home",
                        e.rid
                    ));
                }
                if self.table[i].rid == e.rid {
                    return Err(format!("running index: id {} twice", e.rid));
                }
                i = (i + 1) & mask;
            }
        }
        if n != self.len || self.len * 2 >= self.table.len() {
            return Err(format!("running index: {n} entries, len {}", self.len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::RunIndex;
    use std::collections::HashMap;

    /// Random inserts and removals (ids from a small range, so that runs
    /// collide and wrap around the table) against a HashMap.
    #[test]
    fn matches_a_hash_map() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for range in [8u64, 64, 1000, u64::MAX] {
            let mut idx = RunIndex::default();
            let mut map = HashMap::new();
            for step in 0..20_000 {
                let rid = next() % range;
                if next() % 3 == 0 {
                    idx.remove(rid);
                    map.remove(&rid);
                } else {
                    let slot = (next() % 1_000_000) as u32;
                    idx.insert(rid, slot);
                    map.insert(rid, slot);
                }
                assert_eq!(idx.len(), map.len());
                if step % 97 == 0 {
                    idx.check().unwrap();
                    for (&k, &v) in &map {
                        assert_eq!(idx.get(k), Some(v));
                    }
                }
                let probe = next() % range;
                assert_eq!(idx.get(probe), map.get(&probe).copied());
            }
        }
    }
}
