//! The request slab and the id maps: a request gets a slot and its id an
//! entry at `submit`, and gives both back at `free_slot`.
//!
//! Invariant: `index` maps exactly the live request ids to their slots;
//! freed slots wait on `free_slots` and are reused before the slab grows;
//! `submit*` checks everything before it changes anything, so an `Err`
//! leaves the scheduler as it was.

use super::request::{Request, Slot};
use super::{Policy, Scheduler};
use crate::band::QueueEntry;
use crate::client::ClientId;
use crate::error::{CoreError, Op, Result};
use crate::limits::MAX_TOKENS_PER_CALL;

impl Scheduler {
    pub(super) fn slot_of(&self, rid: u64) -> Result<u32> {
        self.index
            .get(&rid)
            .copied()
            .ok_or(CoreError::UnknownRequest(rid))
    }

    /// The slot of running request `rid`; the error says whether it is
    /// unknown or in another state. Inlined into `decode`'s per-id loop.
    #[inline(always)]
    pub(super) fn running_slot(&self, rid: u64, op: Op) -> Result<u32> {
        match self.running_index.get(rid) {
            Some(s) => Ok(s),
            None => self.not_running(rid, op),
        }
    }

    /// [`running_slot`](Self::running_slot) of a request that is not running.
    #[cold]
    #[inline(never)]
    fn not_running(&self, rid: u64, op: Op) -> Result<u32> {
        let s = self.slot_of(rid)?;
        let state = self.requests[s as usize].state;
        if state != Slot::Running {
            return Err(CoreError::NotRunning {
                request_id: rid,
                op,
                now: state.now(),
            });
        }
        Ok(s)
    }

    fn alloc_slot(&mut self, req: Request) -> u32 {
        if let Some(s) = self.free_slots.pop() {
            self.requests[s as usize] = req;
            s
        } else {
            self.requests.push(req);
            (self.requests.len() - 1) as u32
        }
    }

    pub(super) fn free_slot(&mut self, s: u32) {
        let r = &mut self.requests[s as usize];
        r.state = Slot::Free;
        let rid = r.rid;
        self.index.remove(&rid);
        self.free_slots.push(s);
    }

    /// The checks `submit` makes on a request id and prompt length, without
    /// submitting (lets a caller validate before creating a client).
    pub fn check_submit(&self, rid: u64, prompt_len: i64, cached_len: i64) -> Result<()> {
        self.check_submit_full(rid, prompt_len, cached_len, None)
    }

    /// [`check_submit`](Self::check_submit) with a predicted output length.
    pub fn check_submit_full(
        &self,
        rid: u64,
        prompt_len: i64,
        cached_len: i64,
        predicted_output: Option<i64>,
    ) -> Result<()> {
        if let Some(p) = predicted_output {
            if p < 0 || p as u64 > MAX_TOKENS_PER_CALL {
                return Err(CoreError::InvalidPrediction(p));
            }
        }
        if prompt_len <= 0 {
            return Err(CoreError::InvalidPrompt(prompt_len));
        }
        if cached_len < 0 || cached_len > prompt_len {
            return Err(CoreError::InvalidCached {
                cached_len,
                prompt_len,
            });
        }
        if prompt_len as u64 > self.budget {
            return Err(CoreError::PromptTooLong {
                prompt_len: prompt_len as u64,
                budget: self.budget,
            });
        }
        if self.index.contains_key(&rid) {
            return Err(CoreError::DuplicateRequest(rid));
        }
        Ok(())
    }

    /// Queue a new request `rid` from client `c` with a prompt of `prompt_len`
    /// tokens, at the default priority 0.
    pub fn submit(&mut self, rid: u64, c: ClientId, prompt_len: i64) -> Result<()> {
        self.submit_cached(rid, c, prompt_len, 0)
    }

    /// [`submit`](Self::submit) a request whose first `cached_len` prompt
    /// tokens are a prefix-cache hit: they count in the KV budget but are
    /// not charged (the client pays for the prefill actually computed).
    pub fn submit_cached(
        &mut self,
        rid: u64,
        c: ClientId,
        prompt_len: i64,
        cached_len: i64,
    ) -> Result<()> {
        self.submit_full(rid, c, prompt_len, cached_len, None)
    }

    /// [`submit_cached`](Self::submit_cached) with an optional predicted
    /// output length (oracle or user-supplied): charged up front at first
    /// admission, then only tokens beyond it; an over-estimate is refunded
    /// as credit when the request finishes (see `settle`).
    pub fn submit_full(
        &mut self,
        rid: u64,
        c: ClientId,
        prompt_len: i64,
        cached_len: i64,
        predicted_output: Option<i64>,
    ) -> Result<()> {
        self.submit_priority(rid, c, prompt_len, cached_len, predicted_output, 0)
    }

    /// [`submit_full`](Self::submit_full) in priority band `priority`
    /// (smaller is more urgent). Strict bands: a request is admitted only
    /// when no more urgent request waits; inside a band, the least counter
    /// goes first; one counter per client across bands. A client is lifted
    /// when it enters a band it has nothing waiting in (see `lift`).
    pub fn submit_priority(
        &mut self,
        rid: u64,
        c: ClientId,
        prompt_len: i64,
        cached_len: i64,
        predicted_output: Option<i64>,
        priority: i64,
    ) -> Result<()> {
        self.check_submit_full(rid, prompt_len, cached_len, predicted_output)?;
        if !self.clients.get(c.0 as usize).is_some_and(|cl| cl.live) {
            return Err(CoreError::UnknownClient(c.0));
        }
        self.enqueue_request(rid, c, prompt_len, cached_len, predicted_output, priority);
        Ok(())
    }

    /// The body of [`submit_priority`](Self::submit_priority), for a request
    /// its caller has already checked: `check_submit_full` passed for these
    /// arguments and `c` is live (`submit_keyed` checks, then interns).
    /// Nothing here fails.
    pub(super) fn enqueue_request(
        &mut self,
        rid: u64,
        c: ClientId,
        prompt_len: i64,
        cached_len: i64,
        predicted_output: Option<i64>,
        priority: i64,
    ) {
        debug_assert!(self
            .check_submit_full(rid, prompt_len, cached_len, predicted_output)
            .is_ok());
        let prompt = prompt_len as u64;
        let k = c.0;
        debug_assert!(self.clients.get(k as usize).is_some_and(|cl| cl.live));
        let entity = self.entity_of(k, priority);
        if entity.is_none() && self.policy == Policy::Vtc {
            self.lift(k, priority);
        }
        if self.shares.is_some() {
            if self.find_band(priority).is_none() {
                self.lift_band(priority);
            }
            let shares = self.shares.as_mut().expect("weighted bands");
            let i = shares.slot(priority).expect("placed");
            shares.live[i].live += 1;
        }
        self.seq += 1;
        let seq = self.seq;
        let slot = self.alloc_slot(Request {
            rid,
            client: k,
            prompt,
            cached: cached_len as u64,
            gen: 0,
            seq,
            priority,
            admit_seq: 0,
            decode_epoch: 0,
            state: Slot::Waiting,
            prefill_paid: false,
            prediction_given: predicted_output.is_some(),
            predicted: predicted_output.unwrap_or(0) as u64,
        });
        self.index.insert(rid, slot);
        let e = entity.unwrap_or_else(|| self.add_entity(k, priority));
        let en = &mut self.entities[e as usize];
        en.queue.push_back(QueueEntry { slot, seq });
        en.n_waiting += 1;
        let cl = &mut self.clients[k as usize];
        if cl.n_waiting == 0 {
            self.n_backlogged += 1;
        }
        cl.n_waiting += 1;
        self.changes.touch(k);
        self.num_waiting += 1;
        if entity.is_none() {
            self.entities[e as usize].head_seq = seq;
            let key = self.key_of(e);
            let b = self.entities[e as usize].band as usize;
            self.bands[b].heap.push(e, key, &mut self.entities[..]);
        }
    }
}
