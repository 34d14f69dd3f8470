//! The per-tenant metrics' mirror of every tenant (`vtc.metrics`,
//! `TenantMetrics`), kept in the core: each keyed client's last row read
//! from the scheduler's change feed ([`Scheduler::changes`]), the token
//! increments not yet exported, and the totals over every tenant (waiting
//! and running requests, tenants with either). A refresh read the feed into
//! a Python dict (a key and a 6-tuple per changed tenant), looked the old
//! rows up and tallied the differences in Python (~0.25 ms a refresh at
//! 1,000 tenants, ~310 changed; issue 16 item 6); here one call reads the
//! feed ([`MetricsMirror::read`]) and one ([`MetricsMirror::take`]) returns
//! only what the series need: the rows and increments of the labelled
//! tenants, and the sums of the rest.
//!
//! The rules, as the Python tallied them:
//!
//! - a changed client's waiting (set-aside included) and running requests
//!   replace its last ones in the totals, and it is active when it has
//!   either;
//! - its prompt and decode tallies grew by the difference with its last
//!   row, both counted from zero when either went back (a client forgotten
//!   and back: the core's tallies start again);
//! - a full read (the reader's first, or after `reset_changes`) compares
//!   each client with the row of its key (not its id: the mirror may be of
//!   another scheduler), and drops the keys it no longer has;
//! - a client dropped (forgotten, [`MetricsMirror::drop_keys`], or left out
//!   of a full read) leaves the totals, and its increments not yet taken
//!   stay its key's until the next [`MetricsMirror::take`]: its own if it
//!   is labelled then, else summed with the rest.
//!
//! Never panics; a reader slot out of range is the core's error.

use std::collections::{HashMap, HashSet};

use crate::client::ClientId;
use crate::error::Result;
use crate::keys::{ClientKey, KeyRef};
use crate::scheduler::{Gone, Scheduler};

/// A tenant's row as the change feed gives it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    pub counter: f64,
    pub service: f64,
    pub prompt: u64,
    pub decode: u64,
    /// Waiting requests, set-aside ones included.
    pub waiting: usize,
    pub running: usize,
}

impl Row {
    fn active(&self) -> bool {
        self.waiting > 0 || self.running > 0
    }
}

#[derive(Debug, Clone)]
struct Entry {
    key: ClientKey,
    row: Row,
    /// Prompt and decode tokens not yet taken.
    pending: (u64, u64),
    dirty: bool,
    /// The [`MetricsMirror::take`] that last took it.
    taken: u64,
}

/// What [`MetricsMirror::take`] gives for a refresh.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Taken {
    /// `(index into labelled, counter, waiting, running)` of each labelled
    /// tenant changed since the last take or asked for (`fresh`); the
    /// counter None for one the mirror does not have.
    pub rows: Vec<(usize, Option<f64>, usize, usize)>,
    /// `(index into labelled, prompt, decode)` tokens of each labelled
    /// tenant with some.
    pub increments: Vec<(usize, u64, u64)>,
    /// The prompt and decode tokens of every other tenant, summed.
    pub other_tokens: (u64, u64),
    /// The waiting and running requests of every tenant not labelled.
    pub other_requests: (usize, usize),
    /// Tenants with waiting or running requests.
    pub active: usize,
}

/// Keys to ids, looked up by a borrowed key without a copy.
#[derive(Debug, Default)]
struct Index {
    ints: HashMap<i64, u32>,
    strs: HashMap<Box<[u8]>, u32>,
}

impl Index {
    fn get(&self, k: &KeyRef<'_>) -> Option<u32> {
        match k {
            KeyRef::Int(i) => self.ints.get(i).copied(),
            KeyRef::Str(b) => self.strs.get(&b[..]).copied(),
        }
    }

    fn get_key(&self, k: &ClientKey) -> Option<u32> {
        match k {
            ClientKey::Int(i) => self.ints.get(i).copied(),
            ClientKey::Str(b) => self.strs.get(&b[..]).copied(),
        }
    }

    fn insert(&mut self, k: ClientKey, id: u32) {
        match k {
            ClientKey::Int(i) => self.ints.insert(i, id),
            ClientKey::Str(b) => self.strs.insert(b, id),
        };
    }

    fn remove(&mut self, k: &ClientKey) {
        match k {
            ClientKey::Int(i) => self.ints.remove(i),
            ClientKey::Str(b) => self.strs.remove(&b[..]),
        };
    }

    fn clear(&mut self) {
        self.ints.clear();
        self.strs.clear();
    }

    fn len(&self) -> usize {
        self.ints.len() + self.strs.len()
    }
}

/// See the module doc.
#[derive(Debug, Default)]
pub struct MetricsMirror {
    entries: Vec<Option<Entry>>,
    index: Index,
    dirty: Vec<u32>,
    /// Increments of dropped keys, not yet taken.
    dropped: HashMap<ClientKey, (u64, u64)>,
    /// Increments for the sum of the rest at the next take.
    folded: (u64, u64),
    waiting: usize,
    running: usize,
    active: usize,
    /// Takes so far.
    epoch: u64,
    /// Tenants dropped so far (forgotten, or gone at a full read).
    removed: u64,
    changed: Vec<ClientId>,
    gone: Vec<Gone>,
}

fn add(a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
    (a.0.saturating_add(b.0), a.1.saturating_add(b.1))
}

/// The tokens a row's tallies grew by since `was` (from zero when either went
/// back: the client forgotten and back).
fn grown(was: &Row, row: &Row) -> (u64, u64) {
    if was.prompt > row.prompt || was.decode > row.decode {
        (row.prompt, row.decode)
    } else {
        (row.prompt - was.prompt, row.decode - was.decode)
    }
}

impl MetricsMirror {
    pub fn new() -> Self {
        Self::default()
    }

    /// Tenants mirrored.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// `(active, waiting, running)` over every tenant.
    pub fn totals(&self) -> (usize, usize, usize) {
        (self.active, self.waiting, self.running)
    }

    /// Every tenant's key and row, in id order.
    pub fn rows(&self) -> impl Iterator<Item = (&ClientKey, &Row)> {
        self.entries.iter().flatten().map(|e| (&e.key, &e.row))
    }

    pub fn contains(&self, k: &KeyRef<'_>) -> bool {
        self.index.get(k).is_some()
    }

    /// Tenants dropped so far: while it is unchanged, every tenant mirrored at
    /// some point since is mirrored still.
    pub fn removed(&self) -> u64 {
        self.removed
    }

    fn remove_at(&mut self, id: u32) {
        let Some(e) = self.entries.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        self.leave(&e.row);
        self.index.remove(&e.key);
        self.removed += 1;
        if e.pending != (0, 0) {
            let p = self.dropped.entry(e.key).or_insert((0, 0));
            *p = add(*p, e.pending);
        }
    }

    fn enter(&mut self, row: &Row) {
        self.waiting = self.waiting.saturating_add(row.waiting);
        self.running = self.running.saturating_add(row.running);
        self.active += usize::from(row.active());
    }

    fn leave(&mut self, row: &Row) {
        self.waiting = self.waiting.saturating_sub(row.waiting);
        self.running = self.running.saturating_sub(row.running);
        self.active = self.active.saturating_sub(usize::from(row.active()));
    }

    /// Drop the tenants of `keys` (the core forgets them): their increments
    /// not yet taken stay their keys' (`fold` false) or go to the sum of the
    /// rest at the next take (`fold` true), with those their keys had.
    pub fn drop_keys(&mut self, keys: &[KeyRef<'_>], fold: bool) {
        for k in keys {
            if let Some(id) = self.index.get(k) {
                self.remove_at(id);
            }
            if fold && !self.dropped.is_empty() {
                if let Some(p) = self.dropped.remove(&ClientKey::from(k)) {
                    self.folded = add(self.folded, p);
                }
            }
        }
    }

    /// Apply `core`'s changes since reader slot `reader`'s last call.
    /// Returns whether it was a full read.
    pub fn read(&mut self, core: &mut Scheduler, reader: usize) -> Result<bool> {
        self.changed.clear();
        self.gone.clear();
        let full = core.changes(reader, &mut self.changed, &mut self.gone)?;
        // taken out while the entries change (given back at the end: their capacity)
        let changed = std::mem::take(&mut self.changed);
        let gone = std::mem::take(&mut self.gone);
        // The rows to compare with, by key on a full read.
        let mut before: HashMap<ClientKey, Entry> = HashMap::new();
        if full {
            for mut e in std::mem::take(&mut self.entries).into_iter().flatten() {
                self.leave(&e.row);
                e.dirty = false; // the list is cleared: marked again when read
                before.insert(e.key.clone(), e);
            }
            self.index.clear();
            self.dirty.clear();
        } else {
            for (c, key) in &gone {
                let same = match (self.entries.get(c.0 as usize), key) {
                    (Some(Some(e)), Some(k)) => e.key == *k,
                    (Some(Some(_)), None) => true,
                    _ => false,
                };
                if same {
                    self.remove_at(c.0);
                }
            }
        }
        for &c in &changed {
            let (Ok(cl), Some(key)) = (core.client(c), core.key(c)) else {
                continue;
            };
            let row = Row {
                counter: cl.counter(),
                service: cl.service(),
                prompt: cl.prompt_tokens(),
                decode: cl.decode_tokens(),
                waiting: cl.num_waiting() + cl.num_aside(),
                running: cl.num_running(),
            };
            let id = c.0 as usize;
            if self.entries.len() <= id {
                self.entries.resize(id + 1, None);
            }
            // a row of another key at this id: the feed missed its going
            if matches!(&self.entries[id], Some(e) if e.key != *key) {
                self.remove_at(c.0);
            }
            if let Some(e) = self.entries[id].as_mut() {
                // the key's row, updated in place
                let was = e.row;
                e.pending = add(e.pending, grown(&was, &row));
                e.row = row;
                let newly = !e.dirty;
                e.dirty = true;
                self.leave(&was);
                self.enter(&row);
                if newly {
                    self.dirty.push(c.0);
                }
                continue;
            }
            if let Some(other) = self.index.get_key(key) {
                self.remove_at(other); // at another id: the feed missed its going
            }
            let (pending, was) = match before.remove(key) {
                Some(e) => (e.pending, e.row),
                None => ((0, 0), Row::default()),
            };
            self.enter(&row);
            self.dirty.push(c.0);
            self.index.insert(key.clone(), c.0);
            self.entries[id] = Some(Entry {
                key: key.clone(),
                row,
                pending: add(pending, grown(&was, &row)),
                dirty: true,
                taken: 0,
            });
        }
        for (key, e) in before {
            // left out of a full read: dropped (already out of the totals)
            self.removed += 1;
            if e.pending != (0, 0) {
                let p = self.dropped.entry(key).or_insert((0, 0));
                *p = add(*p, e.pending);
            }
        }
        self.changed = changed;
        self.gone = gone;
        Ok(full)
    }

    /// The refresh's part for the tenants of `labelled` (the tenants with a
    /// label; a key repeated counts once, at its first index): see
    /// [`Taken`]; the tenants of `fresh` among them get their rows whether
    /// they changed or not. Every increment is taken and every tenant marked
    /// unchanged.
    pub fn take(&mut self, labelled: &[KeyRef<'_>], fresh: &[KeyRef<'_>]) -> Taken {
        let mut out = Taken::default();
        let fresh: HashSet<ClientKey> = fresh.iter().map(ClientKey::from).collect();
        let (mut lw, mut lr) = (0usize, 0usize);
        self.epoch = self.epoch.wrapping_add(1);
        let epoch = self.epoch;
        for (i, k) in labelled.iter().enumerate() {
            let wanted = !fresh.is_empty() && fresh.contains(&ClientKey::from(k));
            let mut tokens = (0, 0);
            if !self.dropped.is_empty() {
                if let Some(p) = self.dropped.remove(&ClientKey::from(k)) {
                    tokens = p;
                }
            }
            let entry = self
                .index
                .get(k)
                .and_then(|id| self.entries.get_mut(id as usize))
                .and_then(Option::as_mut);
            match entry {
                Some(e) if e.taken == epoch => continue, // a key repeated
                Some(e) => {
                    e.taken = epoch;
                    tokens = add(tokens, std::mem::take(&mut e.pending));
                    lw += e.row.waiting;
                    lr += e.row.running;
                    if e.dirty || wanted {
                        out.rows
                            .push((i, Some(e.row.counter), e.row.waiting, e.row.running));
                    }
                }
                None if wanted => out.rows.push((i, None, 0, 0)),
                None => {}
            }
            if tokens != (0, 0) {
                out.increments.push((i, tokens.0, tokens.1));
            }
        }
        let mut other = std::mem::take(&mut self.folded);
        for id in self.dirty.drain(..) {
            if let Some(Some(e)) = self.entries.get_mut(id as usize) {
                e.dirty = false;
                other = add(other, std::mem::take(&mut e.pending));
            }
        }
        for (_, p) in self.dropped.drain() {
            other = add(other, p);
        }
        out.other_tokens = other;
        out.other_requests = (
            self.waiting.saturating_sub(lw),
            self.running.saturating_sub(lr),
        );
        out.active = self.active;
        out
    }
}
