//! The prefix lookup of the locality window: a Python callable behind the
//! core's `PrefixLookup` trait.
//!
//! Invariant: the core sees only `Ok(hit)` with a hit the callable returned
//! (an int in u64, which the core checks against the request's footprint:
//! `InvalidPrefixHit`) or `Err(LookupFailed)`, and then the Python
//! exception it stands for (the callable's own, a `TypeError` for a
//! non-int, an `InvalidArgumentError`, worded as the core's, for an int
//! outside u64) is kept here, for the binding to raise in place of the
//! core's `PrefixLookupFailed`. A lookup that calls back into the same scheduler
//! (whose lock its caller holds) gets an error instead of a deadlock.

use std::cell::Cell;

use pyo3::prelude::*;
use vtc_core::{CoreError, LookupFailed, PrefixLookup};

use crate::convert::int_arg_sat;
use crate::errors::{invalid, Error};

thread_local! {
    /// Set while this thread runs a prefix lookup (see `PyLookup`), so that
    /// a scheduler found locked then refuses instead of waiting (`lock_any`).
    static IN_LOOKUP: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside a prefix lookup (and so holds a
/// scheduler's lock: waiting for that lock would deadlock).
pub(crate) fn in_lookup() -> bool {
    IN_LOOKUP.with(Cell::get)
}

/// A Python callable `lookup(request_id) -> int` as the core's lookup.
pub(crate) struct PyLookup<'a, 'py> {
    f: &'a Bound<'py, PyAny>,
    /// The exception of the last failed call.
    err: Option<Error>,
}

impl<'a, 'py> PyLookup<'a, 'py> {
    pub(crate) fn new(f: &'a Bound<'py, PyAny>) -> Self {
        PyLookup { f, err: None }
    }

    /// The binding's error for a core error: the lookup's own exception in
    /// place of `PrefixLookupFailed`.
    pub(crate) fn error(&mut self, e: CoreError) -> Error {
        match (e, self.err.take()) {
            (CoreError::PrefixLookupFailed(_), Some(err)) => err,
            (e, _) => e.into(),
        }
    }

    fn call(&self, request_id: u64, footprint: u64) -> crate::errors::Result<u64> {
        // (restored, not cleared: a lookup may call another scheduler whose
        // selection runs its own lookup)
        let outer = IN_LOOKUP.with(|x| x.replace(true));
        let answer = self.f.call1((request_id,));
        IN_LOOKUP.with(|x| x.set(outer));
        let answer = int_arg_sat("prefix lookup", &answer?)?;
        // the range is the core's to check (InvalidPrefixHit); only an int
        // that a u64 cannot hold is refused here, in the core's words
        u64::try_from(answer.v).map_err(|_| {
            invalid(format!(
                "prefix lookup of request {request_id} returned {}, outside [0, {footprint}] \
                 (its prompt and generated tokens)",
                answer.text()
            ))
        })
    }
}

impl PrefixLookup for PyLookup<'_, '_> {
    fn cached_prefix(&mut self, request_id: u64, footprint: u64) -> Result<u64, LookupFailed> {
        self.call(request_id, footprint).map_err(|e| {
            self.err = Some(e);
            LookupFailed
        })
    }
}
