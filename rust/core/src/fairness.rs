//! The fairness figures of the per-tenant metrics over a sliding window
//! (`vtc.metrics`: `vtc_fairness_jain_index`, `vtc_counter_spread`), kept
//! next to the core so that a metrics refresh does not walk every tenant in
//! Python.
//!
//! A [`FairnessWindow`] keeps snapshots of the services of the clients
//! backlogged (waiting or set-aside requests) at the time of each, one every
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
//! Clients are matched across snapshots by key, as the metrics name tenants:
//! a client forgotten and back under its key is the same tenant (its service
//! then starts again), a forgotten client's id taken by another key is not.
//! Clients without a key (`add_client`) are not tenants and are left out.
//! The window holds the keys of the clients in its snapshots (interned once
//! each) and forgets the others when they outnumber those.
//!
//! Every value is computed as `vtc.metrics` computed it in Python before
//! (issue 16 item 6), up to the order of the floating-point sums.

use std::collections::{HashMap, VecDeque};

use crate::keys::ClientKey;
use crate::scheduler::Scheduler;

/// No local index (`FairnessWindow::by_id`).
const NONE: u32 = u32::MAX;

/// Snapshots per window: one is taken when the last is `window / SLICES` old.
pub const SLICES: f64 = 32.0;

/// One snapshot: its time and the services of the clients backlogged then,
/// by local index.
#[derive(Debug, Clone)]
struct Snapshot {
    time: f64,
    services: Vec<(u32, f64)>,
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

/// The snapshots of one metrics reader (see the module doc).
#[derive(Debug, Clone)]
pub struct FairnessWindow {
    window: f64,
    history: VecDeque<Snapshot>,
    /// Local index -> key, for the clients in snapshots (and those seen
    /// backlogged since the last pruning).
    keys: Vec<ClientKey>,
    index: HashMap<ClientKey, u32>,
    /// By client id: the local index last seen for it (checked by key: ids
    /// are reused, other schedulers may be read).
    by_id: Vec<u32>,
    /// By local index: the refresh at which the client was last seen
    /// backlogged, and its service then.
    seen: Vec<(u64, f64)>,
    refreshes: u64,
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
        let mut current: Vec<(u32, f64)> = Vec::new();
        for (c, key) in core.keyed_clients() {
            let Ok(cl) = core.client(c) else { continue };
            if cl.num_waiting() + cl.num_aside() == 0 {
                continue;
            }
            backlogged += 1;
            low = low.min(cl.counter());
            high = high.max(cl.counter());
            let l = self.local(c.0, key);
            self.seen[l as usize] = (stamp, cl.service());
            current.push((l, cl.service()));
        }
        let spread = if backlogged > 1 { high - low } else { 0.0 };

        let history = &mut self.history;
        while history.len() > 1 && now - history[1].time >= self.window {
            history.pop_front();
        }
        let jain = match history.front() {
            Some(start) if now > start.time => Some(jain_index(
                start
                    .services
                    .iter()
                    .filter(|&&(l, _)| self.seen[l as usize].0 == stamp)
                    .map(|&(l, before)| self.seen[l as usize].1 - before),
            )),
            _ => None,
        };
        let due = match history.back() {
            None => true,
            Some(last) => now - last.time >= self.window / SLICES,
        };
        if due {
            history.push_back(Snapshot {
                time: now,
                services: current,
            });
        }
        self.prune();
        Figures {
            jain,
            spread,
            backlogged,
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
                self.seen.push((0, 0.0));
                l
            }
        };
        self.by_id[i] = l;
        l
    }

    /// Forget the keys no snapshot holds once they are more than those held
    /// (and a few): renumber the rest. Amortized O(1) per key interned.
    fn prune(&mut self) {
        let held: usize = self.history.iter().map(|s| s.services.len()).sum();
        if self.keys.len() <= 2 * held + 64 {
            return;
        }
        let mut renumber = vec![NONE; self.keys.len()];
        let mut keys = Vec::new();
        let mut seen = Vec::new();
        for snapshot in &mut self.history {
            for entry in &mut snapshot.services {
                let old = entry.0 as usize;
                if renumber[old] == NONE {
                    renumber[old] = keys.len() as u32;
                    keys.push(std::mem::replace(
                        &mut self.keys[old],
                        ClientKey::Int(0),
                    ));
                    seen.push(self.seen[old]);
                }
                entry.0 = renumber[old];
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
            *l = if *l == NONE { NONE } else { renumber[*l as usize] };
        }
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
                .any(|s| s.services.iter().any(|&(l, _)| l >= n))
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
