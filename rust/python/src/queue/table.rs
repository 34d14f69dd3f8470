//! The request table's native operations: the parts of a `vtc.adapter.Requests`
//! table the queue reads (`Table`), and the admission, the arrival and the
//! finishes made on it and on the core when nothing else must see them.

use std::sync::atomic::Ordering::Relaxed;

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::{exact_i64, PyWaitingQueue};
use crate::errors::Result;
use crate::tracked::PyTracked;

/// The parts of a `vtc.adapter.Requests` table its admissions, arrivals and
/// finishes are made with natively, taken when the queue is made if
/// `requests.admit`, `submit`, `release_finished` and `_drop` are then `Requests`'
/// own (no subclass or instance replaced them: else what replaced them must see
/// every call).
pub(super) struct Table {
    /// `requests.observers` (a list, changed in place, never replaced): while it
    /// is not empty, `Requests`' methods make each change (they tell it).
    pub(super) observers: Py<PyList>,
    /// `requests._by_key`: the engine's key -> the request's record.
    pub(super) by_key: Py<PyDict>,
    /// `requests._M`: the longest prompt submitted as it is.
    pub(super) budget: i64,
    /// `requests.overrides` and `requests._aside`: keyed by the engine's key,
    /// each emptied of a released request's key.
    pub(super) overrides: Py<PyDict>,
    pub(super) aside: Py<PyDict>,
}

impl Table {
    pub(super) fn of(requests: &Bound<'_, PyAny>) -> PyResult<Option<Table>> {
        let py = requests.py();
        let own = py
            .import(intern!(py, "vtc.adapter"))?
            .getattr(intern!(py, "Requests"))?;
        let names = ["admit", "submit", "release_finished", "_drop"];
        for name in names.map(|n| PyString::intern(py, n)) {
            let func = match requests.getattr_opt(&name)? {
                Some(m) => m.getattr_opt(intern!(py, "__func__"))?,
                None => None,
            };
            let mine = own.getattr(&name)?;
            if !func.is_some_and(|f| f.is(&mine)) {
                return Ok(None);
            }
        }
        let observers = requests.getattr(intern!(py, "observers"))?;
        let by_key = requests.getattr(intern!(py, "_by_key"))?;
        let budget = requests.getattr(intern!(py, "_M"))?;
        let overrides = requests.getattr(intern!(py, "overrides"))?;
        let aside = requests.getattr(intern!(py, "_aside"))?;
        let (Ok(observers), Ok(by_key), Some(budget), Ok(overrides), Ok(aside)) = (
            observers.cast_into::<PyList>(),
            by_key.cast_into_exact::<PyDict>(),
            exact_i64(&budget),
            overrides.cast_into_exact::<PyDict>(),
            aside.cast_into_exact::<PyDict>(),
        ) else {
            return Ok(None);
        };
        Ok(Some(Table {
            observers: observers.unbind(),
            by_key: by_key.unbind(),
            budget,
            overrides: overrides.unbind(),
            aside: aside.unbind(),
        }))
    }

    /// Whether an observer listens.
    pub(super) fn observed(&self, py: Python<'_>) -> bool {
        !self.observers.bind(py).is_empty()
    }
}

impl PyWaitingQueue {
    /// `Requests._drop(tracked, True)` natively (no observer listens): each record
    /// (distinct, tracked) out of the table's maps, then out of the core (`finish`
    /// if it runs, else `cancel` if held).
    pub(super) fn drop_finished(
        &self,
        py: Python<'_>,
        table: &Table,
        tracked: &[Bound<'_, PyTracked>],
    ) -> Result<()> {
        let (by_key, records) = (table.by_key.bind(py), self.records.bind(py));
        let (overrides, aside) = (table.overrides.bind(py), table.aside.bind(py));
        let core = self.core.get();
        for t in tracked {
            let t = t.get();
            let key = t.key.bind(py);
            by_key.del_item(key)?;
            records.del_item(t.rid)?;
            for keyed in [overrides, aside] {
                if !keyed.is_empty() && keyed.contains(key)? {
                    keyed.del_item(key)?;
                }
            }
            core.finish_or_cancel(py, t.rid)?;
        }
        Ok(())
    }

    /// `requests.admit(record, cached)` natively, when nothing but the table and
    /// the core must see it: `record` a native `Tracked`, `cached` an exact int in
    /// i64 and no observer to tell what the admission charged (false, with nothing
    /// done, otherwise). As `Requests.admit`: `cached` clamped to [0, prompt_len],
    /// the core's head popped (it must be `record`'s request), the admission
    /// counted and the tokens it owes charged.
    pub(super) fn admit(
        &self,
        py: Python<'_>,
        record: &Bound<'_, PyAny>,
        cached: &Bound<'_, PyAny>,
    ) -> Result<bool> {
        let Ok(t) = record.cast::<PyTracked>() else {
            return Ok(false);
        };
        if self.table.as_ref().is_none_or(|table| table.observed(py)) {
            return Ok(false);
        }
        let Some(cached) = exact_i64(cached) else {
            return Ok(false);
        };
        let t = t.get();
        let cached = cached.max(0).min(t.prompt_len); // (min(max()): never a panic)
        let core = self.core.get();
        let rid = core.pop_head(py, cached)?;
        if rid != Some(t.rid) {
            // (a bug in the shell, never the engine's input)
            let rid = rid.map_or_else(|| "None".to_string(), |r| r.to_string());
            return Err(PyRuntimeError::new_err(format!(
                "VTC core admitted {rid}, the engine admitted {}",
                t.rid
            ))
            .into());
        }
        t.admissions.fetch_add(1, Relaxed);
        let owed = t.owed.swap(0, Relaxed);
        if owed != 0 {
            core.decode_one(py, t.rid, owed)?;
        }
        Ok(true)
    }

    /// `requests.submit(key, request, tenant, n, priority)` natively, when nothing
    /// but the table and the core must see it and nothing needs converting: the
    /// key and the tenant exact `str`s, `n` an exact int in [1, M], `priority` an
    /// exact int in i64, the id `key_id(key)` free, no observer to tell of the
    /// arrival (false, with nothing done, otherwise). As `Requests.submit`: the
    /// request submitted in band `priority` under its key's id, its record made
    /// and kept under both.
    pub(super) fn submit(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        request: &Bound<'_, PyAny>,
        tenant: &Bound<'_, PyAny>,
        n: &Bound<'_, PyAny>,
        priority: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let Some(table) = self.table.as_ref().filter(|t| !t.observed(py)) else {
            return Ok(false);
        };
        let (Ok(_), Ok(tenant), Some(n), Some(priority)) = (
            key.cast_exact::<PyString>(),
            tenant.cast_exact::<PyString>(),
            exact_i64(n),
            exact_i64(priority),
        ) else {
            return Ok(false);
        };
        if !(1..=table.budget).contains(&n) {
            return Ok(false);
        }
        let rid = key.hash()? as u64; // (key_id)
        let records = self.records.bind(py);
        let rid_int = rid.into_pyobject(py)?; // (made once: contains, then set_item)
        if records.contains(&rid_int)? {
            return Ok(false); // (taken by a live request: the next free id is Python's)
        }
        self.core.get().submit_str(py, rid, tenant, n, priority)?;
        let t = PyTracked::new(
            key.clone().unbind(),
            rid,
            request.clone().unbind(),
            tenant.clone().unbind(),
            n,
            0,
            0,
            0,
        );
        let t = Bound::new(py, t)?;
        table.by_key.bind(py).set_item(key, &t)?;
        records.set_item(rid_int, t)?;
        Ok(true)
    }
}
