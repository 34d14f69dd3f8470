//! A scheduler's whole configuration, validated in one place: what a caller
//! chooses (the selection [`Policy`], the output-length [`Predictor`], the
//! [`ClientCap`]) and the [`Config`] that holds every choice.
//!
//! Invariant: [`Config::validate`] accepts exactly the configurations
//! [`Scheduler::with_config`](crate::Scheduler::with_config) can build, and
//! checks in one fixed order (budget, cost, client cap, locality quantum,
//! band weights), so
//! the first bad value is the error whatever else is wrong; a binding
//! translates its arguments into a `Config` and re-checks nothing. Each
//! named choice has one lowercase name; `name` and `FromStr` are inverse,
//! and an unknown name is an error, never a default. This module imports
//! nothing from the scheduler.

use std::str::FromStr;

use crate::cost::Cost;
use crate::error::{CoreError, Result};
use crate::limits::{weight_ok, MAX_BUDGET};

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

/// A per-client cap on KV tokens in the running batch (see
/// [`Scheduler::schedule`](crate::Scheduler::schedule)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClientCap {
    /// A number of tokens, at least 1 (above `M` it is `M`).
    Tokens(u64),
    /// A fraction of `M` in `(0, 1]`: `floor(fraction * M)` tokens, at least 1.
    Fraction(f64),
}

impl ClientCap {
    /// The cap in tokens under budget `budget`.
    pub fn tokens(self, budget: u64) -> Result<u64> {
        match self {
            ClientCap::Tokens(0) => Err(CoreError::InvalidClientCap(0)),
            ClientCap::Tokens(t) => Ok(t.min(budget)),
            ClientCap::Fraction(f) if f > 0.0 && f <= 1.0 => {
                Ok(((f * budget as f64).floor() as u64).clamp(1, budget))
            }
            ClientCap::Fraction(f) => Err(CoreError::InvalidCapFraction(f)),
        }
    }
}

/// Values that replace a restored snapshot's configuration
/// ([`Restored::override_config`](crate::Restored::override_config));
/// `None` keeps the stored value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub cost: Option<Cost>,
    /// A number of tokens, or a fraction of the restored `M`.
    pub client_cap: Option<ClientCap>,
    pub predictor: Option<Predictor>,
    pub band_weights: Option<Vec<(i64, f64)>>,
    pub locality_quantum: Option<f64>,
}

/// Everything a [`Scheduler`](crate::Scheduler) is built with.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The KV budget `M` in tokens, in `1..=MAX_BUDGET`.
    pub budget: i64,
    /// How service is charged (default: linear, `wp = 1`, `wq = 2`).
    pub cost: Cost,
    pub policy: Policy,
    /// `None`: no per-client cap.
    pub client_cap: Option<ClientCap>,
    pub predictor: Predictor,
    /// Weighted priority bands as `(priority, weight)`; `None`: strict bands.
    pub band_weights: Option<Vec<(i64, f64)>>,
    /// The locality window `Q` in counter units (see `scheduler::window`): a
    /// finite number `>= 0`, above 0 only with a counter policy; 0 is plain
    /// VTC.
    pub locality_quantum: f64,
}

impl Config {
    /// The defaults around budget `budget`: linear cost 1/2, VTC, no cap, no
    /// predictor, strict bands, no locality window.
    pub fn new(budget: i64) -> Self {
        Config {
            budget,
            cost: Cost::default(),
            policy: Policy::Vtc,
            client_cap: None,
            predictor: Predictor::None,
            band_weights: None,
            locality_quantum: 0.0,
        }
    }

    /// Check every value, in the order above; the first bad one is the error.
    pub fn validate(&self) -> Result<()> {
        let budget = self.budget_tokens()?;
        self.cost.validate()?;
        if let Some(cap) = self.client_cap {
            cap.tokens(budget)?;
        }
        check_locality_quantum(self.locality_quantum, self.policy)?;
        if let Some(w) = &self.band_weights {
            check_band_weights(w)?;
        }
        Ok(())
    }

    pub(crate) fn budget_tokens(&self) -> Result<u64> {
        if self.budget <= 0 || self.budget as u64 > MAX_BUDGET {
            return Err(CoreError::InvalidBudget(self.budget));
        }
        Ok(self.budget as u64)
    }
}

/// The locality quantum: finite, `>= 0`, and above 0 only with a counter
/// policy (`vtc` or `lcf`: under `fcfs` there is no counter to be within).
pub(crate) fn check_locality_quantum(q: f64, policy: Policy) -> Result<()> {
    if !(q.is_finite() && q >= 0.0) {
        return Err(CoreError::InvalidLocalityQuantum(q));
    }
    if q > 0.0 && policy == Policy::Fcfs {
        return Err(CoreError::LocalityNeedsCounter(q));
    }
    Ok(())
}

/// Band weights: every weight in `MIN_WEIGHT..=MAX_WEIGHT`.
pub(crate) fn check_band_weights(weights: &[(i64, f64)]) -> Result<()> {
    match weights.iter().find(|&&(_, w)| !weight_ok(w)) {
        Some(&(_, bad)) => Err(CoreError::InvalidWeight(bad)),
        None => Ok(()),
    }
}
