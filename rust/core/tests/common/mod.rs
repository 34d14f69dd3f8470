//! Shared by the integration tests (`mod common;`); each uses some of it.
#![allow(dead_code)]

use vtc_core::Cost;

/// One cost function of each kind, with the parameters the tests use.
pub fn every_cost() -> [Cost; 3] {
    [
        Cost::Linear { wp: 1.0, wq: 2.0 },
        Cost::PAPER_QUADRATIC,
        Cost::Context {
            wp: 1.0,
            wq: 2.0,
            beta: 0.01,
        },
    ]
}

/// A 64-bit linear congruential generator (Knuth's MMIX constants): the random
/// operation sequences of the tests, repeatable from a seed, without a crate.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The scheduler operations the random key-based workloads share (`fairness.rs`,
/// `ledger.rs`), chosen by `op`: 0-2 a submit (request id `*rid + 1`, a tenant
/// `key(rng.below(tenants))`, a prompt of 1-50 tokens; refused ones ignored), 3 a
/// schedule, 4-5 a decode of every running request (1-20 tokens each), 6 the finish
/// of one running request. Returns false for any other `op`: the caller's own.
pub fn scheduler_op(
    rng: &mut Lcg,
    s: &mut vtc_core::Scheduler,
    op: u64,
    rid: &mut u64,
    tenants: u64,
    key: impl Fn(u64) -> vtc_core::KeyRef<'static>,
) -> bool {
    match op {
        0..=2 => {
            *rid += 1;
            let k = key(rng.below(tenants));
            let _ = s.submit_keyed(*rid, &k, 1 + rng.below(50) as i64, 0, None, 0);
        }
        3 => {
            s.schedule(&mut Vec::new());
        }
        4 | 5 => {
            let running: Vec<u64> = s.running().collect();
            if !running.is_empty() {
                let _ = s.decode(&running, vtc_core::Tokens::Each(1 + rng.below(20) as i64));
            }
        }
        6 => {
            let running: Vec<u64> = s.running().collect();
            if !running.is_empty() {
                let r = running[rng.below(running.len() as u64) as usize];
                s.finish(r).unwrap();
            }
        }
        _ => return false,
    }
    true
}
