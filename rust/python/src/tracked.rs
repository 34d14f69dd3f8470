//! `Tracked`: what the adapter knows about one engine request, as Rust data.
//!
//! The record `vtc.adapter.Requests` keeps per request (`vtc.observer.Tracked`,
//! the one observers are handed). As a Python dataclass it cost ~3,000
//! instructions to make at every arrival (its `__init__` a Python frame), and
//! native code could read its fields only through the object protocol (~200
//! instructions a read, ~650 a counter bump; bench/README.md, 40). Here the
//! identity fields are fixed at construction and the three counters are atomics,
//! so the class is `frozen` (no borrow flag) and native code reads and writes
//! them directly; Python reads them through getters.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::PyTraverseError;

/// A counter's new value `n` as an i64, or the error of `n` naming the field
/// (`TypeError` if not an int, `OverflowError` if out of range).
fn counter(field: &str, n: &Bound<'_, PyAny>) -> PyResult<i64> {
    n.extract::<i64>().map_err(|e| {
        let msg = format!(
            "Tracked.{field} must be an int in i64, got {}",
            n.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        );
        if e.is_instance_of::<PyOverflowError>(n.py()) {
            PyOverflowError::new_err(msg)
        } else {
            PyTypeError::new_err(msg)
        }
    })
}

/// One engine request's record. See `vtc/_core.pyi`.
#[pyclass(frozen, weakref, module = "vtc._core", name = "Tracked")]
pub(crate) struct PyTracked {
    /// The engine's handle for it (vLLM: its request id; SGLang: `id(Req)`).
    #[pyo3(get)]
    pub(crate) key: Py<PyAny>,
    /// The core's id.
    #[pyo3(get)]
    pub(crate) rid: u64,
    /// The engine's request object (kept alive while tracked).
    #[pyo3(get)]
    pub(crate) request: Py<PyAny>,
    #[pyo3(get)]
    pub(crate) tenant: Py<PyString>,
    /// As submitted: clamped to [1, M].
    #[pyo3(get)]
    pub(crate) prompt_len: i64,
    /// Tokens produced while not running: charged when admitted again.
    pub(crate) owed: AtomicI64,
    /// Times admitted (its prompt is charged at the first).
    pub(crate) admissions: AtomicI64,
    /// For a shell that sees cumulative output counts (SGLang).
    pub(crate) charged: AtomicI64,
}

#[pymethods]
impl PyTracked {
    #[new]
    #[pyo3(signature = (key, rid, request, tenant, prompt_len, owed = 0, admissions = 0, charged = 0))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        key: Py<PyAny>,
        rid: u64,
        request: Py<PyAny>,
        tenant: Py<PyString>,
        prompt_len: i64,
        owed: i64,
        admissions: i64,
        charged: i64,
    ) -> Self {
        PyTracked {
            key,
            rid,
            request,
            tenant,
            prompt_len,
            owed: AtomicI64::new(owed),
            admissions: AtomicI64::new(admissions),
            charged: AtomicI64::new(charged),
        }
    }

    #[getter]
    fn owed(&self) -> i64 {
        self.owed.load(Relaxed)
    }

    #[setter]
    fn set_owed(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        self.owed.store(counter("owed", n)?, Relaxed);
        Ok(())
    }

    #[getter]
    fn admissions(&self) -> i64 {
        self.admissions.load(Relaxed)
    }

    #[setter]
    fn set_admissions(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        self.admissions.store(counter("admissions", n)?, Relaxed);
        Ok(())
    }

    #[getter]
    fn charged(&self) -> i64 {
        self.charged.load(Relaxed)
    }

    #[setter]
    fn set_charged(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        self.charged.store(counter("charged", n)?, Relaxed);
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Tracked(key={}, rid={}, request={}, tenant={}, prompt_len={}, owed={}, \
             admissions={}, charged={})",
            self.key.bind(py).repr()?,
            self.rid,
            self.request.bind(py).repr()?,
            self.tenant.bind(py).repr()?,
            self.prompt_len,
            self.owed(),
            self.admissions(),
            self.charged(),
        ))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.key)?;
        visit.call(&self.request)?;
        Ok(())
    }
}
