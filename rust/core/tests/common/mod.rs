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
