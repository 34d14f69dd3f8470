//! A request's record in the slab, its states, the token counts of an
//! engine-form decode, and the hasher of the request-id maps.
//!
//! Invariant (kept by `slab`, `engine` and `batch`, checked by
//! `invariants`): a slot is `Free` exactly when no request id maps to it; a
//! live request is `Waiting` (a live entry in its entity's queue), `Running`
//! (in `running` and `running_index`) or `Aside` (in neither, still counted
//! by its client). This module imports nothing from the scheduler.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Where a live request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    Waiting,
    Running,
    /// Taken out of its client's queue by
    /// [`Scheduler::set_aside`](crate::Scheduler::set_aside), not yet put
    /// back: neither waiting nor running, nothing charged.
    Aside,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Free,
    Waiting,
    Running,
    Aside,
}

impl Slot {
    /// The state as error messages name it (never `Free`: that is "unknown").
    pub(super) fn now(self) -> crate::error::Where {
        use crate::error::Where;
        match self {
            Slot::Waiting => Where::Waiting,
            Slot::Running => Where::Running,
            Slot::Aside | Slot::Free => Where::Aside,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Request {
    pub(super) rid: u64,
    pub(super) client: u32,
    pub(super) prompt: u64,
    /// Prompt tokens served from a prefix cache: in the KV budget, not charged.
    pub(super) cached: u64,
    /// Tokens generated; while running, less `Scheduler::uniform`
    /// (wrapping), so that `decode_all` moves every running request on at
    /// once. Read it with [`generated`](Self::generated).
    pub(super) gen: u64,
    /// Global submit order; the tie-break between equal counters.
    pub(super) seq: u64,
    /// Priority band (smaller is more urgent; see `band`).
    pub(super) priority: i64,
    /// Global admission order; running requests are kept sorted by it.
    pub(super) admit_seq: u64,
    /// Last decode call that touched this request (duplicate detection).
    pub(super) decode_epoch: u64,
    pub(super) state: Slot,
    pub(super) prefill_paid: bool,
    /// `predicted` was given at submit (oracle or user prediction).
    pub(super) prediction_given: bool,
    /// Before the first admission: the output length given at submit (if
    /// `prediction_given`); from then on: the output tokens pre-charged at
    /// admission (0: no prediction).
    pub(super) predicted: u64,
}

impl Request {
    /// Tokens generated so far, given the scheduler's `uniform` count.
    #[inline(always)]
    pub(super) fn generated(&self, uniform: u64) -> u64 {
        if self.state == Slot::Running {
            self.running_generated(uniform)
        } else {
            self.gen
        }
    }

    /// [`generated`](Self::generated) of a request known to be running.
    /// Wrapping: the true count stays below MAX_REQUEST_TOKENS.
    #[inline(always)]
    pub(super) fn running_generated(&self, uniform: u64) -> u64 {
        debug_assert_eq!(self.state, Slot::Running);
        self.gen.wrapping_add(uniform)
    }

    /// The request starts running: `gen` becomes relative to `uniform`.
    #[inline(always)]
    pub(super) fn start_running(&mut self, uniform: u64) {
        self.state = Slot::Running;
        self.gen = self.gen.wrapping_sub(uniform);
    }

    /// The request stops running and goes to `next`: `gen` becomes the
    /// plain count again.
    #[inline(always)]
    pub(super) fn stop_running(&mut self, uniform: u64, next: Slot) {
        self.gen = self.running_generated(uniform);
        self.state = next;
    }

    /// KV tokens this request holds while running.
    #[inline(always)]
    pub(super) fn footprint(&self, uniform: u64) -> u64 {
        self.prompt + self.generated(uniform)
    }
}

/// Multiplicative hashing for request ids (engine-chosen integers, not
/// attacker-controlled keys).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        // fold the high bits down so that the table index (low bits) depends on all of them
        let x = (n ^ (n >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

pub(super) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Token counts for [`Scheduler::decode`](crate::Scheduler::decode).
#[derive(Debug, Clone, Copy)]
pub enum Tokens<'a> {
    /// The same count for every request.
    Each(i64),
    /// One count per request id.
    PerRequest(&'a [i64]),
}

impl Tokens<'_> {
    /// The count of the `i`-th request.
    #[inline(always)]
    pub(super) fn at(&self, i: usize) -> i64 {
        match *self {
            Tokens::Each(t) => t,
            Tokens::PerRequest(ts) => ts[i],
        }
    }
}
