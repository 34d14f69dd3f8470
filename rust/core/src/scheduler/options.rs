//! What a caller chooses: the selection [`Policy`] and the output-length
//! [`Predictor`].
//!
//! Invariant: each choice has one lowercase name; `name` and `FromStr` are
//! inverse, and an unknown name is an error, never a default.

use std::str::FromStr;

use crate::error::{CoreError, Result};

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
