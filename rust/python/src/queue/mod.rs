//! `WaitingQueue`: the hot half of an engine's waiting queue, answered here with
//! no Python frame: whether any request waits (`bool`), how many (`len`), the
//! request the core admits next (`peek_request`), its provisional pop
//! (`pop_request`) and its decision (`settle`: admitted or set aside), an
//! arrival (`add_request`), the charge of a step's outputs (`record_outputs`), its
//! finishes (`release_finished`) and the step kept between vLLM's `schedule()` and
//! `update_from_output()` (`scheduled`, `record_step`). The admission, the arrival
//! and the finishes are made here too when nothing else must see them (`Table`).
//!
//! vLLM asks the first four ~6.5 times a step and the rest about once; as Python
//! methods over `vtc.adapter.Requests` they were about a third of VTC's
//! instructions a step (bench/README.md, 39, 43 and 44). A Python subclass
//! (`vtc.vllm.VTCRequestQueue`) keeps every other method (preemptions, removals,
//! iteration). The answers are the core's own (its `num_waiting`, its `peek`
//! with the prefix lookup the core holds), read under the core's lock; the
//! engine's request is the `request` of the record (`vtc._core.Tracked`)
//! `Requests` keeps by core id (its `_by_rid` dict, shared, not copied).

use std::collections::HashSet;

use parking_lot::Mutex;
use pyo3::exceptions::{PyIndexError, PyKeyError, PyNotImplementedError, PyTypeError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::sync::{Interned, PyOnceLock};
use pyo3::types::{PyDict, PyFrozenSet, PyInt, PyList, PySet};
use pyo3::{intern, PyTraverseError};

use crate::errors::Result;
use crate::tenant::PyTenantRule;
use crate::tracked::PyTracked;
use crate::PyScheduler;

mod step;
mod table;

use step::{one_token_each, Kept};
use table::Table;

/// The `TypeError` of a constructor argument's attribute `what` that is not
/// `wanted` (`got`: what it is).
fn wrong_type(what: &str, wanted: &str, got: Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!("{what} must be {wanted}, got {}", got.get_type()))
}

/// The engine's request of `record`: a `Tracked`'s field read directly, any other
/// record's `request` attribute.
fn request_of<'py>(record: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match record.cast::<PyTracked>() {
        Ok(t) => Ok(t.get().request.bind(record.py()).clone()),
        Err(_) => record.getattr(intern!(record.py(), "request")),
    }
}

/// `obj` if it is an exact int in i64.
fn exact_i64(obj: &Bound<'_, PyAny>) -> Option<i64> {
    obj.cast_exact::<PyInt>().ok()?.extract().ok()
}

/// A method the native methods call as the queue's class has it (`runs_own`):
/// its name, and the base class's own method object once looked up.
struct Inner {
    name: Interned,
    descriptor: PyOnceLock<Py<PyAny>>,
}

impl Inner {
    const fn new(name: &'static str) -> Self {
        Inner {
            name: Interned::new(name),
            descriptor: PyOnceLock::new(),
        }
    }
}

static SETTLE: Inner = Inner::new("settle");
static RECORD_OUTPUTS: Inner = Inner::new("record_outputs");
static RELEASE_FINISHED: Inner = Inner::new("release_finished");

/// The native base of an engine's waiting queue. See `vtc/_core.pyi`.
#[pyclass(frozen, subclass, module = "vtc._core", name = "WaitingQueue")]
pub(crate) struct PyWaitingQueue {
    /// `vtc.adapter.Requests`: its counters and its rare paths.
    requests: Py<PyAny>,
    /// `requests.core`.
    core: Py<PyScheduler>,
    /// `requests._by_rid`: core id -> the request's record.
    records: Py<PyDict>,
    /// What the native admission, arrival and finishes read of the table; None:
    /// each is `requests`' own method's.
    table: Option<Table>,
    /// The engine's rule naming an arriving request's tenant (`add_request`).
    tenant_of: Option<Py<PyAny>>,
    /// The engine's status of a running request, and of one loading its KV
    /// (vLLM's `RUNNING`, `WAITING_FOR_REMOTE_KVS`): the native `settle`'s.
    statuses: Option<(Py<PyAny>, Py<PyAny>)>,
    /// The engine's statuses of a finished request (vLLM's `FINISHED_*`): a
    /// request whose `status` is one of them is finished with no call of its
    /// `is_finished()` (`release_finished`).
    finished: Vec<Py<PyAny>>,
    /// The record popped provisionally (`_pending`), until `settle` decides it.
    pending: Mutex<Option<Py<PyAny>>>,
    /// The engine's set of its requests still prefilling after a step's chunk
    /// (vLLM's `Scheduler._inflight_prefills`), if it keeps one: while it is
    /// empty when a step is scheduled, every request of that step samples a token.
    prefilling: Option<Py<PySet>>,
    /// The last `scheduled` step (while the engine's running list and the core's
    /// running set had as many requests).
    step: Mutex<Option<Kept>>,
}

impl PyWaitingQueue {
    /// Whether the engine's `request` is finished: its `status` one of the
    /// `finished` statuses (the same object), else its `is_finished()`.
    fn is_finished(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = request.py();
        if !self.finished.is_empty() {
            let status = request.getattr(intern!(py, "status"))?;
            if self.finished.iter().any(|f| f.is(&status)) {
                return Ok(true);
            }
        }
        request
            .call_method0(intern!(py, "is_finished"))?
            .is_truthy()
    }

    /*
     * runs_own: whether `slf`'s class runs this queue's own `inner` method.
     *
     * The native methods call `settle`, `record_outputs` and `release_finished`
     * as the class has them, so that a subclass may replace or wrap each (a
     * shell that decides its pops, a clock): by name when a class on the way
     * defines one, directly otherwise. A call by name was a bound method, an
     * argument tuple and PyO3's argument parsing, each step (bench/README.md,
     * 46). Looked up on the class, as Python looks up a special method: an
     * instance attribute of that name is not called. The base's own method
     * object is looked up once (`Inner`): a subclass's call costs one lookup.
     */
    fn runs_own(slf: &Bound<'_, Self>, inner: &Inner) -> PyResult<bool> {
        let py = slf.py();
        let own = py.get_type::<Self>();
        let class = slf.get_type();
        if class.is(&own) {
            return Ok(true);
        }
        let name = inner.name.get(py);
        let descriptor = inner
            .descriptor
            .get_or_try_init(py, || own.getattr(name).map(Bound::unbind))?;
        Ok(class.getattr(name)?.is(descriptor.bind(py)))
    }

    /// `self.settle(num_scheduled_tokens)`: this queue's own, or its class's (`runs_own`).
    fn settle_as_class(
        slf: &Bound<'_, Self>,
        num_scheduled_tokens: Option<&Bound<'_, PyAny>>,
    ) -> Result<()> {
        let py = slf.py();
        if Self::runs_own(slf, &SETTLE)? {
            return slf.get().settle(py, num_scheduled_tokens);
        }
        let name = SETTLE.name.get(py);
        match num_scheduled_tokens {
            None => slf.call_method0(name)?,
            Some(tokens) => slf.call_method1(name, (tokens,))?,
        };
        Ok(())
    }

    /// `self.settle()` if a pop is pending (the subclass decides it).
    fn settle_pending(slf: &Bound<'_, Self>) -> Result<()> {
        if slf.get().pending.lock().is_some() {
            Self::settle_as_class(slf, None)?;
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
    #[pyo3(signature = (
        requests, running = None, loading = None, tenant_of = None, finished = None,
        prefilling = None
    ))]
    fn new(
        requests: &Bound<'_, PyAny>,
        running: Option<Py<PyAny>>,
        loading: Option<Py<PyAny>>,
        tenant_of: Option<Py<PyAny>>,
        finished: Option<&Bound<'_, PyAny>>,
        prefilling: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let py = requests.py();
        let core = requests.getattr(intern!(py, "core"))?;
        let core = core
            .cast_into::<PyScheduler>()
            .map_err(|e| wrong_type("requests.core", "a vtc.Scheduler", e.into_inner()))?;
        let records = requests.getattr(intern!(py, "_by_rid"))?;
        let records = records
            .cast_into_exact::<PyDict>()
            .map_err(|e| wrong_type("requests._by_rid", "a dict", e.into_inner()))?;
        let table = Table::of(requests)?;
        let finished = match finished {
            Some(f) => f
                .try_iter()?
                .map(|s| s.map(Bound::unbind))
                .collect::<PyResult<_>>()?,
            None => Vec::new(),
        };
        let prefilling = match prefilling.filter(|p| !p.is_none()) {
            Some(p) => Some(
                p.cast::<PySet>()
                    .map_err(|_| wrong_type("prefilling", "a set", p.clone()))?
                    .clone()
                    .unbind(),
            ),
            None => None,
        };
        Ok(PyWaitingQueue {
            requests: requests.clone().unbind(),
            core: core.unbind(),
            records: records.unbind(),
            table,
            tenant_of,
            statuses: running.zip(loading),
            finished,
            prefilling,
            pending: Mutex::new(None),
            step: Mutex::new(None),
        })
    }

    /// The engine scheduled a step (`output`, with `num_scheduled_tokens`): its
    /// last pop settled by it, and the step kept for `record_step` if `running`,
    /// the engine's running requests, are as many as the core's (with the
    /// core's `state_version` now, and whether the engine's `prefilling` set is
    /// empty; else nothing is kept).
    fn scheduled(slf: &Bound<'_, Self>, output: &Bound<'_, PyAny>, running: usize) -> Result<()> {
        let py = slf.py();
        let this = slf.get();
        if this.pending.lock().is_some() {
            // (as the class has it, as every such call here: a subclass may wrap it)
            let tokens = output.getattr(intern!(py, "num_scheduled_tokens"))?;
            Self::settle_as_class(slf, Some(&tokens))?;
        }
        let decodes_only = this
            .prefilling
            .as_ref()
            .is_some_and(|p| p.bind(py).is_empty());
        let g = this.core.get().lock(py)?;
        let kept = (running == g.core.num_running()).then(|| Kept {
            output: output.clone().unbind(),
            version: g.core.state_version(),
            decodes_only,
        });
        drop(g);
        let old = std::mem::replace(&mut *this.step.lock(), kept);
        drop(old);
        Ok(())
    }

    /// The engine updated a step (`scheduler_output`, `model_runner_output`;
    /// `outputs`: its client -> output groups; `finished`: the ids it freed, or
    /// None): `record_outputs` of its groups, told the step is `running` (every
    /// output from a distinct running request) when it is the step `scheduled`
    /// kept and the core has not changed since, with the runner's
    /// `sampled_token_ids` as the token lists when they are a non-empty list of
    /// lists, known to hold one token each without reading them when the kept
    /// step had no request prefilling and gave one token to each
    /// (`one_token_each`). The kept step is used once.
    fn record_step(
        slf: &Bound<'_, Self>,
        scheduler_output: &Bound<'_, PyAny>,
        model_runner_output: &Bound<'_, PyAny>,
        outputs: &Bound<'_, PyAny>,
        finished: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let kept = this.step.lock().take();
        let (running, decodes_only) = match kept {
            Some(k) if k.output.bind(py).is(scheduler_output) => {
                let same = k.version == this.core.get().lock(py)?.core.state_version();
                (same, same && k.decodes_only)
            }
            _ => (false, false),
        };
        let mut tokens = None;
        if running {
            let sampled = model_runner_output.getattr_opt(intern!(py, "sampled_token_ids"))?;
            if let Some(lists) = sampled.as_ref().and_then(|t| t.cast_exact::<PyList>().ok()) {
                let first_is_list = lists
                    .iter()
                    .next()
                    .is_some_and(|l| l.cast_exact::<PyList>().is_ok());
                if first_is_list {
                    tokens = Some(lists.clone().into_any());
                }
            }
        }
        let one_each = tokens.is_some() && decodes_only && one_token_each(scheduler_output)?;
        let groups = outputs.call_method0(intern!(py, "values"))?;
        if Self::runs_own(slf, &RECORD_OUTPUTS)? {
            let tokens = tokens.as_ref();
            return Self::record_groups(slf, &groups, finished, running, tokens, one_each);
        }
        let name = RECORD_OUTPUTS.name.get(py);
        slf.call_method1(name, (groups, finished, running, tokens))?;
        Ok(())
    }

    /// Decide the pending pop by what the engine did with its request: admitted
    /// (`requests.admit(record, cached)`) if it is running, loading its KV, or has
    /// tokens computed; else skipped (`requests.set_aside(record)`). `cached`: its
    /// computed tokens, less this step's scheduled ones (`num_scheduled_tokens`,
    /// the request id -> tokens of the step, given at the end of a scheduling
    /// pass) for a running request. Nothing pending: nothing to do.
    #[pyo3(signature = (num_scheduled_tokens = None))]
    fn settle(
        &self,
        py: Python<'_>,
        num_scheduled_tokens: Option<&Bound<'_, PyAny>>,
    ) -> Result<()> {
        let mut pending = self.pending.lock();
        if pending.is_none() {
            return Ok(());
        }
        let Some((running, loading)) = &self.statuses else {
            return Err(PyNotImplementedError::new_err(
                "settle: this WaitingQueue was built without the engine's running and loading \
                 statuses; a subclass without them decides its pops itself",
            )
            .into());
        };
        let Some(record) = pending.take() else {
            return Ok(());
        };
        drop(pending); // (before any Python code runs)
        let record = record.into_bound(py);
        let request = request_of(&record)?;
        let status = request.getattr(intern!(py, "status"))?;
        let mut computed = request.getattr(intern!(py, "num_computed_tokens"))?;
        let is_running = status.eq(running)?;
        let requests = self.requests.bind(py);
        if !(is_running || status.eq(loading)? || computed.gt(0)?) {
            requests.call_method1(intern!(py, "set_aside"), (record,))?;
            return Ok(());
        }
        if let Some(scheduled) = num_scheduled_tokens.filter(|n| !n.is_none()) {
            if is_running {
                let id = request.getattr(intern!(py, "request_id"))?;
                let n = match scheduled.cast::<PyDict>() {
                    Ok(d) => d.get_item(id)?,
                    Err(_) => Some(scheduled.call_method1(intern!(py, "get"), (id, 0))?),
                };
                if let Some(n) = n {
                    computed = computed.sub(n)?;
                }
            }
        }
        // (a preempted request's prompt is never charged again, whatever is cached)
        if !self.admit(py, &record, &computed)? {
            requests.call_method1(intern!(py, "admit"), (record, computed))?;
        }
        Ok(())
    }

    /// A request arrives, or a paused one returns (its key is tracked: put back):
    /// `requests.submit(request.request_id, request, tenant_of(request),
    /// request.num_prompt_tokens, request.priority)`, natively when nothing else
    /// must see it. Without a `tenant_of`: `NotImplementedError`.
    fn add_request(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> Result<()> {
        Self::settle_pending(slf)?;
        let py = slf.py();
        let this = slf.get();
        let Some(tenant_of) = &this.tenant_of else {
            return Err(PyNotImplementedError::new_err(
                "add_request: this WaitingQueue was built without the engine's tenant rule \
                 (tenant_of)",
            )
            .into());
        };
        let requests = this.requests.bind(py);
        let key = request.getattr(intern!(py, "request_id"))?;
        let tracked = match &this.table {
            Some(table) => table.by_key.bind(py).get_item(&key)?,
            None => {
                let got = requests.getattr(intern!(py, "get"))?.call1((&key,))?;
                Some(got).filter(|t| !t.is_none())
            }
        };
        if let Some(t) = tracked {
            requests.call_method1(intern!(py, "put_back"), (t,))?;
            return Ok(());
        }
        // vLLM's priority (smaller first; always 0 unless --scheduling-policy
        // priority) is the core's band: strict bands, VTC inside each
        // (the engine's rule, `vtc._core.TenantRule`, called without Python's call
        // protocol: no argument tuple, no argument parsing; any other callable called)
        let tenant_of = tenant_of.bind(py);
        let tenant = match tenant_of.cast_exact::<PyTenantRule>() {
            Ok(rule) => rule
                .try_borrow()
                .map_err(PyErr::from)?
                .name_tenant(request)?,
            Err(_) => tenant_of.call1((request,))?,
        };
        let n = request.getattr(intern!(py, "num_prompt_tokens"))?;
        let priority = request.getattr(intern!(py, "priority"))?;
        if !this.submit(py, &key, request, &tenant, &n, &priority)? {
            let args = (key, request, tenant, n, priority);
            requests.call_method1(intern!(py, "submit"), args)?;
        }
        Ok(())
    }

    /// A step's finished requests forgotten (`finished`: their keys): each tracked
    /// key's once, if its engine request's `is_finished()` says so (a resumable
    /// request that only stopped a turn stays; `is_finished`), as `Requests.release_finished(
    /// finished, done)` releases them (natively when no observer listens: else
    /// `requests._drop(records, True)`, which tells them); the pending pop is
    /// dropped if it is one of them. Without the table (`requests`' methods
    /// replaced): `requests.release_finished`.
    fn release_finished(slf: &Bound<'_, Self>, finished: &Bound<'_, PyAny>) -> Result<()> {
        let py = slf.py();
        let this = slf.get();
        let requests = this.requests.bind(py);
        let Some(table) = &this.table else {
            let done = py
                .import(intern!(py, "operator"))?
                .getattr(intern!(py, "methodcaller"))?
                .call1((intern!(py, "is_finished"),))?;
            let released =
                requests.call_method1(intern!(py, "release_finished"), (finished, done))?;
            let pending = this.get_pending(py);
            if let Some(p) = pending {
                if released.contains(p)? {
                    this.set_pending(None);
                }
            }
            return Ok(());
        };
        let by_key = table.by_key.bind(py);
        // (a set holds each key once; any other iterable is made distinct here)
        let distinct =
            finished.is_instance_of::<PySet>() || finished.is_instance_of::<PyFrozenSet>();
        let mut seen = HashSet::new();
        let mut tracked = Vec::new();
        for key in finished.try_iter()? {
            let Some(t) = by_key.get_item(key?)? else {
                continue;
            };
            let t = t.cast_into::<PyTracked>().map_err(PyErr::from)?;
            if !distinct && !seen.insert(t.get().rid) {
                continue;
            }
            if this.is_finished(t.get().request.bind(py))? {
                tracked.push(t);
            }
        }
        if tracked.is_empty() {
            return Ok(());
        }
        if table.observed(py) {
            let list = PyList::new(py, &tracked)?;
            requests.call_method1(intern!(py, "_drop"), (list, true))?;
        } else {
            this.drop_finished(py, table, &tracked)?;
        }
        let mut pending = this.pending.lock();
        let released = pending
            .as_ref()
            .is_some_and(|p| tracked.iter().any(|t| t.is(p)));
        let old = if released { pending.take() } else { None };
        drop(pending);
        drop(old);
        Ok(())
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

    /// The engine's set of requests still prefilling this queue was made with
    /// (the same object), None if none.
    #[getter]
    fn prefilling(&self, py: Python<'_>) -> Option<Py<PySet>> {
        self.prefilling.as_ref().map(|p| p.clone_ref(py))
    }

    fn __bool__(slf: &Bound<'_, Self>) -> Result<bool> {
        Ok(Self::count(slf)? > 0)
    }

    fn __len__(slf: &Bound<'_, Self>) -> Result<usize> {
        Self::count(slf)
    }

    fn peek_request<'py>(slf: &Bound<'py, Self>) -> Result<Bound<'py, PyAny>> {
        let record = Self::head(slf, "peek")?;
        Ok(request_of(&record)?)
    }

    fn pop_request<'py>(slf: &Bound<'py, Self>) -> Result<Bound<'py, PyAny>> {
        let record = Self::head(slf, "pop")?;
        let request = request_of(&record)?;
        let old = slf.get().pending.lock().replace(record.unbind());
        drop(old);
        Ok(request)
    }

    /// One step's output groups: charge what each request produced, then hand the
    /// finished ones to `self.release_finished`.
    #[pyo3(signature = (outputs, finished = None, running = false, tokens = None))]
    fn record_outputs(
        slf: &Bound<'_, Self>,
        outputs: &Bound<'_, PyAny>,
        finished: Option<&Bound<'_, PyAny>>,
        running: bool,
        tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Self::record_groups(slf, outputs, finished, running, tokens, false)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> std::result::Result<(), PyTraverseError> {
        visit.call(&self.requests)?;
        visit.call(&self.core)?;
        visit.call(&self.records)?;
        if let Some(table) = &self.table {
            visit.call(&table.observers)?;
            visit.call(&table.by_key)?;
            visit.call(&table.overrides)?;
            visit.call(&table.aside)?;
        }
        visit.call(&self.tenant_of)?;
        for status in &self.finished {
            visit.call(status)?;
        }
        if let Some(pending) = self.pending.try_lock() {
            visit.call(pending.as_ref())?;
        }
        if let Some(step) = self.step.try_lock() {
            if let Some(kept) = step.as_ref() {
                visit.call(&kept.output)?;
            }
        }
        visit.call(&self.prefilling)?;
        Ok(())
    }

    fn __clear__(&self) {
        let old = (self.pending.lock().take(), self.step.lock().take());
        drop(old);
    }
}
