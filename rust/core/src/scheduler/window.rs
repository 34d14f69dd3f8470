//! The locality window: among the clients close to the least served, the
//! waiting request with the longest cached prefix goes next, looking a few
//! requests deep into each client's queue (docs/locality.md; specified by
//! `vtc.reference`).
//!
//! Invariant: the window only chooses; it moves no counter, queue or heap
//! (the choice is taken out of its queue by the caller, `admit_at` or
//! `set_aside_at`, which also count an overtake of the head).
//!
//! With a quantum `Q > 0` and a [`PrefixLookup`], once the band and its
//! least-key entity `e0` are chosen as plain VTC chooses them, the
//! *candidate clients* are the entities in that band's heap (so not parked
//! by a capped `schedule`) whose counter is `<= counter(e0) + Q`. Each
//! offers its first [`LOCALITY_DEPTH`] waiting requests in queue order, or
//! only its head once [`LOCALITY_DEPTH`]` - 1` of its requests have been
//! taken before that head (so every request is overtaken by a bounded
//! number of its client's later ones). With one candidate request (`e0`'s
//! head) the lookup is not called, else it is called once for each
//! candidate request, clients in client id order, each client's in queue
//! order; the request with the longest cached prefix wins, ties by the
//! plain key `(counter, seq of the head)` of its client, then by queue
//! position. A failing or out-of-range lookup fails the selection before
//! anything changed. `Q = 0`, or no lookup, is plain VTC exactly (the
//! window is never entered). The walk reuses one scratch buffer: no
//! allocation per selection once it has grown to the largest window.

use super::Scheduler;
use crate::error::{CoreError, Result};
use crate::heap::Key;
use crate::lookup::{LookupFailed, PrefixLookup};

/// How many waiting requests of each candidate client the locality window
/// considers: its first `LOCALITY_DEPTH` in queue order (docs/locality.md).
/// Also one more than the overtakes a head allows before the window offers
/// only that head.
pub const LOCALITY_DEPTH: usize = 8;

/// The selection's choice: an entity and the position in its queue of the
/// request chosen (0: its head, always live; plain VTC always takes 0).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pick {
    pub e: u32,
    pub pos: usize,
}

impl Scheduler {
    /// The request that goes next: plain VTC's `top_entity`'s head, then,
    /// with a quantum and a lookup, the window's choice (see above).
    #[inline]
    pub(super) fn select<'l>(
        &mut self,
        lookup: Option<&mut (dyn PrefixLookup + 'l)>,
    ) -> Result<Option<Pick>> {
        let Some(e0) = self.top_entity() else {
            return Ok(None);
        };
        match lookup {
            Some(lookup) if self.locality_quantum > 0.0 => {
                self.choose_in_window(e0, lookup).map(Some)
            }
            _ => Ok(Some(Pick { e: e0, pos: 0 })),
        }
    }

    /// The slot of the request at queue position `pos` of entity `e`.
    #[inline]
    pub(super) fn slot_at(&self, p: Pick) -> u32 {
        self.entities[p.e as usize].queue[p.pos].slot
    }

    /// How many of entity `e`'s waiting requests the window offers: its
    /// first `LOCALITY_DEPTH`, or only its head once that head has been
    /// overtaken `LOCALITY_DEPTH - 1` times.
    #[inline]
    fn depth_of(&self, e: u32) -> usize {
        let en = &self.entities[e as usize];
        if en.skip_seq == en.head_seq && en.skips as usize >= LOCALITY_DEPTH - 1 {
            1
        } else {
            LOCALITY_DEPTH.min(en.n_waiting)
        }
    }

    /// A request behind entity `e`'s head is being taken (`admit_at`,
    /// `set_aside_at`): one more overtake of the head.
    pub(super) fn count_overtake(&mut self, e: u32) {
        let en = &mut self.entities[e as usize];
        if en.skip_seq != en.head_seq {
            en.skip_seq = en.head_seq;
            en.skips = 0;
        }
        en.skips += 1;
    }

    /// The window's choice in `e0`'s band (`e0` is its band's top).
    fn choose_in_window(&mut self, e0: u32, lookup: &mut dyn PrefixLookup) -> Result<Pick> {
        let b = self.entities[e0 as usize].band as usize;
        let edge = self.key_of(e0).counter + self.locality_quantum;
        let mut window = std::mem::take(&mut self.window);
        self.bands[b].heap.collect_within(edge, &mut window);
        // (by the keys the heap holds, a superset: a stale key is lower than its true one)
        window.retain(|&e| self.key_of(e).counter <= edge);
        let chosen = if window.len() <= 1 && self.depth_of(e0) <= 1 {
            Ok(Pick { e: e0, pos: 0 })
        } else {
            window.sort_unstable_by_key(|&e| self.entities[e as usize].client);
            self.longest_prefix(&window, lookup)
        };
        self.window = window;
        chosen
    }

    /// Among the candidate requests of `candidates`, the one with the
    /// longest cached prefix, ties by its client's key, then by queue
    /// position; the first failing lookup is the error.
    fn longest_prefix(&self, candidates: &[u32], lookup: &mut dyn PrefixLookup) -> Result<Pick> {
        let mut best: Option<(u64, Key, Pick)> = None;
        for &e in candidates {
            let key = self.key_of(e);
            let mut left = self.depth_of(e);
            let queue = &self.entities[e as usize].queue;
            for (pos, entry) in queue.iter().enumerate() {
                if left == 0 {
                    break;
                }
                if !self.entry_live(entry) {
                    continue; // a cancelled request's entry, left behind
                }
                left -= 1;
                let r = &self.requests[entry.slot as usize];
                let footprint = r.footprint(self.uniform);
                let hit = lookup
                    .cached_prefix(r.rid, footprint)
                    .map_err(|LookupFailed| CoreError::PrefixLookupFailed(r.rid))?;
                if hit > footprint {
                    return Err(CoreError::InvalidPrefixHit {
                        request_id: r.rid,
                        hit,
                        footprint,
                    });
                }
                // a client's later request wins only with a strictly longer hit
                let better = match best {
                    None => true,
                    Some((h, k, _)) => hit > h || (hit == h && key.less(&k)),
                };
                if better {
                    best = Some((hit, key, Pick { e, pos }));
                }
            }
        }
        Ok(best.expect("at least one candidate").2)
    }
}
