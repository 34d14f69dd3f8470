//! The Scheduler's read-only views (request states, clients, counters,
//! tallies), `forget_idle`, snapshots, and the test hooks.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString};
use vtc_core::{ClientKey, Overrides, Predictor, RequestState};

use crate::args::RequestId;
use crate::convert::{
    band_weights_arg, client_cap_arg, float_arg, int_arg, rid_of, type_error, Ints,
};
use crate::costs::cost_arg;
use crate::errors::{invalid, Error, Result};
use crate::keys::{key_dict, key_to_py};
use crate::{Given, Inner, PyScheduler, Scratch};

#[pymethods]
impl PyScheduler {
    fn status(&self, py: Python<'_>, request_id: RequestId) -> Result<Option<&'static str>> {
        Ok(self.lock(py)?.core.status(request_id.0).map(|s| match s {
            RequestState::Waiting => "waiting",
            RequestState::Running => "running",
            RequestState::Aside => "aside",
        }))
    }

    /// `status` of each of `request_ids` (a list, tuple, integer array or
    /// other iterable of ids), in one call; the first bad id raises as
    /// `status` would.
    fn statuses<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
    ) -> Result<Bound<'py, PyList>> {
        let mut ids = Ints::new("request_ids", request_ids, usize::MAX)?;
        let mut rids = Vec::new();
        if let Some((_, e)) = ids.copy_into(&mut rids, rid_of) {
            return Err(e);
        }
        let mut states = Vec::new();
        self.lock(py)?.core.statuses(&rids, &mut states);
        let (waiting, running, aside) = (
            pyo3::intern!(py, "waiting"),
            pyo3::intern!(py, "running"),
            pyo3::intern!(py, "aside"),
        );
        Ok(PyList::new(
            py,
            states.iter().map(|s| {
                s.map(|s| match s {
                    RequestState::Waiting => waiting.clone(),
                    RequestState::Running => running.clone(),
                    RequestState::Aside => aside.clone(),
                })
            }),
        )?)
    }

    fn generated(&self, py: Python<'_>, request_id: RequestId) -> Result<u64> {
        Ok(self.lock(py)?.core.generated(request_id.0)?)
    }

    fn running<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids: Vec<u64> = self.lock(py)?.core.running().collect();
        PyList::new(py, ids)
    }

    fn clients<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys: Vec<ClientKey> = self
            .lock(py)?
            .core
            .keyed_clients()
            .map(|(_, k)| k.clone())
            .collect();
        let list = PyList::empty(py);
        for k in &keys {
            list.append(key_to_py(py, k)?)?;
        }
        Ok(list)
    }

    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.per_client(py, |c| c.counter())
    }

    fn services<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.per_client(py, |c| c.service())
    }

    /// Every client's raw charged tokens, `(prompt, decode)`.
    fn tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.per_client(py, |c| (c.prompt_tokens(), c.decode_tokens()))
    }

    /// Every client with live requests, `(waiting, running)`, set-aside
    /// requests counted as waiting (the keys as in `tokens`). See `vtc/_core.pyi`.
    fn active_clients<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let values: Vec<(ClientKey, (usize, usize))> = {
            let g = self.lock(py)?;
            g.core
                .active_clients()
                .map(|(c, counts)| {
                    let key = g.core.key(c);
                    (key.expect("interned client has a key").clone(), counts)
                })
                .collect()
        };
        key_dict(py, values)
    }

    /// The clients changed since reader `reader`'s last call: `(full,
    /// changed, gone)`, `changed` a dict of key -> `(counter, service,
    /// prompt tokens, decode tokens, waiting, running)` (waiting counts
    /// set-aside requests, as `active_clients`), `gone` the keys forgotten
    /// since (apply them first). `full`: the reader's first call (or after
    /// `reset_changes`, or on a scheduler restored from a snapshot): every
    /// client is in `changed`. See `vtc/_core.pyi`.
    #[pyo3(signature = (reader = None))]
    fn changes<'py>(
        &self,
        py: Python<'py>,
        reader: Option<&Bound<'py, PyAny>>,
    ) -> Result<(bool, Bound<'py, PyDict>, Bound<'py, PyList>)> {
        let r = reader_arg(reader)?;
        type Row = (f64, f64, u64, u64, usize, usize);
        let (full, rows, gone): (bool, Vec<(ClientKey, Row)>, Vec<ClientKey>) = {
            let mut g = self.lock(py)?;
            let mut changed = Vec::new();
            let mut gone = Vec::new();
            let full = g.core.changes(r, &mut changed, &mut gone)?;
            let core = &g.core;
            let rows = changed
                .iter()
                .filter_map(|&c| {
                    let cl = core.client(c).ok()?;
                    let key = core.key(c)?.clone();
                    let row = (
                        cl.counter(),
                        cl.service(),
                        cl.prompt_tokens(),
                        cl.decode_tokens(),
                        cl.num_waiting() + cl.num_aside(),
                        cl.num_running(),
                    );
                    Some((key, row))
                })
                .collect();
            (
                full,
                rows,
                gone.into_iter().filter_map(|(_, k)| k).collect(),
            )
        };
        let list = PyList::empty(py);
        for k in &gone {
            list.append(key_to_py(py, k)?)?;
        }
        Ok((full, key_dict(py, rows)?, list))
    }

    /// Make reader `reader` start again: its next `changes` is a full read.
    #[pyo3(signature = (reader = None))]
    fn reset_changes(&self, py: Python<'_>, reader: Option<&Bound<'_, PyAny>>) -> Result<()> {
        let r = reader_arg(reader)?;
        Ok(self.lock(py)?.core.reset_changes(r)?)
    }

    /// Forget idle clients whose state can no longer influence a decision;
    /// returns how many were forgotten.
    fn forget_idle(&self, py: Python<'_>) -> Result<usize> {
        let mut g = self.lock(py)?;
        let mut gone = Vec::new();
        g.core.forget_idle(&mut gone);
        Ok(gone.len())
    }

    /// The state (the whole configuration, every client's key, counter,
    /// service, weight, refund credit and moving average, the last client
    /// to leave the backlog) as bytes, format version 2. Works
    /// even on a scheduler disabled by an internal error: it is the way out.
    fn snapshot<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyBytes>> {
        let data = {
            let g = self.lock_any(py)?;
            g.core.snapshot()
        };
        Ok(PyBytes::new(py, &data))
    }

    /// A scheduler with the state of `data` and no requests. Each argument
    /// given replaces the value the snapshot stores; one omitted (or None)
    /// keeps it (a version 1 snapshot stores M, wp, wq and the policy, the
    /// rest is the default).
    #[staticmethod]
    #[pyo3(signature = (data, *, cost = None, client_cap = None, predictor = None, band_weights = None, locality_quantum = Given(None)))]
    fn from_snapshot(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        client_cap: Option<&Bound<'_, PyAny>>,
        predictor: Option<&Bound<'_, PyAny>>,
        band_weights: Option<&Bound<'_, PyAny>>,
        locality_quantum: Given<'_>,
    ) -> Result<Self> {
        let cost = cost.map(cost_arg).transpose()?;
        let band_weights = band_weights_arg(band_weights)?;
        let locality_quantum = (locality_quantum.0.as_ref())
            .map(|q| float_arg("locality_quantum", q))
            .transpose()?;
        let predictor: Option<Predictor> = match predictor {
            None => None,
            Some(p) => Some(
                p.cast::<PyString>()
                    .map_err(|_| type_error("predictor", "a str", p))?
                    .to_str()?
                    .parse()?,
            ),
        };
        // Only buffers: their size is real (a sequence's `__len__` may lie).
        let bytes: Vec<u8> = if let Ok(b) = data.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else if let Ok(b) = data.cast::<PyByteArray>() {
            b.to_vec()
        } else if data.is_instance_of::<PyMemoryView>() {
            let b = data.call_method0("tobytes")?;
            b.cast::<PyBytes>()
                .map_err(PyErr::from)?
                .as_bytes()
                .to_vec()
        } else {
            return Err(type_error("data", "bytes, bytearray or memoryview", data));
        };
        let mut restored = py.detach(|| vtc_core::Scheduler::restore(&bytes))?;
        // read after the snapshot, as before (a bad snapshot is the error
        // first); the cost given is valid, so no check comes between
        let client_cap = client_cap.map(client_cap_arg).transpose()?;
        restored.override_config(Overrides {
            cost,
            client_cap,
            predictor,
            band_weights,
            locality_quantum,
        })?;
        let inner = Inner {
            core: restored.interned()?,
            scratch: Scratch::default(),
            prefix_lookup: None,
        };
        Ok(PyScheduler::new_inner(inner))
    }

    /// Tests only: panic while holding the lock, as an internal bug would.
    fn _panic_for_tests(&self, py: Python<'_>) -> Result<()> {
        let _guard = self.lock(py)?;
        panic!("deliberate internal panic (tests)");
    }

    fn _check_invariants(&self, py: Python<'_>) -> Result<()> {
        let g = self.lock(py)?;
        g.core
            .check_invariants()
            .map_err(|m| Error::Py(pyo3::exceptions::PyAssertionError::new_err(m)))?;
        Ok(())
    }
}

/// A change reader slot: an int in `[0, READERS)`.
pub(crate) fn reader_arg(obj: Option<&Bound<'_, PyAny>>) -> Result<usize> {
    let Some(obj) = obj else { return Ok(0) };
    let v = int_arg("reader", obj)?;
    usize::try_from(v)
        .ok()
        .filter(|&r| r < vtc_core::READERS)
        .ok_or_else(|| {
            invalid(format!(
                "reader must be an int in [0, {}), got {v}",
                vtc_core::READERS
            ))
        })
}
