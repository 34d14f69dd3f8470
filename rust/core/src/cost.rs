//! How service is charged: the cost function `h(n_p, n_q)`.
//!
//! A request with `n_p` prompt tokens that has generated `n_q` tokens has
//! cost `h(n_p, n_q)` in total; it is charged incrementally: `h(n_p', 0)` at
//! its first admission (`n_p'` = prompt tokens actually computed, i.e. minus
//! the prefix-cache hit) and `h(n_p, j) - h(n_p, j - 1)` for its `j`-th
//! generated token (`n_p` = the whole prompt: a cached prefix is still read
//! by attention).
//!
//! Every decode increment of every shipped cost is a fixed linear combination
//! of a few *integer* sums, so a decode call aggregates those integers per
//! client (exactly, in `u128`) and turns them into one float charge per
//! client with a fixed expression. The result is therefore independent of
//! the order in which requests are listed, for every cost, and the linear
//! cost is bit-for-bit the historical `wq * tokens`.
//!
//! For a request that generates `t` tokens in a call, having generated `g`
//! before it, with prompt `n` (all integers):
//!
//! * `T = t`
//! * `P = t * n`                      (sum over the new tokens of `n_p`)
//! * `Q = t * (2g + t)`               (`(g+t)^2 - g^2`, the `n_q^2` increment)
//! * `C = t * (n + g) + t * (t - 1) / 2`  (sum of the context each new token
//!   attends over: prompt + tokens generated before it)
//!
//! and per client and call `T`, `P`, `Q`, `C` are summed over its requests.

use crate::error::{CoreError, Result};

/// The cost function. Coefficients are finite and `>= 0`, so every
/// increment is `>= 0` (the cost is monotone) and counters never decrease.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cost {
    /// `h = wp * n_p + wq * n_q` (the VTC paper's default; the scheduler's
    /// `wp` and `wq`).
    Linear { wp: f64, wq: f64 },
    /// `h = a_p * n_p + a_q * n_q + a_pq * n_p * n_q + a_qq * n_q^2 + c`
    /// (the paper's profiled cost: 2.1, 1, 0.04, 0.032, 11.46).
    Quadratic {
        a_p: f64,
        a_q: f64,
        a_pq: f64,
        a_qq: f64,
        c: f64,
    },
    /// Context-aware decode: prefill `wp` per computed prompt token, each
    /// generated token `wq + beta * context_len` where `context_len` is the
    /// prompt plus the tokens generated before it (meters KV reads, i.e. HBM
    /// bandwidth, not just tokens).
    Context { wp: f64, wq: f64, beta: f64 },
}

/// Integer aggregates of one client's decode tokens in one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    pub t: u64,
    pub p: u128,
    pub q: u128,
    pub ctx: u128,
}

impl Default for Cost {
    fn default() -> Self {
        Cost::LINEAR
    }
}

impl Cost {
    /// The default prices: a prompt token 1, a generated token 2.
    pub const DEFAULT_WP: f64 = 1.0;
    pub const DEFAULT_WQ: f64 = 2.0;
    /// Default `beta` of the context cost: a token decoded over 1024 tokens
    /// of context costs `wq + 2`, twice a bare token at the default `wq = 2`.
    pub const DEFAULT_BETA: f64 = 1.0 / 512.0;

    /// The default cost: linear with the default prices.
    pub const LINEAR: Cost = Cost::Linear {
        wp: Cost::DEFAULT_WP,
        wq: Cost::DEFAULT_WQ,
    };

    /// The context cost with its default coefficients.
    pub const CONTEXT: Cost = Cost::Context {
        wp: Cost::DEFAULT_WP,
        wq: Cost::DEFAULT_WQ,
        beta: Cost::DEFAULT_BETA,
    };

    /// A cost by name, with its default coefficients: "linear",
    /// "quadratic" (the paper's profile) or "context".
    pub fn named(name: &str) -> Result<Cost> {
        match name {
            "linear" => Ok(Cost::LINEAR),
            "quadratic" => Ok(Cost::PAPER_QUADRATIC),
            "context" => Ok(Cost::CONTEXT),
            other => Err(CoreError::UnknownCost(other.to_string())),
        }
    }

    /// The paper's profiled quadratic cost (Sheng et al., OSDI '24, §5).
    pub const PAPER_QUADRATIC: Cost = Cost::Quadratic {
        a_p: 2.1,
        a_q: 1.0,
        a_pq: 0.04,
        a_qq: 0.032,
        c: 11.46,
    };

    /// Reject a coefficient that is negative, NaN or infinite.
    pub fn validate(&self) -> Result<()> {
        let check = |name: &'static str, value: f64| {
            if crate::limits::price_ok(value) {
                Ok(())
            } else {
                Err(CoreError::InvalidTokenWeight { name, value })
            }
        };
        match *self {
            Cost::Linear { wp, wq } => {
                check("wp", wp)?;
                check("wq", wq)
            }
            Cost::Quadratic {
                a_p,
                a_q,
                a_pq,
                a_qq,
                c,
            } => {
                check("a_p", a_p)?;
                check("a_q", a_q)?;
                check("a_pq", a_pq)?;
                check("a_qq", a_qq)?;
                check("c", c)
            }
            Cost::Context { wp, wq, beta } => {
                check("wp", wp)?;
                check("wq", wq)?;
                check("beta", beta)
            }
        }
    }

    pub fn is_linear(&self) -> bool {
        matches!(self, Cost::Linear { .. })
    }

    /// The per-prompt-token coefficient (`wp`, or `a_p`).
    pub fn wp(&self) -> f64 {
        match *self {
            Cost::Linear { wp, .. } | Cost::Context { wp, .. } => wp,
            Cost::Quadratic { a_p, .. } => a_p,
        }
    }

    /// The per-generated-token coefficient (`wq`, or `a_q`).
    pub fn wq(&self) -> f64 {
        match *self {
            Cost::Linear { wq, .. } | Cost::Context { wq, .. } => wq,
            Cost::Quadratic { a_q, .. } => a_q,
        }
    }

    /// `h(computed, 0)`: the charge at first admission.
    #[inline]
    pub fn prefill(&self, computed: u64) -> f64 {
        match *self {
            Cost::Linear { wp, .. } | Cost::Context { wp, .. } => wp * computed as f64,
            Cost::Quadratic { a_p, c, .. } => a_p * computed as f64 + c,
        }
    }

    /// The charge for a client's aggregated decode tokens of one call.
    #[inline]
    pub fn decode(&self, a: &Pending) -> f64 {
        match *self {
            Cost::Linear { wq, .. } => wq * a.t as f64,
            Cost::Quadratic {
                a_q, a_pq, a_qq, ..
            } => a_q * a.t as f64 + a_pq * a.p as f64 + a_qq * a.q as f64,
            Cost::Context { wq, beta, .. } => wq * a.t as f64 + beta * a.ctx as f64,
        }
    }
}

/// Sums over a set of running requests (a client's, a band's): how many,
/// their prompts, their generated tokens. With them one uniform decode of
/// `t` tokens each is one [`Pending`], whatever the number of requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunSums {
    pub n: u64,
    pub prompt: u128,
    pub gen: u128,
}

impl RunSums {
    #[inline]
    pub fn enter(&mut self, prompt: u64, gen: u64) {
        self.n += 1;
        self.prompt += u128::from(prompt);
        self.gen += u128::from(gen);
    }

    #[inline]
    pub fn leave(&mut self, prompt: u64, gen: u64) {
        self.n -= 1;
        self.prompt -= u128::from(prompt);
        self.gen -= u128::from(gen);
    }

    /// The sums of every request generating `t` more tokens (the sum over
    /// the requests of `Pending::add(n_i, g_i, t)`, exactly), and the
    /// generated tokens moved on.
    #[inline]
    pub fn grow_all(&mut self, t: u64) -> Pending {
        let (k, t128) = (u128::from(self.n), u128::from(t));
        let p = Pending {
            t: self.n * t,
            p: t128 * self.prompt,
            q: t128 * (2 * self.gen + k * t128),
            ctx: t128 * (self.prompt + self.gen) + k * (t128 * t128.saturating_sub(1) / 2),
        };
        self.gen += k * t128;
        p
    }
}

impl Pending {
    /// Add a request with prompt `n` that generated `t` tokens after `g`.
    #[inline]
    pub fn add(&mut self, n: u64, g: u64, t: u64) {
        if t == 0 {
            return;
        }
        let (n, g, t128) = (n as u128, g as u128, t as u128);
        self.t += t;
        self.p += t128 * n;
        self.q += t128 * (2 * g + t128);
        self.ctx += t128 * (n + g) + t128 * (t128 - 1) / 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(cost: &Cost, n: u64, q: u64) -> f64 {
        let (np, nq) = (n as f64, q as f64);
        match *cost {
            Cost::Linear { wp, wq } => wp * np + wq * nq,
            Cost::Quadratic {
                a_p,
                a_q,
                a_pq,
                a_qq,
                c,
            } => a_p * np + a_q * nq + a_pq * np * nq + a_qq * nq * nq + c,
            Cost::Context { wp, wq, beta } => {
                wp * np + wq * nq + beta * (np * nq + nq * (nq - 1.0) / 2.0)
            }
        }
    }

    #[test]
    fn increments_telescope_to_h() {
        let costs = [
            Cost::Linear { wp: 1.0, wq: 2.0 },
            Cost::PAPER_QUADRATIC,
            Cost::Context {
                wp: 1.0,
                wq: 2.0,
                beta: 0.01,
            },
        ];
        for cost in costs {
            for n in [1u64, 7, 300] {
                let mut total = cost.prefill(n);
                let mut g = 0;
                for t in [1u64, 3, 0, 10, 1] {
                    let mut a = Pending::default();
                    a.add(n, g, t);
                    total += cost.decode(&a);
                    g += t;
                }
                let want = h(&cost, n, g);
                assert!(
                    (total - want).abs() < 1e-9 * want.max(1.0),
                    "{cost:?} {n}: {total} != {want}"
                );
            }
        }
    }

    #[test]
    fn many_tokens_at_once_equal_one_at_a_time() {
        let mut once = Pending::default();
        once.add(100, 5, 4);
        let mut steps = Pending::default();
        for g in 5..9 {
            steps.add(100, g, 1);
        }
        assert_eq!(once, steps);
    }

    #[test]
    fn uniform_sums_equal_the_sum_over_requests() {
        let reqs = [(100u64, 5u64), (7, 0), (3000, 12345), (1, 1)];
        for t in [0u64, 1, 2, 9, 1 << 32] {
            let mut each = Pending::default();
            let mut run = RunSums::default();
            for &(n, g) in &reqs {
                each.add(n, g, t);
                run.enter(n, g);
            }
            let gen_before = run.gen;
            assert_eq!(run.grow_all(t), each, "t = {t}");
            assert_eq!(run.gen, gen_before + 4 * u128::from(t));
        }
    }

    #[test]
    fn coefficients_are_validated() {
        assert!(Cost::PAPER_QUADRATIC.validate().is_ok());
        assert!(Cost::Context {
            wp: 1.0,
            wq: 2.0,
            beta: -1.0
        }
        .validate()
        .is_err());
        assert!(Cost::Quadratic {
            a_p: 1.0,
            a_q: 1.0,
            a_pq: f64::NAN,
            a_qq: 0.0,
            c: 0.0
        }
        .validate()
        .is_err());
    }
}
