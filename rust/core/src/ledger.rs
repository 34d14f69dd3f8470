//! The sync ledger of shared counters (`vtc.distributed.SharedCounters`):
//! per tenant, the service this replica charged that the store has not
//! acknowledged yet, and what the last read of the scheduler's change feed
//! said of it. It is kept next to the core so that a sync after every tenant
//! was charged does not fold, encode and look up each tenant in Python
//! (issue 15 item 5: that was most of the GIL a background sync takes from
//! the engine thread).
//!
//! A [`SyncLedger`] owns one change-feed reader slot of the scheduler it
//! serves. Each [`read`](SyncLedger::read) folds the service of the tenants
//! changed since the last read into their unacknowledged amounts and follows
//! whether each has requests waiting (or set aside), returning only the
//! tenants whose waiting state changed; [`acknowledge`](SyncLedger::acknowledge)
//! empties the amounts once the store applied them.
//!
//! The fold rule (the one `SharedCounters.fold_changed` keeps for schedulers
//! without a feed): a tenant's service only grows while it is live, so what
//! it gained since the last read is `service - seen`; a service smaller than
//! what was seen, or a tenant not seen (new, or back after `forget_idle`
//! forgot it: the feed reports it gone first), is all new. Tenants are
//! matched by key, as the store names them: a key forgotten and back is the
//! same tenant (its service starts again from 0), an id reused by another
//! key is not. Clients without a key (`Scheduler::add_client`) are not
//! tenants and are left out.
//!
//! Invariant (checked by [`SyncLedger::check`]): every entry has a positive
//! unacknowledged amount, or a service seen at the last read, or waiting
//! requests at the last read (an entry with none of the three is dropped);
//! an entry waiting was live and keyed at the read that said so.

use std::collections::HashMap;

use crate::client::ClientId;
use crate::error::Result;
use crate::keys::ClientKey;
use crate::scheduler::{Gone, Scheduler};

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The tenant's service at the last read that saw it live; `None`: not
    /// live then (forgotten, or not read yet).
    seen: Option<f64>,
    /// Service folded since the last acknowledgment (>= 0).
    unacked: f64,
    /// Waiting or set-aside requests at the last read.
    waiting: bool,
    /// The full read that last saw it (full reads drop what they miss).
    stamp: u64,
}

impl Entry {
    fn idle(&self) -> bool {
        self.seen.is_none() && self.unacked == 0.0 && !self.waiting
    }
}

/// What one [`SyncLedger::read`] found. The vectors are the caller's to
/// keep between reads (cleared at each, their capacity kept).
#[derive(Debug, Clone, Default)]
pub struct Read {
    /// The reader's first read (or after a reset): `entered` then holds
    /// every tenant waiting now and `left` nothing.
    pub full: bool,
    /// Tenants with nothing waiting at the last read and something now.
    pub entered: Vec<ClientKey>,
    /// Tenants waiting at the last read and not now (forgotten ones
    /// included).
    pub left: Vec<ClientKey>,
    /// With `idle` asked: every changed tenant with nothing waiting now.
    pub idle: Vec<ClientKey>,
    /// Tenants forgotten since the last read (by `forget_idle`).
    pub gone: Vec<ClientKey>,
    /// Rows read: changed tenants plus forgotten ones.
    pub rows: usize,
}

impl Read {
    fn clear(&mut self) {
        self.full = false;
        self.entered.clear();
        self.left.clear();
        self.idle.clear();
        self.gone.clear();
        self.rows = 0;
    }
}

/// One replica's unacknowledged service by tenant. See the module doc.
#[derive(Debug, Clone)]
pub struct SyncLedger {
    reader: usize,
    entries: HashMap<ClientKey, Entry>,
    /// Full reads so far (the stamp of the current one).
    reads: u64,
    changed: Vec<ClientId>,
    gone: Vec<Gone>,
}

impl SyncLedger {
    /// A ledger reading the scheduler's change-feed slot `reader`.
    pub fn new(reader: usize) -> Self {
        SyncLedger {
            reader,
            entries: HashMap::new(),
            reads: 0,
            changed: Vec::new(),
            gone: Vec::new(),
        }
    }

    pub fn reader(&self) -> usize {
        self.reader
    }

    /// Start serving `sched`: its reader slot starts again (the next read
    /// is full) and the service it holds now counts as already seen, so what
    /// was charged before (a scheduler restored from a snapshot) is never
    /// pushed. Unacknowledged amounts are kept.
    pub fn reset(&mut self, sched: &mut Scheduler) -> Result<()> {
        sched.reset_changes(self.reader)?;
        for e in self.entries.values_mut() {
            e.seen = None;
            e.waiting = false;
        }
        for (c, key) in sched.keyed_clients() {
            let service = sched.service(c)?;
            match self.entries.get_mut(key) {
                Some(e) => e.seen = Some(service),
                None => {
                    let e = Entry {
                        seen: Some(service),
                        unacked: 0.0,
                        waiting: false,
                        stamp: 0,
                    };
                    self.entries.insert(key.clone(), e);
                }
            }
        }
        self.entries.retain(|_, e| !e.idle());
        Ok(())
    }

    /// Fold what `sched` charged since the last read and follow the waiting
    /// tenants; `idle`: also list every changed tenant with nothing waiting.
    /// O(changed tenants), O(tenants) for a full read.
    pub fn read(&mut self, sched: &mut Scheduler, idle: bool, out: &mut Read) -> Result<()> {
        out.clear();
        self.changed.clear();
        self.gone.clear();
        let full = sched.changes(self.reader, &mut self.changed, &mut self.gone)?;
        // taken out while the entries change (given back at the end: their capacity)
        let changed = std::mem::take(&mut self.changed);
        let mut gone = std::mem::take(&mut self.gone);
        out.full = full;
        out.rows = changed.len() + gone.len();
        for (_, key) in gone.drain(..) {
            let Some(key) = key else { continue };
            if let Some(e) = self.entries.get_mut(&key) {
                e.seen = None;
                if e.waiting {
                    e.waiting = false;
                    out.left.push(key.clone());
                }
                if e.idle() {
                    self.entries.remove(&key);
                }
            }
            out.gone.push(key);
        }
        if full {
            self.reads += 1;
        }
        let stamp = self.reads;
        for &c in &changed {
            let (Ok(cl), Some(key)) = (sched.client(c), sched.key(c)) else {
                continue;
            };
            let service = cl.service();
            let waiting = cl.num_waiting() + cl.num_aside() > 0;
            let e = match self.entries.get_mut(key) {
                Some(e) => e,
                None => {
                    let e = Entry {
                        seen: None,
                        unacked: 0.0,
                        waiting: false,
                        stamp,
                    };
                    self.entries.entry(key.clone()).or_insert(e)
                }
            };
            e.stamp = stamp;
            if e.seen != Some(service) {
                let gained = match e.seen {
                    Some(old) if service >= old => service - old,
                    _ => service, // not seen, or smaller: forgotten and back, all new
                };
                e.seen = Some(service);
                if gained > 0.0 {
                    e.unacked += gained;
                }
            }
            if full {
                e.waiting = waiting;
                if waiting {
                    out.entered.push(key.clone());
                }
            } else if waiting != e.waiting {
                e.waiting = waiting;
                if waiting {
                    out.entered.push(key.clone());
                } else {
                    out.left.push(key.clone());
                }
            }
            if idle && !waiting {
                out.idle.push(key.clone());
            }
        }
        if full {
            // a full read lists every live tenant: the others are not live
            for e in self.entries.values_mut() {
                if e.stamp != stamp {
                    e.seen = None;
                    e.waiting = false;
                }
            }
            self.entries.retain(|_, e| !e.idle());
        }
        self.changed = changed;
        self.gone = gone;
        Ok(())
    }

    /// The store applied every amount pushed: none is unacknowledged now.
    /// O(tenants in the ledger).
    pub fn acknowledge(&mut self) {
        for e in self.entries.values_mut() {
            e.unacked = 0.0;
        }
        self.entries.retain(|_, e| !e.idle());
    }

    /// The scheduler forgot `keys` without this ledger reading the feed in
    /// between (their service starts again from 0): drop what was seen.
    pub fn forget<'a>(&mut self, keys: impl IntoIterator<Item = &'a ClientKey>) {
        for key in keys {
            if let Some(e) = self.entries.get_mut(key) {
                e.seen = None;
                if e.idle() {
                    self.entries.remove(key);
                }
            }
        }
    }

    /// Every tenant with an unacknowledged amount, and the amount (> 0).
    pub fn unacked(&self) -> impl Iterator<Item = (&ClientKey, f64)> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| e.unacked > 0.0)
            .map(|(k, e)| (k, e.unacked))
    }

    /// The unacknowledged amount of `key` (0 for none).
    pub fn unacked_of(&self, key: &ClientKey) -> f64 {
        self.entries.get(key).map_or(0.0, |e| e.unacked)
    }

    /// Tenants with an unacknowledged amount.
    pub fn num_unacked(&self) -> usize {
        self.entries.values().filter(|e| e.unacked > 0.0).count()
    }

    /// Whether `key` had requests waiting at the last read.
    pub fn waiting(&self, key: &ClientKey) -> bool {
        self.entries.get(key).is_some_and(|e| e.waiting)
    }

    /// The service last seen of `key` (`None`: not live at the last read).
    pub fn seen(&self, key: &ClientKey) -> Option<f64> {
        self.entries.get(key).and_then(|e| e.seen)
    }

    /// Entries kept (tenants with an amount, a service seen or waiting).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The module doc's invariant.
    pub fn check(&self) -> std::result::Result<(), String> {
        for (k, e) in &self.entries {
            if e.idle() {
                return Err(format!("ledger keeps an idle entry {k:?}"));
            }
            if !(e.unacked >= 0.0 && e.unacked.is_finite()) {
                return Err(format!("ledger entry {k:?} has amount {}", e.unacked));
            }
        }
        Ok(())
    }
}

impl SyncLedger {
    /// Each of `pulled` (tenant, global counter from the store) with what it
    /// should be raised to: the global counter plus the tenant's
    /// unacknowledged amount (what was charged here since the fold the store
    /// acknowledged, i.e. during the round trip); `None` past `MAX_COUNTER`
    /// (left out).
    fn raise_targets<'a>(
        &'a self,
        pulled: &'a [(ClientKey, f64)],
    ) -> impl Iterator<Item = (&'a ClientKey, Option<f64>)> + 'a {
        pulled.iter().map(|(k, g)| {
            let v = g + self.unacked_of(k);
            (k, (v <= crate::limits::MAX_COUNTER).then_some(v))
        })
    }

    /// The raise targets of `pulled` (see `raise_targets`) appended to
    /// `out`; returns how many were left out.
    pub fn raise_values(
        &self,
        pulled: &[(ClientKey, f64)],
        out: &mut Vec<(ClientKey, f64)>,
    ) -> usize {
        let mut skipped = 0;
        for (k, v) in self.raise_targets(pulled) {
            match v {
                Some(v) => out.push((k.clone(), v)),
                None => skipped += 1,
            }
        }
        skipped
    }

    /// [`raise_values`](Self::raise_values) applied to `sched` in one call
    /// (`Scheduler::raise_counters_keyed`): `(raised, left out)`.
    pub fn raise_pulled(
        &self,
        sched: &mut Scheduler,
        pulled: &[(ClientKey, f64)],
    ) -> Result<(usize, usize)> {
        let mut skipped = 0;
        let mut items = Vec::with_capacity(pulled.len());
        for (k, v) in self.raise_targets(pulled) {
            match v {
                Some(v) => items.push((k.as_key_ref(), v)),
                None => skipped += 1,
            }
        }
        Ok((sched.raise_counters_keyed(&items)?, skipped))
    }
}
