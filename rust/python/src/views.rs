//! The Scheduler's read-only views (request states, clients, counters,
//! tallies), `forget_idle`, snapshots, and the test hooks.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString};
use vtc_core::{CoreError, Predictor, RequestState};

use crate::convert::{band_weights_arg, client_cap_arg, request_id_arg, rid_of, type_error, Ints};
use crate::costs::cost_arg;
use crate::errors::{Error, Result};
use crate::keys::{decode_key, encode_key, key_dict, key_to_py, Key};
use crate::{locality_quantum_arg, Given, Inner, PyScheduler, Scratch};

#[pymethods]
impl PyScheduler {
    fn status(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> Result<Option<&'static str>> {
        let rid = request_id_arg(request_id)?;
        Ok(self.lock(py)?.core.status(rid).map(|s| match s {
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

    fn generated(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> Result<u64> {
        let rid = request_id_arg(request_id)?;
        Ok(self.lock(py)?.core.generated(rid)?)
    }

    fn running<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids: Vec<u64> = self.lock(py)?.core.running().collect();
        PyList::new(py, ids)
    }

    fn clients<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys: Vec<Key> = self.lock(py)?.live_keys().map(|(_, k)| k.clone()).collect();
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
        let values: Vec<(Key, (usize, usize))> = {
            let g = self.lock(py)?;
            g.core
                .active_clients()
                .map(|(c, counts)| {
                    let key = g.keys[c.0 as usize].as_ref();
                    (key.expect("interned client has a key").clone(), counts)
                })
                .collect()
        };
        key_dict(py, values)
    }

    /// Forget idle clients whose state can no longer influence a decision;
    /// returns how many were forgotten.
    fn forget_idle(&self, py: Python<'_>) -> Result<usize> {
        let mut g = self.lock(py)?;
        let mut gone = Vec::new();
        g.core.forget_idle(&mut gone);
        for c in &gone {
            match g.keys[c.0 as usize].take() {
                Some(Key::Int(i)) => {
                    g.ints.remove(&i);
                }
                Some(Key::Str(s)) => {
                    g.strs.remove(&s);
                }
                None => {}
            }
        }
        if g.ints.capacity() > 4 * g.ints.len() + 1024 {
            g.ints.shrink_to_fit();
        }
        if g.strs.capacity() > 4 * g.strs.len() + 1024 {
            g.strs.shrink_to_fit();
        }
        Ok(gone.len())
    }

    /// The fairness state (configuration, every client's counter, service
    /// and weight, the last client to leave the backlog) as bytes. Works
    /// even on a scheduler disabled by an internal error: it is the way out.
    fn snapshot<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let data = {
            let g = self.lock_any(py);
            g.core.snapshot(|c| {
                encode_key(
                    g.keys[c.0 as usize]
                        .as_ref()
                        .expect("live client has a key"),
                )
            })
        };
        PyBytes::new(py, &data)
    }

    /// A scheduler with the fairness state of `data` and no requests.
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
        let locality_quantum = locality_quantum_arg(&locality_quantum)?;
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
        if let Some(cost) = cost {
            restored.scheduler.set_cost(cost)?;
        }
        if let Some(cap) = client_cap {
            let budget = restored.scheduler.budget();
            let tokens = client_cap_arg(cap)?.tokens(budget)?;
            restored.scheduler.set_client_cap(Some(tokens))?;
        }
        if let Some(p) = predictor {
            restored.scheduler.set_predictor(p);
        }
        restored
            .scheduler
            .set_band_weights(band_weights.as_deref())?;
        restored.scheduler.set_locality_quantum(locality_quantum)?;
        let mut inner = Inner {
            core: restored.scheduler,
            ints: HashMap::new(),
            strs: HashMap::new(),
            keys: Vec::with_capacity(restored.keys.len()),
            scratch: Scratch::default(),
            prefix_lookup: None,
        };
        for (i, raw) in restored.keys.iter().enumerate() {
            let key = decode_key(raw)
                .filter(|k| key_to_py(py, k).is_ok())
                .ok_or_else(|| CoreError::BadSnapshot(format!("client {i} has a malformed key")))?;
            let dup = match &key {
                Key::Int(v) => inner.ints.insert(*v, i as u32).is_some(),
                Key::Str(v) => inner.strs.insert(v.clone(), i as u32).is_some(),
            };
            if dup {
                return Err(
                    CoreError::BadSnapshot(format!("client key {key:?} appears twice")).into(),
                );
            }
            inner.keys.push(Some(key));
        }
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
        let live = g.live_keys().count();
        if live != g.core.num_clients() || g.ints.len() + g.strs.len() != live {
            return Err(Error::Py(pyo3::exceptions::PyAssertionError::new_err(
                "client interning out of sync",
            )));
        }
        Ok(())
    }
}
