//! Shared by the integration tests (`mod common;`).

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
