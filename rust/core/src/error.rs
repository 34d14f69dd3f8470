//! The one error type of the core. Every fallible operation validates its
//! input completely before it mutates anything, so an `Err` always means the
//! scheduler is exactly as it was before the call.

use std::fmt;

/// Which operation found a request in the wrong state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Finish,
    Decode,
    Preempt,
}

/// Where a request is, for error messages (`RequestState` without `Running`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    Waiting,
    Running,
    Aside,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Where::Waiting => "waiting",
            Where::Running => "running",
            Where::Aside => "set aside",
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Finish => "finish",
            Op::Decode => "decode",
            Op::Preempt => "preempt",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum CoreError {
    /// `M` must be in `1..=MAX_BUDGET` tokens.
    InvalidBudget(i64),
    /// A per-client cap must be at least one token.
    InvalidClientCap(i64),
    /// A change reader must be below `READERS` (see `Scheduler::changes`).
    InvalidReader(usize),
    /// A token price (`wp`, `wq`, a cost coefficient) must be in `0..=MAX_PRICE`.
    InvalidTokenWeight { name: &'static str, value: f64 },
    /// A counter value must be finite, at most `MAX_COUNTER` in magnitude.
    InvalidCounter(f64),
    /// A client weight must be in `MIN_WEIGHT..=MAX_WEIGHT`.
    InvalidWeight(f64),
    /// `prompt_len` must be >= 1.
    InvalidPrompt(i64),
    /// `cached_len` must be in `0..=prompt_len`.
    InvalidCached { cached_len: i64, prompt_len: i64 },
    /// A predicted output length must be in `0..=MAX_TOKENS_PER_CALL`.
    InvalidPrediction(i64),
    /// The predictor name is not `none` or `mean`.
    UnknownPredictor(String),
    /// A prompt larger than `M` could never be admitted.
    PromptTooLong { prompt_len: u64, budget: u64 },
    /// The policy name is not one of `vtc`, `lcf`, `fcfs`.
    UnknownPolicy(String),
    /// A cost name other than "linear", "quadratic", "context".
    UnknownCost(String),
    /// A per-client cap given as a fraction of `M` must be in `(0, 1]`.
    InvalidCapFraction(f64),
    /// A request id that is already waiting or running.
    DuplicateRequest(u64),
    /// A request id that is neither waiting nor running.
    UnknownRequest(u64),
    /// A request in the wrong state for the operation (e.g. finishing a waiting one).
    NotRunning { request_id: u64, op: Op, now: Where },
    /// `put_back` of a request that was not set aside.
    NotAside { request_id: u64, now: Where },
    /// The same request twice in one decode call.
    DuplicateInBatch(u64),
    /// `request_ids` and `tokens` of different lengths.
    LengthMismatch { ids: usize, tokens: usize },
    /// A negative token count.
    NegativeTokens(i64),
    /// More tokens for one request in one call than `MAX_TOKENS_PER_CALL`.
    TooManyTokens(u64),
    /// A request would hold more than `MAX_REQUEST_TOKENS` generated tokens.
    RequestTooLong { request_id: u64, tokens: u128 },
    /// The oldest running request alone cannot grow within `M`.
    Capacity {
        request_id: u64,
        tokens: u64,
        budget: u64,
    },
    /// A client id the core never issued.
    UnknownClient(u32),
    /// A snapshot that cannot be restored (truncated, corrupted, other version).
    BadSnapshot(String),
    /// The locality quantum must be a finite number `>= 0`.
    InvalidLocalityQuantum(f64),
    /// A locality quantum above 0 needs a counter policy (`vtc` or `lcf`).
    LocalityNeedsCounter(f64),
    /// The prefix lookup failed for this offered request (its own error is
    /// the caller's: the core only passes the failure on).
    PrefixLookupFailed(u64),
    /// The prefix lookup answered more tokens than the request holds.
    InvalidPrefixHit {
        request_id: u64,
        hit: u64,
        footprint: u64,
    },
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CoreError::*;
        match self {
            InvalidBudget(m) => write!(
                f,
                "M must be a number of tokens in [1, 2**53], got {m}"
            ),
            InvalidReader(r) => write!(
                f,
                "reader must be an int in [0, {}), got {r}",
                crate::limits::READERS
            ),
            InvalidClientCap(c) => write!(
                f,
                "client_cap must be a positive number of tokens (or a fraction of M in (0, 1]), got {c}"
            ),
            InvalidTokenWeight { name, value } => {
                write!(
                    f,
                    "{name} must be a finite number in [0, {:e}], got {value:?}",
                    crate::limits::MAX_PRICE
                )
            }
            InvalidCounter(v) => write!(
                f,
                "counter must be a finite number in [-{m:e}, {m:e}], got {v:?}",
                m = crate::limits::MAX_COUNTER
            ),
            InvalidWeight(w) => write!(
                f,
                "weight must be a finite number in [{:e}, {:e}], got {w:?}",
                crate::limits::MIN_WEIGHT,
                crate::limits::MAX_WEIGHT
            ),
            InvalidPrompt(p) => write!(f, "prompt_len must be >= 1, got {p}"),
            InvalidPrediction(p) => write!(
                f,
                "predicted_output must be between 0 and {}, got {p}",
                crate::limits::MAX_TOKENS_PER_CALL
            ),
            UnknownPredictor(p) => {
                write!(f, "unknown predictor {p:?}; expected 'none' or 'mean'")
            }
            InvalidCached { cached_len, prompt_len } => write!(
                f,
                "cached_len must be between 0 and prompt_len={prompt_len}, got {cached_len}"
            ),
            PromptTooLong { prompt_len, budget } => write!(
                f,
                "prompt_len {prompt_len} exceeds the KV budget M={budget}; it could never be admitted"
            ),
            UnknownPolicy(p) => {
                write!(f, "unknown policy {p:?}; expected one of \"vtc\", \"lcf\", \"fcfs\"")
            }
            UnknownCost(c) => write!(
                f,
                "unknown cost {c:?}; expected 'linear', 'quadratic', 'context' or a cost object"
            ),
            InvalidCapFraction(x) => {
                write!(f, "client_cap as a fraction of M must be in (0, 1], got {x:?}")
            }
            DuplicateRequest(r) => write!(f, "request {r} is already live"),
            UnknownRequest(r) => write!(f, "unknown request {r}"),
            NotRunning { request_id, op, now } => write!(
                f,
                "cannot {op} request {request_id}: it is {now}, not running"
            ),
            NotAside { request_id, now } => write!(
                f,
                "cannot put back request {request_id}: it is {now}, not set aside"
            ),
            DuplicateInBatch(r) => write!(f, "request {r} appears twice in one decode call"),
            LengthMismatch { ids, tokens } => write!(
                f,
                "request_ids and tokens differ in length: {ids} != {tokens}"
            ),
            NegativeTokens(t) => write!(f, "tokens must be >= 0, got {t}"),
            TooManyTokens(t) => write!(
                f,
                "tokens {t} exceeds {} for one request in one decode call",
                crate::limits::MAX_TOKENS_PER_CALL
            ),
            RequestTooLong { request_id, tokens } => write!(
                f,
                "request {request_id} would have generated {tokens} tokens, more than {} (2**54)",
                crate::limits::MAX_REQUEST_TOKENS
            ),
            Capacity { request_id, tokens, budget } => write!(
                f,
                "request {request_id} holds {tokens} tokens and cannot grow within M={budget}; finish or cancel it"
            ),
            UnknownClient(c) => write!(f, "unknown client id {c}"),
            BadSnapshot(m) => write!(f, "cannot restore snapshot: {m}"),
            InvalidLocalityQuantum(q) => write!(
                f,
                "locality_quantum must be a finite number >= 0, got {}",
                PyFloat(*q)
            ),
            LocalityNeedsCounter(q) => write!(
                f,
                "locality_quantum={} needs a counter policy (vtc or lcf), not fcfs",
                PyFloat(*q)
            ),
            PrefixLookupFailed(r) => write!(f, "the prefix lookup of request {r} failed"),
            InvalidPrefixHit {
                request_id,
                hit,
                footprint,
            } => write!(
                f,
                "prefix lookup of request {request_id} returned {hit}, outside [0, {footprint}] \
                 (its prompt and generated tokens)"
            ),
        }
    }
}

impl std::error::Error for CoreError {}

/// A float as Python's `repr` spells the values Rust's `Debug` spells
/// otherwise (`nan`; finite values and `inf` read the same in both for the
/// values these messages meet).
struct PyFloat(f64);

impl fmt::Display for PyFloat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_nan() {
            f.write_str("nan")
        } else {
            write!(f, "{:?}", self.0)
        }
    }
}

pub type Result<T> = std::result::Result<T, CoreError>;
