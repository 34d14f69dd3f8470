//! The policy key and selection: which entity's head request goes next.
//!
//! Invariant: every entity (a client's waiting requests in one band, see
//! `band`) is in its band's heap at key (its client's counter, 0 under
//! fcfs; its head's submit seq), except while a capped `schedule` has it
//! parked; `order` lists the live bands by priority; a band or entity exists
//! only while a request waits in it. The next entity is the least key of
//! the most urgent band, or under weighted bands of the band with the least
//! band counter.
//!
//! A decode's charges may leave an entity's heap key *stale*: its counter
//! below the client's, its seq the head's (see `charge_touched`). Counters
//! only grow there, so a stale key is a lower bound and the heap, ordered by
//! the keys it holds, still has every entity at or after its ancestors'
//! true keys. Each band's top is kept fresh (`freshen_top`, after every
//! change that can bring another entity to the top), and a fresh top whose
//! every rival is at or past it is the least true key: so `top_entity`,
//! `least_backlogged` and `lift` read tops as before.

use super::request::Slot;
use super::{Policy, Scheduler};
use crate::band::QueueEntry;
use crate::band::{Band, Entity, Shares, NO_ENTITY, NO_SKIP};
use crate::heap::{Key, NOT_IN_HEAP};

impl Scheduler {
    /// An entity's heap key: its client's counter and its head's submit seq.
    #[inline(always)]
    pub(super) fn key_of(&self, e: u32) -> Key {
        let en = &self.entities[e as usize];
        Key {
            counter: if self.policy == Policy::Fcfs {
                0.0
            } else {
                self.clients[en.client as usize].counter
            },
            seq: en.head_seq,
        }
    }

    /*
     * freshen_top: band `b`'s top entity holds its true key. While the top's
     * key is stale (its client's counter has grown past it), re-key it:
     * it sinks, and the next least key comes up. Each re-key makes one
     * stale key fresh, so the loop ends; over a run it re-keys at most once
     * per charge it deferred.
     */
    #[inline]
    pub(super) fn freshen_top(&mut self, b: usize) {
        while let Some((e, key)) = self.bands[b].heap.top() {
            let fresh = self.key_of(e);
            if !key.less(&fresh) {
                return;
            }
            self.bands[b].heap.update(e, fresh, &mut self.entities[..]);
        }
    }

    /// [`freshen_top`](Self::freshen_top) for every live band.
    pub(super) fn freshen_tops(&mut self) {
        for i in 0..self.order.len() {
            let b = self.order[i] as usize;
            self.freshen_top(b);
        }
    }

    /// Re-key entity `e` in band `b`'s heap to `key` (its true key), keeping
    /// the band's top fresh.
    #[inline(always)]
    pub(super) fn rekey_entity(&mut self, b: usize, e: u32, key: Key) {
        let was_top = self.bands[b].heap.top().map(|(t, _)| t) == Some(e);
        self.bands[b].heap.update(e, key, &mut self.entities[..]);
        if was_top {
            self.freshen_top(b); // (it may have sunk below a stale key)
        }
    }

    /// Restore entity `e`'s heap position after its head or counter changed.
    #[inline(always)]
    pub(super) fn adjust_entity(&mut self, e: u32) {
        let en = &self.entities[e as usize];
        if en.heap_pos != NOT_IN_HEAP {
            let b = en.band as usize;
            let key = self.key_of(e);
            self.rekey_entity(b, e, key);
        }
    }

    /// Restore the heap position of each of `c`'s entities after its
    /// counter changed (one entity per band it waits in).
    #[inline(always)]
    pub(super) fn adjust(&mut self, c: u32) {
        let cl = &self.clients[c as usize];
        let counter = if self.policy == Policy::Fcfs {
            0.0
        } else {
            cl.counter
        };
        let mut e = cl.entities;
        while e != NO_ENTITY {
            let en = &self.entities[e as usize];
            let (pos, b, seq, next) = (en.heap_pos, en.band, en.head_seq, en.next);
            if pos != NOT_IN_HEAP {
                self.rekey_entity(b as usize, e, Key { counter, seq });
            }
            e = next;
        }
    }

    /// Where band `priority` is in `order`: `Ok(i)` if a client waits in it,
    /// else `Err(i)`, where it would go.
    #[inline]
    fn band_slot(&self, priority: i64) -> std::result::Result<usize, usize> {
        self.order
            .binary_search_by_key(&priority, |&b| self.bands[b as usize].priority)
    }

    /// The live band of `priority`, if a client waits in it.
    #[inline]
    pub(super) fn find_band(&self, priority: i64) -> Option<u32> {
        self.band_slot(priority).ok().map(|i| self.order[i])
    }

    /// The entity of client `c` in band `priority`, if it waits there.
    #[inline]
    pub(super) fn entity_of(&self, c: u32, priority: i64) -> Option<u32> {
        let mut e = self.clients[c as usize].entities;
        while e != NO_ENTITY {
            let en = &self.entities[e as usize];
            if self.bands[en.band as usize].priority == priority {
                return Some(e);
            }
            e = en.next;
        }
        None
    }

    /// A new entity of client `c` in band `priority` (the band is created in
    /// priority order if nobody waits in it), linked first in the client's
    /// list, empty and not yet in the band heap.
    pub(super) fn add_entity(&mut self, c: u32, priority: i64) -> u32 {
        let b = match self.band_slot(priority) {
            Ok(i) => self.order[i],
            Err(i) => {
                let b = match self.free_bands.pop() {
                    Some(b) => b,
                    None => {
                        self.bands.push(Band::default());
                        (self.bands.len() - 1) as u32
                    }
                };
                self.bands[b as usize].priority = priority;
                self.order.insert(i, b);
                b
            }
        };
        self.bands[b as usize].n_entities += 1;
        let next = self.clients[c as usize].entities;
        let e = match self.free_entities.pop() {
            Some(e) => {
                let en = &mut self.entities[e as usize];
                en.client = c;
                en.band = b;
                en.n_waiting = 0;
                en.heap_pos = NOT_IN_HEAP;
                en.skip_seq = NO_SKIP;
                en.skips = 0;
                e
            }
            None => {
                let e = u32::try_from(self.entities.len()).expect("more than 2^32 entities");
                assert!(e != NO_ENTITY, "entity id space exhausted");
                self.entities.push(Entity::new(c, b));
                e
            }
        };
        self.entities[e as usize].next = next;
        self.clients[c as usize].entities = e;
        e
    }

    /// Entity `e` has lost its last waiting request: out of its band heap
    /// and its client's list, freed; a band left without entities goes.
    fn remove_entity(&mut self, e: u32) {
        let (c, b) = {
            let en = &self.entities[e as usize];
            (en.client, en.band)
        };
        if self.entities[e as usize].heap_pos != NOT_IN_HEAP {
            self.bands[b as usize]
                .heap
                .remove(e, &mut self.entities[..]);
            self.freshen_top(b as usize);
        }
        let next = self.entities[e as usize].next;
        let head = self.clients[c as usize].entities;
        if head == e {
            self.clients[c as usize].entities = next;
        } else {
            let mut p = head;
            while self.entities[p as usize].next != e {
                p = self.entities[p as usize].next;
            }
            self.entities[p as usize].next = next;
        }
        let en = &mut self.entities[e as usize];
        en.next = NO_ENTITY;
        en.queue.clear();
        if en.queue.capacity() > 64 {
            en.queue.shrink_to(8);
        }
        self.free_entities.push(e);
        let band = &mut self.bands[b as usize];
        band.n_entities -= 1;
        if band.n_entities == 0 {
            let i = self
                .order
                .iter()
                .position(|&x| x == b)
                .expect("live band is ordered");
            self.order.remove(i);
            self.free_bands.push(b);
            let priority = self.bands[b as usize].priority;
            if let Some(sh) = &mut self.shares {
                // the value is read only once the share is gone, which sets it
                sh.last_left = Some((priority, f64::NAN));
            }
        }
    }

    /// The entity whose head request goes next: the least key of the most
    /// urgent band (a band whose entities a capped `schedule` parked is
    /// passed over).
    #[inline(always)]
    pub(super) fn top_entity(&self) -> Option<u32> {
        if let Some(sh) = &self.shares {
            return self.top_entity_weighted(sh);
        }
        let (&first, rest) = self.order.split_first()?;
        match self.bands[first as usize].heap.top() {
            Some((e, _)) => Some(e),
            None => rest
                .iter()
                .find_map(|&b| self.bands[b as usize].heap.top())
                .map(|(e, _)| e),
        }
    }

    /// Weighted bands: the least key of the band with the least (band
    /// counter, priority) among those with a selectable entity.
    fn top_entity_weighted(&self, shares: &Shares) -> Option<u32> {
        let mut best: Option<(f64, u32)> = None;
        // `order` is by priority, so the first of equal counters is the most urgent
        for &b in &self.order {
            let band = &self.bands[b as usize];
            let Some((e, _)) = band.heap.top() else {
                continue;
            };
            let v = shares
                .get(band.priority)
                .expect("a backlogged band has a share")
                .counter;
            if best.is_none_or(|(bv, _)| v < bv) {
                best = Some((v, e));
            }
        }
        best.map(|(_, e)| e)
    }

    #[inline]
    pub(super) fn entry_live(&self, e: &QueueEntry) -> bool {
        let r = &self.requests[e.slot as usize];
        r.state == Slot::Waiting && r.seq == e.seq
    }

    /// Drop dead (cancelled) entries from the front of entity `e`'s queue
    /// and record the new head's seq. Only called while `e` has a live
    /// waiting request.
    fn clean_front(&mut self, e: u32) {
        loop {
            let front = *self.entities[e as usize]
                .queue
                .front()
                .expect("an entity has a queue");
            if self.entry_live(&front) {
                self.entities[e as usize].head_seq = front.seq;
                return;
            }
            self.entities[e as usize].queue.pop_front();
        }
    }

    /// A waiting request of client `c` in entity `e` has left (admitted,
    /// set aside or cancelled; the counts are already down): `e` goes if it
    /// is empty, else its head is cleaned (not re-keyed), and `c` leaves the
    /// backlog if nothing else waits. Whether `e` is still there.
    pub(super) fn waiting_left(&mut self, c: u32, e: u32) -> bool {
        let kept = self.entities[e as usize].n_waiting > 0;
        if kept {
            self.clean_front(e);
        } else {
            self.remove_entity(e);
        }
        if self.clients[c as usize].n_waiting == 0 {
            self.n_backlogged -= 1;
            self.last_left = Some(c);
        }
        kept
    }
}
