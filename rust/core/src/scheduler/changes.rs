//! Change feeds: which clients changed since a reader's last read.
//!
//! A reader (the per-tenant metrics, later the Redis sync) that mirrors
//! every client's counter, service, token tallies and request counts would
//! otherwise read all of them at each refresh: O(clients) work for a few
//! changed ones. Instead each of [`READERS`] reader slots keeps its own
//! cursor: a list of the clients changed since its last read, and a bit per
//! client saying the client is on that list (so a client changed a thousand
//! times is listed once). Marking costs one byte compare when the client is
//! already listed for every active reader, and nothing (one branch) while
//! no reader is active; a read moves the list into the caller's buffer and
//! clears it, keeping its capacity: no allocation in steady state beyond
//! amortized vector growth.
//!
//! Design: a small fixed number of reader slots (not a per-client epoch
//! plus a shared change log): each reader drains its own list at its own
//! pace, and a reader that never reads again costs only its list's growth,
//! bounded by the number of client ids (each listed at most once), plus the
//! keys of the clients forgotten since (see below).
//!
//! What marks a client changed (`Changes::touch`): a charge (counter and
//! service; prompt tallies at admission, decode tallies at a decode call),
//! a lift (a submit into an empty band, raised counters from
//! `raise_counter(s)`), every change of its waiting, set-aside or running
//! counts (submit, admission, preemption, finish, cancel, set aside, put
//! back), a weight set (`set_weight`: a reader showing weights hears of it,
//! though the row has no weight), a new client (`add_client`, also for a
//! reused id) and a snapshot restore of a client's state. A client forgotten by `forget_idle` is
//! reported as gone, with the key it had (its id may belong to another
//! client by the next read).
//!
//! A reader's first read (the slot inactive: a new scheduler, one restored
//! from a snapshot, or after [`Scheduler::reset_changes`]) returns every
//! live client and says so (`full`), so the reader rebuilds its mirror.
//!
//! Invariant (checked by `check_invariants`): for every active reader `r`
//! and client id `c`, bit `r` of `dirty[c]` is set iff `c` is on `lists[r]`,
//! and `lists[r]` holds no id twice; inactive readers have no bits, empty
//! lists and nothing gone.

use super::Scheduler;
use crate::client::ClientId;
use crate::error::{CoreError, Result};
use crate::keys::ClientKey;

pub use crate::limits::READERS;

/// A client forgotten since a reader's last read: its id then and its key.
pub type Gone = (ClientId, Option<ClientKey>);

#[derive(Debug, Clone, Default)]
pub(super) struct Changes {
    /// Bit `r`: reader `r` has read at least once (its list is kept).
    active: u8,
    /// By client id: bit `r` set while the client is on `lists[r]`.
    dirty: Vec<u8>,
    lists: [Vec<u32>; READERS],
    gone: [Vec<Gone>; READERS],
    /// Every change counted (see `Scheduler::state_version`), readers or none.
    version: u64,
}

impl Changes {
    /// Mark client `c` changed for every active reader.
    #[inline(always)]
    pub(super) fn touch(&mut self, c: u32) {
        self.bump();
        let active = self.active;
        if active == 0 {
            return;
        }
        let i = c as usize;
        if i >= self.dirty.len() {
            self.dirty.resize(i + 1, 0);
        }
        let missing = active & !self.dirty[i];
        if missing == 0 {
            return;
        }
        self.dirty[i] |= missing;
        for (r, list) in self.lists.iter_mut().enumerate() {
            if missing & (1 << r) != 0 {
                list.push(c);
            }
        }
    }

    /// Client `c` (key `key`) is forgotten: report it gone to every active
    /// reader, and take it off their lists (its id may be reused).
    pub(super) fn forget(&mut self, c: u32, key: Option<&ClientKey>) {
        self.bump();
        if self.active == 0 {
            return;
        }
        for r in 0..READERS {
            if self.active & (1 << r) != 0 {
                self.gone[r].push((ClientId(c), key.cloned()));
            }
        }
        // still listed: a listed id that is not live, or live again under
        // another key, is sorted out at the read
    }

    /// Count a change that touches no one client (the configuration, tokens
    /// inside a prediction) in the version.
    #[inline(always)]
    pub(super) fn bump(&mut self) {
        self.version = self.version.wrapping_add(1);
    }

    pub(super) fn check(&self) -> std::result::Result<(), String> {
        for r in 0..READERS {
            let bit = 1u8 << r;
            if self.active & bit == 0 {
                if !self.lists[r].is_empty() || !self.gone[r].is_empty() {
                    return Err(format!("inactive change reader {r} holds changes"));
                }
                if self.dirty.iter().any(|d| d & bit != 0) {
                    return Err(format!("inactive change reader {r} marks clients"));
                }
                continue;
            }
            let listed = self.dirty.iter().filter(|d| *d & bit != 0).count();
            if listed != self.lists[r].len()
                || self.lists[r]
                    .iter()
                    .any(|&c| self.dirty.get(c as usize).is_none_or(|d| d & bit == 0))
            {
                return Err(format!(
                    "change reader {r}: {} listed, {listed} marked",
                    self.lists[r].len()
                ));
            }
        }
        Ok(())
    }
}

impl Scheduler {
    /// The clients changed since reader `reader`'s last call (see the
    /// module doc `changes`): the live ones appended to `changed` (each
    /// once, in no order), the forgotten ones to `gone` with their keys.
    /// Returns `true` for a full read (the reader's first since it was
    /// reset or the scheduler built or restored): `changed` then holds
    /// every live client, `gone` nothing, and the reader should drop what
    /// it mirrored. A client both forgotten and listed again (its key
    /// back, or its id reused) is in both: apply `gone` first.
    ///
    /// O(changes) (O(clients) for a full read); the reader's list keeps
    /// its capacity. Fails with [`CoreError::InvalidReader`] for a reader
    /// not below [`READERS`].
    pub fn changes(
        &mut self,
        reader: usize,
        changed: &mut Vec<ClientId>,
        gone: &mut Vec<Gone>,
    ) -> Result<bool> {
        if reader >= READERS {
            return Err(CoreError::InvalidReader(reader));
        }
        let bit = 1u8 << reader;
        let ch = &mut self.changes;
        if ch.active & bit == 0 {
            ch.active |= bit;
            changed.extend(
                self.clients
                    .iter()
                    .enumerate()
                    .filter(|(_, cl)| cl.live)
                    .map(|(i, _)| ClientId(i as u32)),
            );
            return Ok(true);
        }
        gone.append(&mut ch.gone[reader]);
        let list = &mut ch.lists[reader];
        for &c in list.iter() {
            ch.dirty[c as usize] &= !bit;
            if self.clients[c as usize].live {
                changed.push(ClientId(c));
            }
        }
        list.clear();
        Ok(false)
    }

    /// Make reader `reader` inactive: its list and gone clients are
    /// dropped, and its next [`changes`](Self::changes) is a full read.
    pub fn reset_changes(&mut self, reader: usize) -> Result<()> {
        if reader >= READERS {
            return Err(CoreError::InvalidReader(reader));
        }
        let bit = 1u8 << reader;
        let ch = &mut self.changes;
        ch.active &= !bit;
        for &c in &ch.lists[reader] {
            ch.dirty[c as usize] &= !bit;
        }
        ch.lists[reader].clear();
        ch.gone[reader].clear();
        Ok(())
    }

    /*
     * state_version: the scheduling state's version, for a caller that keeps an
     * answer (the next request, whether the running set is as it was) until
     * something changes.
     *
     * It advances with every change a reader hears of (`Changes::touch`, a
     * forgotten client) and with the changes that touch no one client: the
     * configuration setters and a decode's tokens (inside a prediction they
     * charge no one). So two equal reads mean that no call in between changed
     * the requests, their states, the counters or the weights; a call that
     * fails changes nothing and leaves it. Wrapping: compare, never order.
     */
    /// The scheduling state's version (see above).
    pub fn state_version(&self) -> u64 {
        self.changes.version
    }

    pub(super) fn check_changes(&self) -> std::result::Result<(), String> {
        self.changes.check()
    }
}
