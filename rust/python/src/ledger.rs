//! `SyncLedger`: the shared counters' unacknowledged service by tenant and
//! the waiting tenants, kept in the core (`vtc_core::ledger`) so that a sync
//! does not fold, encode and look up every changed tenant in Python.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use vtc_core::ledger::{Read, SyncLedger};
use vtc_core::wire::{parse_changed, push_json};
use vtc_core::ClientKey;

use crate::convert::{float_arg, mapping_items, scheduler_arg};
use crate::errors::{invalid, Result};
use crate::keys::{client_key, key_to_py};
use crate::views::reader_arg;

/// One replica's sync ledger. See `vtc/_core.pyi`.
#[pyclass(module = "vtc", name = "SyncLedger")]
pub(crate) struct PySyncLedger {
    inner: SyncLedger,
    read: Read,
    json: Vec<u8>,
    /// The counters of the reply being applied (`take_changed`), cleared when used.
    pulled: Vec<(ClientKey, f64)>,
}

fn key_list<'py>(py: Python<'py>, keys: &[ClientKey]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for k in keys {
        list.append(key_to_py(py, k)?)?;
    }
    Ok(list)
}

/// A key as the store names it: `i:<int>` or `s:<str>`.
fn encoded<'py>(py: Python<'py>, k: &ClientKey) -> PyResult<Bound<'py, PyAny>> {
    let mut out = Vec::with_capacity(16);
    match k {
        ClientKey::Int(i) => out.extend_from_slice(format!("i:{i}").as_bytes()),
        ClientKey::Str(s) => {
            out.extend_from_slice(b"s:");
            out.extend_from_slice(s);
        }
    }
    crate::keys::str_of(py, &out)
}

type ReadOut<'py> = (
    bool,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    usize,
);

#[pymethods]
impl PySyncLedger {
    #[new]
    fn new(reader: &Bound<'_, PyAny>) -> Result<Self> {
        Ok(PySyncLedger {
            inner: SyncLedger::new(reader_arg(Some(reader))?),
            read: Read::default(),
            json: Vec::new(),
            pulled: Vec::new(),
        })
    }

    #[getter]
    fn reader(&self) -> usize {
        self.inner.reader()
    }

    /// Serve `scheduler` from now on: its reader slot starts again and what
    /// it was charged so far counts as already in the store.
    fn reset(&mut self, py: Python<'_>, scheduler: &Bound<'_, PyAny>) -> Result<()> {
        let scheduler = scheduler_arg(scheduler)?;
        let mut g = scheduler.get().lock(py)?;
        Ok(self.inner.reset(&mut g.core)?)
    }

    /// Fold what `scheduler` charged since the last read: `(full, entered,
    /// left, idle, gone, rows)`.
    #[pyo3(signature = (scheduler, idle = false))]
    fn read<'py>(
        &mut self,
        py: Python<'py>,
        scheduler: &Bound<'py, PyAny>,
        idle: bool,
    ) -> Result<ReadOut<'py>> {
        let scheduler = scheduler_arg(scheduler)?;
        {
            let mut g = scheduler.get().lock(py)?;
            self.inner.read(&mut g.core, idle, &mut self.read)?;
        }
        let r = &self.read;
        Ok((
            r.full,
            key_list(py, &r.entered)?,
            key_list(py, &r.left)?,
            key_list(py, &r.idle)?,
            key_list(py, &r.gone)?,
            r.rows,
        ))
    }

    /// `(json, n)`: the unacknowledged amounts of `n` tenants as the sync
    /// script's services argument, one JSON array of strings.
    fn push_json<'py>(&mut self, py: Python<'py>) -> (Bound<'py, PyBytes>, usize) {
        let n = push_json(&self.inner, &mut self.json);
        (PyBytes::new(py, &self.json), n)
    }

    /// The unacknowledged amounts by stored key (`i:<int>`, `s:<str>`).
    fn pushed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.unacked() {
            d.set_item(encoded(py, k)?, v)?;
        }
        Ok(d)
    }

    /// `[(tenant, amount)]` of every unacknowledged amount.
    fn unacked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for (k, v) in self.inner.unacked() {
            list.append((key_to_py(py, k)?, v))?;
        }
        Ok(list)
    }

    /// The tenants with an unacknowledged amount; `waiting=False`: only
    /// those with nothing waiting at the last read.
    #[pyo3(signature = (waiting = None))]
    fn unacked_tenants<'py>(
        &self,
        py: Python<'py>,
        waiting: Option<bool>,
    ) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for (k, _) in self.inner.unacked() {
            if waiting.is_none_or(|w| self.inner.waiting(k) == w) {
                list.append(key_to_py(py, k)?)?;
            }
        }
        Ok(list)
    }

    /// The unacknowledged amount of `tenant` (0 for none).
    fn unacked_of(&self, tenant: &Bound<'_, PyAny>) -> Result<f64> {
        let k = ClientKey::from(&client_key(tenant.as_borrowed())?);
        Ok(self.inner.unacked_of(&k))
    }

    /// The service of `tenant` at the last read (`None`: not live then).
    fn seen(&self, tenant: &Bound<'_, PyAny>) -> Result<Option<f64>> {
        let k = ClientKey::from(&client_key(tenant.as_borrowed())?);
        Ok(self.inner.seen(&k))
    }

    /// The store applied every amount: none is unacknowledged now.
    fn acknowledge(&mut self) {
        self.inner.acknowledge();
    }

    /// The scheduler forgot `tenants` without a read in between.
    fn forget(&mut self, tenants: &Bound<'_, PyAny>) -> Result<()> {
        let mut keys = Vec::new();
        for t in tenants.try_iter()? {
            keys.push(ClientKey::from(&client_key(t?.as_borrowed())?));
        }
        self.inner.forget(&keys);
        Ok(())
    }

    /// Read the reply's changed counters (the script's JSON array of keys and
    /// their values comma-separated) for `raise_pulled`/`pulled_values`:
    /// `(kept, dropped)`, the values that are no counter dropped. A reply
    /// that cannot be read: `InvalidArgumentError`, nothing kept.
    fn take_changed(&mut self, keys: &[u8], values: &[u8]) -> Result<(usize, usize)> {
        self.pulled.clear();
        let dropped = parse_changed(keys, values, &mut self.pulled).map_err(invalid)?;
        Ok((self.pulled.len(), dropped))
    }

    /// Raise the counters taken (`take_changed`) and `extra` (a mapping of
    /// tenant -> global counter) each to the global counter plus the tenant's
    /// unacknowledged amount, in one call into `scheduler`: `(raised,
    /// skipped)`, skipped the values past `MAX_COUNTER`. The counters taken are
    /// used up, also on an error.
    #[pyo3(signature = (scheduler, extra = None))]
    fn raise_pulled(
        &mut self,
        py: Python<'_>,
        scheduler: &Bound<'_, PyAny>,
        extra: Option<&Bound<'_, PyAny>>,
    ) -> Result<(usize, usize)> {
        let pulled = self.pulled_with(extra);
        let scheduler = scheduler_arg(scheduler)?;
        let pulled = pulled?;
        let mut g = scheduler.get().lock(py)?;
        Ok(self.inner.raise_pulled(&mut g.core, &pulled)?)
    }

    /// What `raise_pulled` would raise each tenant to, as a dict, and how many
    /// it would skip (for a raise left to later); uses up the counters taken.
    #[pyo3(signature = (extra = None))]
    fn pulled_values<'py>(
        &mut self,
        py: Python<'py>,
        extra: Option<&Bound<'py, PyAny>>,
    ) -> Result<(Bound<'py, PyDict>, usize)> {
        let pulled = self.pulled_with(extra)?;
        let mut values = Vec::with_capacity(pulled.len());
        let skipped = self.inner.raise_values(&pulled, &mut values);
        let d = PyDict::new(py);
        for (k, v) in &values {
            d.set_item(key_to_py(py, k)?, *v)?;
        }
        Ok((d, skipped))
    }

    /// Tenants with an unacknowledged amount.
    fn __len__(&self) -> usize {
        self.inner.num_unacked()
    }

    /// Raises `AssertionError` if the ledger's invariant is broken.
    fn check(&self) -> PyResult<()> {
        self.inner
            .check()
            .map_err(pyo3::exceptions::PyAssertionError::new_err)
    }

    /// Counters taken and not used yet.
    #[getter]
    fn num_pulled(&self) -> usize {
        self.pulled.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "SyncLedger(reader={}, tenants={}, unacked={})",
            self.inner.reader(),
            self.inner.len(),
            self.inner.num_unacked()
        )
    }
}

impl PySyncLedger {
    /// The counters taken, and `extra`'s after them; the buffer is emptied.
    fn pulled_with(&mut self, extra: Option<&Bound<'_, PyAny>>) -> Result<Vec<(ClientKey, f64)>> {
        let mut pulled = std::mem::take(&mut self.pulled);
        if let Some(extra) = extra {
            let items = mapping_items(extra, "extra", "a mapping of tenant to counter")?;
            for (k, v) in &items {
                let key = ClientKey::from(&client_key(k.as_borrowed())?);
                pulled.push((key, float_arg("counter", v)?));
            }
        }
        Ok(pulled)
    }
}
