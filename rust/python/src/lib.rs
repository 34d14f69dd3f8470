//! `vtc._core`: a thin PyO3 layer over `vtc-core`.
//!
//! Arguments are read into plain Rust values first (client keys are interned
//! to the core's dense ids here); the work then runs on the core, with the
//! GIL released for batch calls. The scheduler sits behind a mutex so that
//! API threads and an engine thread can share one object safely.
//!
//! Modules: `convert` reads argument shapes (ints, floats, batches, mappings,
//! the client cap) into Rust values, `keys` client keys and their snapshot
//! bytes, `costs` the cost objects, `errors` the one conversion of core
//! errors into Python exceptions; this file holds the `Scheduler` class.

mod convert;
mod costs;
mod errors;
mod keys;

use std::collections::HashMap;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{
    IntoPyDict, PyBool, PyByteArray, PyBytes, PyDict, PyInt, PyList, PyMemoryView, PyString,
};
use vtc_core::{ClientId, Config, CoreError, Cost, Policy, Predictor, RequestState, Tokens};

use convert::{
    band_weights_arg, client_cap_arg, float_arg, has_special, i64_arg, int_arg, int_arg_sat,
    mapping_items, output_attr, repr, request_id_arg, rid_of, sized_len, tokens_of, type_error,
    Ints,
};
use costs::{cost_arg, cost_repr, cost_to_py, PyContextCost, PyLinearCost, PyQuadraticCost};
use errors::{invalid, Error, Result};
use keys::{client_arg, decode_key, encode_key, key_dict, key_to_py, Key, KeyRef};

/// Batches at least this long are processed with the GIL released.
///
/// Releasing the GIL is not free when another thread wants it: that thread
/// takes it, and getting it back can wait for its switch interval (5 ms by
/// default). A 256-request decode is ~2 us of work; with a busy Python thread
/// beside it, releasing the GIL made its mean 300-600 us (one call in ten
/// waited ~5 ms; bench/README.md, optimisation 6). vLLM's engine process has
/// such threads (its output thread serializes the previous step). So only
/// batches whose work is long next to a switch release it: 65,536 ids are
/// ~0.5 ms.
const DETACH_MIN: usize = 65_536;

/// The request id `Scheduler.decode_outputs(..., missing="hash")` gives a key
/// its request id mapping does not hold: `hash(key) % 2**64`. An engine that
/// submits each request as `key_id(its key)` needs no id mapping of its own
/// (only for the rare key whose id is taken by another live request). Python
/// salts str hashes per process, so such ids are not stable across processes.
/// A str caches its hash, so this reads no more memory than the key.
#[pyfunction]
#[pyo3(signature = (key, /))]
fn key_id(key: &Bound<'_, PyAny>) -> Result<u64> {
    Ok(key.hash()? as u64)
}

/// The core's engine-form `decode`, with the GIL released for a batch of at
/// least [`DETACH_MIN`] ids.
fn decode_batch(
    py: Python<'_>,
    core: &mut vtc_core::Scheduler,
    rids: &[u64],
    tokens: Tokens<'_>,
) -> Result<()> {
    if rids.len() >= DETACH_MIN {
        py.detach(|| core.decode(rids, tokens))?;
    } else {
        core.decode(rids, tokens)?;
    }
    Ok(())
}

struct Inner {
    core: vtc_core::Scheduler,
    ints: HashMap<i64, u32>,
    strs: HashMap<Box<[u8]>, u32>,
    /// Key of each client id; `None` for ids the core forgot (free for reuse).
    keys: Vec<Option<Key>>,
    /// Reused copies of a batch call's numpy arguments (no allocation per step).
    scratch: Scratch,
}

/// Buffers a batch call copies its numpy arguments into before the GIL is
/// released (another thread may write to the arrays once it is).
#[derive(Default)]
struct Scratch {
    ids: Vec<u64>,
    tokens: Vec<i64>,
}

impl Inner {
    fn lookup(&self, k: &KeyRef<'_>) -> Option<ClientId> {
        match k {
            KeyRef::Int(i) => self.ints.get(i),
            KeyRef::Str(s) => self.strs.get(s.as_ref()),
        }
        .map(|&c| ClientId(c))
    }

    fn intern(&mut self, k: &KeyRef<'_>) -> ClientId {
        if let Some(c) = self.lookup(k) {
            return c;
        }
        let c = self.core.add_client();
        let key = match k {
            KeyRef::Int(i) => {
                self.ints.insert(*i, c.0);
                Key::Int(*i)
            }
            KeyRef::Str(s) => {
                let b: Box<[u8]> = s.as_ref().into();
                self.strs.insert(b.clone(), c.0);
                Key::Str(b)
            }
        };
        let id = c.0 as usize;
        if id == self.keys.len() {
            self.keys.push(Some(key));
        } else {
            self.keys[id] = Some(key); // a forgotten id, reused
        }
        c
    }

    /// Live clients as (id, key), in id order.
    fn live_keys(&self) -> impl Iterator<Item = (ClientId, &Key)> {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| k.as_ref().map(|k| (ClientId(i as u32), k)))
    }
}

/// The Virtual Token Counter scheduler. See `vtc/_core.pyi` for the API.
#[pyclass(frozen, module = "vtc", name = "Scheduler")]
struct PyScheduler {
    inner: Mutex<Inner>,
    /// Set when a panic unwound through a call holding the lock: the state
    /// may be half-updated, so every later call refuses (see `lock`).
    poisoned: AtomicBool,
}

/// The lock guard. Dropped during a panic's unwinding, it poisons the
/// scheduler (as `std::sync::Mutex` would): PyO3 turns the panic itself into
/// a Python `PanicException`, and every later call raises `InternalError`
/// instead of working on state a panic may have left half-updated.
struct Guard<'a> {
    g: MutexGuard<'a, Inner>,
    poisoned: &'a AtomicBool,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
    }
}

impl std::ops::Deref for Guard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.g
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.g
    }
}

impl PyScheduler {
    fn new_inner(inner: Inner) -> Self {
        PyScheduler {
            inner: Mutex::new(inner),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Take the lock (waiting with the GIL released if another thread holds
    /// it), unless an earlier panic poisoned the scheduler.
    fn lock<'a>(&'a self, py: Python<'_>) -> Result<Guard<'a>> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Error::Arg(
                errors::Kind::Internal,
                "the scheduler is disabled after an internal error (a panic) left its state \
                 undefined; rebuild it with Scheduler.from_snapshot(s.snapshot())"
                    .into(),
            ));
        }
        Ok(self.lock_any(py))
    }

    /// The lock even when poisoned: only for `snapshot`, the way out.
    fn lock_any<'a>(&'a self, py: Python<'_>) -> Guard<'a> {
        let g = match self.inner.try_lock() {
            Some(g) => g,
            None => py.detach(|| self.inner.lock()),
        };
        Guard {
            g,
            poisoned: &self.poisoned,
        }
    }
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (M, wp = None, wq = None, policy = None, *, cost = None, client_cap = None, predictor = None, band_weights = None))]
    #[allow(non_snake_case, clippy::too_many_arguments)]
    fn new(
        M: &Bound<'_, PyAny>,
        wp: Option<&Bound<'_, PyAny>>,
        wq: Option<&Bound<'_, PyAny>>,
        policy: Option<&Bound<'_, PyAny>>,
        cost: Option<&Bound<'_, PyAny>>,
        client_cap: Option<&Bound<'_, PyAny>>,
        predictor: Option<&Bound<'_, PyAny>>,
        band_weights: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self> {
        let m = i64_arg("M", M)?;
        let predictor: Predictor = match predictor {
            None => Predictor::None,
            Some(p) => p
                .cast::<PyString>()
                .map_err(|_| type_error("predictor", "a str", p))?
                .to_str()?
                .parse()?,
        };
        if cost.is_some() && (wp.is_some() || wq.is_some()) {
            return Err(invalid(
                "give either wp/wq or cost, not both (LinearCost(wp, wq) is the default cost)"
                    .into(),
            ));
        }
        let cost = cost.map(cost_arg).transpose()?;
        let cap = client_cap.map(client_cap_arg).transpose()?;
        let wp = wp.map(|w| float_arg("wp", w)).transpose()?;
        let wq = wq.map(|w| float_arg("wq", w)).transpose()?;
        let policy: Policy = match policy {
            None => Policy::Vtc,
            Some(p) => p
                .cast::<PyString>()
                .map_err(|_| type_error("policy", "a str", p))?
                .to_str()?
                .parse()?,
        };
        let cost = cost.unwrap_or(Cost::Linear {
            wp: wp.unwrap_or(Cost::DEFAULT_WP),
            wq: wq.unwrap_or(Cost::DEFAULT_WQ),
        });
        let core = vtc_core::Scheduler::with_config(&Config {
            budget: m,
            cost,
            policy,
            client_cap: cap,
            predictor,
            band_weights: band_weights_arg(band_weights)?,
        })?;
        Ok(PyScheduler::new_inner(Inner {
            core,
            ints: HashMap::new(),
            strs: HashMap::new(),
            keys: Vec::new(),
            scratch: Scratch::default(),
        }))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let g = self.lock_any(py);
        let mut out = match g.core.cost() {
            Cost::Linear { wp, wq } => format!(
                "Scheduler(M={}, wp={wp:?}, wq={wq:?}, policy='{}'",
                g.core.budget(),
                g.core.policy().name()
            ),
            cost => format!(
                "Scheduler(M={}, policy='{}', cost={}",
                g.core.budget(),
                g.core.policy().name(),
                cost_repr(cost)
            ),
        };
        if let Some(cap) = g.core.client_cap() {
            out += &format!(", client_cap={cap}");
        }
        if g.core.predictor() != Predictor::None {
            out += &format!(", predictor='{}'", g.core.predictor().name());
        }
        if let Some(w) = g.core.band_weights() {
            let pairs: Vec<String> = w.iter().map(|(p, w)| format!("{p}: {w:?}")).collect();
            out += &format!(", band_weights={{{}}}", pairs.join(", "));
        }
        out + ")"
    }

    /// Weighted bands with these weights (a mapping of priority to weight; a
    /// priority not listed weighs 1), or strict bands with None.
    fn set_band_weights(&self, py: Python<'_>, weights: &Bound<'_, PyAny>) -> Result<()> {
        let weights = band_weights_arg(Some(weights))?;
        let mut g = self.lock(py)?;
        g.core.set_band_weights(weights.as_deref())?;
        Ok(())
    }

    /// The band weights (a dict of priority to weight), or None under strict bands.
    fn band_weights<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let w: Option<Vec<(i64, f64)>> = self.lock(py)?.core.band_weights().map(|w| w.to_vec());
        w.map(|w| w.into_py_dict(py)).transpose()
    }

    /// Under weighted bands, each band with live requests and its counter
    /// (a dict by priority); empty under strict bands.
    fn band_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let v: Vec<(i64, f64)> = self.lock(py)?.core.band_counters().collect();
        v.into_py_dict(py)
    }

    /// The cost function (a LinearCost, QuadraticCost or ContextCost).
    #[getter]
    fn cost(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let cost = self.lock(py)?.core.cost();
        cost_to_py(py, cost)
    }

    /// Where predictions come from for requests submitted without one.
    #[getter]
    fn predictor(&self, py: Python<'_>) -> Result<&'static str> {
        Ok(self.lock(py)?.core.predictor().name())
    }

    /// Refund credit not yet absorbed by later charges (length prediction).
    fn credit(&self, py: Python<'_>, client: &Bound<'_, PyAny>) -> Result<f64> {
        let key = client_arg(client)?;
        let g = self.lock(py)?;
        Ok(match g.lookup(&key) {
            Some(c) => g.core.client(c)?.credit(),
            None => 0.0,
        })
    }

    /// The per-client KV cap in tokens, or None.
    #[getter]
    fn client_cap(&self, py: Python<'_>) -> Result<Option<u64>> {
        Ok(self.lock(py)?.core.client_cap())
    }

    #[getter(M)]
    fn budget(&self, py: Python<'_>) -> Result<u64> {
        Ok(self.lock(py)?.core.budget())
    }
    #[getter]
    fn wp(&self, py: Python<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.wp())
    }
    #[getter]
    fn wq(&self, py: Python<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.wq())
    }
    #[getter]
    fn policy(&self, py: Python<'_>) -> Result<&'static str> {
        Ok(self.lock(py)?.core.policy().name())
    }
    #[getter]
    fn occupancy(&self, py: Python<'_>) -> Result<u128> {
        Ok(self.lock(py)?.core.occupancy())
    }
    #[getter]
    fn num_waiting(&self, py: Python<'_>) -> Result<usize> {
        Ok(self.lock(py)?.core.num_waiting())
    }
    #[getter]
    fn num_running(&self, py: Python<'_>) -> Result<usize> {
        Ok(self.lock(py)?.core.num_running())
    }
    #[getter]
    fn num_clients(&self, py: Python<'_>) -> Result<usize> {
        Ok(self.lock(py)?.core.num_clients())
    }

    fn set_weight(
        &self,
        py: Python<'_>,
        client: &Bound<'_, PyAny>,
        weight: &Bound<'_, PyAny>,
    ) -> Result<()> {
        let key = client_arg(client)?;
        let w = float_arg("weight", weight)?;
        if !vtc_core::limits::weight_ok(w) {
            return Err(CoreError::InvalidWeight(w).into());
        }
        let mut g = self.lock(py)?;
        let c = g.intern(&key);
        g.core.set_weight(c, w)?;
        Ok(())
    }

    fn raise_counter(
        &self,
        py: Python<'_>,
        client: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> Result<()> {
        let key = client_arg(client)?;
        let v = float_arg("value", value)?;
        if !(v.is_finite() && v.abs() <= vtc_core::limits::MAX_COUNTER) {
            return Err(CoreError::InvalidCounter(v).into());
        }
        let mut g = self.lock(py)?;
        let c = g.intern(&key);
        g.core.raise_counter(c, v)?;
        Ok(())
    }

    /// `raise_counter` for every `client: value` of a mapping, all checked
    /// (in order: the client, then its value) before any counter moves;
    /// returns how many counters rose.
    fn raise_counters(&self, py: Python<'_>, counters: &Bound<'_, PyAny>) -> Result<usize> {
        let items = mapping_items(counters, "counters", "a mapping of client to counter")?;
        let mut checked = Vec::with_capacity(items.len());
        for (k, v) in &items {
            let key = client_arg(k)?;
            let v = float_arg("value", v)?;
            if !(v.is_finite() && v.abs() <= vtc_core::limits::MAX_COUNTER) {
                return Err(CoreError::InvalidCounter(v).into());
            }
            checked.push((key, v));
        }
        let mut g = self.lock(py)?;
        let pairs: Vec<(ClientId, f64)> = checked.iter().map(|(k, v)| (g.intern(k), *v)).collect();
        Ok(g.core.raise_counters(&pairs)?)
    }

    fn weight(&self, py: Python<'_>, client: &Bound<'_, PyAny>) -> Result<f64> {
        let key = client_arg(client)?;
        let g = self.lock(py)?;
        Ok(match g.lookup(&key) {
            Some(c) => g.core.client(c)?.weight(),
            None => 1.0,
        })
    }

    fn counter(&self, py: Python<'_>, client: &Bound<'_, PyAny>) -> Result<f64> {
        let key = client_arg(client)?;
        let g = self.lock(py)?;
        Ok(match g.lookup(&key) {
            Some(c) => g.core.counter(c)?,
            None => 0.0,
        })
    }

    fn service(&self, py: Python<'_>, client: &Bound<'_, PyAny>) -> Result<f64> {
        let key = client_arg(client)?;
        let g = self.lock(py)?;
        Ok(match g.lookup(&key) {
            Some(c) => g.core.service(c)?,
            None => 0.0,
        })
    }

    /// The raw tokens charged to the client, `(prompt, decode)` ((0, 0) if
    /// never seen). See `vtc/_core.pyi`.
    fn client_tokens(&self, py: Python<'_>, client: &Bound<'_, PyAny>) -> Result<(u64, u64)> {
        let key = client_arg(client)?;
        let g = self.lock(py)?;
        Ok(match g.lookup(&key) {
            Some(c) => g.core.tokens(c)?,
            None => (0, 0),
        })
    }

    #[pyo3(signature = (request_id, client, prompt_len, cached_len = None, predicted_output = None, priority = None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        client: &Bound<'_, PyAny>,
        prompt_len: &Bound<'_, PyAny>,
        cached_len: Option<&Bound<'_, PyAny>>,
        predicted_output: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> Result<()> {
        let rid = request_id_arg(request_id)?;
        let key = client_arg(client)?;
        let prompt = i64_arg("prompt_len", prompt_len)?;
        let cached = cached_len
            .map(|c| i64_arg("cached_len", c))
            .transpose()?
            .unwrap_or(0);
        let predicted = predicted_output
            .map(|p| i64_arg("predicted_output", p))
            .transpose()?;
        let priority = priority
            .map(|p| i64_arg("priority", p))
            .transpose()?
            .unwrap_or(0);
        let mut g = self.lock(py)?;
        // Validate before interning so a rejected submit creates no client.
        g.core.check_submit_full(rid, prompt, cached, predicted)?;
        let c = g.intern(&key);
        g.core
            .submit_priority(rid, c, prompt, cached, predicted, priority)?;
        Ok(())
    }

    fn schedule<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        {
            let mut g = self.lock(py)?;
            g.core.schedule(&mut out);
        }
        PyList::new(py, out)
    }

    #[pyo3(signature = (request_ids = None, tokens = None))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        request_ids: Option<&Bound<'py, PyAny>>,
        tokens: Option<&Bound<'py, PyAny>>,
    ) -> Result<Bound<'py, PyList>> {
        let Some(ids) = request_ids else {
            if tokens.is_some() {
                return Err(Error::Py(PyTypeError::new_err(
                    "tokens given without request_ids",
                )));
            }
            let mut preempted = Vec::new();
            let mut g = self.lock(py)?;
            let n = g.core.num_running();
            if n >= DETACH_MIN {
                py.detach(|| g.core.decode_step(&mut preempted))?;
            } else {
                g.core.decode_step(&mut preempted)?;
            }
            drop(g);
            return Ok(PyList::new(py, preempted)?);
        };
        // A list, tuple or array is read whole; another iterable only up to
        // one more id than there are running requests (more is an error
        // anyway), or as many as a list, tuple or array of tokens holds, so
        // that the lengths can be compared (the same rule in `vtc.reference`).
        let limit = if sized_len(ids).is_some() {
            usize::MAX
        } else {
            let n = self.lock(py)?.core.num_running().saturating_add(1);
            tokens.and_then(sized_len).map_or(n, |t| t.max(n))
        };
        let mut ids = Ints::new("request_ids", ids, limit)?;
        enum Toks<'py> {
            Each(Result<i64>),
            Per(Ints<'py>),
        }
        let mut toks = match tokens {
            None => Toks::Each(Ok(1)),
            Some(t) if t.is_instance_of::<PyInt>() && !t.is_instance_of::<PyBool>() => {
                Toks::Each(int_arg("tokens", t).and_then(tokens_of))
            }
            Some(t) => Toks::Per(Ints::new("tokens", t, ids.len())?),
        };
        let mut g = self.lock(py)?;
        let inner = &mut *g;
        let scratch = &mut inner.scratch;
        let id_err = ids.copy_into(&mut scratch.ids, rid_of);
        // The order of checks (the same in `vtc.reference`): the lengths;
        // then position by position: the id (type, range, known, running),
        // a duplicate, the token count (type, range). Conversion errors
        // found while reading are raised at their position, after the core
        // has checked the positions before it.
        let (tok_err, each) = match &mut toks {
            Toks::Each(Ok(t)) => (None, Some(*t)),
            Toks::Each(Err(_)) if ids.len() == 0 && !ids.more() => return Ok(PyList::empty(py)),
            Toks::Each(e) => {
                let e = std::mem::replace(e, Ok(0)).expect_err("an error");
                (Some((0, e)), Some(0))
            }
            Toks::Per(per) => {
                if per.len() != ids.len() || per.more() != ids.more() {
                    let n = |x: &Ints<'_>| {
                        if x.more() {
                            format!("more than {}", x.len())
                        } else {
                            x.len().to_string()
                        }
                    };
                    return Err(invalid(format!(
                        "request_ids and tokens differ in length: {} != {}",
                        n(&ids),
                        n(per)
                    )));
                }
                (per.copy_into(&mut scratch.tokens, tokens_of), None)
            }
        };
        fn per(each: Option<i64>, t: &[i64]) -> Tokens<'_> {
            match each {
                Some(e) => Tokens::Each(e),
                None => Tokens::PerRequest(t),
            }
        }
        if id_err.is_none() && tok_err.is_none() && !ids.more() {
            decode_batch(
                py,
                &mut inner.core,
                &scratch.ids,
                per(each, &scratch.tokens),
            )?;
            drop(g);
            return Ok(PyList::empty(py));
        }
        let id_at = id_err.as_ref().map_or(usize::MAX, |e| e.0);
        let tok_at = tok_err.as_ref().map_or(usize::MAX, |e| e.0);
        let (n, deferred) = if id_at <= tok_at && id_err.is_some() {
            (id_at, id_err.map(|e| e.1))
        } else if let Some((p, e)) = tok_err {
            // the id at `p` is checked before its token count
            if each.is_none() {
                scratch.tokens.truncate(p);
                scratch.tokens.push(0);
            }
            (p + 1, Some(e))
        } else {
            (ids.len(), None) // cut short: an error lies within the ids read
        };
        let n = n.min(scratch.ids.len());
        let t = &scratch.tokens[..if each.is_none() { n } else { 0 }];
        inner.core.check_decode(&scratch.ids[..n], per(each, t))?;
        drop(g);
        Err(deferred.unwrap_or_else(|| {
            invalid(format!(
                "request_ids has more than {} items, more than there are running requests",
                ids.len()
            ))
        }))
    }

    /// Engine form, uniform: every running request generated `tokens`
    /// tokens (default 1), no ids passed; the charges of `decode(<every
    /// running id>, tokens)`. No capacity check; all or nothing.
    #[pyo3(signature = (tokens = None))]
    fn decode_all(&self, py: Python<'_>, tokens: Option<&Bound<'_, PyAny>>) -> Result<()> {
        let t = match tokens {
            None => 1,
            Some(t) => int_arg("tokens", t).and_then(tokens_of)?,
        };
        let mut g = self.lock(py)?;
        if g.core.num_running() >= DETACH_MIN {
            py.detach(|| g.core.decode_all(t))?;
        } else {
            g.core.decode_all(t)?;
        }
        Ok(())
    }

    /// Engine form of `decode` that reads an engine step's output objects
    /// itself: for each object, `len(obj.<tokens_attr>)` tokens (or the int
    /// it holds) are charged to the request its key `obj.<id_attr>` names:
    /// `request_ids[key]`, or with `missing="hash"` and a key not there,
    /// `key_id(key)`. One call with no Python-level loop; all or nothing.
    #[pyo3(signature = (outputs, request_ids, /, *, missing = "error", id_attr = "request_id", tokens_attr = "new_token_ids"))]
    fn decode_outputs(
        &self,
        py: Python<'_>,
        outputs: &Bound<'_, PyAny>,
        request_ids: &Bound<'_, PyDict>,
        missing: &str,
        id_attr: &str,
        tokens_attr: &str,
    ) -> Result<()> {
        let hashed = match missing {
            "error" => false,
            "hash" => true,
            other => {
                return Err(invalid(format!(
                    "missing must be \"error\" or \"hash\", got {other:?}"
                )))
            }
        };
        // With `hashed`, an empty mapping (the common case) is not consulted.
        let consult = !(hashed && request_ids.is_empty());
        let id_name = PyString::intern(py, id_attr);
        let tokens_name = PyString::intern(py, tokens_attr);
        // Never sized from `len(outputs)` (it may lie); an iterable other
        // than a list is read up to one more output than there are running
        // requests (more is an error whatever they hold).
        let limit = if outputs.is_exact_instance_of::<PyList>() {
            usize::MAX
        } else {
            self.lock(py)?.core.num_running().saturating_add(1)
        };
        let mut rids: Vec<u64> = Vec::new();
        let mut toks: Vec<i64> = Vec::new();
        // Everything that may run Python code (attribute getters, __len__,
        // __hash__) happens here, before the lock is taken.
        let mut read = |i: usize, out: Bound<'_, PyAny>| -> Result<()> {
            let key = output_attr(i, &out, &id_name)?;
            let found = if consult {
                request_ids.get_item(&key)?
            } else {
                None
            };
            let rid = match found {
                Some(rid) => request_id_arg(&rid)?,
                None if hashed => key_id(&key)?,
                None => {
                    return Err(Error::Arg(
                        errors::Kind::UnknownRequest,
                        format!(
                            "outputs[{i}].{id_attr} = {} is not in request_ids",
                            repr(&key)
                        ),
                    ))
                }
            };
            let produced = output_attr(i, &out, &tokens_name)?;
            let n = if let Ok(n) = produced.cast_exact::<PyInt>() {
                i64_arg(tokens_attr, n.as_any())?
            } else {
                if !has_special(&produced, "__len__") {
                    return Err(type_error(
                        &format!("outputs[{i}].{tokens_attr}"),
                        "a sized container or an int",
                        &produced,
                    ));
                }
                let len = produced.len()?; // an error raised by __len__ propagates
                i64::try_from(len).map_err(|_| invalid(format!("{len} tokens do not fit")))?
            };
            rids.push(rid);
            toks.push(n);
            Ok(())
        };
        if let Ok(list) = outputs.cast_exact::<PyList>() {
            for (i, out) in list.iter().enumerate() {
                read(i, out)?;
            }
        } else {
            let iter = outputs
                .try_iter()
                .map_err(|_| type_error("outputs", "an iterable of output objects", outputs))?;
            for (i, out) in iter.enumerate() {
                let out = out?;
                if i == limit {
                    let mut g = self.lock(py)?;
                    g.core.check_decode(&rids, Tokens::PerRequest(&toks))?;
                    return Err(invalid(format!(
                        "outputs has more than {limit} items, more than there are running requests"
                    )));
                }
                read(i, out)?;
            }
        }
        let mut g = self.lock(py)?;
        decode_batch(py, &mut g.core, &rids, Tokens::PerRequest(&toks))
    }

    fn finish(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> Result<()> {
        let rid = request_id_arg(request_id)?;
        self.lock(py)?.core.finish(rid)?;
        Ok(())
    }

    fn cancel(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> Result<()> {
        let rid = request_id_arg(request_id)?;
        self.lock(py)?.core.cancel(rid)?;
        Ok(())
    }

    fn preempt(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> Result<()> {
        let rid = request_id_arg(request_id)?;
        self.lock(py)?.core.preempt(rid)?;
        Ok(())
    }

    fn peek(&self, py: Python<'_>) -> Result<Option<u64>> {
        Ok(self.lock(py)?.core.peek())
    }

    fn set_aside(&self, py: Python<'_>) -> Result<Option<u64>> {
        Ok(self.lock(py)?.core.set_aside())
    }

    fn put_back(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> Result<()> {
        let rid = request_id_arg(request_id)?;
        self.lock(py)?.core.put_back(rid)?;
        Ok(())
    }

    #[pyo3(signature = (cached_len = None))]
    fn pop(&self, py: Python<'_>, cached_len: Option<&Bound<'_, PyAny>>) -> Result<Option<u64>> {
        // As in `vtc.reference`, `cached_len` is checked only when there is
        // a request to pop: on an empty queue any argument returns None.
        let cached = cached_len.map(|c| int_arg_sat("cached_len", c));
        let mut g = self.lock(py)?;
        if g.core.peek().is_none() {
            return Ok(None);
        }
        let Some((v, int)) = cached.transpose()? else {
            return Ok(g.core.pop_cached(None)?);
        };
        // A value outside i64 is outside [0, prompt_len] too: the core
        // rejects its clamped stand-in, and the message names the real one.
        let clamped = i64::try_from(v).unwrap_or(if v < 0 { -1 } else { i64::MAX });
        g.core.pop_cached(Some(clamped)).map_err(|e| match e {
            CoreError::InvalidCached { prompt_len, .. } if i128::from(clamped) != v => invalid(
                format!("cached_len must be between 0 and prompt_len={prompt_len}, got {int}"),
            ),
            e => e.into(),
        })
    }

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
    #[pyo3(signature = (data, *, cost = None, client_cap = None, predictor = None, band_weights = None))]
    fn from_snapshot(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        client_cap: Option<&Bound<'_, PyAny>>,
        predictor: Option<&Bound<'_, PyAny>>,
        band_weights: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self> {
        let cost = cost.map(cost_arg).transpose()?;
        let band_weights = band_weights_arg(band_weights)?;
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
        let mut inner = Inner {
            core: restored.scheduler,
            ints: HashMap::new(),
            strs: HashMap::new(),
            keys: Vec::with_capacity(restored.keys.len()),
            scratch: Scratch::default(),
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

impl PyScheduler {
    fn per_client<'py, V: IntoPyObject<'py>>(
        &self,
        py: Python<'py>,
        f: impl Fn(&vtc_core::Client) -> V,
    ) -> PyResult<Bound<'py, PyDict>> {
        let values: Vec<(Key, V)> = {
            let g = self.lock(py)?;
            g.live_keys()
                .map(|(c, k)| {
                    (
                        k.clone(),
                        f(g.core.client(c).expect("interned client exists")),
                    )
                })
                .collect()
        };
        key_dict(py, values)
    }
}

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyScheduler>()?;
    m.add_class::<PyLinearCost>()?;
    m.add_class::<PyQuadraticCost>()?;
    m.add_class::<PyContextCost>()?;
    m.add_function(wrap_pyfunction!(key_id, m)?)?;
    m.add("SchedulerError", py.get_type::<errors::SchedulerError>())?;
    for kind in [
        errors::Kind::InvalidArgument,
        errors::Kind::DuplicateRequest,
        errors::Kind::UnknownRequest,
        errors::Kind::RequestState,
        errors::Kind::Capacity,
        errors::Kind::Snapshot,
        errors::Kind::Internal,
    ] {
        let ty = errors::exception_type(py, kind)?;
        m.add(ty.name()?.to_string().as_str(), ty)?;
    }
    m.add("MAX_TOKENS_PER_CALL", vtc_core::MAX_TOKENS_PER_CALL)?;
    m.add("MAX_BUDGET", vtc_core::MAX_BUDGET)?;
    m.add("MAX_REQUEST_TOKENS", vtc_core::MAX_REQUEST_TOKENS)?;
    m.add("MAX_PRICE", vtc_core::limits::MAX_PRICE)?;
    m.add("MIN_WEIGHT", vtc_core::limits::MIN_WEIGHT)?;
    m.add("MAX_WEIGHT", vtc_core::limits::MAX_WEIGHT)?;
    m.add("MAX_COUNTER", vtc_core::limits::MAX_COUNTER)?;
    m.add("SNAPSHOT_VERSION", vtc_core::SNAPSHOT_VERSION)?;
    Ok(())
}
