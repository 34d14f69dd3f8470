//! Priority bands and the entities the band heaps order.
//!
//! A request carries a priority (smaller is more urgent). A *band* holds the
//! clients with waiting requests of one priority; an *entity* is one client's
//! waiting requests of one priority: the FIFO of them, the submit sequence of
//! its head, and its position in the band's heap (as in dmclock's
//! `ClientRec::heap_data`). A client waiting in two bands has two entities,
//! linked from the client record; both are keyed by the client's one counter.
//! With every request at the default priority there is one band and one
//! entity per backlogged client.
//!
//! An entity exists exactly while it holds a waiting request, and a band
//! exactly while it holds an entity, so memory follows the waiting requests
//! whatever priorities an engine hands over.

use std::collections::VecDeque;

use crate::heap::{IndexedHeap, Positions, NOT_IN_HEAP};

/// End of a client's entity list.
pub(crate) const NO_ENTITY: u32 = u32::MAX;
/// `Entity::skip_seq` when no head has been overtaken (no request has this seq).
pub(crate) const NO_SKIP: u64 = u64::MAX;

/// One waiting entry: a request slot and the submit sequence it had when it
/// was queued. Cancelling a waiting request leaves its entry behind; an entry
/// is live only while the slot still holds a waiting request with that `seq`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueEntry {
    pub slot: u32,
    pub seq: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Entity {
    pub client: u32,
    /// Index of its band in `Scheduler::bands`.
    pub band: u32,
    /// Waiting requests of this priority, oldest first; the front entry is
    /// always live (`n_waiting > 0` while the entity exists).
    pub queue: VecDeque<QueueEntry>,
    /// Live entries in `queue`.
    pub n_waiting: usize,
    /// Submit sequence of the head request.
    pub head_seq: u64,
    /// Position in the band heap, or `NOT_IN_HEAP` (only while
    /// `Scheduler::schedule` has parked a client at its cap).
    pub heap_pos: u32,
    /// The client's next entity, or `NO_ENTITY`.
    pub next: u32,
    /// The locality window's overtakes of the head: `skips` requests behind
    /// the head whose seq is `skip_seq` were taken before it (see
    /// `scheduler::window`); stale once the head has another seq.
    pub skip_seq: u64,
    pub skips: u32,
}

impl Entity {
    pub fn new(client: u32, band: u32) -> Self {
        Entity {
            client,
            band,
            queue: VecDeque::new(),
            n_waiting: 0,
            head_seq: 0,
            heap_pos: NOT_IN_HEAP,
            next: NO_ENTITY,
            skip_seq: NO_SKIP,
            skips: 0,
        }
    }
}

impl Positions for [Entity] {
    #[inline(always)]
    fn set_pos(&mut self, id: u32, pos: u32) {
        self[id as usize].heap_pos = pos;
    }
    #[inline(always)]
    fn pos(&self, id: u32) -> u32 {
        self[id as usize].heap_pos
    }
    #[inline(always)]
    fn owner(&self, id: u32) -> u32 {
        self[id as usize].client
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Band {
    pub priority: i64,
    /// The band's entities keyed by (client counter, head seq).
    pub heap: IndexedHeap,
    /// Entities in this band (in the heap, or parked by a capped schedule).
    pub n_entities: usize,
}

/*
 * Weighted bands: a fair share of bands first, of clients inside each.
 *
 * With band weights set, every band with a live request has a *band
 * counter*: the service its requests received (prefill at first admission,
 * every generated token; before the client's weight and any prediction)
 * divided by the band's weight. Admission takes the band with the least
 * (band counter, priority) among those with a selectable client, then the
 * least client counter inside it. A band that enters the backlog (a request
 * submitted where nobody waits) is lifted to the least band counter over
 * the backlogged bands, or, with none, to the counter of the band that
 * last left the backlog: the client rule one level up, so that two bands
 * backlogged over an interval keep
 *
 *     |V_a - V_b| <= 2 * max(wp * L_input, wq * M) / min(w_a, w_b).
 *
 * Shares live while their band has live requests (waiting, set aside or
 * running: running ones are still charged), so memory follows the live
 * requests whatever priorities an engine hands over; they are kept sorted
 * by priority and found by binary search.
 */

use crate::cost::{Pending, RunSums};

#[derive(Debug, Clone)]
pub(crate) struct Share {
    pub priority: i64,
    pub counter: f64,
    pub inv_w: f64,
    /// Live requests of this priority.
    pub live: u64,
    /// A decode call's token sums for this band, charged at its end.
    pub pending: Pending,
    /// Its running requests' sums (for `decode_all`).
    pub run: RunSums,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Shares {
    /// The configured weights by priority, sorted; others weigh 1.
    pub weights: Vec<(i64, f64)>,
    /// Bands with live requests, sorted by priority.
    pub live: Vec<Share>,
    /// The band that last left the backlog, and its counter when its share
    /// went (read only while it has none).
    pub last_left: Option<(i64, f64)>,
    /// Scratch: the shares a decode call touched (indices into `live`).
    pub touched: Vec<u32>,
}

impl Shares {
    pub fn weight_of(&self, priority: i64) -> f64 {
        self.weights
            .binary_search_by_key(&priority, |&(p, _)| p)
            .map_or(1.0, |i| self.weights[i].1)
    }

    #[inline]
    pub fn slot(&self, priority: i64) -> std::result::Result<usize, usize> {
        self.live.binary_search_by_key(&priority, |s| s.priority)
    }

    pub fn get(&self, priority: i64) -> Option<&Share> {
        self.slot(priority).ok().map(|i| &self.live[i])
    }

    pub fn get_mut(&mut self, priority: i64) -> Option<&mut Share> {
        self.slot(priority).ok().map(|i| &mut self.live[i])
    }

    /// The counter the band that last left the backlog stands at.
    pub fn last_left_counter(&self) -> Option<f64> {
        let (p, value) = self.last_left?;
        Some(self.get(p).map_or(value, |s| s.counter))
    }

    /// Add `tokens` generated after `before` by a request of band `priority`
    /// with prompt `prompt` to its band's sums.
    #[inline]
    pub fn add_tokens(&mut self, priority: i64, prompt: u64, before: u64, tokens: u64) {
        let i = self
            .slot(priority)
            .expect("a live request's band has a share");
        let sh = &mut self.live[i];
        if sh.pending.t == 0 {
            self.touched.push(i as u32);
        }
        sh.pending.add(prompt, before, tokens);
        sh.run.gen += u128::from(tokens);
    }

    /// Every running request generated `t > 0` tokens: each band with
    /// running requests gets their sums at once.
    pub fn add_uniform(&mut self, t: u64) {
        for (i, sh) in self.live.iter_mut().enumerate() {
            if sh.run.n > 0 {
                debug_assert_eq!(sh.pending.t, 0);
                sh.pending = sh.run.grow_all(t);
                self.touched.push(i as u32);
            }
        }
    }

    /// The share of band `priority`, which has a live request.
    #[inline]
    fn live_share(&mut self, priority: i64) -> &mut Share {
        self.get_mut(priority)
            .expect("a live request's band has a share")
    }

    /// A running request of band `priority` enters or leaves the running set.
    #[inline]
    pub fn enter_running(&mut self, priority: i64, prompt: u64, gen: u64) {
        self.live_share(priority).run.enter(prompt, gen);
    }

    #[inline]
    pub fn leave_running(&mut self, priority: i64, prompt: u64, gen: u64) {
        self.live_share(priority).run.leave(prompt, gen);
    }

    /// Charge every touched band its decode call's sums.
    pub fn charge_touched(&mut self, cost: &crate::cost::Cost) {
        for &i in &self.touched {
            let sh = &mut self.live[i as usize];
            let sums = std::mem::take(&mut sh.pending);
            sh.counter += cost.decode(&sums) * sh.inv_w;
        }
        self.touched.clear();
    }

    /// A live request of band `priority` leaves for good: the share goes
    /// with the band's last one.
    pub fn release(&mut self, priority: i64) {
        let i = self
            .slot(priority)
            .expect("a live request's band has a share");
        self.live[i].live -= 1;
        if self.live[i].live == 0 {
            let sh = self.live.remove(i);
            if let Some((p, v)) = &mut self.last_left {
                if *p == priority {
                    *v = sh.counter;
                }
            }
        }
    }
}
