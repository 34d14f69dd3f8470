//! Argument shapes as `FromPyObject` types: a method that takes one names it
//! in its signature (`prompt_len: Int<PromptLen>`), and PyO3 reads it before
//! the body runs, so each method is extract -> lock -> core -> convert.
//!
//! The readers themselves are `convert`'s (an int or anything with
//! `__index__`, never a bool; a real number by `vtc.reference`'s rule; a
//! client key as an int or a str): these types only carry which argument
//! they read, so that an error names it exactly as `vtc.reference` does
//! ("prompt_len must be an int, got ..."). PyO3 adds a note ("while
//! processing 'prompt_len'") and leaves the message and the type as they
//! are.
//!
//! Not here, on purpose: arguments whose reading depends on the scheduler
//! or on another argument (`decode`'s ids and tokens, read against a limit;
//! `pop`'s `cached_len`, whose error comes after the selection; the
//! constructor's and `from_snapshot`'s configuration, read in the core's
//! order of checks) stay functions in `convert`, called from the body.

use std::marker::PhantomData;

use pyo3::prelude::*;
use pyo3::Borrowed;
use vtc_core::KeyRef;

use crate::convert::{float_arg, i64_arg, request_id_arg, token_count_arg};
use crate::keys::client_key;

/// The name an argument's errors carry.
pub(crate) trait ArgName {
    const NAME: &'static str;
}

macro_rules! arg_names {
    ($($(#[$doc:meta])* $ty:ident = $name:literal;)*) => {$(
        $(#[$doc])*
        pub(crate) enum $ty {}
        impl ArgName for $ty {
            const NAME: &'static str = $name;
        }
    )*};
}

arg_names! {
    PromptLen = "prompt_len";
    CachedLen = "cached_len";
    PredictedOutput = "predicted_output";
    Priority = "priority";
    Weight = "weight";
    Value = "value";
}

/// An integer argument that must fit in i64 (see `convert::i64_arg`).
pub(crate) struct Int<N>(pub(crate) i64, PhantomData<N>);

impl<'a, 'py, N: ArgName> FromPyObject<'a, 'py> for Int<N> {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Int(i64_arg(N::NAME, &obj)?, PhantomData))
    }
}

/// A real-number argument (see `convert::float_arg`).
pub(crate) struct Real<N>(pub(crate) f64, PhantomData<N>);

impl<'a, 'py, N: ArgName> FromPyObject<'a, 'py> for Real<N> {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Real(float_arg(N::NAME, &obj)?, PhantomData))
    }
}

/// `request_id`: an int in `[0, 2**64)`.
pub(crate) struct RequestId(pub(crate) u64);

impl<'a, 'py> FromPyObject<'a, 'py> for RequestId {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(RequestId(request_id_arg(&obj)?))
    }
}

/// `tokens` given as one count for every request: an int in
/// `[0, MAX_TOKENS_PER_CALL]`.
pub(crate) struct TokenCount(pub(crate) i64);

impl<'a, 'py> FromPyObject<'a, 'py> for TokenCount {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(TokenCount(token_count_arg(&obj)?))
    }
}

/// `client`: a client key (see `keys::client_key`).
pub(crate) struct Client<'a>(pub(crate) KeyRef<'a>);

impl<'a, 'py> FromPyObject<'a, 'py> for Client<'a> {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Client(client_key(obj)?))
    }
}
