//! The numeric limits of every value the scheduler accepts.
//!
//! They are chosen so that no accepted sequence of calls can overflow an
//! integer or make a counter infinite or NaN (every snapshot stays
//! restorable):
//!
//! * tokens are integers: a budget up to 2^53 (exact in an `f64`), at most
//!   2^32 - 1 tokens per request per decode call, at most 2^54 tokens in one
//!   request's footprint over its life; occupancy is summed in `u128`, so
//!   even 2^32 requests of 2^55 tokens each cannot wrap it;
//! * prices (`wp`, `wq`, every cost coefficient) are at most 1e9 and client
//!   weights within [1e-6, 1e6], so one charge is at most about
//!   1e9 * (2^54)^2 * 1e6 < 1e50 (the quadratic term of a huge request) and
//!   `1 / weight` is finite: reaching f64's 1.8e308 would take more than
//!   1e250 charges;
//! * counters given from outside (`raise_counter`) are at most 1e30 in
//!   magnitude.

/// Largest KV budget `M`, in tokens (every token count stays exact in an `f64`).
pub const MAX_BUDGET: u64 = 1 << 53;

/// Largest token count accepted for one request in one decode call. Keeps
/// every sum of tokens far from `u64` overflow and exact in an `f64`.
pub const MAX_TOKENS_PER_CALL: u64 = u32::MAX as u64;

/// Largest number of tokens one request may generate over its life.
pub const MAX_REQUEST_TOKENS: u64 = 1 << 54;

/// Largest price of a token (`wp`, `wq` and every cost coefficient).
pub const MAX_PRICE: f64 = 1e9;

/// Smallest client weight.
pub const MIN_WEIGHT: f64 = 1e-6;

/// Largest client weight.
pub const MAX_WEIGHT: f64 = 1e6;

/// Largest magnitude of a counter given from outside (`raise_counter`).
pub const MAX_COUNTER: f64 = 1e30;

/// A client weight the scheduler accepts.
#[inline]
pub fn weight_ok(w: f64) -> bool {
    (MIN_WEIGHT..=MAX_WEIGHT).contains(&w)
}

/// A counter value the scheduler accepts from outside (`raise_counter`).
#[inline]
pub fn counter_ok(v: f64) -> bool {
    v.is_finite() && v.abs() <= MAX_COUNTER
}

/// A token price the scheduler accepts.
#[inline]
pub fn price_ok(p: f64) -> bool {
    (0.0..=MAX_PRICE).contains(&p)
}

/// Change-feed reader slots (`Scheduler::changes`): independent cursors over
/// the clients' changes, each reader's own.
pub const READERS: usize = 4;
