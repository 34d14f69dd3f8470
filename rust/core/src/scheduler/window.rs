//! The locality window: among the clients close to the least served, the one
//! whose head request has the longest cached prefix goes next
//! (docs/locality.md; specified by `vtc.reference`).
//!
//! Invariant: the window only chooses; it moves no counter, queue or heap.
//! With a quantum `Q > 0` and a [`PrefixLookup`], once the band and its
//! least-key entity `e0` are chosen as plain VTC chooses them, the
//! *candidates* are the entities in that band's heap (so not parked by a
//! capped `schedule`) whose counter is `<= counter(e0) + Q`; with one
//! candidate (`e0`) the lookup is not called, else it is called once for
//! each candidate's head, in client id order, and the candidate with the
//! longest cached prefix wins, ties by the plain key `(counter, seq)`. A
//! failing or out-of-range lookup fails the selection before anything
//! changed. `Q = 0`, or no lookup, is plain VTC exactly (the window is
//! never entered). The walk reuses one scratch buffer: no allocation per
//! selection once it has grown to the largest window.

use super::Scheduler;
use crate::error::{CoreError, Result};
use crate::heap::Key;
use crate::lookup::{LookupFailed, PrefixLookup};

impl Scheduler {
    /// The entity whose head goes next: plain VTC's `top_entity`, then,
    /// with a quantum and a lookup, the window's choice (see above).
    #[inline]
    pub(super) fn select_entity<'l>(
        &mut self,
        lookup: Option<&mut (dyn PrefixLookup + 'l)>,
    ) -> Result<Option<u32>> {
        let Some(e0) = self.top_entity() else {
            return Ok(None);
        };
        match lookup {
            Some(lookup) if self.locality_quantum > 0.0 => {
                self.choose_in_window(e0, lookup).map(Some)
            }
            _ => Ok(Some(e0)),
        }
    }

    /// The window's choice in `e0`'s band (`e0` is its band's top).
    fn choose_in_window(&mut self, e0: u32, lookup: &mut dyn PrefixLookup) -> Result<u32> {
        let b = self.entities[e0 as usize].band as usize;
        let edge = self.key_of(e0).counter + self.locality_quantum;
        let mut window = std::mem::take(&mut self.window);
        self.bands[b].heap.collect_within(edge, &mut window);
        let chosen = if window.len() <= 1 {
            Ok(e0)
        } else {
            window.sort_unstable_by_key(|&e| self.entities[e as usize].client);
            self.longest_prefix(&window, lookup)
        };
        self.window = window;
        chosen
    }

    /// Among `candidates`, the entity whose head has the longest cached
    /// prefix, ties by the least key; the first failing lookup is the error.
    fn longest_prefix(&self, candidates: &[u32], lookup: &mut dyn PrefixLookup) -> Result<u32> {
        let mut best: Option<(u64, Key, u32)> = None;
        for &e in candidates {
            let front = self.entities[e as usize]
                .queue
                .front()
                .expect("a candidate entity has a head");
            let r = &self.requests[front.slot as usize];
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
            let key = self.key_of(e);
            let better = match best {
                None => true,
                Some((h, k, _)) => hit > h || (hit == h && key.less(&k)),
            };
            if better {
                best = Some((hit, key, e));
            }
        }
        Ok(best.expect("at least two candidates").2)
    }
}
