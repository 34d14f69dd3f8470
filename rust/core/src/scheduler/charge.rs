//! Charging: the service each client and band pays for its tokens.
//!
//! Invariant: a charge is `(w * tokens) * inv_w >= 0`, added to both the
//! counter and the delivered service (so counter >= service, and neither
//! decreases), less any refund credit, which absorbs charges first; a decode
//! call's tokens are charged once, at the end of the call, and only beyond
//! what was pre-charged as a prediction.

use super::changes::Changes;
use super::{Policy, Predictor, Scheduler};
use crate::client::Client;
use crate::cost::{Cost, Pending};

impl Scheduler {
    /// Charge `amount` of weighted service to client `c`.
    /// (CFS does this in `update_curr`, Linux kernel/sched/fair.c.)
    ///
    /// Both the counter and the delivered service grow by the same amount;
    /// `amount` is `(w * tokens) * inv_w >= 0`, so counters never decrease.
    /// The caller re-keys the client (`adjust`) once it is done charging, or
    /// leaves its heap keys stale (`charge_touched`: a decode's charges).
    ///
    /// A refund credit (length prediction) is absorbed first: the charge is
    /// reduced by up to `credit`, never below 0.
    #[inline(always)]
    pub(super) fn charge(&mut self, c: u32, weighted_tokens: f64) {
        charge_client(&mut self.clients[c as usize], weighted_tokens);
        self.changes.touch(c);
    }

    /*
     * charge_touched: charge every touched client its pending decode tokens.
     *
     * Its heap keys are left stale (a lower bound: the charge is >= 0) and
     * only each band's top is freshened (`select`): an engine step charges
     * every running client, most of them far from the top, and a sift per
     * client per step was most of a decode's cost. A stale key is re-keyed
     * when it reaches a top, at most once per deferred charge.
     *
     * When a decode charges as many clients as there are entities in the
     * heaps (a big batch over few clients, every one running), their keys
     * are all set and the heaps rebuilt in O(C): every key is then stale by
     * about the same charge, and freshening the tops would sift nearly every
     * one of them. Below that, leaving keys stale costs less than the
     * rebuild (optimisation 34 in bench/README.md).
     */
    pub(super) fn charge_touched(&mut self) {
        let cost = self.cost;
        // the fields the loop writes, borrowed apart (kept in registers)
        let (clients, changes, extra) = (&mut self.clients[..], &mut self.changes, &mut self.extra);
        for &c in &self.touched {
            let cl = &mut clients[c as usize];
            let t = std::mem::take(&mut cl.pending_tokens);
            let amount = match cost {
                Cost::Linear { wq, .. } => wq * t as f64,
                _ => cost.decode(&std::mem::take(&mut extra[c as usize])),
            };
            charge_decode(cl, c, t, amount, changes);
        }
        self.rekey_touched();
    }

    /// The touched clients were charged: re-key them as `charge_touched`
    /// says (their keys left stale, or all set and the heaps rebuilt), then
    /// empty `touched`.
    pub(super) fn rekey_touched(&mut self) {
        let touched = std::mem::take(&mut self.touched);
        let rekey = self.policy != Policy::Fcfs;
        let in_heaps = self.entities.len() - self.free_entities.len();
        let bulk = rekey && touched.len() >= 32 && touched.len() >= in_heaps;
        if bulk {
            // every entry's counter set from its client (each heap entry holds
            // its client): no entity record read; a seq it holds may be stale
            // (a head cleaned, not re-keyed), a lower bound `freshen_tops`
            // makes true at the top, as for any stale key
            let clients = &self.clients[..];
            for &b in &self.order {
                let heap = &mut self.bands[b as usize].heap;
                heap.set_counters_unordered(|c| clients[c as usize].counter);
                heap.rebuild(&mut self.entities[..]);
            }
        }
        if rekey && !touched.is_empty() {
            self.freshen_tops();
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// Weighted bands: charge every band its decode call's tokens.
    #[inline(always)]
    pub(super) fn charge_bands(&mut self) {
        if let Some(sh) = &mut self.shares {
            sh.charge_touched(&self.cost);
        }
    }

    /*
     * settle: a request with a predicted output length leaves.
     *
     * It was charged h(n_p, p) - h(n_p, 0) for its predicted p tokens at
     * admission and then only for tokens beyond p. If it generated g < p,
     * the tokens g+1..p were paid for and never delivered. The paper
     * subtracts them from the counter; here counters never decrease, so the
     * over-charge becomes a *credit* that absorbs the client's next charges
     * (its counter stays flat until the credit is used up). The client's
     * effective counter, counter - credit, is exactly the paper's; the
     * difference is only that the priority catches up gradually instead of
     * jumping back, and the lift forfeits credit that lies below the floor
     * (a returning client banks no refunds either, see `lift`).
     * Applies to finish and to cancelling a request that was admitted.
     * With `learn`, the `mean` predictor learns the actual length.
     */
    pub(super) fn settle(&mut self, s: u32, learn: bool) {
        let r = &self.requests[s as usize];
        if !r.prefill_paid {
            return;
        }
        let (c, prompt, g, p) = (r.client, r.prompt, r.generated(self.uniform), r.predicted);
        if p > g {
            let mut over = Pending::default();
            over.add(prompt, g, p - g);
            let cl = &mut self.clients[c as usize];
            cl.credit += self.cost.decode(&over) * cl.inv_w;
        }
        if learn && self.predictor == Predictor::Mean {
            if self.means.len() <= c as usize {
                self.means.resize(self.clients.len(), None);
            }
            let m = &mut self.means[c as usize];
            *m = Some(match *m {
                Some(mean) => mean + (g as f64 - mean) * 0.125,
                None => g as f64,
            });
        }
    }
}

/// [`Scheduler::charge`] of one client's record: `weighted_tokens * inv_w`,
/// less the refund credit it absorbs first, added to its counter and its
/// delivered service.
#[inline(always)]
fn charge_client(cl: &mut Client, weighted_tokens: f64) {
    let mut amount = weighted_tokens * cl.inv_w;
    if cl.credit > 0.0 {
        let used = cl.credit.min(amount);
        amount -= used;
        cl.credit -= used;
    }
    cl.counter += amount;
    cl.service += amount;
}

/// Client `c`'s decode of `tokens` tokens, `weighted_tokens` by the cost:
/// counted in its decode tokens, charged (`charge_client`) and told to the
/// change feed. Every decode charge is this one (`charge_touched`,
/// `charge_running_linear`), so the two stay the same bit for bit.
#[inline(always)]
pub(super) fn charge_decode(
    cl: &mut Client,
    c: u32,
    tokens: u64,
    weighted_tokens: f64,
    changes: &mut Changes,
) {
    cl.decode_tokens = cl.decode_tokens.saturating_add(tokens);
    charge_client(cl, weighted_tokens);
    changes.touch(c);
}

/// What a decode call's tokens accrue before `charge_touched` charges them:
/// the scheduler's fields that record them, borrowed apart from the rest so
/// that a loop over a batch keeps them in registers.
pub(super) struct Accrual<'a> {
    pub(super) clients: &'a mut [Client],
    pub(super) touched: &'a mut Vec<u32>,
    pub(super) extra: &'a mut Vec<Pending>,
    pub(super) n_predicting: &'a mut usize,
    pub(super) linear: bool,
}

impl Accrual<'_> {
    /// Record that a request of client `c` with prompt `prompt`, having
    /// generated `before` tokens and with `predicted` tokens pre-charged,
    /// generated `tokens > 0` more; only the tokens beyond the prediction
    /// are charged.
    #[inline(always)]
    pub(super) fn add(&mut self, c: u32, prompt: u64, before: u64, tokens: u64, predicted: u64) {
        let cl = &mut self.clients[c as usize];
        cl.occupancy += u128::from(tokens);
        let (before, tokens) = if predicted > before {
            let end = before + tokens;
            if end >= predicted {
                *self.n_predicting -= 1; // the prediction is used up now
            }
            if end <= predicted {
                return;
            }
            (predicted, end - predicted)
        } else {
            (before, tokens)
        };
        if cl.pending_tokens == 0 {
            self.touched.push(c);
        }
        cl.pending_tokens += tokens;
        if !self.linear {
            if self.extra.len() <= c as usize {
                self.extra.resize(self.clients.len(), Pending::default());
            }
            self.extra[c as usize].add(prompt, before, tokens);
        }
    }
}
