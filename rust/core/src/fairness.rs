//! The window figures of the per-tenant metrics (`vtc.metrics`), kept next
//! to the core so that a metrics refresh does not walk every tenant in
//! Python: Jain's index (`vtc_fairness_jain_index`), the counter spread
//! (`vtc_counter_spread`) and each tenant's service over the window (which
//! tenants get their own label).
//!
//! A [`FairnessWindow`] keeps snapshots of every keyed client's service, and
//! whether it was backlogged (waiting or set-aside requests), one every
//! `window / 32` seconds at most, and drops those no longer needed: the
//! window's start is the last snapshot at least `window` old, else the first.
//! [`FairnessWindow::refresh`] returns, in one pass over the clients:
//!
//! * Jain's index `(sum g)^2 / (n * sum g^2)` of the services `g` gained
//!   since the window's start by the clients backlogged both then and now
//!   (NaN when there are none or all gained 0; `None` when the window has no
//!   start before `now`, the first refresh);
//! * the counter spread: max - min counter of the clients backlogged now (0
//!   with fewer than two).
//!
//! After it, [`gains`](FairnessWindow::gains) and
//! [`above`](FairnessWindow::above) give clients' services gained since that
//! refresh's start (0 before for a client not in it; the whole service when
//! the refresh had no start).
//!
//! Clients are matched across snapshots by key, as the metrics name tenants:
//! a client forgotten and back under its key is the same tenant (its service
//! then starts again), a forgotten client's id taken by another key is not.
//! Clients without a key (`add_client`) are not tenants and are left out.
//! The window interns the keys it has seen (once each) and forgets those no
//! snapshot holds when they have doubled since the last pruning.
//!
//! Every value is computed as `vtc.metrics` computed it in Python before
//! (issue 16 item 6), up to the order of the floating-point sums.

use std::collections::{HashMap, VecDeque};

use crate::client::ClientId;
use crate::keys::{ClientKey, KeyRef};
use crate::scheduler::Scheduler;

/// No local index (`FairnessWindow::by_id`).
const NONE: u32 = u32::MAX;

/// Snapshots per window: one is taken when the last is `window / SLICES` old.
pub const SLICES: f64 = 32.0;

/// A client in a snapshot: its local index, service, and whether it was
/// backlogged.
#[derive(Debug, Clone, Copy)]
struct Entry {
    local: u32,
    service: f64,
    backlogged: bool,
}

#[derive(Debug, Clone)]
struct Snapshot {
    time: f64,
    entries: Vec<Entry>,
}

/// What one [`FairnessWindow::refresh`] returns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Jain's index of the gains over the window (see the module doc);
    /// `None` when the window's start is not before `now`.
    pub jain: Option<f64>,
    /// Max - min counter of the clients backlogged now (0 below two).
    pub spread: f64,
    /// Clients backlogged now.
    pub backlogged: usize,
}

/// By local index: the last refresh that saw the client (backlogged or
/// not) and its service then, and its service at that refresh's start.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    stamp: u64,
    service: f64,
    backlogged: bool,
    start_stamp: u64,
    before: f64,
}

/// The snapshots of one metrics reader (see the module doc).
#[derive(Debug, Clone)]
pub struct FairnessWindow {
    window: f64,
    history: VecDeque<Snapshot>,
    /// Local index -> key, and back.
    keys: Vec<ClientKey>,
    index: HashMap<ClientKey, u32>,
    /// By client id: the local index last seen for it (checked by key: ids
    /// are reused, other schedulers may be read).
    by_id: Vec<u32>,
    seen: Vec<Seen>,
    refreshes: u64,
    /// The entries of the next snapshot: empty between refreshes, its
    /// capacity kept (the entries of the snapshots dropped come back here),
    /// so that a refresh allocates nothing once warmed up.
    spare: Vec<Entry>,
    /// Prune the keys once there are this many.
    prune_at: usize,
}

impl FairnessWindow {
    /// A window of `window` seconds; `None` unless `window > 0` (infinity
    /// allowed: the first snapshot stays the start).
    pub fn new(window: f64) -> Option<Self> {
        (window > 0.0).then(|| FairnessWindow {
            window,
            history: VecDeque::new(),
            keys: Vec::new(),
            index: HashMap::new(),
            by_id: Vec::new(),
            seen: Vec::new(),
            refreshes: 0,
            spare: Vec::new(),
            prune_at: 1024,
        })
    }

    pub fn window(&self) -> f64 {
        self.window
    }

    /// Snapshots kept (at most ~`SLICES` + 2 while time moves forward).
    pub fn snapshots(&self) -> usize {
        self.history.len()
    }

    /// The figures of `core` at time `now` (seconds, any clock that does not
    /// go back), taking a snapshot when one is due. O(clients + the
    /// window's start); never fails (a `now` that goes back or is NaN takes
    /// no snapshot and drops none).
    pub fn refresh(&mut self, core: &Scheduler, now: f64) -> Figures {
        self.refreshes += 1;
        let stamp = self.refreshes;
        let (mut low, mut high, mut backlogged) = (f64::INFINITY, f64::NEG_INFINITY, 0usize);
        // The snapshots the window no longer needs go first (their entries'
        // buffer is kept for the next one); dropping them changes neither the
        // last snapshot (so whether one is due) nor the clients read below.
        while self.history.len() > 1 && now - self.history[1].time >= self.window {
            if let Some(old) = self.history.pop_front() {
                if old.entries.capacity() > self.spare.capacity() {
                    self.spare = old.entries;
                }
            }
        }
        let due = match self.history.back() {
            None => true,
            Some(last) => now - last.time >= self.window / SLICES,
        };
        let mut current = std::mem::take(&mut self.spare);
        current.clear();
        for (c, key) in core.keyed_clients() {
            let Ok(cl) = core.client(c) else { continue };
            let waiting = cl.num_waiting() + cl.num_aside() > 0;
            if waiting {
                backlogged += 1;
                low = low.min(cl.counter());
                high = high.max(cl.counter());
            }
            let l = self.local(c.0, key);
            let seen = &mut self.seen[l as usize];
            seen.stamp = stamp;
            seen.service = cl.service();
            seen.backlogged = waiting;
            if due {
                current.push(Entry {
                    local: l,
                    service: cl.service(),
                    backlogged: waiting,
                });
            }
        }
        let spread = if backlogged > 1 { high - low } else { 0.0 };

        let mut jain = None;
        if let Some(start) = self.history.front() {
            for e in &start.entries {
                let seen = &mut self.seen[e.local as usize];
                seen.start_stamp = stamp;
                seen.before = e.service;
            }
            if now > start.time {
                let seen = &self.seen;
                jain = Some(jain_index(start.entries.iter().filter_map(|e| {
                    let s = &seen[e.local as usize];
                    (e.backlogged && s.stamp == stamp && s.backlogged)
                        .then_some(s.service - e.service)
                })));
            }
        }
        if due {
            self.history.push_back(Snapshot {
                time: now,
                entries: current,
            });
        } else {
            self.spare = current;
        }
        if self.keys.len() >= self.prune_at {
            self.prune();
        }
        Figures {
            jain,
            spread,
            backlogged,
        }
    }

    /// The service client `c` (key `key`) gained since the last refresh's
    /// window start: its service less its service then (0 if it was not
    /// in the start, or the refresh had none).
    pub(crate) fn gain(&self, c: ClientId, key: &ClientKey, service: f64) -> f64 {
        let before = match self.find(c.0, key) {
            Some(l) if self.seen[l as usize].start_stamp == self.refreshes => {
                self.seen[l as usize].before
            }
            _ => 0.0,
        };
        service - before
    }

    /// The service each of `keys` gained over the last refresh's window
    /// (see [`gain`](Self::gain)); NaN for a key `core` does not have.
    pub fn gains(&self, core: &Scheduler, keys: &[KeyRef<'_>]) -> Vec<f64> {
        keys.iter()
            .map(|k| {
                let Some(c) = core.client_of(k) else {
                    return f64::NAN;
                };
                match (core.key(c), core.client(c)) {
                    (Some(key), Ok(cl)) => self.gain(c, key, cl.service()),
                    _ => f64::NAN,
                }
            })
            .collect()
    }

    /// Every keyed client of `core` that gained more than `bar` over the
    /// last refresh's window, with its gain, in client id order.
    pub fn above<'c>(&self, core: &'c Scheduler, bar: f64) -> Vec<(&'c ClientKey, f64)> {
        core.keyed_clients()
            .filter_map(|(c, key)| {
                let cl = core.client(c).ok()?;
                let g = self.gain(c, key, cl.service());
                (g > bar).then_some((key, g))
            })
            .collect()
    }

    /// The local index of client `c` with key `key`, if interned.
    fn find(&self, c: u32, key: &ClientKey) -> Option<u32> {
        match self.by_id.get(c as usize) {
            Some(&l) if l != NONE && self.keys[l as usize] == *key => Some(l),
            _ => self.index.get(key).copied(),
        }
    }

    /// The local index of client `c` with key `key`, interned if new.
    fn local(&mut self, c: u32, key: &ClientKey) -> u32 {
        let i = c as usize;
        if i >= self.by_id.len() {
            self.by_id.resize(i + 1, NONE);
        }
        let l = self.by_id[i];
        if l != NONE && self.keys[l as usize] == *key {
            return l;
        }
        let l = match self.index.get(key) {
            Some(&l) => l,
            None => {
                let l = self.keys.len() as u32;
                self.keys.push(key.clone());
                self.index.insert(key.clone(), l);
                self.seen.push(Seen::default());
                l
            }
        };
        self.by_id[i] = l;
        l
    }

    /// Forget the keys no snapshot holds and renumber the rest; the next
    /// pruning once the keys have doubled. Amortized O(1) per key interned
    /// and snapshot entry.
    fn prune(&mut self) {
        let mut renumber = vec![NONE; self.keys.len()];
        let mut keys = Vec::new();
        let mut seen = Vec::new();
        for snapshot in &mut self.history {
            for entry in &mut snapshot.entries {
                let old = entry.local as usize;
                if renumber[old] == NONE {
                    renumber[old] = keys.len() as u32;
                    keys.push(std::mem::replace(&mut self.keys[old], ClientKey::Int(0)));
                    seen.push(self.seen[old]);
                }
                entry.local = renumber[old];
            }
        }
        self.index = keys
            .iter()
            .enumerate()
            .map(|(l, k)| (k.clone(), l as u32))
            .collect();
        self.keys = keys;
        self.seen = seen;
        for l in &mut self.by_id {
            *l = if *l == NONE {
                NONE
            } else {
                renumber[*l as usize]
            };
        }
        self.prune_at = (2 * self.keys.len()).max(1024);
    }

    /// Check the window's own consistency (tests, fuzzing).
    pub fn check(&self) -> Result<(), String> {
        if self.keys.len() != self.index.len() || self.keys.len() != self.seen.len() {
            return Err("fairness window: key tables differ in length".into());
        }
        for (l, k) in self.keys.iter().enumerate() {
            if self.index.get(k) != Some(&(l as u32)) {
                return Err(format!("fairness window: key {l} not indexed"));
            }
        }
        let n = self.keys.len() as u32;
        if self.by_id.iter().any(|&l| l != NONE && l >= n)
            || self
                .history
                .iter()
                .any(|s| s.entries.iter().any(|e| e.local >= n))
        {
            return Err("fairness window: a local index out of range".into());
        }
        Ok(())
    }
}

/// Jain's fairness index `(sum x)^2 / (n * sum x^2)` of `values`: 1 when all
/// are equal, `1/n` when one has everything; NaN for none or all zero.
pub fn jain_index(values: impl IntoIterator<Item = f64>) -> f64 {
    let (mut n, mut sum, mut square) = (0usize, 0.0f64, 0.0f64);
    for x in values {
        n += 1;
        sum += x;
        square += x * x;
    }
    if n == 0 || square <= 0.0 {
        return f64::NAN;
    }
    sum * sum / (n as f64 * square)
}
