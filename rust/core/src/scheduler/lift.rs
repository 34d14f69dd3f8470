//! The lift and the forget floor: when a counter may be raised, and when an
//! idle client may be forgotten.
//!
//! Invariant: counters never decrease, and a client (or, under weighted
//! bands, a band) never gains service by having been idle: on entering a
//! backlog it is lifted to the floor (`lift`, `lift_band`, the long comments
//! below); `raise_counter(s)` only raise; `forget_idle` drops only clients
//! whose return would be exactly a new client's.

use super::{Policy, Scheduler};
use crate::band::Share;
use crate::client::{Client, ClientId};
use crate::cost::{Pending, RunSums};
use crate::error::{CoreError, Result};
use crate::limits::counter_ok;

impl Scheduler {
    /// Raise `c`'s counter to at least `value` (never lowers it). For
    /// schedulers that share counters across replicas: a replica lifts its
    /// local view to the global counter it learned.
    pub fn raise_counter(&mut self, c: ClientId, value: f64) -> Result<()> {
        self.check_raise(c, value)?;
        self.lift_counter(c.0, value);
        Ok(())
    }

    /*
     * raise_counters: raise_counter for many clients in one call (a replica
     * applying what one sync pulled), all or nothing.
     *
     * Every pair is checked (a valid counter, a live client) before any
     * counter moves, so an error leaves the scheduler as it was. A client
     * named twice ends at the larger value, as two raise_counter calls would
     * leave it. Returns how many pairs raised a counter.
     */
    pub fn raise_counters(&mut self, items: &[(ClientId, f64)]) -> Result<usize> {
        for &(c, v) in items {
            self.check_raise(c, v)?;
        }
        Ok(items
            .iter()
            .filter(|&&(c, v)| self.lift_counter(c.0, v))
            .count())
    }

    fn check_raise(&self, c: ClientId, value: f64) -> Result<()> {
        if !counter_ok(value) {
            return Err(CoreError::InvalidCounter(value));
        }
        self.clients
            .get(c.0 as usize)
            .filter(|cl| cl.live)
            .map(|_| ())
            .ok_or(CoreError::UnknownClient(c.0))
    }

    /// Set a checked client's counter to `value` if that raises it, keeping
    /// the heap in order; whether it rose.
    fn lift_counter(&mut self, c: u32, value: f64) -> bool {
        let cl = &mut self.clients[c as usize];
        if value <= cl.counter {
            return false;
        }
        cl.counter = value;
        self.changes.touch(c);
        if self.policy != Policy::Fcfs {
            self.adjust(c);
        }
        true
    }

    /*
     * forget_idle: bounded memory under client churn.
     *
     * Let L = min(floor, min counter of clients with running or set-aside
     * requests), where floor is the least backlogged counter over every
     * band (or the last-left client's when nobody waits). Every client that will ever be
     * backlogged or running again has a counter >= L: backlogged, running and
     * set-aside clients already do, counters only grow, a client re-entering
     * the backlog without a lift (through preemption or put_back) is one that
     * is running or set aside now or was admitted or set aside later (from
     * the backlog, so at a counter >= the floor then), and a client entering
     * through submit is lifted to a floor (the least counter of its band, or
     * of all bands) that, by the same argument, is >= L (or, with nobody
     * backlogged, to the last-left client's counter, >= L).
     * Before anyone was ever admitted there is no lift at all, so L = 0.
     * So a client with nothing waiting or running, counter <= L, default
     * weight, and which is not the lift's last-left reference, would be
     * lifted on its return to exactly what a brand-new client gets:
     * forgetting it changes no future decision. (Under lcf a returning
     * client is not lifted, so nothing is forgotten; under fcfs counters
     * decide nothing, so any idle client may go.) Its delivered service and
     * its token tally (`tokens`) are forgotten with it.
     *
     * A refund credit does not pin a client either: the lift of a client
     * with credit moves its position counter - credit up to the floor, so
     * with counter <= L <= floor it returns at the floor with credit
     * floor - max(counter - credit, floor) = 0, like a new client (and
     * credit <= counter always: it refunds what was charged).
     *
     * The one state that does matter is the `mean` predictor's learned
     * output length: a forgotten client starts learning again, as a new
     * client does (its next requests are admitted without a prediction
     * until one of them finishes). That is the price of memory that follows
     * the live set; a deployment that wants the means kept across idle
     * periods does not call forget_idle (or calls it less often).
     */
    /// Forget idle clients whose state can no longer influence any decision
    /// (see above), and their keys (see `keyed`); their ids are appended to
    /// `out` and will be reused.
    pub fn forget_idle(&mut self, out: &mut Vec<ClientId>) -> usize {
        let limit = match self.policy {
            Policy::Lcf => return 0,
            Policy::Fcfs => f64::INFINITY,
            Policy::Vtc => {
                let floor = match (self.least_backlogged(), self.last_left) {
                    (Some(least), _) => least,
                    (None, Some(l)) => self.clients[l as usize].counter,
                    // nobody was ever admitted: a returning client is not lifted
                    // at all, so only a client still at 0 is like a new one
                    (None, None) => 0.0,
                };
                self.clients
                    .iter()
                    .filter(|c| c.live && (c.n_running > 0 || c.n_aside > 0))
                    .fold(floor, |m, c| m.min(c.counter))
            }
        };
        let start = out.len();
        let means = &mut self.means;
        for (i, cl) in self.clients.iter_mut().enumerate() {
            let idle = cl.live
                && cl.n_waiting == 0
                && cl.n_running == 0
                && cl.n_aside == 0
                && cl.weight == 1.0;
            if idle && cl.counter <= limit && self.last_left != Some(i as u32) {
                *cl = Client {
                    live: false,
                    ..Client::default()
                };
                if let Some(m) = means.get_mut(i) {
                    *m = None;
                }
                self.changes
                    .forget(i as u32, self.keys.key(ClientId(i as u32)));
                self.free_clients.push(i as u32);
                out.push(ClientId(i as u32));
            }
        }
        self.keys.release(&out[start..]);
        out.len() - start
    }

    /// The least counter over every backlogged client (all bands).
    fn least_backlogged(&self) -> Option<f64> {
        self.order
            .iter()
            .filter_map(|&b| self.bands[b as usize].heap.top())
            .map(|(_, key)| key.counter)
            .reduce(f64::min)
    }

    /*
     * lift_band: the band lift (weighted bands only, vtc only; see `band`).
     * A band entering the backlog is placed at max(its counter, the least
     * band counter over the backlogged bands), or, with none backlogged, at
     * the counter of the band that last left; a band with no live request
     * starts there (at 0 without a floor). Called before the request counts
     * in its band.
     */
    pub(super) fn lift_band(&mut self, priority: i64) {
        let vtc = self.policy == Policy::Vtc;
        let least = self
            .order
            .iter()
            .map(|&b| self.bands[b as usize].priority)
            .filter_map(|p| self.shares.as_ref().and_then(|s| s.get(p)))
            .map(|s| s.counter)
            .reduce(f64::min);
        let shares = self.shares.as_mut().expect("weighted bands");
        let floor = least.or_else(|| shares.last_left_counter()).filter(|_| vtc);
        match shares.slot(priority) {
            Ok(i) => {
                if let Some(f) = floor {
                    let sh = &mut shares.live[i];
                    sh.counter = sh.counter.max(f);
                }
            }
            Err(i) => {
                let inv_w = 1.0 / shares.weight_of(priority);
                shares.live.insert(
                    i,
                    Share {
                        priority,
                        counter: floor.unwrap_or(0.0),
                        inv_w,
                        live: 0,
                        pending: Pending::default(),
                        run: RunSums::default(),
                    },
                );
            }
        }
    }

    /*
     * lift: the lift applied to a client entering a band's backlog.
     * (CFS's counterpart: `place_entity` in Linux kernel/sched/fair.c.)
     *
     * Let B be the set of backlogged clients (those with waiting requests),
     * B_p those with waiting requests of priority p, and c_i the counters.
     * A client k that submits a request of priority p while it has nothing
     * of priority p waiting is placed at
     *
     *     c_k := max(c_k, min_{i in B_p} c_i)        if B_p is non-empty
     *     c_k := max(c_k, min_{i in B} c_i)          else if B is non-empty
     *     c_k := max(c_k, c_l)                       otherwise, l = last client to leave B
     *
     * (with one band, the first two are the same rule).
     *
     * Invariant: a client never gains service by having been idle. While k
     * was out of B, every backlogged client kept being charged; had k kept
     * its stale counter it would now hold a credit it never contended for,
     * and least-counter-first would hand it the whole machine until the
     * credit ran out. Lifting to the *minimum* of B puts k at the front of
     * the active pack (not behind it), and `max` means k is never placed
     * backwards: a client that was over-served keeps its debt. Together with
     * admission from the least counter, this keeps any two clients that are
     * backlogged over [t1, t2] within
     *
     *     |W_f(t1,t2) - W_g(t1,t2)| <= 2 * max(wp * L_input, wq * M)
     *
     * (Sheng et al., OSDI '24, Theorem 4.4), independently of t2 - t1.
     * With bands the bound holds between two clients backlogged in the same
     * band while no more urgent band is backlogged: their band then takes
     * every admission, by least counter. The lift is to the least counter
     * of k's own band, the clients k competes with there: the least over
     * all bands would let a client banked low by a busy urgent band take
     * over a less urgent one, and vice versa. An empty band has no
     * competitors yet; the least over all bands then keeps idleness from
     * being banked against whoever joins next.
     */
    pub(super) fn lift(&mut self, k: u32, priority: i64) {
        // Band heaps are keyed by (counter, seq) under vtc: a top holds its band's least counter.
        let own = self
            .find_band(priority)
            .and_then(|b| self.bands[b as usize].heap.top())
            .map(|(_, key)| key.counter);
        let floor = if let Some(f) = own.or_else(|| self.least_backlogged()) {
            f
        } else if let Some(l) = self.last_left {
            self.clients[l as usize].counter
        } else {
            return;
        };
        let cl = &mut self.clients[k as usize];
        // With a refund credit the client's "true" counter is counter - credit;
        // the lift raises that to the floor, so credit below the floor is
        // forfeited (idle time banks nothing, refunds included).
        if cl.credit > 0.0 {
            let raised = cl.counter.max(floor);
            cl.credit = raised - (cl.counter - cl.credit).max(floor);
            cl.counter = raised;
        } else if floor > cl.counter {
            cl.counter = floor;
        }
        self.changes.touch(k);
        // k may wait in other bands: its keys there follow its counter.
        self.adjust(k);
    }
}
