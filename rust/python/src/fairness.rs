//! `FairnessWindow`: the per-tenant metrics' window figures (Jain's index of
//! the backlogged tenants' gains, the counter spread, each tenant's gain over
//! the window), computed in the core (`vtc_core::fairness`).

use pyo3::prelude::*;
use pyo3::types::PyList;
use vtc_core::fairness::FairnessWindow;
use vtc_core::relabel::Holder;
use vtc_core::ClientKey;

use crate::convert::{float_arg, int_arg, scheduler_arg, type_error};
use crate::errors::{invalid, Result};
use crate::keys::{client_key, key_to_py};

/// The window snapshots of one metrics reader. See `vtc/_core.pyi`.
#[pyclass(module = "vtc", name = "FairnessWindow")]
pub(crate) struct PyFairnessWindow {
    inner: FairnessWindow,
}

/// Who holds the label value of the tenant `relabel` passed over, copied out of
/// the scheduler's lock (`vtc_core::relabel::Holder`, owned).
enum ClashHolder {
    Labelled(usize),
    Tenant(ClientKey),
    Reserved,
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
        let scheduler = scheduler_arg(scheduler)?;
        let now = float_arg("now", now)?;
        let g = scheduler.get().lock(py)?;
        let f = self.inner.refresh(&g.core, now);
        Ok((f.jain, f.spread, f.backlogged))
    }

    /// The service each of `tenants` (an iterable of keys) gained over the
    /// last refresh's window; NaN for a key the scheduler does not have.
    fn gains(
        &self,
        py: Python<'_>,
        scheduler: &Bound<'_, PyAny>,
        tenants: &Bound<'_, PyAny>,
    ) -> Result<Vec<f64>> {
        let scheduler = scheduler_arg(scheduler)?;
        let items: Vec<Bound<'_, PyAny>> = tenants.try_iter()?.collect::<PyResult<_>>()?;
        let keys = items
            .iter()
            .map(|k| client_key(k.as_borrowed()))
            .collect::<Result<Vec<_>>>()?;
        let g = scheduler.get().lock(py)?;
        Ok(self.inner.gains(&g.core, &keys))
    }

    /// `[(key, gain)]` of every client that gained more than `bar` over the
    /// last refresh's window.
    fn above<'py>(
        &self,
        py: Python<'py>,
        scheduler: &Bound<'py, PyAny>,
        bar: &Bound<'py, PyAny>,
    ) -> Result<Bound<'py, PyList>> {
        let scheduler = scheduler_arg(scheduler)?;
        let bar = float_arg("bar", bar)?;
        let rows: Vec<(vtc_core::ClientKey, f64)> = {
            let g = scheduler.get().lock(py)?;
            (self.inner.above(&g.core, bar).into_iter())
                .map(|(k, v)| (k.clone(), v))
                .collect()
        };
        let list = PyList::empty(py);
        for (k, v) in &rows {
            list.append((key_to_py(py, k)?, *v))?;
        }
        Ok(list)
    }

    /// `(dropped, taken, swaps, clash)`: the labels' changes for `labelled`
    /// (a sequence of keys, the tenants with a label) at most `limit` labels
    /// and margin `factor`, over the last refresh's window: indices into
    /// `labelled` of the tenants over the limit, the tenants that take the
    /// free labels, `(tenant, index into labelled)` of each swap, and the
    /// first candidate passed over for its label value with its holder (an
    /// item of `labelled`, or a tenant that took a label before it), or
    /// None. See `vtc_core::relabel` and `vtc/_core.pyi`.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (scheduler, labelled, limit, factor, reserved = None))]
    fn relabel<'py>(
        &self,
        py: Python<'py>,
        scheduler: &Bound<'py, PyAny>,
        labelled: &Bound<'py, PyAny>,
        limit: &Bound<'py, PyAny>,
        factor: &Bound<'py, PyAny>,
        reserved: Option<&Bound<'py, PyAny>>,
    ) -> Result<(
        Vec<usize>,
        Bound<'py, PyList>,
        Bound<'py, PyList>,
        Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    )> {
        let scheduler = scheduler_arg(scheduler)?;
        let items: Vec<Bound<'_, PyAny>> = labelled.try_iter()?.collect::<PyResult<_>>()?;
        let keys = items
            .iter()
            .map(|k| client_key(k.as_borrowed()))
            .collect::<Result<Vec<_>>>()?;
        let n = int_arg("limit", limit)?;
        let limit =
            usize::try_from(n).map_err(|_| invalid(format!("limit must be >= 0, got {n}")))?;
        let factor = float_arg("factor", factor)?;
        let reserved: Option<String> = match reserved {
            None => None,
            Some(r) if r.is_none() => None,
            Some(r) => Some(
                r.extract::<String>()
                    .map_err(|_| type_error("reserved", "a str or None", r))?,
            ),
        };
        type Owned = (
            Vec<usize>,
            Vec<ClientKey>,
            Vec<(ClientKey, usize)>,
            Option<(ClashHolder, ClientKey)>,
        );
        let (dropped, taken, swaps, clash): Owned = {
            let g = scheduler.get().lock(py)?;
            let r = self.inner.relabel(
                &g.core,
                &keys,
                limit,
                factor,
                reserved.as_deref().map(str::as_bytes),
            );
            (
                r.dropped,
                r.taken.into_iter().cloned().collect(),
                r.swaps.into_iter().map(|(k, i)| (k.clone(), i)).collect(),
                r.clash.map(|(holder, k)| {
                    let holder = match holder {
                        Holder::Labelled(i) => ClashHolder::Labelled(i),
                        Holder::Candidate(h) => ClashHolder::Tenant(h.clone()),
                        Holder::Reserved => ClashHolder::Reserved,
                    };
                    (holder, k.clone())
                }),
            )
        };
        let taken_list = PyList::empty(py);
        for k in &taken {
            taken_list.append(key_to_py(py, k)?)?;
        }
        let swap_list = PyList::empty(py);
        for (k, i) in &swaps {
            swap_list.append((key_to_py(py, k)?, *i))?;
        }
        let clash = match clash {
            None => None,
            Some((holder, k)) => {
                let holder = match holder {
                    ClashHolder::Labelled(i) => items
                        .get(i)
                        .cloned()
                        .ok_or_else(|| invalid(format!("no labelled tenant {i}")))?,
                    ClashHolder::Tenant(h) => key_to_py(py, &h)?,
                    ClashHolder::Reserved => py.None().into_bound(py),
                };
                Some((holder, key_to_py(py, &k)?))
            }
        };
        Ok((dropped, taken_list, swap_list, clash))
    }

    fn __repr__(&self) -> String {
        format!(
            "FairnessWindow(window={:?}, snapshots={})",
            self.inner.window(),
            self.inner.snapshots()
        )
    }
}
