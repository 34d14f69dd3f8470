//! `vtc-core`: the Virtual Token Counter fair scheduler for LLM serving
//! (Sheng et al., "Fairness in Serving Large Language Models", OSDI '24).
//!
//! Pure Rust, no Python: the `vtc-python` crate wraps it as `vtc._core`.
//!
//! ```
//! use vtc_core::{Policy, Scheduler};
//! let mut s = Scheduler::new(8192, 1.0, 2.0, Policy::Vtc).unwrap();
//! let a = s.add_client();
//! let b = s.add_client();
//! s.submit(1, a, 100).unwrap();
//! s.submit(2, b, 100).unwrap();
//! let mut admitted = Vec::new();
//! s.schedule(&mut admitted);
//! assert_eq!(admitted, vec![1, 2]);
//! s.decode_step(&mut Vec::new()).unwrap();
//! assert_eq!(s.counter(a).unwrap(), 100.0 + 2.0);
//! ```

mod band;
mod client;
mod config;
mod cost;
mod error;
pub mod fairness;
mod heap;
mod keys;
pub mod ledger;
pub mod limits;
mod lookup;
pub mod mirror;
pub mod relabel;
mod scheduler;
mod snapshot;
pub mod wire;

pub use client::{Client, ClientId};
pub use config::{ClientCap, Config, Overrides};
pub use cost::{Cost, Pending, RunSums};
pub use error::{CoreError, Op, Result, Where};
pub use heap::{IndexedHeap, Key, Positions, NOT_IN_HEAP};
pub use keys::{str_key_ok, ClientKey, KeyRef};
pub use limits::{MAX_BUDGET, MAX_REQUEST_TOKENS, MAX_TOKENS_PER_CALL};
pub use scheduler::{
    Gone, LookupFailed, Policy, Predictor, PrefixLookup, RequestState, Scheduler, Tokens,
    LOCALITY_DEPTH, READERS,
};
pub use snapshot::{ClientRecord, Restored, SNAPSHOT_VERSION};
