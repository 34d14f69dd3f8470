//! `MetricsMirror`: the per-tenant metrics' mirror of every tenant, read from
//! a scheduler's change feed in the core (`vtc_core::mirror`), so a refresh's
//! Python touches only the labelled tenants' rows and the sums of the rest.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use vtc_core::mirror::{MetricsMirror, Row};
use vtc_core::KeyRef;

use crate::convert::scheduler_arg;
use crate::errors::Result;
use crate::keys::{client_key, key_to_py};
use crate::views::reader_arg;

/// The mirror of one metrics reader. See `vtc/_core.pyi`.
#[pyclass(module = "vtc", name = "MetricsMirror")]
pub(crate) struct PyMetricsMirror {
    inner: MetricsMirror,
}

type TakenRows = Vec<(usize, Option<f64>, usize, usize)>;

/// The items of an iterable, each a client key argument.
fn items<'py>(obj: &Bound<'py, PyAny>) -> Result<Vec<Bound<'py, PyAny>>> {
    Ok(obj.try_iter()?.collect::<PyResult<_>>()?)
}

fn keys_of<'a>(items: &'a [Bound<'_, PyAny>]) -> Result<Vec<KeyRef<'a>>> {
    items.iter().map(|k| client_key(k.as_borrowed())).collect()
}

#[pymethods]
impl PyMetricsMirror {
    #[new]
    fn new() -> Self {
        PyMetricsMirror {
            inner: MetricsMirror::new(),
        }
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> Result<bool> {
        Ok(self.inner.contains(&client_key(key.as_borrowed())?))
    }

    /// Tenants dropped so far (forgotten, or gone at a full read).
    #[getter]
    fn removed(&self) -> u64 {
        self.inner.removed()
    }

    /// Apply `scheduler`'s changes since reader slot `reader`'s last call;
    /// whether it was a full read.
    #[pyo3(signature = (scheduler, reader = None))]
    fn read(
        &mut self,
        py: Python<'_>,
        scheduler: &Bound<'_, PyAny>,
        reader: Option<&Bound<'_, PyAny>>,
    ) -> Result<bool> {
        let scheduler = scheduler_arg(scheduler)?;
        let r = reader_arg(reader)?;
        let mut g = scheduler.get().lock(py)?;
        Ok(self.inner.read(&mut g.core, r)?)
    }

    /// Drop the tenants of `keys` (an iterable of keys): their increments not
    /// yet taken stay theirs, or (`fold`) go to the sum of the rest.
    fn drop(&mut self, keys: &Bound<'_, PyAny>, fold: bool) -> Result<()> {
        let items = items(keys)?;
        let keys = keys_of(&items)?;
        self.inner.drop_keys(&keys, fold);
        Ok(())
    }

    /// `(rows, increments, other_prompt, other_decode, other_waiting,
    /// other_running, active)` for the tenants of `labelled` (a sequence of
    /// keys), the tenants of `fresh` (an iterable of keys) among them with
    /// their rows whether changed or not. See `vtc/_core.pyi`.
    #[allow(clippy::type_complexity)]
    fn take(
        &mut self,
        labelled: &Bound<'_, PyAny>,
        fresh: &Bound<'_, PyAny>,
    ) -> Result<(
        TakenRows,
        Vec<(usize, u64, u64)>,
        u64,
        u64,
        usize,
        usize,
        usize,
    )> {
        let labelled = items(labelled)?;
        let labelled = keys_of(&labelled)?;
        let fresh = items(fresh)?;
        let fresh = keys_of(&fresh)?;
        let t = self.inner.take(&labelled, &fresh);
        Ok((
            t.rows,
            t.increments,
            t.other_tokens.0,
            t.other_tokens.1,
            t.other_requests.0,
            t.other_requests.1,
            t.active,
        ))
    }

    /// Every tenant's key.
    fn keys<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for (k, _) in self.inner.rows() {
            list.append(key_to_py(py, k)?)?;
        }
        Ok(list)
    }

    /// Every tenant's row, key -> `(counter, service, prompt tokens, decode
    /// tokens, waiting, running)`, as `Scheduler.changes` gives them.
    fn rows<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, r) in self.inner.rows() {
            let Row {
                counter,
                service,
                prompt,
                decode,
                waiting,
                running,
            } = *r;
            d.set_item(
                key_to_py(py, k)?,
                (counter, service, prompt, decode, waiting, running),
            )?;
        }
        Ok(d)
    }

    /// `(active, waiting, running)` over every tenant.
    fn totals(&self) -> (usize, usize, usize) {
        self.inner.totals()
    }

    fn __repr__(&self) -> String {
        format!("MetricsMirror(tenants={})", self.inner.len())
    }
}
