//! `FairnessWindow`: the per-tenant metrics' window figures (Jain's index of
//! the backlogged tenants' gains, the counter spread), computed in the core
//! (`vtc_core::fairness`) in one call per refresh.

use pyo3::prelude::*;
use vtc_core::fairness::FairnessWindow;

use crate::convert::{float_arg, type_error};
use crate::errors::{invalid, Result};
use crate::PyScheduler;

/// The window snapshots of one metrics reader. See `vtc/_core.pyi`.
#[pyclass(module = "vtc", name = "FairnessWindow")]
pub(crate) struct PyFairnessWindow {
    inner: FairnessWindow,
}

#[pymethods]
impl PyFairnessWindow {
    #[new]
    fn new(window: &Bound<'_, PyAny>) -> Result<Self> {
        let w = float_arg("window", window)?;
        let inner = FairnessWindow::new(w)
            .ok_or_else(|| invalid(format!("window must be > 0, got {w}")))?;
        Ok(PyFairnessWindow { inner })
    }

    #[getter]
    fn window(&self) -> f64 {
        self.inner.window()
    }

    /// Snapshots kept.
    #[getter]
    fn snapshots(&self) -> usize {
        self.inner.snapshots()
    }

    /// `(jain, spread, backlogged)` of `scheduler` at time `now`, taking a
    /// snapshot when one is due.
    fn refresh(
        &mut self,
        py: Python<'_>,
        scheduler: &Bound<'_, PyAny>,
        now: &Bound<'_, PyAny>,
    ) -> Result<(Option<f64>, f64, usize)> {
        let scheduler = scheduler
            .cast::<PyScheduler>()
            .map_err(|_| type_error("scheduler", "a vtc.Scheduler", scheduler))?;
        let now = float_arg("now", now)?;
        let g = scheduler.get().lock(py)?;
        let f = self.inner.refresh(&g.core, now);
        Ok((f.jain, f.spread, f.backlogged))
    }

    fn __repr__(&self) -> String {
        format!(
            "FairnessWindow(window={:?}, snapshots={})",
            self.inner.window(),
            self.inner.snapshots()
        )
    }
}
