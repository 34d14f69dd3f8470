//! The Virtual Token Counter scheduler.
//!
//! Data path (see `shared/design.md`):
//!
//! ```text
//! submit   -> place_entity (the lift) -> client FIFO; client joins the heap if it was idle
//! schedule -> least-key backlogged client -> fits in M? no: stop (no skipping)
//!                                                   yes: charge prefill, run it, re-key client
//! decode   -> update_curr: charge each client for its tokens, grow occupancy, re-key
//! finish   -> release prompt + generated tokens from occupancy
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;

use crate::band::{Band, Entity, QueueEntry, Share, Shares, NO_ENTITY};
use crate::client::{Client, ClientId};
use crate::cost::{Cost, Pending};
use crate::error::{CoreError, Op, Result};
use crate::heap::{Key, NOT_IN_HEAP};
use crate::limits::{
    price_ok, weight_ok, MAX_BUDGET, MAX_COUNTER, MAX_REQUEST_TOKENS, MAX_TOKENS_PER_CALL,
};

/// Which request goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Least counter first, with the lift.
    Vtc,
    /// Least counter first without the lift (idle time can be banked).
    Lcf,
    /// Global submit order.
    Fcfs,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Vtc => "vtc",
            Policy::Lcf => "lcf",
            Policy::Fcfs => "fcfs",
        }
    }
}

impl FromStr for Policy {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "vtc" => Ok(Policy::Vtc),
            "lcf" => Ok(Policy::Lcf),
            "fcfs" => Ok(Policy::Fcfs),
            other => Err(CoreError::UnknownPolicy(other.to_string())),
        }
    }
}

/// Where a live request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    Waiting,
    Running,
    /// Taken out of its client's queue by [`Scheduler::set_aside`], not yet
    /// put back: neither waiting nor running, nothing charged.
    Aside,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Waiting,
    Running,
    Aside,
}

impl Slot {
    /// The state as error messages name it (never `Free`: that is "unknown").
    fn now(self) -> crate::error::Where {
        use crate::error::Where;
        match self {
            Slot::Waiting => Where::Waiting,
            Slot::Running => Where::Running,
            Slot::Aside | Slot::Free => Where::Aside,
        }
    }
}

#[derive(Debug, Clone)]
struct Request {
    rid: u64,
    client: u32,
    prompt: u64,
    /// Prompt tokens served from a prefix cache: in the KV budget, not charged.
    cached: u64,
    generated: u64,
    /// Global submit order; the tie-break between equal counters.
    seq: u64,
    /// Priority band (smaller is more urgent; see `band`).
    priority: i64,
    /// Global admission order; running requests are kept sorted by it.
    admit_seq: u64,
    /// Last decode call that touched this request (duplicate detection).
    decode_epoch: u64,
    state: Slot,
    prefill_paid: bool,
    /// `predicted` was given at submit (oracle or user prediction).
    prediction_given: bool,
    /// Before the first admission: the output length given at submit (if
    /// `prediction_given`); from then on: the output tokens pre-charged at
    /// admission (0: no prediction).
    predicted: u64,
}

impl Request {
    /// KV tokens this request holds while running.
    #[inline(always)]
    fn footprint(&self) -> u64 {
        self.prompt + self.generated
    }
}

/// Multiplicative hashing for request ids (engine-chosen integers, not
/// attacker-controlled keys).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        // fold the high bits down so that the table index (low bits) depends on all of them
        let x = (n ^ (n >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Where output-length predictions come from for requests submitted without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predictor {
    /// No prediction: such requests are charged per generated token (plain VTC).
    None,
    /// Per-client moving average of finished output lengths
    /// (`m += (len - m) / 8`, first sample taken as is), floored.
    Mean,
}

impl Predictor {
    pub fn name(self) -> &'static str {
        match self {
            Predictor::None => "none",
            Predictor::Mean => "mean",
        }
    }
}

impl FromStr for Predictor {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Predictor::None),
            "mean" => Ok(Predictor::Mean),
            other => Err(CoreError::UnknownPredictor(other.to_string())),
        }
    }
}

/// Token counts for [`Scheduler::decode`].
#[derive(Debug, Clone, Copy)]
pub enum Tokens<'a> {
    /// The same count for every request.
    Each(i64),
    /// One count per request id.
    PerRequest(&'a [i64]),
}

impl Tokens<'_> {
    /// The count of the `i`-th request.
    #[inline(always)]
    fn at(&self, i: usize) -> i64 {
        match *self {
            Tokens::Each(t) => t,
            Tokens::PerRequest(ts) => ts[i],
        }
    }
}

#[derive(Debug, Clone)]
pub struct Scheduler {
    budget: u64,
    cost: Cost,
    /// Per-client KV cap in the running batch (see `schedule`).
    client_cap: Option<u64>,
    predictor: Predictor,
    policy: Policy,
    clients: Vec<Client>,
    /// Priority bands by index; `order` lists the live ones, most urgent
    /// first. A band lives while a client waits in it.
    bands: Vec<Band>,
    order: Vec<u32>,
    free_bands: Vec<u32>,
    /// (client, band) entities by index (see `band`); freed ones are reused.
    entities: Vec<Entity>,
    free_entities: Vec<u32>,
    /// Clients with waiting requests.
    n_backlogged: usize,
    requests: Vec<Request>,
    free_slots: Vec<u32>,
    index: IdMap<u32>,
    /// Request id -> slot of the running requests only: a batch-sized table
    /// that stays in cache, for the per-request look-ups of `decode`,
    /// `finish` and `preempt` (`index` holds every request, waiting ones too).
    running_index: IdMap<u32>,
    /// Running request slots in admission order.
    running: Vec<u32>,
    /// KV tokens of the running requests. `u128`: engine mode (`pop`,
    /// `decode` with ids) adds without a capacity check, so only the
    /// per-request limits bound it (see `limits`).
    occupancy: u128,
    num_waiting: usize,
    seq: u64,
    admit_seq: u64,
    decode_epoch: u64,
    last_left: Option<u32>,
    /// Scratch list of clients touched by a decode call (kept to avoid allocating).
    touched: Vec<u32>,
    /// Scratch for choosing preemption victims.
    victims: Vec<(i64, f64, u64, u32)>,
    /// Scratch: the slots of a decode call's requests.
    slots: Vec<u32>,
    /// Ids of forgotten clients, reused by `add_client`.
    free_clients: Vec<u32>,
    /// Scratch: entities set aside by `schedule` while their client is at its cap.
    parked: Vec<u32>,
    /// Scratch, by client id: a non-linear cost's decode aggregates.
    extra: Vec<Pending>,
    /// By client id: the `mean` predictor's moving average of finished
    /// output lengths (`None` before the first finish).
    means: Vec<Option<f64>>,
    /// Weighted bands (see `band`); `None`: strict bands.
    shares: Option<Box<Shares>>,
}

impl Scheduler {
    /// A scheduler with KV budget `budget` tokens, prompt weight `wp`, decode
    /// weight `wq` and the given policy.
    pub fn new(budget: i64, wp: f64, wq: f64, policy: Policy) -> Result<Self> {
        if budget <= 0 || budget as u64 > MAX_BUDGET {
            return Err(CoreError::InvalidBudget(budget));
        }
        for (name, value) in [("wp", wp), ("wq", wq)] {
            if !price_ok(value) {
                return Err(CoreError::InvalidTokenWeight { name, value });
            }
        }
        Ok(Scheduler {
            budget: budget as u64,
            cost: Cost::Linear { wp, wq },
            client_cap: None,
            predictor: Predictor::None,
            policy,
            clients: Vec::new(),
            bands: Vec::new(),
            order: Vec::new(),
            free_bands: Vec::new(),
            entities: Vec::new(),
            free_entities: Vec::new(),
            n_backlogged: 0,
            requests: Vec::new(),
            free_slots: Vec::new(),
            index: IdMap::default(),
            running_index: IdMap::default(),
            running: Vec::new(),
            occupancy: 0,
            num_waiting: 0,
            seq: 0,
            admit_seq: 0,
            decode_epoch: 0,
            last_left: None,
            touched: Vec::new(),
            victims: Vec::new(),
            slots: Vec::new(),
            free_clients: Vec::new(),
            parked: Vec::new(),
            extra: Vec::new(),
            means: Vec::new(),
            shares: None,
        })
    }

    /// A scheduler charging with `cost` (see [`Cost`]) instead of `wp`/`wq`.
    pub fn with_cost(budget: i64, cost: Cost, policy: Policy) -> Result<Self> {
        let mut s = Scheduler::new(budget, 1.0, 2.0, policy)?;
        s.set_cost(cost)?;
        Ok(s)
    }

    /// Charge every later admission and decode with `cost`. Meant for
    /// configuration, before requests run: charges already made (including
    /// predictions pre-charged at admission, whose refund is computed with the
    /// cost in force at finish) are not revisited.
    pub fn set_cost(&mut self, cost: Cost) -> Result<()> {
        cost.validate()?;
        self.cost = cost;
        Ok(())
    }

    pub fn cost(&self) -> Cost {
        self.cost
    }

    /// Limit each client's KV tokens in the running batch (`None`: no cap).
    /// See [`schedule`](Self::schedule) for the rule. Fails for a cap of 0;
    /// a cap above `M` is `M` (the same constraint: `schedule` never lets
    /// the batch outgrow `M`).
    pub fn set_client_cap(&mut self, cap: Option<u64>) -> Result<()> {
        if cap == Some(0) {
            return Err(CoreError::InvalidClientCap(0));
        }
        self.client_cap = cap.map(|c| c.min(self.budget));
        Ok(())
    }

    pub fn client_cap(&self) -> Option<u64> {
        self.client_cap
    }

    /// Predict output lengths of requests submitted without one.
    pub fn set_predictor(&mut self, p: Predictor) {
        self.predictor = p;
    }

    pub fn predictor(&self) -> Predictor {
        self.predictor
    }

    // ---------------------------------------------------------------- views

    pub fn budget(&self) -> u64 {
        self.budget
    }
    /// The cost's per-prompt-token coefficient (`wp`; `a_p` for quadratic).
    pub fn wp(&self) -> f64 {
        self.cost.wp()
    }
    /// The cost's per-generated-token coefficient (`wq`; `a_q` for quadratic).
    pub fn wq(&self) -> f64 {
        self.cost.wq()
    }
    pub fn policy(&self) -> Policy {
        self.policy
    }
    /// KV tokens held by running requests (prompt + generated).
    pub fn occupancy(&self) -> u128 {
        self.occupancy
    }
    pub fn num_waiting(&self) -> usize {
        self.num_waiting
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    /// Clients known to the scheduler (forgotten ones excluded).
    pub fn num_clients(&self) -> usize {
        self.clients.len() - self.free_clients.len()
    }

    /// One past the largest client id in use (ids below it may be free).
    pub fn client_id_bound(&self) -> u32 {
        self.clients.len() as u32
    }
    /// Clients with waiting requests.
    pub fn num_backlogged(&self) -> usize {
        self.n_backlogged
    }

    /// Priority bands with waiting requests, most urgent first.
    pub fn num_bands(&self) -> usize {
        self.order.len()
    }

    pub fn client(&self, c: ClientId) -> Result<&Client> {
        self.clients
            .get(c.0 as usize)
            .filter(|cl| cl.live)
            .ok_or(CoreError::UnknownClient(c.0))
    }

    pub fn counter(&self, c: ClientId) -> Result<f64> {
        self.client(c).map(|c| c.counter)
    }

    pub fn service(&self, c: ClientId) -> Result<f64> {
        self.client(c).map(|c| c.service)
    }

    /// The raw tokens charged to `c`, `(prompt, decode)`, whatever they cost
    /// (prices, weight, cost function and refund credit do not enter):
    ///
    /// * `prompt`: at each request's first admission (`schedule`, `pop`,
    ///   `pop_cached`), its prompt minus its `cached_len`; a request
    ///   re-admitted after a preemption is not charged its prompt again and
    ///   adds nothing;
    /// * `decode`: the output tokens whose cost was charged: those of every
    ///   decode call (`decode_step`, `decode`), and a prediction's tokens,
    ///   pre-charged at the first admission (a decode then adds only tokens
    ///   beyond the prediction, and an over-prediction refunded at finish is
    ///   not taken back: the tally only grows).
    ///
    /// Both saturate at `u64::MAX`. The tally lives in the client record: a
    /// client forgotten by [`forget_idle`](Self::forget_idle) loses it (a
    /// client added again starts at 0), and a snapshot does not store it (a
    /// restored scheduler starts every client at 0).
    pub fn tokens(&self, c: ClientId) -> Result<(u64, u64)> {
        self.client(c).map(|c| (c.prompt_tokens, c.decode_tokens))
    }

    /// Every client with live requests, in id order, with `(waiting,
    /// running)`: `waiting` counts its queued requests and those set aside
    /// (taken out by [`set_aside`](Self::set_aside), not yet put back or
    /// cancelled: they are still the client's, between a pop and a put back
    /// within one engine step), `running` its admitted ones. A client with
    /// neither is absent (a forgotten one always is).
    ///
    /// Invariant (checked by [`check_invariants`](Self::check_invariants)):
    /// a client is listed iff it has a live request; the waiting counts sum
    /// to [`num_waiting`](Self::num_waiting) plus the set-aside requests,
    /// the running counts to [`num_running`](Self::num_running); each pair
    /// is what counting the client's requests by [`status`](Self::status)
    /// gives (`Waiting` and `Aside` as waiting, `Running` as running). Read
    /// from counts the client record keeps: O(clients), no allocation and no
    /// per-request work.
    pub fn active_clients(&self) -> impl Iterator<Item = (ClientId, (usize, usize))> + '_ {
        self.clients.iter().enumerate().filter_map(|(i, cl)| {
            let waiting = cl.n_waiting + cl.n_aside;
            (cl.live && waiting + cl.n_running > 0)
                .then_some((ClientId(i as u32), (waiting, cl.n_running)))
        })
    }

    pub fn status(&self, rid: u64) -> Option<RequestState> {
        self.index
            .get(&rid)
            .map(|&s| match self.requests[s as usize].state {
                Slot::Waiting => RequestState::Waiting,
                Slot::Running => RequestState::Running,
                Slot::Aside => RequestState::Aside,
                Slot::Free => unreachable!("indexed request {rid} in a free slot"),
            })
    }

    /// The status of each of `rids`, appended to `out` in order: one call
    /// for a batch (an engine reconciling its queues with the core).
    pub fn statuses(&self, rids: &[u64], out: &mut Vec<Option<RequestState>>) {
        out.reserve(rids.len());
        out.extend(rids.iter().map(|&rid| self.status(rid)));
    }

    /// Running request ids, oldest admission first.
    pub fn running(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.running.iter().map(|&s| self.requests[s as usize].rid)
    }

    /// Tokens generated so far by a live request.
    pub fn generated(&self, rid: u64) -> Result<u64> {
        let s = self.slot_of(rid)?;
        Ok(self.requests[s as usize].generated)
    }

    /// The client that most recently left the backlog (the lift's reference
    /// when nobody is backlogged).
    pub fn last_left(&self) -> Option<ClientId> {
        self.last_left.map(ClientId)
    }

    pub(crate) fn set_last_left(&mut self, c: Option<ClientId>) {
        self.last_left = c.map(|c| c.0);
    }

    /// Snapshot restore: set an idle client's state directly.
    pub(crate) fn restore_client(&mut self, c: ClientId, counter: f64, service: f64, weight: f64) {
        let cl = &mut self.clients[c.0 as usize];
        debug_assert!(cl.n_waiting == 0 && cl.n_running == 0);
        cl.counter = counter;
        cl.service = service;
        cl.weight = weight;
        cl.inv_w = 1.0 / weight;
    }

    // -------------------------------------------------------- configuration

    /// A new client with counter 0 and weight 1.
    pub fn add_client(&mut self) -> ClientId {
        if let Some(id) = self.free_clients.pop() {
            self.clients[id as usize] = Client::default();
            if let Some(m) = self.means.get_mut(id as usize) {
                *m = None;
            }
            return ClientId(id);
        }
        let id = u32::try_from(self.clients.len()).expect("more than 2^32 clients");
        assert!(id != NOT_IN_HEAP, "client id space exhausted");
        self.clients.push(Client::default());
        ClientId(id)
    }

    /// Weighted VTC: every later charge to `c` is divided by `weight`.
    pub fn set_weight(&mut self, c: ClientId, weight: f64) -> Result<()> {
        if !weight_ok(weight) {
            return Err(CoreError::InvalidWeight(weight));
        }
        let cl = self
            .clients
            .get_mut(c.0 as usize)
            .filter(|cl| cl.live)
            .ok_or(CoreError::UnknownClient(c.0))?;
        cl.weight = weight;
        cl.inv_w = 1.0 / weight;
        Ok(())
    }

    /// Weighted bands with these `(priority, weight)` pairs (a priority not
    /// listed weighs 1; a repeated priority keeps its last weight), or strict
    /// bands with `None` (see `band`). The counters of live bands are kept
    /// across a change of weights; switching modes starts them at 0. Fails,
    /// changing nothing, on a weight out of range.
    pub fn set_band_weights(&mut self, weights: Option<&[(i64, f64)]>) -> Result<()> {
        let Some(weights) = weights else {
            self.shares = None;
            return Ok(());
        };
        if let Some(&(_, w)) = weights.iter().find(|&&(_, w)| !weight_ok(w)) {
            return Err(CoreError::InvalidWeight(w));
        }
        let mut sorted: Vec<(i64, f64)> = Vec::with_capacity(weights.len());
        for &(p, w) in weights {
            match sorted.iter_mut().find(|(q, _)| *q == p) {
                Some(x) => x.1 = w,
                None => sorted.push((p, w)),
            }
        }
        sorted.sort_by_key(|&(p, _)| p);
        let shares = self.shares.get_or_insert_with(|| {
            let mut sh = Shares::default();
            for r in self.requests.iter().filter(|r| r.state != Slot::Free) {
                match sh.slot(r.priority) {
                    Ok(i) => sh.live[i].live += 1,
                    Err(i) => sh.live.insert(
                        i,
                        Share {
                            priority: r.priority,
                            counter: 0.0,
                            inv_w: 1.0,
                            live: 1,
                            pending: Pending::default(),
                        },
                    ),
                }
            }
            Box::new(sh)
        });
        shares.weights = sorted;
        for i in 0..shares.live.len() {
            shares.live[i].inv_w = 1.0 / shares.weight_of(shares.live[i].priority);
        }
        Ok(())
    }

    /// The band weights set with [`set_band_weights`](Self::set_band_weights)
    /// (`None`: strict bands), sorted by priority.
    pub fn band_weights(&self) -> Option<&[(i64, f64)]> {
        self.shares.as_ref().map(|s| &s.weights[..])
    }

    /// Under weighted bands, each band with live requests and its counter,
    /// by priority (nothing under strict bands).
    pub fn band_counters(&self) -> impl Iterator<Item = (i64, f64)> + '_ {
        self.shares
            .iter()
            .flat_map(|s| s.live.iter().map(|x| (x.priority, x.counter)))
    }

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
        if !(value.is_finite() && value.abs() <= MAX_COUNTER) {
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
    /// (see above); their ids are appended to `out` and will be reused.
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
                self.free_clients.push(i as u32);
                out.push(ClientId(i as u32));
            }
        }
        out.len() - start
    }

    // --------------------------------------------------------------- policy

    /// An entity's heap key: its client's counter and its head's submit seq.
    #[inline(always)]
    fn key_of(&self, e: u32) -> Key {
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

    /// Restore entity `e`'s heap position after its head or counter changed.
    #[inline(always)]
    fn adjust_entity(&mut self, e: u32) {
        let en = &self.entities[e as usize];
        if en.heap_pos != NOT_IN_HEAP {
            let b = en.band as usize;
            let key = self.key_of(e);
            self.bands[b].heap.update(e, key, &mut self.entities[..]);
        }
    }

    /// Restore the heap position of each of `c`'s entities after its
    /// counter changed (one entity per band it waits in).
    #[inline(always)]
    fn adjust(&mut self, c: u32) {
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
                let key = Key { counter, seq };
                self.bands[b as usize]
                    .heap
                    .update(e, key, &mut self.entities[..]);
            }
            e = next;
        }
    }

    /// The least counter over every backlogged client (all bands).
    fn least_backlogged(&self) -> Option<f64> {
        self.order
            .iter()
            .filter_map(|&b| self.bands[b as usize].heap.top())
            .map(|(_, key)| key.counter)
            .reduce(f64::min)
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
    fn find_band(&self, priority: i64) -> Option<u32> {
        self.band_slot(priority).ok().map(|i| self.order[i])
    }

    /// The entity of client `c` in band `priority`, if it waits there.
    #[inline]
    fn entity_of(&self, c: u32, priority: i64) -> Option<u32> {
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
    fn add_entity(&mut self, c: u32, priority: i64) -> u32 {
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
    fn top_entity(&self) -> Option<u32> {
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

    /*
     * place_band: the band lift (weighted bands only, vtc only; see `band`).
     * A band entering the backlog is placed at max(its counter, the least
     * band counter over the backlogged bands), or, with none backlogged, at
     * the counter of the band that last left; a band with no live request
     * starts there (at 0 without a floor). Called before the request counts
     * in its band.
     */
    fn place_band(&mut self, priority: i64) {
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
                    },
                );
            }
        }
    }

    /// update_curr: charge `amount` of weighted service to client `c`.
    ///
    /// Both the counter and the delivered service grow by the same amount;
    /// `amount` is `(w * tokens) * inv_w >= 0`, so counters never decrease.
    /// The caller re-keys the client (`adjust`) once it is done charging.
    ///
    /// A refund credit (length prediction) is absorbed first: the charge is
    /// reduced by up to `credit`, never below 0.
    #[inline(always)]
    fn update_curr(&mut self, c: u32, weighted_tokens: f64) {
        let cl = &mut self.clients[c as usize];
        let mut amount = weighted_tokens * cl.inv_w;
        if cl.credit > 0.0 {
            let used = cl.credit.min(amount);
            amount -= used;
            cl.credit -= used;
        }
        cl.counter += amount;
        cl.service += amount;
    }

    /*
     * place_entity: the lift applied to a client entering a band's backlog.
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
    fn place_entity(&mut self, k: u32, priority: i64) {
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
        // k may wait in other bands: its keys there follow its counter.
        self.adjust(k);
    }

    // ------------------------------------------------------------- requests

    fn slot_of(&self, rid: u64) -> Result<u32> {
        self.index
            .get(&rid)
            .copied()
            .ok_or(CoreError::UnknownRequest(rid))
    }

    #[inline]
    fn running_slot(&self, rid: u64, op: Op) -> Result<u32> {
        if let Some(&s) = self.running_index.get(&rid) {
            return Ok(s);
        }
        // Not running: say whether it is unknown or in another state.
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

    fn free_slot(&mut self, s: u32) {
        let r = &mut self.requests[s as usize];
        r.state = Slot::Free;
        let rid = r.rid;
        self.index.remove(&rid);
        self.free_slots.push(s);
    }

    #[inline]
    fn entry_live(&self, e: &QueueEntry) -> bool {
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
    fn waiting_left(&mut self, c: u32, e: u32) -> bool {
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
    /// when it enters a band it has nothing waiting in (see place_entity).
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
        let prompt = prompt_len as u64;
        let k = c.0;
        if !self.clients.get(k as usize).is_some_and(|cl| cl.live) {
            return Err(CoreError::UnknownClient(k));
        }
        // validated: from here on nothing fails
        let entity = self.entity_of(k, priority);
        if entity.is_none() && self.policy == Policy::Vtc {
            self.place_entity(k, priority);
        }
        if self.shares.is_some() {
            if self.find_band(priority).is_none() {
                self.place_band(priority);
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
            generated: 0,
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
        self.num_waiting += 1;
        if entity.is_none() {
            self.entities[e as usize].head_seq = seq;
            let key = self.key_of(e);
            let b = self.entities[e as usize].band as usize;
            self.bands[b].heap.push(e, key, &mut self.entities[..]);
        }
        Ok(())
    }

    /// The slot of the request the policy would admit next.
    #[inline]
    fn next_slot(&self) -> Option<u32> {
        let e = self.top_entity()?;
        let front = self.entities[e as usize].queue.front()?;
        Some(front.slot)
    }

    /// Admit the head request of the least-key entity of the most urgent
    /// band, without a KV check.
    fn admit_next(&mut self) -> Option<u64> {
        let e = self.top_entity()?;
        let c = self.entities[e as usize].client;
        let entry = self.entities[e as usize]
            .queue
            .pop_front()
            .expect("an entity has a queue");
        debug_assert!(self.entry_live(&entry));
        self.admit_seq += 1;
        let admit_seq = self.admit_seq;
        let cost = self.cost;
        let predictor = self.predictor;
        let mean = self.means.get(c as usize).copied().flatten();
        let r = &mut self.requests[entry.slot as usize];
        r.state = Slot::Running;
        r.admit_seq = admit_seq;
        let rid = r.rid;
        let fp = r.footprint();
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
            self.update_curr(c, w);
        }
        let cl = &mut self.clients[c as usize];
        cl.prompt_tokens = cl.prompt_tokens.saturating_add(prompt_tokens);
        cl.decode_tokens = cl.decode_tokens.saturating_add(decode_tokens);
        cl.occupancy += u128::from(fp);
        cl.n_waiting -= 1;
        cl.n_running += 1;
        self.entities[e as usize].n_waiting -= 1;
        if self.waiting_left(c, e) || charge.is_some() {
            // a new head, a new counter, or both: re-key every band it waits in
            self.adjust(c);
        }
        Some(rid)
    }

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
        let start = out.len();
        if self.client_cap.is_some() {
            self.schedule_capped(out);
            return out.len() - start;
        }
        while let Some(s) = self.next_slot() {
            let fp = self.requests[s as usize].footprint();
            if self.occupancy + u128::from(fp) > u128::from(self.budget) {
                break;
            }
            out.push(self.admit_next().expect("next_slot was Some"));
        }
        out.len() - start
    }

    #[cold]
    fn schedule_capped(&mut self, out: &mut Vec<u64>) {
        let cap = self.client_cap.expect("capped");
        let mut parked = std::mem::take(&mut self.parked);
        while let Some(e) = self.top_entity() {
            let s = self.next_slot().expect("an entity has a head");
            let fp = self.requests[s as usize].footprint();
            let c = self.entities[e as usize].client;
            let cl = &self.clients[c as usize];
            if cl.n_running > 0 && cl.occupancy + u128::from(fp) > u128::from(cap) {
                // out of selection for this call, in every band it waits in
                let mut x = cl.entities;
                while x != NO_ENTITY {
                    let b = self.entities[x as usize].band as usize;
                    self.bands[b].heap.remove(x, &mut self.entities[..]);
                    parked.push(x);
                    x = self.entities[x as usize].next;
                }
                continue;
            }
            if self.occupancy + u128::from(fp) > u128::from(self.budget) {
                break;
            }
            out.push(self.admit_next().expect("top entity has a head"));
        }
        for &e in &parked {
            let key = self.key_of(e);
            let b = self.entities[e as usize].band as usize;
            self.bands[b].heap.push(e, key, &mut self.entities[..]);
        }
        parked.clear();
        self.parked = parked;
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
        let Some(s) = self.next_slot() else {
            return Ok(None);
        };
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
        Ok(self.admit_next())
    }

    /// Charge every touched client its pending decode tokens and re-key it.
    ///
    /// When a decode touches a large share of the backlogged clients (a big
    /// batch over few clients), re-keying each with its own sift costs more
    /// than one O(C) rebuild: every client gets about the same charge in no
    /// particular order, so each sift sinks past siblings not yet charged.
    fn charge_touched(&mut self) {
        let cost = self.cost;
        let touched = std::mem::take(&mut self.touched);
        let rekey = self.policy != Policy::Fcfs;
        let in_heaps = self.entities.len() - self.free_entities.len();
        let bulk = rekey && touched.len() >= 32 && touched.len() * 4 >= in_heaps;
        for &c in &touched {
            let cl = &mut self.clients[c as usize];
            let t = std::mem::take(&mut cl.pending_tokens);
            cl.decode_tokens = cl.decode_tokens.saturating_add(t);
            let amount = match cost {
                Cost::Linear { wq, .. } => wq * t as f64,
                _ => cost.decode(&std::mem::take(&mut self.extra[c as usize])),
            };
            self.update_curr(c, amount);
            if bulk {
                let mut e = self.clients[c as usize].entities;
                while e != NO_ENTITY {
                    let key = self.key_of(e);
                    let b = self.entities[e as usize].band as usize;
                    self.bands[b]
                        .heap
                        .set_key_unordered(e, key, &self.entities[..]);
                    e = self.entities[e as usize].next;
                }
            } else if rekey {
                self.adjust(c);
            }
        }
        if bulk {
            for &b in &self.order {
                self.bands[b as usize].heap.rebuild(&mut self.entities[..]);
            }
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// Weighted bands: charge every band its decode call's tokens.
    #[inline(always)]
    fn charge_bands(&mut self) {
        if let Some(sh) = &mut self.shares {
            sh.charge_touched(&self.cost);
        }
    }

    /// Record that a request of client `c` with prompt `prompt`, having
    /// generated `before` tokens and with `predicted` tokens pre-charged,
    /// generated `tokens > 0` more; only the tokens beyond the prediction
    /// are charged.
    #[inline(always)]
    fn add_pending(&mut self, c: u32, prompt: u64, before: u64, tokens: u64, predicted: u64) {
        let linear = self.cost.is_linear();
        let cl = &mut self.clients[c as usize];
        cl.occupancy += u128::from(tokens);
        let (before, tokens) = if predicted > before {
            let end = before + tokens;
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
        if !linear {
            if self.extra.len() <= c as usize {
                self.extra.resize(self.clients.len(), Pending::default());
            }
            self.extra[c as usize].add(prompt, before, tokens);
        }
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
        let keep = self.running.len();
        for i in 0..keep {
            let s = self.running[i];
            let r = &mut self.requests[s as usize];
            let (c, prompt, before, pred) = (r.client, r.prompt, r.generated, r.predicted);
            let priority = r.priority;
            r.generated += 1;
            self.add_pending(c, prompt, before, 1, pred);
            if let Some(sh) = &mut self.shares {
                sh.add_tokens(priority, prompt, before, 1);
            }
        }
        self.occupancy += keep as u128;
        self.charge_touched();
        self.charge_bands();
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
                    tokens: r.footprint(),
                    budget: self.budget,
                };
                self.victims = order;
                return Err(err);
            }
            occ -= u128::from(self.requests[order[k].3 as usize].footprint());
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
        self.decode_epoch += 1;
        let epoch = self.decode_epoch;
        let mut slots = std::mem::take(&mut self.slots);
        slots.clear();
        let mut result = Ok(());
        for (i, &rid) in rids.iter().enumerate() {
            let s = match self.running_slot(rid, Op::Decode) {
                Ok(s) => s,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            slots.push(s);
            let r = &mut self.requests[s as usize];
            let t = tokens.at(i);
            let err = if r.decode_epoch == epoch {
                Some(CoreError::DuplicateInBatch(rid))
            } else if t < 0 {
                Some(CoreError::NegativeTokens(t))
            } else if t as u64 > MAX_TOKENS_PER_CALL {
                Some(CoreError::TooManyTokens(t as u64))
            } else if r.generated + t as u64 > MAX_REQUEST_TOKENS {
                Some(CoreError::RequestTooLong {
                    request_id: rid,
                    tokens: u128::from(r.generated) + t as u128,
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
        let mut total = 0u128;
        for (i, &s) in slots.iter().enumerate() {
            let t = tokens.at(i) as u64;
            let r = &mut self.requests[s as usize];
            let (c, prompt, before, pred) = (r.client, r.prompt, r.generated, r.predicted);
            let priority = r.priority;
            r.generated += t;
            total += u128::from(t);
            if t > 0 {
                self.add_pending(c, prompt, before, t, pred);
                if let Some(sh) = &mut self.shares {
                    sh.add_tokens(priority, prompt, before, t);
                }
            }
        }
        self.slots = slots;
        self.occupancy += total;
        self.charge_touched();
        self.charge_bands();
        Ok(())
    }

    fn remove_running(&mut self, s: u32) {
        let admit_seq = self.requests[s as usize].admit_seq;
        let pos = self
            .running
            .binary_search_by_key(&admit_seq, |&x| self.requests[x as usize].admit_seq)
            .expect("running request is in the running list");
        self.running.remove(pos);
        let r = &self.requests[s as usize];
        self.running_index.remove(&r.rid);
        let fp = r.footprint();
        self.occupancy -= u128::from(fp);
        let cl = &mut self.clients[r.client as usize];
        cl.n_running -= 1;
        cl.occupancy -= u128::from(fp);
    }

    fn preempt_slot(&mut self, s: u32) {
        self.remove_running(s);
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
        self.num_waiting += 1;
        let key = self.key_of(e);
        let b = self.entities[e as usize].band as usize;
        if first {
            self.bands[b].heap.push(e, key, &mut self.entities[..]);
        } else {
            self.bands[b].heap.update(e, key, &mut self.entities[..]);
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
        let c = self.entities[e as usize].client;
        let entry = self.entities[e as usize]
            .queue
            .pop_front()
            .expect("an entity has a queue");
        debug_assert!(self.entry_live(&entry));
        let r = &mut self.requests[entry.slot as usize];
        r.state = Slot::Aside;
        let rid = r.rid;
        self.num_waiting -= 1;
        let cl = &mut self.clients[c as usize];
        cl.n_waiting -= 1;
        cl.n_aside += 1;
        self.entities[e as usize].n_waiting -= 1;
        if self.waiting_left(c, e) {
            self.adjust_entity(e);
        }
        Some(rid)
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
     * (a returning client banks no refunds either, see place_entity).
     * Applies to finish and to cancelling a request that was admitted.
     * With `learn`, the `mean` predictor learns the actual length.
     */
    fn settle(&mut self, s: u32, learn: bool) {
        let r = &self.requests[s as usize];
        if !r.prefill_paid {
            return;
        }
        let (c, prompt, g, p) = (r.client, r.prompt, r.generated, r.predicted);
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

    /// A running request is done: its tokens leave the KV budget.
    pub fn finish(&mut self, rid: u64) -> Result<()> {
        let s = self.running_slot(rid, Op::Finish)?;
        self.settle(s, true);
        self.remove_running(s);
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
                self.remove_running(s);
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

    /// The bands: ordered by priority, each heap in order over entities of
    /// that band, every live entity in exactly one heap.
    fn check_bands(&self) -> std::result::Result<(), String> {
        let mut entities = 0;
        for (i, &b) in self.order.iter().enumerate() {
            let band = &self.bands[b as usize];
            if i > 0 && self.bands[self.order[i - 1] as usize].priority >= band.priority {
                return Err(format!("band {} out of priority order", band.priority));
            }
            band.heap.check(&self.entities[..])?;
            if band.heap.len() != band.n_entities || band.n_entities == 0 {
                return Err(format!(
                    "band {}: {} in its heap, {} entities",
                    band.priority,
                    band.heap.len(),
                    band.n_entities
                ));
            }
            entities += band.n_entities;
        }
        if entities + self.free_entities.len() != self.entities.len() {
            return Err(format!(
                "{entities} entities in bands, {} free, {} in all",
                self.free_entities.len(),
                self.entities.len()
            ));
        }
        if self.order.len() + self.free_bands.len() != self.bands.len() {
            return Err("a band is neither ordered nor free".into());
        }
        Ok(())
    }

    /// One entity of live client `c`: its queue, head and key; how many
    /// requests it holds.
    fn check_entity(&self, c: u32, e: u32) -> std::result::Result<usize, String> {
        let en = &self.entities[e as usize];
        let band = &self.bands[en.band as usize];
        if en.client != c || !self.order.contains(&en.band) {
            return Err(format!(
                "client {c}: entity {e} is not its own or has no band"
            ));
        }
        if en.heap_pos == NOT_IN_HEAP
            || self.bands[en.band as usize].heap.key_at(en.heap_pos) != self.key_of(e)
        {
            return Err(format!(
                "client {c}: entity {e} out of its heap or stale key"
            ));
        }
        let live: Vec<&QueueEntry> = en.queue.iter().filter(|q| self.entry_live(q)).collect();
        if live.len() != en.n_waiting || en.n_waiting == 0 {
            return Err(format!(
                "client {c}, band {}: n_waiting {} != live entries {}",
                band.priority,
                en.n_waiting,
                live.len()
            ));
        }
        if live.iter().any(|q| {
            let r = &self.requests[q.slot as usize];
            r.client != c || r.priority != band.priority
        }) {
            return Err(format!(
                "client {c}, band {}: queues a request of another client or band",
                band.priority
            ));
        }
        let front = en.queue.front().expect("non-empty");
        if !self.entry_live(front) || front.seq != en.head_seq {
            return Err(format!(
                "client {c}, band {}: front entry is not the live head",
                band.priority
            ));
        }
        let mut x = en.next;
        while x != NO_ENTITY {
            if self.entities[x as usize].band == en.band {
                return Err(format!(
                    "client {c}: two entities in band {}",
                    band.priority
                ));
            }
            x = self.entities[x as usize].next;
        }
        Ok(en.n_waiting)
    }

    /// Weighted bands: one share per priority with live requests, sorted,
    /// counting them; every backlogged band has one.
    fn check_shares(&self) -> std::result::Result<(), String> {
        let Some(sh) = &self.shares else {
            return Ok(());
        };
        let mut live: Vec<(i64, u64)> = Vec::new();
        for r in self.requests.iter().filter(|r| r.state != Slot::Free) {
            match live.binary_search_by_key(&r.priority, |x| x.0) {
                Ok(i) => live[i].1 += 1,
                Err(i) => live.insert(i, (r.priority, 1)),
            }
        }
        let have: Vec<(i64, u64)> = sh.live.iter().map(|x| (x.priority, x.live)).collect();
        if have != live {
            return Err(format!(
                "band shares {have:?} != live requests by band {live:?}"
            ));
        }
        if sh.live.iter().any(|x| x.pending != Pending::default()) || !sh.touched.is_empty() {
            return Err("band shares hold a decode call's sums".into());
        }
        Ok(())
    }

    /// Check every structural invariant (tests and fuzzing; O(n)).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.check_bands()?;
        self.check_shares()?;
        let mut occ = 0u128;
        let mut prev = 0u64;
        for &s in &self.running {
            let r = &self.requests[s as usize];
            if r.state != Slot::Running {
                return Err(format!("request {} in running list is not running", r.rid));
            }
            if r.admit_seq <= prev {
                return Err("running list out of admission order".into());
            }
            prev = r.admit_seq;
            occ += u128::from(r.footprint());
        }
        if occ != self.occupancy {
            return Err(format!(
                "occupancy {} != sum of footprints {occ}",
                self.occupancy
            ));
        }
        if self.running_index.len() != self.running.len()
            || self
                .running
                .iter()
                .any(|&s| self.running_index.get(&self.requests[s as usize].rid) != Some(&s))
        {
            return Err("running index disagrees with the running list".into());
        }
        let mut waiting = 0usize;
        let mut aside = vec![0usize; self.clients.len()];
        for r in self.requests.iter().filter(|r| r.state == Slot::Aside) {
            aside[r.client as usize] += 1;
        }
        let mut running = vec![0usize; self.clients.len()];
        let mut occ_of = vec![0u128; self.clients.len()];
        for &s in &self.running {
            let r = &self.requests[s as usize];
            running[r.client as usize] += 1;
            occ_of[r.client as usize] += u128::from(r.footprint());
        }
        for (i, cl) in self.clients.iter().enumerate() {
            if !cl.live {
                if cl.n_waiting + cl.n_running + cl.n_aside != 0 || cl.entities != NO_ENTITY {
                    return Err(format!("forgotten client {i} still has requests"));
                }
                continue;
            }
            let mut queued = 0;
            let mut e = cl.entities;
            while e != NO_ENTITY {
                queued += self.check_entity(i as u32, e)?;
                e = self.entities[e as usize].next;
            }
            if queued != cl.n_waiting {
                return Err(format!(
                    "client {i}: n_waiting {} != live entries {queued}",
                    cl.n_waiting
                ));
            }
            if cl.n_running != running[i] {
                return Err(format!(
                    "client {i}: n_running {} != {}",
                    cl.n_running, running[i]
                ));
            }
            if cl.n_aside != aside[i] {
                return Err(format!(
                    "client {i}: n_aside {} != {}",
                    cl.n_aside, aside[i]
                ));
            }
            if cl.occupancy != occ_of[i] {
                return Err(format!(
                    "client {i}: occupancy {} != {}",
                    cl.occupancy, occ_of[i]
                ));
            }
            waiting += cl.n_waiting;
            // Rounding is monotone, so equal charges keep counter >= service exactly.
            if cl.counter < cl.service {
                return Err(format!(
                    "client {i}: counter {} below service {}",
                    cl.counter, cl.service
                ));
            }
        }
        if waiting != self.num_waiting {
            return Err(format!("num_waiting {} != {waiting}", self.num_waiting));
        }
        let backlogged = self
            .clients
            .iter()
            .filter(|c| c.live && c.n_waiting > 0)
            .count();
        if backlogged != self.n_backlogged {
            return Err(format!(
                "n_backlogged {} != {backlogged}",
                self.n_backlogged
            ));
        }
        // active_clients: the per-client counts it reads, summed, are the
        // queues, the set-aside requests and the running list.
        let (mut w, mut r, mut n) = (0usize, 0usize, 0usize);
        for (c, (cw, cr)) in self.active_clients() {
            if !self.clients[c.0 as usize].live || cw + cr == 0 {
                return Err(format!("active_clients lists idle client {}", c.0));
            }
            (w, r, n) = (w + cw, r + cr, n + 1);
        }
        let with_requests = self
            .clients
            .iter()
            .enumerate()
            .filter(|&(i, cl)| cl.live && (cl.n_waiting > 0 || running[i] > 0 || aside[i] > 0))
            .count();
        let aside_total: usize = aside.iter().sum();
        if w != self.num_waiting + aside_total || r != self.running.len() || n != with_requests {
            return Err(format!(
                "active_clients: waiting {w}, running {r} over {n} clients, but {} waiting, \
                 {aside_total} set aside, {} running over {with_requests} clients",
                self.num_waiting,
                self.running.len()
            ));
        }
        let live = self
            .requests
            .iter()
            .filter(|r| r.state != Slot::Free)
            .count();
        if live != self.index.len() {
            return Err(format!(
                "{} live slots but {} indexed ids",
                live,
                self.index.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_tallies_saturate_instead_of_overflowing() {
        let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
        let x = s.add_client();
        s.clients[x.0 as usize].prompt_tokens = u64::MAX - 1;
        s.clients[x.0 as usize].decode_tokens = u64::MAX - 2;
        s.submit_full(1, x, 10, 0, Some(5)).unwrap();
        s.schedule(&mut Vec::new());
        assert_eq!(s.tokens(x).unwrap(), (u64::MAX, u64::MAX));
        s.decode(&[1], Tokens::Each(20)).unwrap();
        s.decode_step(&mut Vec::new()).unwrap();
        assert_eq!(s.tokens(x).unwrap(), (u64::MAX, u64::MAX));
        s.check_invariants().unwrap();
    }
}
