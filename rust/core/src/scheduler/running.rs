//! The running set's sums, and `decode_all`: the uniform decode in
//! O(running clients).
//!
//! Invariant (checked by `invariants`): a running request's generated count
//! is its `gen` plus `uniform` (wrapping), so `decode_all` moves every
//! running request on by moving `uniform`; every client's `run_prompt` is
//! the sum of its running requests' prompts (their generated tokens sum to
//! `occupancy - run_prompt`), every weighted band's `run` holds its running
//! requests' count, prompts and generated tokens; `running_clients` lists
//! each client with running requests exactly once, at its `run_pos`;
//! `n_predicting` counts the running requests with generated < predicted;
//! `gen_hi` is at least every running request's generated count.

use super::charge::charge_decode;
use super::request::Slot;
use super::{Scheduler, Tokens};
use crate::cost::{Cost, RunSums};
use crate::error::{CoreError, Result};
use crate::limits::{MAX_REQUEST_TOKENS, MAX_TOKENS_PER_CALL};

impl Scheduler {
    /// Request slot `s` (waiting, just taken from its queue) starts running.
    pub(super) fn start_running(&mut self, s: u32) {
        let uniform = self.uniform;
        let r = &mut self.requests[s as usize];
        let (c, prompt, gen, priority) = (r.client, r.prompt, r.gen, r.priority);
        if r.predicted > gen {
            self.n_predicting += 1;
        }
        r.start_running(uniform);
        self.gen_hi = self.gen_hi.max(gen);
        let cl = &mut self.clients[c as usize];
        if cl.run_pos == u32::MAX {
            cl.run_pos = self.running_clients.len() as u32;
            self.running_clients.push(c);
        }
        cl.run_prompt += u128::from(prompt);
        if let Some(sh) = &mut self.shares {
            sh.enter_running(priority, prompt, gen);
        }
    }

    /// Running request slot `s` stops running and goes to state `next`
    /// (its client's `n_running` is updated by the caller, after).
    pub(super) fn stop_running(&mut self, s: u32, next: Slot) {
        let uniform = self.uniform;
        let r = &mut self.requests[s as usize];
        r.stop_running(uniform, next);
        let (c, prompt, gen, priority) = (r.client, r.prompt, r.gen, r.priority);
        if r.predicted > gen {
            self.n_predicting -= 1;
        }
        let cl = &mut self.clients[c as usize];
        cl.run_prompt -= u128::from(prompt);
        if cl.n_running == 1 {
            let pos = std::mem::replace(&mut cl.run_pos, u32::MAX) as usize;
            self.running_clients.swap_remove(pos);
            if let Some(&moved) = self.running_clients.get(pos) {
                self.clients[moved as usize].run_pos = pos as u32;
            }
        }
        if let Some(sh) = &mut self.shares {
            sh.leave_running(priority, prompt, gen);
        }
    }

    /*
     * decode_all: every running request generated `t` tokens.
     *
     * The charges are those of `decode(<every running id>, Each(t))`, bit
     * for bit: a client's decode charge is a fixed expression of integer
     * sums over its requests (`cost`), and for a uniform step those sums
     * follow from the client's running sums alone (`RunSums::grow_all`).
     * So the call costs O(clients with running requests), not O(running
     * requests): the per-request counts move on together through `uniform`.
     * Two cases still walk the requests: a running request inside its
     * prediction (its tokens up to the prediction are not charged, so the
     * sums do not apply; the `mean` predictor makes this the usual case),
     * and a call that might take a request past MAX_REQUEST_TOKENS (the
     * bound `gen_hi` is loose once requests leave; the walk finds the exact
     * largest count, and the first request over, in admission order).
     */
    /// Engine form, uniform: every running request generated `tokens` more
    /// tokens (most decode steps: one each), with no ids to pass or look up.
    /// The same charges as `decode(<every running id>, Each(tokens))`.
    /// Checks: `tokens` (negative, more than MAX_TOKENS_PER_CALL), then the
    /// running requests in admission order (past MAX_REQUEST_TOKENS); the
    /// first failing check is the error and nothing has changed then. No
    /// capacity check, as for every engine-form call.
    pub fn decode_all(&mut self, tokens: i64) -> Result<()> {
        if tokens < 0 {
            return Err(CoreError::NegativeTokens(tokens));
        }
        let t = tokens as u64;
        if t > MAX_TOKENS_PER_CALL {
            return Err(CoreError::TooManyTokens(t));
        }
        if self.gen_hi + t > MAX_REQUEST_TOKENS {
            self.tighten_gen_hi(t)?;
        }
        if t == 0 || self.running.is_empty() {
            return Ok(());
        }
        // (the version moves by `apply_decode`, or by the charge's touches below)
        self.uniform_decodes += 1;
        if self.n_predicting > 0 {
            let slots = std::mem::take(&mut self.running);
            self.apply_decode(&slots, Tokens::Each(tokens));
            self.running = slots;
            return Ok(());
        }
        self.uniform = self.uniform.wrapping_add(t);
        self.gen_hi += t;
        debug_assert!(self.touched.is_empty());
        if let Cost::Linear { wq, .. } = self.cost {
            self.charge_running_linear(wq, t);
        } else {
            if self.extra.len() < self.clients.len() {
                self.extra.resize(self.clients.len(), Default::default());
            }
            for &c in &self.running_clients {
                let cl = &mut self.clients[c as usize];
                debug_assert!(cl.n_running > 0 && cl.pending_tokens == 0);
                let mut run = RunSums {
                    n: u64::from(cl.n_running),
                    prompt: cl.run_prompt,
                    gen: cl.occupancy - cl.run_prompt,
                };
                let sums = run.grow_all(t);
                cl.occupancy = cl.run_prompt + run.gen;
                cl.pending_tokens = sums.t;
                self.extra[c as usize] = sums;
                self.touched.push(c);
            }
            self.charge_touched();
        }
        if let Some(sh) = &mut self.shares {
            sh.add_uniform(t);
        }
        self.occupancy += self.running.len() as u128 * u128::from(t);
        self.charge_bands();
        Ok(())
    }

    /*
     * charge_running_linear: `decode_all`'s charge under a linear cost, in
     * one pass over the running clients.
     *
     * The charges of `charge_touched` for `n * t` pending tokens each, bit for
     * bit (the same `wq * tokens` and `charge_decode`, the same clients
     * touched in the same order), but each client's record is visited once,
     * while its line is in cache, and no scratch count is written: a step's
     * cost here is the lines it touches (`Client`'s layout). The wide sums
     * of `grow_all` are not made: a linear cost charges the token count
     * alone, and the occupancy is that count too.
     */
    fn charge_running_linear(&mut self, wq: f64, t: u64) {
        let (clients, changes, touched) =
            (&mut self.clients[..], &mut self.changes, &mut self.touched);
        for &c in &self.running_clients {
            let cl = &mut clients[c as usize];
            debug_assert!(cl.n_running > 0 && cl.pending_tokens == 0);
            let tokens = u64::from(cl.n_running) * t;
            cl.occupancy += u128::from(tokens);
            charge_decode(cl, c, tokens, wq * tokens as f64, changes);
            touched.push(c);
        }
        self.rekey_touched();
    }

    /// `gen_hi + t` is past the limit: make `gen_hi` exact, or fail with the
    /// first running request (admission order) that `t` more would take
    /// past MAX_REQUEST_TOKENS. Changes nothing observable.
    #[cold]
    fn tighten_gen_hi(&mut self, t: u64) -> Result<()> {
        let mut hi = 0;
        for &s in &self.running {
            let r = &self.requests[s as usize];
            let g = r.generated(self.uniform);
            if g + t > MAX_REQUEST_TOKENS {
                return Err(CoreError::RequestTooLong {
                    request_id: r.rid,
                    tokens: u128::from(g) + u128::from(t),
                });
            }
            hi = hi.max(g);
        }
        self.gen_hi = hi;
        Ok(())
    }
}
