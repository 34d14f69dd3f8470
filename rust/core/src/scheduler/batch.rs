//! The built-in batch loop: `schedule` fills the batch within `M`,
//! `decode_step` grows every running request by one token, preempting first.
//!
//! Invariant: without engine-mode calls in between, occupancy never exceeds
//! `M` (no skipping: admission stops at the first head that does not fit),
//! and preemption evicts from the least urgent band, the most-served client
//! first, the latest admission among equals.

use super::{Policy, PrefixLookup, Scheduler, Tokens};
use crate::band::NO_ENTITY;
use crate::error::{CoreError, Result};

impl Scheduler {
    /// Fill the batch: admit from the least-served backlogged client until
    /// the next request does not fit in `M` (no skipping). Appends the
    /// admitted ids, in admission order, to `out` and returns how many.
    ///
    /// With a per-client cap ([`set_client_cap`](Self::set_client_cap)), a
    /// client is *eligible* when it has nothing running or when its running
    /// KV tokens plus its head request's footprint stay within the cap. An
    /// ineligible client is removed from selection for the rest of this call
    /// (as if it had nothing waiting, but it keeps its counter and place);
    /// the no-skipping rule applies among eligible clients: the least-counter
    /// eligible client's head either fits in `M` or admission stops.
    pub fn schedule(&mut self, out: &mut Vec<u64>) -> usize {
        self.schedule_from(out, None)
            .expect("without a lookup selection cannot fail")
    }

    /// [`schedule`](Self::schedule) through the locality window: with a
    /// quantum (see [`Config::locality_quantum`](crate::Config)), each
    /// selection asks `lookup` for the cached prefix of the requests it offers
    /// (see `window`). A lookup that fails before anything was admitted is
    /// the error, nothing changed; once requests were admitted it stops the
    /// call, which returns them (an engine must learn of every admission),
    /// and the next selecting call asks again.
    pub fn schedule_with(
        &mut self,
        out: &mut Vec<u64>,
        lookup: &mut dyn PrefixLookup,
    ) -> Result<usize> {
        self.schedule_from(out, Some(lookup))
    }

    fn schedule_from(
        &mut self,
        out: &mut Vec<u64>,
        mut lookup: Option<&mut dyn PrefixLookup>,
    ) -> Result<usize> {
        let start = out.len();
        if self.client_cap.is_some() {
            self.schedule_capped(out, lookup)?;
            return Ok(out.len() - start);
        }
        loop {
            let p = match self.select(lookup.as_deref_mut()) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(err) if out.len() == start => return Err(err),
                Err(_) => break,
            };
            let fp = self.requests[self.slot_at(p) as usize].footprint(self.uniform);
            if self.occupancy + u128::from(fp) > u128::from(self.budget) {
                break;
            }
            out.push(self.admit_at(p));
        }
        Ok(out.len() - start)
    }

    #[cold]
    fn schedule_capped(
        &mut self,
        out: &mut Vec<u64>,
        mut lookup: Option<&mut dyn PrefixLookup>,
    ) -> Result<()> {
        let cap = self.client_cap.expect("capped");
        let start = out.len();
        let mut parked = std::mem::take(&mut self.parked);
        let mut failed = None;
        loop {
            let p = match self.select(lookup.as_deref_mut()) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(err) => {
                    if out.len() == start {
                        failed = Some(err);
                    }
                    break;
                }
            };
            let s = self.slot_at(p);
            let fp = self.requests[s as usize].footprint(self.uniform);
            let c = self.entities[p.e as usize].client;
            let cl = &self.clients[c as usize];
            if cl.n_running > 0 && cl.occupancy + u128::from(fp) > u128::from(cap) {
                // out of selection for this call, in every band it waits in
                let mut x = cl.entities;
                while x != NO_ENTITY {
                    let b = self.entities[x as usize].band as usize;
                    self.bands[b].heap.remove(x, &mut self.entities[..]);
                    self.freshen_top(b);
                    parked.push(x);
                    x = self.entities[x as usize].next;
                }
                continue;
            }
            if self.occupancy + u128::from(fp) > u128::from(self.budget) {
                break;
            }
            out.push(self.admit_at(p));
        }
        for &e in &parked {
            let key = self.key_of(e);
            let b = self.entities[e as usize].band as usize;
            self.bands[b].heap.push(e, key, &mut self.entities[..]);
        }
        parked.clear();
        self.parked = parked;
        failed.map_or(Ok(()), Err)
    }

    /// One engine iteration: every running request generates one token.
    ///
    /// If the grown batch would not fit in `M`, requests are preempted first
    /// (their ids are appended to `preempted`, in eviction order): the victim
    /// is always the running request whose client has the largest counter,
    /// the latest admitted among equals (under `fcfs`, simply the latest
    /// admitted, as a plain engine does). Evicting the most-served client keeps
    /// preemption on the side of fairness; evicting the latest admission (as
    /// engines do by default) would hit exactly the client VTC just favoured.
    /// Fails with [`CoreError::Capacity`], changing nothing, when even the
    /// last remaining request alone cannot grow.
    pub fn decode_step(&mut self, preempted: &mut Vec<u64>) -> Result<()> {
        let n = self.running.len();
        if self.occupancy + n as u128 > u128::from(self.budget) {
            self.preempt_for_growth(preempted)?;
        }
        // one token for each request left: the engine form's charge
        let running = std::mem::take(&mut self.running);
        self.apply_decode(&running, Tokens::Each(1));
        self.running = running;
        Ok(())
    }

    /// Preempt until every running request can grow by one token.
    #[cold]
    fn preempt_for_growth(&mut self, preempted: &mut Vec<u64>) -> Result<()> {
        let mut order = std::mem::take(&mut self.victims);
        let fcfs = self.policy == Policy::Fcfs;
        order.clear();
        order.extend(self.running.iter().map(|&s| {
            let r = &self.requests[s as usize];
            // fcfs, the baseline, evicts like a plain engine: latest admission first
            let served = if fcfs {
                0.0
            } else {
                self.clients[r.client as usize].counter
            };
            (r.priority, served, r.admit_seq, s)
        }));
        // least urgent band first; in it the most-served client, latest
        // admission first among equals
        order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(b.2.cmp(&a.2)));
        let mut occ = self.occupancy;
        let mut keep = order.len();
        let mut k = 0;
        while occ + keep as u128 > u128::from(self.budget) {
            if keep == 1 {
                let r = &self.requests[order[k].3 as usize];
                let err = CoreError::Capacity {
                    request_id: r.rid,
                    tokens: r.footprint(self.uniform),
                    budget: self.budget,
                };
                self.victims = order;
                return Err(err);
            }
            occ -= u128::from(self.requests[order[k].3 as usize].footprint(self.uniform));
            keep -= 1;
            k += 1;
        }
        for &(_, _, _, s) in &order[..k] {
            preempted.push(self.requests[s as usize].rid);
            self.preempt_slot(s);
        }
        self.victims = order;
        Ok(())
    }
}
