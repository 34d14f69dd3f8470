//! The Virtual Token Counter scheduler.
//!
//! Data path (the whole of it, engine mode included: docs/architecture.md):
//!
//! ```text
//! submit   -> lift -> client FIFO; client joins the heap if it was idle
//! schedule -> least-key backlogged client -> fits in M? no: stop (no skipping)
//!                                                   yes: charge prefill, run it, re-key client
//! decode   -> charge: charge each client for its tokens, grow occupancy; keys left
//!             stale below each band's fresh top (select.rs)
//! finish   -> release prompt + generated tokens from occupancy
//! ```
//!
//! This module holds the [`Scheduler`] struct, its constructors (from a
//! [`Config`], validated in `crate::config`), its configuration setters and
//! its read-only views; its other methods live in child modules, by concern:
//!
//! * `request`: the request record and its states, [`Tokens`], the id hasher;
//! * `slab`: request slots and the id maps, `submit`;
//! * `select`: heap keys, bands and entities, which request goes next;
//! * `window`: the locality window (it asks a [`PrefixLookup`], `crate::lookup`);
//! * `lift`: the lift, raised counters, the forget floor;
//! * `charge`: charging clients and bands, the refund at `settle`;
//! * `running`: the running set's sums per client and band, `decode_all`;
//! * `engine`: the engine-mode calls (`pop`, `decode`, `preempt`, `finish`, ...);
//! * `batch`: the built-in batch loop (`schedule`, `decode_step`);
//! * `keyed`: clients by the caller's key (`intern`, `client_of`, `key`);
//! * `changes`: which clients changed since a reader's last read (`changes`);
//! * `invariants`: `check_invariants`.
//!
//! Imports: `crate::config` and `request` import nothing from the
//! scheduler, and this module imports them; the other child modules hold
//! `impl Scheduler` blocks and import this one. [`PrefixLookup`] lives in
//! `crate::lookup` (it imports nothing from the scheduler); this module
//! re-exports it.
//!
//! Invariant: the configuration setters change no request, queue or heap
//! (`set_band_weights` only builds the band shares from the live requests),
//! and the views change nothing.

mod batch;
mod changes;
mod charge;
mod engine;
mod invariants;
mod keyed;
mod lift;
mod request;
mod run_index;
mod running;
mod select;
mod slab;
mod window;

pub use crate::config::{Policy, Predictor};
pub use crate::lookup::{LookupFailed, PrefixLookup};
pub use changes::{Gone, READERS};
pub use request::{RequestState, Tokens};
pub use window::LOCALITY_DEPTH;

use crate::band::{Band, Entity, Share, Shares};
use crate::client::{Client, ClientId};
use crate::config::{check_band_weights, check_locality_quantum};
use crate::config::{ClientCap, Config};
use crate::cost::{Cost, Pending, RunSums};
use crate::error::{CoreError, Result};
use crate::heap::NOT_IN_HEAP;
use crate::keys::ClientKeys;
use crate::limits::weight_ok;
use request::{IdMap, Request, Slot};
use run_index::RunIndex;

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
    /// `finish` and `preempt` (`index` holds every request, waiting ones too);
    /// open addressing in one array, a probe usually one cache line (`run_index`).
    running_index: RunIndex,
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
    /// Tokens `decode_all` gave every running request, in all (wrapping:
    /// only differences are read, see `Request::generated`).
    uniform: u64,
    /// `decode_all` calls that charged tokens (see `uniform_decodes`).
    uniform_decodes: u64,
    /// Clients with running requests, in no order (see `running`).
    running_clients: Vec<u32>,
    /// Running requests still inside their prediction (generated < predicted).
    n_predicting: usize,
    /// At least the largest generated count of a running request.
    gen_hi: u64,
    /// The locality window's quantum `Q` (0: plain VTC; see `window`).
    locality_quantum: f64,
    /// Scratch: the locality window's candidate entities.
    window: Vec<u32>,
    /// The caller's key of each client (see `keyed`).
    keys: ClientKeys,
    /// The change readers' cursors (see `changes`).
    changes: changes::Changes,
}

impl Scheduler {
    /// A scheduler with KV budget `budget` tokens, prompt weight `wp`, decode
    /// weight `wq` and the given policy.
    pub fn new(budget: i64, wp: f64, wq: f64, policy: Policy) -> Result<Self> {
        Scheduler::with_config(&Config {
            cost: Cost::Linear { wp, wq },
            policy,
            ..Config::new(budget)
        })
    }

    /// A scheduler charging with `cost` (see [`Cost`]) instead of `wp`/`wq`.
    pub fn with_cost(budget: i64, cost: Cost, policy: Policy) -> Result<Self> {
        Scheduler::with_config(&Config {
            cost,
            policy,
            ..Config::new(budget)
        })
    }

    /// A scheduler built from `config`, which is validated first (see
    /// [`Config::validate`]): a bad value fails the call, nothing is built.
    pub fn with_config(config: &Config) -> Result<Self> {
        config.validate()?;
        let budget = config.budget_tokens()?;
        let mut s = Scheduler::empty(budget, config.cost, config.policy);
        s.client_cap = config.client_cap.map(|c| c.tokens(budget)).transpose()?;
        s.predictor = config.predictor;
        s.locality_quantum = config.locality_quantum;
        s.set_band_weights(config.band_weights.as_deref())?;
        Ok(s)
    }

    /// The configuration this scheduler runs with (the client cap in tokens).
    pub fn config(&self) -> Config {
        Config {
            budget: self.budget as i64,
            cost: self.cost,
            policy: self.policy,
            client_cap: self.client_cap.map(ClientCap::Tokens),
            predictor: self.predictor,
            band_weights: self.shares.as_ref().map(|s| s.weights.clone()),
            locality_quantum: self.locality_quantum,
        }
    }

    /// A scheduler with a validated budget and cost, and nothing else set.
    fn empty(budget: u64, cost: Cost, policy: Policy) -> Self {
        Scheduler {
            budget,
            cost,
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
            running_index: RunIndex::default(),
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
            uniform: 0,
            uniform_decodes: 0,
            running_clients: Vec::new(),
            n_predicting: 0,
            gen_hi: 0,
            locality_quantum: 0.0,
            window: Vec::new(),
            keys: ClientKeys::default(),
            changes: changes::Changes::default(),
        }
    }

    /// Charge every later admission and decode with `cost`. Meant for
    /// configuration, before requests run: charges already made (including
    /// predictions pre-charged at admission, whose refund is computed with the
    /// cost in force at finish) are not revisited.
    pub fn set_cost(&mut self, cost: Cost) -> Result<()> {
        cost.validate()?;
        self.cost = cost;
        self.changes.bump();
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
        self.changes.bump();
        Ok(())
    }

    pub fn client_cap(&self) -> Option<u64> {
        self.client_cap
    }

    /// Predict output lengths of requests submitted without one.
    pub fn set_predictor(&mut self, p: Predictor) {
        self.predictor = p;
        self.changes.bump();
    }

    pub fn predictor(&self) -> Predictor {
        self.predictor
    }

    /// Set the locality window's quantum `Q` (checked as
    /// [`Config::validate`] checks it: finite, `>= 0`, above 0 only with a
    /// counter policy); for a scheduler restored from a snapshot, which does
    /// not keep it. Fails, changing nothing, on a bad value.
    pub fn set_locality_quantum(&mut self, q: f64) -> Result<()> {
        check_locality_quantum(q, self.policy)?;
        self.locality_quantum = q;
        self.changes.bump();
        Ok(())
    }

    /// The locality window's quantum `Q` in counter units (0: plain VTC);
    /// set with the [`Config`], used by the `*_with` selecting calls
    /// ([`schedule_with`](Self::schedule_with), ...) given a [`PrefixLookup`].
    pub fn locality_quantum(&self) -> f64 {
        self.locality_quantum
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
    /// The `decode_all` calls that charged tokens (any running request and
    /// `tokens > 0`), so far: an engine's uniform steps. Not kept in a snapshot.
    pub fn uniform_decodes(&self) -> u64 {
        self.uniform_decodes
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
            let (waiting, running) = (cl.n_waiting + cl.n_aside, cl.num_running());
            (cl.live && waiting + running > 0).then_some((ClientId(i as u32), (waiting, running)))
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
        Ok(self.requests[s as usize].generated(self.uniform))
    }

    /// The client that most recently left the backlog (the lift's reference
    /// when nobody is backlogged).
    pub fn last_left(&self) -> Option<ClientId> {
        self.last_left.map(ClientId)
    }

    pub(crate) fn set_last_left(&mut self, c: Option<ClientId>) {
        self.last_left = c.map(|c| c.0);
    }

    /// Snapshot restore: set an idle client's state directly (its refund
    /// credit, and the `mean` predictor's average of it if it has one).
    pub(crate) fn restore_client(
        &mut self,
        c: ClientId,
        (counter, service, weight): (f64, f64, f64),
        credit: f64,
        mean: Option<f64>,
    ) {
        let cl = &mut self.clients[c.0 as usize];
        debug_assert!(cl.n_waiting == 0 && cl.n_running == 0);
        cl.counter = counter;
        cl.service = service;
        cl.weight = weight;
        cl.inv_w = 1.0 / weight;
        cl.credit = credit;
        self.changes.touch(c.0);
        if let Some(m) = mean {
            if self.means.len() <= c.0 as usize {
                self.means.resize(self.clients.len(), None);
            }
            self.means[c.0 as usize] = Some(m);
        }
    }

    /// The `mean` predictor's moving average of client `c`'s finished
    /// output lengths (`None` before its first finish, or if `c` is not live).
    pub fn mean(&self, c: ClientId) -> Option<f64> {
        self.client(c).ok()?;
        self.means.get(c.0 as usize).copied().flatten()
    }

    // -------------------------------------------------------- configuration

    /// A new client with counter 0 and weight 1.
    pub fn add_client(&mut self) -> ClientId {
        if let Some(id) = self.free_clients.pop() {
            self.clients[id as usize] = Client::default();
            if let Some(m) = self.means.get_mut(id as usize) {
                *m = None;
            }
            self.changes.touch(id);
            return ClientId(id);
        }
        let id = u32::try_from(self.clients.len()).expect("more than 2^32 clients");
        assert!(id != NOT_IN_HEAP, "client id space exhausted");
        self.clients.push(Client::default());
        self.changes.touch(id);
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
        self.changes.touch(c.0);
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
            self.changes.bump();
            return Ok(());
        };
        check_band_weights(weights)?;
        self.changes.bump();
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
            let uniform = self.uniform;
            for r in self.requests.iter().filter(|r| r.state != Slot::Free) {
                let i = match sh.slot(r.priority) {
                    Ok(i) => i,
                    Err(i) => {
                        sh.live.insert(
                            i,
                            Share {
                                priority: r.priority,
                                counter: 0.0,
                                inv_w: 1.0,
                                live: 0,
                                pending: Pending::default(),
                                run: RunSums::default(),
                            },
                        );
                        i
                    }
                };
                sh.live[i].live += 1;
                if r.state == Slot::Running {
                    sh.live[i].run.enter(r.prompt, r.generated(uniform));
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
