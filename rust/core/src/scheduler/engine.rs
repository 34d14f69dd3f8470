//! Engine-mode calls: the engine owns memory, the core owns the order and
//! the charges (`peek`/`pop`, `decode` with ids, `preempt`, `set_aside` /
//! `put_back`, `finish`, `cancel`).
//!
//! Invariant: every call validates all its input before it changes anything
//! (an `Err` leaves the scheduler as it was); no capacity check is made;
//! `occupancy` is the sum of the running requests' footprints and `running`
//! is in admission order.

use super::charge::Accrual;
use super::request::Slot;
use super::window::Pick;
use super::{Predictor, PrefixLookup, Scheduler, Tokens};
use crate::band::QueueEntry;
use crate::cost::Pending;
use crate::error::{CoreError, Op, Result};
use crate::limits::{MAX_REQUEST_TOKENS, MAX_TOKENS_PER_CALL};

impl Scheduler {
    /// The slot of the request the policy would admit next (plain VTC: no
    /// locality window).
    #[inline]
    pub(super) fn next_slot(&self) -> Option<u32> {
        self.top_entity().map(|e| self.head_slot(e))
    }

    /// The slot of entity `e`'s head request.
    #[inline]
    pub(super) fn head_slot(&self, e: u32) -> u32 {
        self.entities[e as usize]
            .queue
            .front()
            .expect("an entity has a head")
            .slot
    }

    /// Admit the head request of the least-key entity of the most urgent
    /// band, without a KV check.
    pub(super) fn admit_next(&mut self) -> Option<u64> {
        let e = self.top_entity()?;
        Some(self.admit_at(Pick { e, pos: 0 }))
    }

    /// Take the request at `p` out of its entity's queue: the head, or (the
    /// locality window's choice) one behind it, an overtake of the head.
    fn take_at(&mut self, p: Pick) -> QueueEntry {
        if p.pos > 0 {
            self.count_overtake(p.e);
        }
        self.entities[p.e as usize]
            .queue
            .remove(p.pos)
            .expect("the pick is in its entity's queue")
    }

    /// Admit the request at `p` (the selection's choice), without a KV check.
    pub(super) fn admit_at(&mut self, p: Pick) -> u64 {
        let e = p.e;
        let c = self.entities[e as usize].client;
        let entry = self.take_at(p);
        debug_assert!(self.entry_live(&entry));
        self.admit_seq += 1;
        let admit_seq = self.admit_seq;
        let cost = self.cost;
        let predictor = self.predictor;
        let mean = self.means.get(c as usize).copied().flatten();
        let r = &mut self.requests[entry.slot as usize];
        r.admit_seq = admit_seq;
        let rid = r.rid;
        let fp = r.footprint(0); // not running yet: the plain count
                                 // A preempted request that comes back already paid for its prompt.
        let (mut prompt_tokens, mut decode_tokens) = (0, 0);
        let charge = if r.prefill_paid {
            None
        } else {
            let predicted = match (r.prediction_given, predictor) {
                (true, _) => r.predicted,
                (false, Predictor::Mean) => mean.map_or(0, |m| m as u64),
                _ => 0,
            };
            r.predicted = predicted;
            (prompt_tokens, decode_tokens) = (r.prompt - r.cached, predicted);
            let prefill = cost.prefill(r.prompt - r.cached);
            if let Some(sh) = self.shares.as_mut().and_then(|s| s.get_mut(r.priority)) {
                sh.counter += prefill * sh.inv_w;
            }
            Some(if predicted > 0 {
                let mut p = Pending::default();
                p.add(r.prompt, 0, predicted);
                prefill + cost.decode(&p)
            } else {
                prefill
            })
        };
        r.prefill_paid = true;
        self.occupancy += u128::from(fp);
        self.running.push(entry.slot);
        self.running_index.insert(rid, entry.slot);
        self.num_waiting -= 1;
        if let Some(w) = charge {
            self.charge(c, w);
        }
        let cl = &mut self.clients[c as usize];
        cl.prompt_tokens = cl.prompt_tokens.saturating_add(prompt_tokens);
        cl.decode_tokens = cl.decode_tokens.saturating_add(decode_tokens);
        cl.occupancy += u128::from(fp);
        cl.n_waiting -= 1;
        cl.n_running += 1;
        self.changes.touch(c);
        self.start_running(entry.slot);
        self.entities[e as usize].n_waiting -= 1;
        if self.waiting_left(c, e) || charge.is_some() {
            // a new head, a new counter, or both: re-key every band it waits in
            self.adjust(c);
        }
        rid
    }

    /// The request the policy would admit next, if any.
    pub fn peek(&self) -> Option<u64> {
        self.next_slot().map(|s| self.requests[s as usize].rid)
    }

    /// Engine mode: admit the request [`peek`](Self::peek) names, without the
    /// KV check (the engine does its own memory accounting).
    pub fn pop(&mut self) -> Option<u64> {
        self.admit_next()
    }

    /// [`pop`](Self::pop), telling the core how many prompt tokens the
    /// engine found in its prefix cache (known only at admission); `None`
    /// keeps what `submit` said. Fails, admitting nothing, when `cached_len`
    /// is not in `0..=prompt_len` of the request that would be popped.
    pub fn pop_cached(&mut self, cached_len: Option<i64>) -> Result<Option<u64>> {
        self.pop_from(cached_len, None)
    }

    /// [`peek`](Self::peek) through the locality window: with a quantum
    /// (see [`Config::locality_quantum`](crate::Config)), `lookup` is asked
    /// for the cached prefix of each offered request (see `window`). Fails,
    /// changing nothing, when the lookup fails or answers out of range.
    pub fn peek_with(&mut self, lookup: &mut dyn PrefixLookup) -> Result<Option<u64>> {
        let p = self.select(Some(lookup))?;
        Ok(p.map(|p| self.requests[self.slot_at(p) as usize].rid))
    }

    /// [`pop_cached`](Self::pop_cached) through the locality window (see
    /// [`peek_with`](Self::peek_with)): the lookup first, then `cached_len`
    /// against the chosen request; either failing admits nothing.
    pub fn pop_with(
        &mut self,
        cached_len: Option<i64>,
        lookup: &mut dyn PrefixLookup,
    ) -> Result<Option<u64>> {
        self.pop_from(cached_len, Some(lookup))
    }

    fn pop_from(
        &mut self,
        cached_len: Option<i64>,
        lookup: Option<&mut dyn PrefixLookup>,
    ) -> Result<Option<u64>> {
        let Some(p) = self.select(lookup)? else {
            return Ok(None);
        };
        let s = self.slot_at(p);
        if let Some(k) = cached_len {
            let r = &mut self.requests[s as usize];
            if k < 0 || k as u64 > r.prompt {
                return Err(CoreError::InvalidCached {
                    cached_len: k,
                    prompt_len: r.prompt as i64,
                });
            }
            r.cached = k as u64;
        }
        Ok(Some(self.admit_at(p)))
    }

    /*
     * The order of checks of an engine-form decode (the reference follows
     * the same order, and the binding defers its own conversion errors to
     * the position they belong to):
     *
     *   1. `request_ids` and per-request `tokens` of different lengths;
     *   2. then position by position, i = 0, 1, ...: the id (unknown, not
     *      running), the id again in the same call, then its token count
     *      (negative, more than MAX_TOKENS_PER_CALL, or past the request's
     *      MAX_REQUEST_TOKENS).
     *
     * The first failing check is the error; nothing has changed then.
     */
    /// Validate an engine-form [`decode`](Self::decode) call without
    /// changing anything observable (the order of checks is above).
    pub fn check_decode(&mut self, rids: &[u64], tokens: Tokens<'_>) -> Result<()> {
        self.validate_decode(rids, tokens)
    }

    /// The checks of `decode`; on success `self.slots` holds each request's slot.
    fn validate_decode(&mut self, rids: &[u64], tokens: Tokens<'_>) -> Result<()> {
        if let Tokens::PerRequest(t) = tokens {
            if t.len() != rids.len() {
                return Err(CoreError::LengthMismatch {
                    ids: rids.len(),
                    tokens: t.len(),
                });
            }
        }
        // one copy of the loop per kind of `tokens`: with `Each` the count's
        // checks do not depend on the id (the compiler hoists them)
        match tokens {
            Tokens::Each(t) => self.validate_ids(rids, |_| t),
            Tokens::PerRequest(ts) => self.validate_ids(rids, |i| ts[i]),
        }
    }

    /// `validate_decode`'s loop over the ids; `rids[i]` generated `tok(i)`.
    #[inline(always)]
    fn validate_ids(&mut self, rids: &[u64], tok: impl Fn(usize) -> i64) -> Result<()> {
        self.decode_epoch += 1;
        let epoch = self.decode_epoch;
        let uniform = self.uniform;
        // no running request is near the limit: no count in range can pass it
        let near_limit = self.gen_hi + MAX_TOKENS_PER_CALL > MAX_REQUEST_TOKENS;
        let mut slots = std::mem::take(&mut self.slots);
        // one slot per id, written in place (no capacity check per id), cut
        // back to the ids found if one is not running
        slots.clear();
        slots.resize(rids.len(), 0);
        // two passes, each with few live values (registers, not spills): the
        // slots up to the first id that is not running, then each position's
        // own checks up to there; an error of the second pass comes first,
        // since its position is before the first pass's
        let mut result = Ok(());
        let mut found = rids.len();
        for (i, (dst, &rid)) in slots.iter_mut().zip(rids).enumerate() {
            match self.running_slot(rid, Op::Decode) {
                Ok(s) => *dst = s,
                Err(e) => {
                    (result, found) = (Err(e), i);
                    break;
                }
            }
        }
        slots.truncate(found);
        for (i, &s) in slots.iter().enumerate() {
            let r = &mut self.requests[s as usize];
            let t = tok(i);
            let err = if r.decode_epoch == epoch {
                Some(CoreError::DuplicateInBatch(r.rid))
            } else if t < 0 {
                Some(CoreError::NegativeTokens(t))
            } else if t as u64 > MAX_TOKENS_PER_CALL {
                Some(CoreError::TooManyTokens(t as u64))
            } else if near_limit && r.running_generated(uniform) + t as u64 > MAX_REQUEST_TOKENS {
                Some(CoreError::RequestTooLong {
                    request_id: r.rid,
                    tokens: u128::from(r.running_generated(uniform)) + t as u128,
                })
            } else {
                None
            };
            if let Some(e) = err {
                result = Err(e);
                break;
            }
            r.decode_epoch = epoch;
        }
        self.slots = slots;
        result
    }

    /// Engine form: record that request `rids[i]` generated `tokens[i]`
    /// tokens (or `Each(t)` for all). The engine owns memory here: no
    /// capacity check is made. All-or-nothing: any bad id or count fails the
    /// whole call before anything is charged (checks in the order above).
    pub fn decode(&mut self, rids: &[u64], tokens: Tokens<'_>) -> Result<()> {
        self.validate_decode(rids, tokens)?;
        let slots = std::mem::take(&mut self.slots);
        self.apply_decode(&slots, tokens);
        self.slots = slots;
        Ok(())
    }

    /// Charge a validated decode: `slots[i]` generated `tokens.at(i)`.
    pub(super) fn apply_decode(&mut self, slots: &[u32], tokens: Tokens<'_>) {
        // (tokens inside a prediction touch no client: the version counts them here)
        self.changes.bump();
        // one copy of the loop per kind of `tokens` (see `validate_decode`)
        let total = match tokens {
            Tokens::Each(t) => self.apply_slots(slots, |_| t as u64),
            Tokens::PerRequest(ts) => self.apply_slots(slots, |i| ts[i] as u64),
        };
        self.apply_rest(slots, tokens, total);
    }

    /// `apply_decode`'s loop over the requests; returns the tokens added.
    #[inline(always)]
    fn apply_slots(&mut self, slots: &[u32], tok: impl Fn(usize) -> u64) -> u128 {
        let mut total = 0u128;
        let uniform = self.uniform;
        // the fields the loop writes, borrowed apart (kept in registers)
        let requests = &mut self.requests[..];
        let mut acc = Accrual {
            clients: &mut self.clients[..],
            touched: &mut self.touched,
            extra: &mut self.extra,
            n_predicting: &mut self.n_predicting,
            linear: self.cost.is_linear(),
        };
        for (i, &s) in slots.iter().enumerate() {
            let t = tok(i);
            let r = &mut requests[s as usize];
            let before = r.running_generated(uniform);
            let (c, prompt, pred) = (r.client, r.prompt, r.predicted);
            r.gen = r.gen.wrapping_add(t);
            total += u128::from(t);
            if t > 0 {
                acc.add(c, prompt, before, t, pred);
            }
        }
        total
    }

    /// The rest of `apply_decode`, after its loop: bands, totals, charges.
    fn apply_rest(&mut self, slots: &[u32], tokens: Tokens<'_>, total: u128) {
        let uniform = self.uniform;
        if let Some(sh) = &mut self.shares {
            // a pass of its own: strict bands keep the loop above free of it
            for (i, &s) in slots.iter().enumerate() {
                let t = tokens.at(i) as u64;
                let r = &self.requests[s as usize];
                if t > 0 {
                    let before = r.running_generated(uniform) - t;
                    sh.add_tokens(r.priority, r.prompt, before, t);
                }
            }
        }
        self.occupancy += total;
        // every request grew by at most this much (no request: nothing grew, and
        // `Each(t)` was never checked, so `t` may be anything, negative too)
        let most = match tokens {
            Tokens::Each(_) if slots.is_empty() => 0,
            Tokens::Each(t) => t as u64,
            Tokens::PerRequest(_) => u64::try_from(total).unwrap_or(u64::MAX),
        };
        self.gen_hi = self.gen_hi.saturating_add(most);
        self.charge_touched();
        self.charge_bands();
    }

    /// Take running request slot `s` out of the running set; it goes to
    /// state `next` (the caller puts it there).
    fn remove_running(&mut self, s: u32, next: Slot) {
        self.stop_running(s, next);
        let admit_seq = self.requests[s as usize].admit_seq;
        let pos = self
            .running
            .binary_search_by_key(&admit_seq, |&x| self.requests[x as usize].admit_seq)
            .expect("running request is in the running list");
        self.running.remove(pos);
        let r = &self.requests[s as usize];
        self.running_index.remove(r.rid);
        let fp = r.footprint(self.uniform); // stopped: the plain count
        self.occupancy -= u128::from(fp);
        let c = r.client;
        let cl = &mut self.clients[c as usize];
        cl.n_running -= 1;
        cl.occupancy -= u128::from(fp);
        self.changes.touch(c);
    }

    pub(super) fn preempt_slot(&mut self, s: u32) {
        self.remove_running(s, Slot::Waiting);
        // No lift: the client was being served, not idle.
        self.requeue_front(s);
    }

    /// Put request slot `s` (not waiting) back at the head of its client's
    /// queue in its band, with its original seq, ahead of the client's later
    /// requests of that band. No lift.
    fn requeue_front(&mut self, s: u32) {
        let r = &mut self.requests[s as usize];
        r.state = Slot::Waiting;
        let (c, seq, priority) = (r.client, r.seq, r.priority);
        let (e, first) = match self.entity_of(c, priority) {
            Some(e) => (e, false),
            None => (self.add_entity(c, priority), true),
        };
        let en = &mut self.entities[e as usize];
        en.queue.push_front(QueueEntry { slot: s, seq });
        en.head_seq = seq;
        en.n_waiting += 1;
        let cl = &mut self.clients[c as usize];
        if cl.n_waiting == 0 {
            self.n_backlogged += 1;
        }
        cl.n_waiting += 1;
        self.changes.touch(c);
        self.num_waiting += 1;
        let key = self.key_of(e);
        let b = self.entities[e as usize].band as usize;
        if first {
            self.bands[b].heap.push(e, key, &mut self.entities[..]);
        } else {
            self.rekey_entity(b, e, key);
        }
    }

    /// Engine mode: evict a running request under memory pressure. Its KV
    /// leaves the budget, it goes back to the head of its client's queue, and
    /// when it is admitted again it is not charged again for its prompt (its
    /// footprint then is prompt + generated, which the engine recomputes).
    pub fn preempt(&mut self, rid: u64) -> Result<()> {
        let s = self.running_slot(rid, Op::Preempt)?;
        self.preempt_slot(s);
        Ok(())
    }

    /*
     * set_aside / put_back: an engine skips the request it popped.
     *
     * An engine that pops a request and then cannot serve it yet (vLLM: its
     * grammar is still compiling, its LoRA adapter has no slot) sets it
     * aside, and puts it back once it is done walking its queue. Set aside,
     * the request is out of its client's queue (so `peek` moves on), neither
     * waiting nor running, and nothing is charged. Put back, it returns to
     * the head of its client's queue with its original submit seq (ahead of
     * the client's later requests, and in the tie-break as if it had never
     * left), and its client is not lifted, even when it had nothing else
     * waiting: it was set aside, not idle, so no counter changes at all.
     * (Cancel-and-resubmit would put it behind its client's later requests
     * and lift the client to the floor.) Putting back several of one
     * client's requests latest first restores their order.
     */
    /// Engine mode: take the request [`peek`](Self::peek) names out of its
    /// client's queue without admitting or charging it (see above).
    pub fn set_aside(&mut self) -> Option<u64> {
        let e = self.top_entity()?;
        Some(self.set_aside_at(Pick { e, pos: 0 }))
    }

    /// [`set_aside`](Self::set_aside) through the locality window (see
    /// [`peek_with`](Self::peek_with)); a failing lookup sets nothing aside.
    pub fn set_aside_with(&mut self, lookup: &mut dyn PrefixLookup) -> Result<Option<u64>> {
        let p = self.select(Some(lookup))?;
        Ok(p.map(|p| self.set_aside_at(p)))
    }

    /// Take the request at `p` out of its queue (see above).
    fn set_aside_at(&mut self, p: Pick) -> u64 {
        let e = p.e;
        let c = self.entities[e as usize].client;
        let entry = self.take_at(p);
        debug_assert!(self.entry_live(&entry));
        let r = &mut self.requests[entry.slot as usize];
        r.state = Slot::Aside;
        let rid = r.rid;
        self.num_waiting -= 1;
        let cl = &mut self.clients[c as usize];
        cl.n_waiting -= 1;
        cl.n_aside += 1;
        self.changes.touch(c);
        self.entities[e as usize].n_waiting -= 1;
        if self.waiting_left(c, e) {
            self.adjust_entity(e);
        }
        rid
    }

    /// Engine mode: return a request [`set_aside`](Self::set_aside) took to
    /// the head of its client's queue, with its place, nothing charged and
    /// no lift (see above).
    pub fn put_back(&mut self, rid: u64) -> Result<()> {
        let s = self.slot_of(rid)?;
        let state = self.requests[s as usize].state;
        if state != Slot::Aside {
            return Err(CoreError::NotAside {
                request_id: rid,
                now: state.now(),
            });
        }
        let c = self.requests[s as usize].client;
        self.clients[c as usize].n_aside -= 1;
        self.requeue_front(s);
        Ok(())
    }

    /// A running request is done: its tokens leave the KV budget.
    pub fn finish(&mut self, rid: u64) -> Result<()> {
        let s = self.running_slot(rid, Op::Finish)?;
        self.settle(s, true);
        self.remove_running(s, Slot::Free);
        self.free_slot(s);
        self.release_band(self.requests[s as usize].priority);
        Ok(())
    }

    /// Drop a live request: a waiting one leaves its queue, a running one
    /// (an abort) releases its KV tokens like `finish`.
    pub fn cancel(&mut self, rid: u64) -> Result<()> {
        let s = self.slot_of(rid)?;
        let priority = self.requests[s as usize].priority;
        match self.requests[s as usize].state {
            Slot::Running => {
                self.settle(s, false);
                self.remove_running(s, Slot::Free);
                self.free_slot(s);
            }
            Slot::Waiting => {
                self.settle(s, false);
                let r = &self.requests[s as usize];
                let (c, seq) = (r.client, r.seq);
                let e = self
                    .entity_of(c, r.priority)
                    .expect("a waiting request has its entity");
                let was_head = self.entities[e as usize].head_seq == seq;
                self.free_slot(s);
                self.num_waiting -= 1;
                self.clients[c as usize].n_waiting -= 1;
                self.changes.touch(c);
                self.entities[e as usize].n_waiting -= 1;
                // not the head: the live head stays, nothing to re-key
                debug_assert!(was_head || self.entities[e as usize].n_waiting > 0);
                if was_head && self.waiting_left(c, e) {
                    self.adjust_entity(e);
                }
            }
            Slot::Aside => {
                self.settle(s, false);
                let c = self.requests[s as usize].client;
                self.clients[c as usize].n_aside -= 1;
                self.changes.touch(c);
                self.free_slot(s);
            }
            Slot::Free => unreachable!("indexed request {rid} in a free slot"),
        }
        self.release_band(priority);
        Ok(())
    }

    /// Weighted bands: a request of band `priority` has left for good (after
    /// its band's backlog is updated, so a band leaving both at once records
    /// its counter as the last to leave).
    fn release_band(&mut self, priority: i64) {
        if let Some(sh) = &mut self.shares {
            sh.release(priority);
        }
    }
}
