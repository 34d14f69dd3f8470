//! The exception hierarchy and the one place where core errors become Python
//! exceptions.
//!
//! ```text
//! SchedulerError(Exception)
//! ├── InvalidArgumentError(SchedulerError, ValueError)   bad M, weight, prompt_len, tokens, policy
//! ├── DuplicateRequestError(SchedulerError, ValueError)  a request id that is already live
//! ├── UnknownRequestError(SchedulerError, KeyError)      an id that is neither waiting nor running
//! ├── RequestStateError(SchedulerError, ValueError)      e.g. finishing a waiting request
//! ├── SnapshotError(SchedulerError, ValueError)          a snapshot that cannot be restored
//! ├── CapacityError(SchedulerError)                      a lone request outgrew M
//! └── InternalError(SchedulerError)                      disabled after a panic (see lib.rs)
//! ```
//!
//! The subclasses also derive from the matching built-in so that callers can
//! catch `ValueError`/`KeyError` as usual.

use pyo3::exceptions::{PyException, PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use vtc_core::CoreError;

pyo3::create_exception!(
    vtc,
    SchedulerError,
    PyException,
    "Base class of every error vtc raises."
);

static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DUPLICATE_REQUEST: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UNKNOWN_REQUEST: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static REQUEST_STATE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static CAPACITY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SNAPSHOT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INTERNAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();

#[derive(Clone, Copy)]
pub enum Kind {
    InvalidArgument,
    DuplicateRequest,
    UnknownRequest,
    RequestState,
    Capacity,
    Snapshot,
    Internal,
}

fn slot(kind: Kind) -> (&'static PyOnceLock<Py<PyType>>, &'static str, &'static str) {
    match kind {
        Kind::InvalidArgument => (
            &INVALID_ARGUMENT,
            "InvalidArgumentError",
            "An argument has a value the scheduler cannot accept; nothing was changed.",
        ),
        Kind::DuplicateRequest => (
            &DUPLICATE_REQUEST,
            "DuplicateRequestError",
            "The request id is already waiting or running; nothing was changed.",
        ),
        Kind::UnknownRequest => (
            &UNKNOWN_REQUEST,
            "UnknownRequestError",
            "The request id is neither waiting nor running; nothing was changed.",
        ),
        Kind::RequestState => (
            &REQUEST_STATE,
            "RequestStateError",
            "The request is in the wrong state for the operation; nothing was changed.",
        ),
        Kind::Snapshot => (
            &SNAPSHOT,
            "SnapshotError",
            "A snapshot could not be restored (truncated, corrupted or another version).",
        ),
        Kind::Internal => (
            &INTERNAL,
            "InternalError",
            "An earlier internal error (a panic) left the scheduler's state undefined; rebuild it from a snapshot.",
        ),
        Kind::Capacity => (
            &CAPACITY,
            "CapacityError",
            "The oldest running request alone cannot grow within M; nothing was changed.",
        ),
    }
}

fn builtin_base(py: Python<'_>, kind: Kind) -> Option<Bound<'_, PyType>> {
    match kind {
        Kind::InvalidArgument | Kind::DuplicateRequest | Kind::RequestState | Kind::Snapshot => {
            Some(py.get_type::<PyValueError>())
        }
        Kind::UnknownRequest => Some(py.get_type::<PyKeyError>()),
        Kind::Capacity | Kind::Internal => None,
    }
}

/// The Python class for `kind`, created on first use as
/// `type(name, (SchedulerError, builtin), {...})`.
pub fn exception_type(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    let (cell, name, doc) = slot(kind);
    let ty = cell.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let base = py.get_type::<SchedulerError>();
        let bases = match builtin_base(py, kind) {
            Some(b) => PyTuple::new(py, [base, b])?,
            None => PyTuple::new(py, [base])?,
        };
        let ns = PyDict::new(py);
        ns.set_item("__module__", "vtc")?;
        ns.set_item("__doc__", doc)?;
        let t = py.get_type::<PyType>().call1((name, bases, ns))?;
        Ok(t.cast_into::<PyType>()?.unbind())
    })?;
    Ok(ty.bind(py).clone())
}

pub fn kind_of(e: &CoreError) -> Kind {
    use CoreError::*;
    match e {
        InvalidBudget(_)
        | InvalidClientCap(_)
        | InvalidReader(_)
        | InvalidPrediction(_)
        | UnknownPredictor(_)
        | InvalidTokenWeight { .. }
        | InvalidWeight(_)
        | InvalidPrompt(_)
        | InvalidCached { .. }
        | InvalidCounter(_)
        | PromptTooLong { .. }
        | UnknownPolicy(_)
        | UnknownCost(_)
        | InvalidCapFraction(_)
        | LengthMismatch { .. }
        | NegativeTokens(_)
        | TooManyTokens(_)
        | RequestTooLong { .. }
        | DuplicateInBatch(_)
        | InvalidLocalityQuantum(_)
        | LocalityNeedsCounter(_)
        | PrefixLookupFailed(_)
        | InvalidPrefixHit { .. }
        | UnknownClient(_) => Kind::InvalidArgument,
        DuplicateRequest(_) => Kind::DuplicateRequest,
        UnknownRequest(_) => Kind::UnknownRequest,
        NotRunning { .. } | NotAside { .. } => Kind::RequestState,
        Capacity { .. } => Kind::Capacity,
        BadSnapshot(_) => Kind::Snapshot,
    }
}

/// Every error a binding method can return: a core error, or a Python one
/// raised while reading arguments.
pub enum Error {
    Core(CoreError),
    Arg(Kind, String),
    Py(PyErr),
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error::Core(e)
    }
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error::Py(e)
    }
}

/// The one conversion into Python exceptions.
impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let (kind, msg) = match e {
            Error::Py(e) => return e,
            Error::Core(e) => (kind_of(&e), e.to_string()),
            Error::Arg(kind, msg) => (kind, msg),
        };
        Python::attach(|py| match exception_type(py, kind) {
            Ok(ty) => PyErr::from_type(ty, msg),
            Err(e) => e,
        })
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// An invalid-argument error with `msg`.
pub fn invalid(msg: String) -> Error {
    Error::Arg(Kind::InvalidArgument, msg)
}
