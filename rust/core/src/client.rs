//! Per-client state: the virtual counter, the service actually delivered, the
//! weight (with its inverse precomputed, as dmclock does), the list of its
//! entities (its waiting requests, one FIFO per priority band; see `band`),
//! and the tally of the raw tokens it was charged.

use crate::band::NO_ENTITY;

/// Dense client handle issued by [`crate::Scheduler::add_client`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u32);

/*
 * Client layout: what a decode step writes, in its first cache line.
 *
 * An engine step charges every running client (`Scheduler::decode_all`),
 * and runs between the engine's bulk work, with this array cold: a client
 * costs about the cache lines it touches, not its instructions. So the
 * fields a linear uniform charge reads and writes (the counter, service,
 * inverse weight and credit of `charge_client`, the occupancy and raw
 * tokens, the running count) and the entity list its re-key walks share the
 * first 64 bytes, and the record is aligned to a line (bench/README.md, 47).
 * `repr(C)` keeps that order; the assertions below keep it true.
 */
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub struct Client {
    /// Virtual counter: weighted service received plus lifts. Never decreases.
    pub(crate) counter: f64,
    /// Weighted service actually delivered (no lifts). Never decreases.
    pub(crate) service: f64,
    /// `1 / weight`, so a charge is one multiplication.
    pub(crate) inv_w: f64,
    /// Refunded over-predictions not yet absorbed by later charges
    /// (weighted service; see `Scheduler::settle`).
    pub(crate) credit: f64,
    /// KV tokens held by this client's running requests (the memory cap).
    pub(crate) occupancy: u128,
    /// Raw output tokens charged: by decode calls, and predicted output
    /// pre-charged at admission. Saturating; see `Scheduler::tokens`.
    pub(crate) decode_tokens: u64,
    /// Requests of this client that are running (fewer than the request
    /// slab's `u32` ids).
    pub(crate) n_running: u32,
    /// First of its entities (one per band it waits in), or `NO_ENTITY`.
    pub(crate) entities: u32,
    // ---- second line: the rest
    /// The sum of its running requests' prompts (their generated tokens
    /// sum to `occupancy - run_prompt`; see `Scheduler::decode_all`).
    pub(crate) run_prompt: u128,
    pub(crate) weight: f64,
    /// Waiting requests, over all its entities.
    pub(crate) n_waiting: usize,
    /// Requests of this client set aside (`Scheduler::set_aside`).
    pub(crate) n_aside: usize,
    /// Scratch: tokens to charge from the decode call being applied (the
    /// other integer aggregates of a non-linear cost live beside the clients,
    /// in `Scheduler::extra`, to keep this struct small).
    pub(crate) pending_tokens: u64,
    /// Raw prompt tokens charged at admission (prompt minus `cached_len`,
    /// once per request). Saturating; see `Scheduler::tokens`.
    pub(crate) prompt_tokens: u64,
    /// Its index in `Scheduler::running_clients` while it has running requests.
    pub(crate) run_pos: u32,
    /// False once forgotten; the id is then free for reuse.
    pub(crate) live: bool,
}

// (the layout above: the uniform charge's fields in the first line, two lines in all)
const _: () = assert!(std::mem::offset_of!(Client, entities) + 4 <= 64);
const _: () = assert!(std::mem::size_of::<Client>() == 128);

impl Default for Client {
    fn default() -> Self {
        Client::NEW
    }
}

impl Client {
    /// A new client's record: counter 0, weight 1, nothing charged.
    pub const NEW: Client = Client {
        counter: 0.0,
        service: 0.0,
        weight: 1.0,
        inv_w: 1.0,
        entities: NO_ENTITY,
        n_waiting: 0,
        n_running: 0,
        n_aside: 0,
        pending_tokens: 0,
        occupancy: 0,
        credit: 0.0,
        prompt_tokens: 0,
        decode_tokens: 0,
        live: true,
        run_prompt: 0,
        run_pos: u32::MAX,
    };
}

impl Client {
    #[inline]
    pub fn counter(&self) -> f64 {
        self.counter
    }
    #[inline]
    pub fn service(&self) -> f64 {
        self.service
    }
    #[inline]
    pub fn weight(&self) -> f64 {
        self.weight
    }
    #[inline]
    pub fn num_waiting(&self) -> usize {
        self.n_waiting
    }
    #[inline]
    pub fn num_running(&self) -> usize {
        self.n_running as usize
    }
    /// Requests of this client set aside (`Scheduler::set_aside`), not yet
    /// put back; `Scheduler::active_clients` counts them as waiting.
    #[inline]
    pub fn num_aside(&self) -> usize {
        self.n_aside
    }
    /// KV tokens held by this client's running requests.
    #[inline]
    pub fn occupancy(&self) -> u128 {
        self.occupancy
    }
    /// Refund not yet absorbed (length prediction).
    #[inline]
    pub fn credit(&self) -> f64 {
        self.credit
    }
    /// Raw prompt tokens charged to this client (see `Scheduler::tokens`).
    #[inline]
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }
    /// Raw output tokens charged to this client (see `Scheduler::tokens`).
    #[inline]
    pub fn decode_tokens(&self) -> u64 {
        self.decode_tokens
    }
    #[inline]
    pub fn is_backlogged(&self) -> bool {
        self.n_waiting > 0
    }
}
