//! `WaitingQueue`: the hot half of an engine's waiting queue, answered here with
//! no Python frame: whether any request waits (`bool`), how many (`len`), the
//! request the core admits next (`peek_request`) and its provisional pop
//! (`pop_request`).
//!
//! vLLM asks these ~6.5 times a step; as Python methods over
//! `vtc.adapter.Requests` they were ~20,000 instructions of VTC's ~96,500 a step
//! (bench/README.md, 39 and 43). A Python subclass (`vtc.vllm.VTCRequestQueue`)
//! keeps every other method, and `settle`, which decides the provisional pop:
//! each method here calls it first while a pop is pending, as the Python
//! methods did. The answers are the core's own (its `num_waiting`, its `peek`
//! with the prefix lookup the core holds), read under the core's lock; the
//! engine's request is the `request` attribute of the record `Requests` keeps by
//! core id (its `_by_rid` dict, shared, not copied).

use parking_lot::Mutex;
use pyo3::exceptions::{PyIndexError, PyKeyError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::{intern, PyTraverseError};

use crate::errors::Result;
use crate::PyScheduler;

/// The native base of an engine's waiting queue. See `vtc/_core.pyi`.
#[pyclass(frozen, subclass, module = "vtc._core", name = "WaitingQueue")]
pub(crate) struct PyWaitingQueue {
    core: Py<PyScheduler>,
    /// `Requests._by_rid`: core id -> the request's record.
    records: Py<PyDict>,
    /// The record popped provisionally (`_pending`), until `settle` decides it.
    pending: Mutex<Option<Py<PyAny>>>,
}

impl PyWaitingQueue {
    /// `self.settle()` if a pop is pending (the subclass decides it).
    fn settle_pending(slf: &Bound<'_, Self>) -> PyResult<()> {
        if slf.get().pending.lock().is_some() {
            slf.call_method0(intern!(slf.py(), "settle"))?;
        }
        Ok(())
    }

    /// How many requests wait in the core, once a pending pop is settled.
    fn count(slf: &Bound<'_, Self>) -> Result<usize> {
        Self::settle_pending(slf)?;
        let py = slf.py();
        Ok(slf.get().core.get().lock(py)?.core.num_waiting())
    }

    /// The record of the request the core admits next (`what` names the call in
    /// the `IndexError` of an empty queue), once a pending pop is settled.
    fn head<'py>(slf: &Bound<'py, Self>, what: &str) -> Result<Bound<'py, PyAny>> {
        Self::settle_pending(slf)?;
        let py = slf.py();
        let this = slf.get();
        let Some(rid) = this.core.get().peek(py)? else {
            return Err(PyIndexError::new_err(format!("{what} from an empty VTC queue")).into());
        };
        match this.records.bind(py).get_item(rid)? {
            Some(record) => Ok(record),
            // (a core id with no record: a bug in the shell, never the engine's input)
            None => Err(PyKeyError::new_err(rid).into()),
        }
    }
}

#[pymethods]
impl PyWaitingQueue {
    #[new]
    fn new(core: Py<PyScheduler>, records: Py<PyDict>) -> Self {
        PyWaitingQueue {
            core,
            records,
            pending: Mutex::new(None),
        }
    }

    #[getter(_pending)]
    fn get_pending(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.pending.lock().as_ref().map(|p| p.clone_ref(py))
    }

    #[setter(_pending)]
    fn set_pending(&self, record: Option<Py<PyAny>>) {
        // (the old record is dropped after the lock is let go: its last reference
        // may run Python code)
        let old = std::mem::replace(&mut *self.pending.lock(), record);
        drop(old);
    }

    fn __bool__(slf: &Bound<'_, Self>) -> Result<bool> {
        Ok(Self::count(slf)? > 0)
    }

    fn __len__(slf: &Bound<'_, Self>) -> Result<usize> {
        Self::count(slf)
    }

    fn peek_request<'py>(slf: &Bound<'py, Self>) -> Result<Bound<'py, PyAny>> {
        let record = Self::head(slf, "peek")?;
        Ok(record.getattr(intern!(slf.py(), "request"))?)
    }

    fn pop_request<'py>(slf: &Bound<'py, Self>) -> Result<Bound<'py, PyAny>> {
        let record = Self::head(slf, "pop")?;
        let request = record.getattr(intern!(slf.py(), "request"))?;
        let old = slf.get().pending.lock().replace(record.unbind());
        drop(old);
        Ok(request)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> std::result::Result<(), PyTraverseError> {
        visit.call(&self.core)?;
        visit.call(&self.records)?;
        if let Some(pending) = self.pending.try_lock() {
            visit.call(pending.as_ref())?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        let old = self.pending.lock().take();
        drop(old);
    }
}
