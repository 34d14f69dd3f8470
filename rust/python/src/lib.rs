//! `vtc._core`: a thin PyO3 layer over `vtc-core`.
//!
//! Arguments are read into plain Rust values first (client keys into the
//! core's key type, which the core interns to its dense client ids and
//! forgets with its clients); the work then runs on the core, with the
//! GIL released for batch calls. The scheduler sits behind a mutex so that
//! API threads and an engine thread can share one object safely.
//!
//! Modules: `args` the argument shapes a method names in its signature
//! (`FromPyObject` types), `convert` the readers behind them and the shapes
//! read in a method's body (batches, mappings, the client cap), `outputs` an
//! engine step's output objects (`decode_outputs`), `keys` client keys (Python's int or str to the core's `ClientKey` and back),
//! `costs` the cost objects, `lookup` the prefix lookup, `tenant` the arrival's tenant rule, `errors` the one
//! conversion of core errors into Python exceptions. The `Scheduler` class is this file (its
//! state, the lock, construction and configuration), `engine` (the calls
//! that change requests) and `views` (read-only views, snapshots): one class
//! over several `#[pymethods]` blocks (PyO3's `multiple-pymethods`).

mod args;
mod convert;
mod costs;
mod engine;
mod errors;
mod fairness;
mod items;
mod keys;
mod ledger;
mod lookup;
mod mirror;
mod outputs;
mod queue;
mod tenant;
mod tracked;
mod views;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict, PyString};
use vtc_core::{ClientKey, Config, CoreError, Cost, Policy, Predictor};

use args::{Client, Real, Value, Weight};
use convert::{band_weights_arg, client_cap_arg, float_arg, i64_arg, mapping_items, type_error};
use costs::{cost_arg, cost_repr, cost_to_py, PyContextCost, PyLinearCost, PyQuadraticCost};
use errors::{invalid, Error, Result};
use keys::{client_key, key_dict};

/// A keyword argument that tells "not given" (`Given(None)`, its default)
/// from any value, `None` included (for arguments whose default is not
/// `None`, as `vtc.reference`'s `locality_quantum=0.0`).
struct Given<'py>(Option<Bound<'py, PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Given<'py> {
    type Error = PyErr;
    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given(Some(obj.to_owned())))
    }
}

/// `locality_quantum`: a real number (0.0 when not given), range-checked
/// by the core's `Config::validate` in its place among the other values.
fn locality_quantum_arg(q: &Given<'_>) -> Result<f64> {
    q.0.as_ref()
        .map_or(Ok(0.0), |q| float_arg("locality_quantum", q))
}

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

struct Inner {
    /// The core, which also interns the client keys.
    core: vtc_core::Scheduler,
    /// Reused copies of a batch call's numpy arguments (no allocation per step).
    scratch: Scratch,
    /// The locality window's prefix lookup (`set_prefix_lookup`), if any.
    prefix_lookup: Option<Py<PyAny>>,
}

/// Buffers a batch call copies its numpy arguments into before the GIL is
/// released (another thread may write to the arrays once it is).
#[derive(Default)]
struct Scratch {
    ids: Vec<u64>,
    tokens: Vec<i64>,
}

impl Inner {
    /// The prefix lookup when the locality window is on (a lookup set and a
    /// quantum above 0), bound to `py`; `None`: plain selection.
    fn window_lookup<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        if self.core.locality_quantum() > 0.0 {
            self.prefix_lookup.as_ref().map(|f| f.bind(py).clone())
        } else {
            None
        }
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
        self.lock_any(py)
    }

    /*
     * lock_any: the state for one call, even when poisoned (only `snapshot`,
     * the way out, and `__repr__` take it so).
     *
     * A selection holds the lock while it runs the prefix lookup, Python code
     * that may call back into this scheduler: waiting then would wait for
     * itself, forever. So a lock found taken while this thread is inside a
     * lookup (`lookup::in_lookup`) is refused with `RuntimeError` instead (it
     * may be the lookup's own selection's); a free lock is never this thread's,
     * so the thread-local flag is read only when the lock is taken.
     */
    fn lock_any<'a>(&'a self, py: Python<'_>) -> Result<Guard<'a>> {
        let g = match self.inner.try_lock() {
            Some(g) => g,
            None if lookup::in_lookup() => {
                return Err(Error::Py(pyo3::exceptions::PyRuntimeError::new_err(
                    "a prefix lookup called back into a scheduler while a selection was \
                     running (the scheduler is locked until the lookup returns)",
                )))
            }
            None => py.detach(|| self.inner.lock()),
        };
        Ok(Guard {
            g,
            poisoned: &self.poisoned,
        })
    }
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (M, wp = None, wq = None, policy = None, *, cost = None, client_cap = None, predictor = None, band_weights = None, locality_quantum = Given(None)))]
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
        locality_quantum: Given<'_>,
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
        let locality_quantum = locality_quantum_arg(&locality_quantum)?;
        let core = vtc_core::Scheduler::with_config(&Config {
            budget: m,
            cost,
            policy,
            client_cap: cap,
            predictor,
            band_weights: band_weights_arg(band_weights)?,
            locality_quantum,
        })?;
        Ok(PyScheduler::new_inner(Inner {
            core,
            scratch: Scratch::default(),
            prefix_lookup: None,
        }))
    }

    fn __repr__(&self, py: Python<'_>) -> Result<String> {
        let g = self.lock_any(py)?;
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
        if g.core.locality_quantum() != 0.0 {
            out += &format!(", locality_quantum={:?}", g.core.locality_quantum());
        }
        Ok(out + ")")
    }

    /// The locality window's quantum `Q` (0.0: plain VTC).
    #[getter]
    fn locality_quantum(&self, py: Python<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.locality_quantum())
    }

    /// The engine's prefix-cache lookup for the locality window, or None:
    /// `lookup(request_id)` returns how many tokens of that waiting request
    /// the engine holds cached now. See `vtc/_core.pyi`.
    fn set_prefix_lookup(&self, py: Python<'_>, lookup: &Bound<'_, PyAny>) -> Result<()> {
        let f = if lookup.is_none() {
            None
        } else if lookup.is_callable() {
            Some(lookup.clone().unbind())
        } else {
            return Err(Error::Py(pyo3::exceptions::PyTypeError::new_err(format!(
                "lookup must be callable or None, got {}",
                convert::repr(lookup)
            ))));
        };
        // the old lookup dropped after the lock is released: its last reference
        // may run Python code (a `__del__`) that calls this scheduler
        let old = std::mem::replace(&mut self.lock(py)?.prefix_lookup, f);
        drop(old);
        Ok(())
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
    fn credit(&self, py: Python<'_>, client: Client<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.client_by_key(&client.0).credit())
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
    fn state_version(&self, py: Python<'_>) -> Result<u64> {
        Ok(self.lock(py)?.core.state_version())
    }
    #[getter]
    fn uniform_decodes(&self, py: Python<'_>) -> Result<u64> {
        Ok(self.lock(py)?.core.uniform_decodes())
    }
    #[getter]
    fn num_clients(&self, py: Python<'_>) -> Result<usize> {
        Ok(self.lock(py)?.core.num_clients())
    }

    fn set_weight(&self, py: Python<'_>, client: Client<'_>, weight: Real<Weight>) -> Result<()> {
        Ok(self.lock(py)?.core.set_weight_keyed(&client.0, weight.0)?)
    }

    fn raise_counter(&self, py: Python<'_>, client: Client<'_>, value: Real<Value>) -> Result<()> {
        Ok(self
            .lock(py)?
            .core
            .raise_counter_keyed(&client.0, value.0)?)
    }

    /// `raise_counter` for every `client: value` of a mapping, all checked
    /// (in order: the client, then its value: the core's rule, applied as
    /// each pair is read so that a bad value comes before a later pair's
    /// bad shape) before any counter moves; returns how many counters rose.
    fn raise_counters(&self, py: Python<'_>, counters: &Bound<'_, PyAny>) -> Result<usize> {
        let items = mapping_items(counters, "counters", "a mapping of client to counter")?;
        let mut checked = Vec::with_capacity(items.len());
        for (k, v) in &items {
            let key = client_key(k.as_borrowed())?;
            let v = float_arg("value", v)?;
            if !vtc_core::limits::counter_ok(v) {
                return Err(CoreError::InvalidCounter(v).into());
            }
            checked.push((key, v));
        }
        Ok(self.lock(py)?.core.raise_counters_keyed(&checked)?)
    }

    fn weight(&self, py: Python<'_>, client: Client<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.client_by_key(&client.0).weight())
    }

    fn counter(&self, py: Python<'_>, client: Client<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.client_by_key(&client.0).counter())
    }

    fn service(&self, py: Python<'_>, client: Client<'_>) -> Result<f64> {
        Ok(self.lock(py)?.core.client_by_key(&client.0).service())
    }

    /// The raw tokens charged to the client, `(prompt, decode)` ((0, 0) if
    /// never seen). See `vtc/_core.pyi`.
    fn client_tokens(&self, py: Python<'_>, client: Client<'_>) -> Result<(u64, u64)> {
        let g = self.lock(py)?;
        let c = g.core.client_by_key(&client.0);
        Ok((c.prompt_tokens(), c.decode_tokens()))
    }
}

impl PyScheduler {
    fn per_client<'py, V: IntoPyObject<'py>>(
        &self,
        py: Python<'py>,
        f: impl Fn(&vtc_core::Client) -> V,
    ) -> PyResult<Bound<'py, PyDict>> {
        let values: Vec<(ClientKey, V)> = {
            let g = self.lock(py)?;
            g.core
                .keyed_clients()
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
    items::check_layout(py)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyScheduler>()?;
    m.add_class::<tenant::PyTenantRule>()?;
    m.add_class::<queue::PyWaitingQueue>()?;
    m.add_class::<tracked::PyTracked>()?;
    m.add_class::<PyLinearCost>()?;
    m.add_class::<PyQuadraticCost>()?;
    m.add_class::<PyContextCost>()?;
    m.add_class::<fairness::PyFairnessWindow>()?;
    m.add_class::<mirror::PyMetricsMirror>()?;
    m.add_class::<ledger::PySyncLedger>()?;
    m.add_function(wrap_pyfunction!(outputs::key_id, m)?)?;
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
    m.setattr("_LISTS_IN_PLACE", items::in_place())?; // private: not in __all__
    m.add("MAX_TOKENS_PER_CALL", vtc_core::MAX_TOKENS_PER_CALL)?;
    m.add("CHANGE_READERS", vtc_core::READERS)?;
    m.add("MAX_BUDGET", vtc_core::MAX_BUDGET)?;
    m.add("MAX_REQUEST_TOKENS", vtc_core::MAX_REQUEST_TOKENS)?;
    m.add("MAX_PRICE", vtc_core::limits::MAX_PRICE)?;
    m.add("MIN_WEIGHT", vtc_core::limits::MIN_WEIGHT)?;
    m.add("MAX_WEIGHT", vtc_core::limits::MAX_WEIGHT)?;
    m.add("MAX_COUNTER", vtc_core::limits::MAX_COUNTER)?;
    m.add("SNAPSHOT_VERSION", vtc_core::SNAPSHOT_VERSION)?;
    Ok(())
}
