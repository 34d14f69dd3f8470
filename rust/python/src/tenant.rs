//! `TenantRule`: which tenant an arriving request is billed to, with the common
//! case (a known tenant named by a plain `str` field) answered here, with no
//! Python frame, and every other case handed to `vtc.adapter.Tenancy`.
//!
//! An arrival ran four Python frames in vLLM's step (the tenant fields, the
//! first that names a tenant, the tenant cap, the shell's wrapper: ~87
//! bytecodes; bench/README.md, optimisation 41). The rule reads a vLLM request's
//! two tenant fields in their order, `sampling_params.extra_args[key]` and then
//! `lora_request.lora_name` (`vtc.adapter.vllm_tenant_fields`), each as Python's
//! `getattr(obj, name, None)` would. The object also counts arrivals, for
//! `Tenancy.arrive` too: every `forget_every`-th one is due a `forget_idle`.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySet, PyString, PyTuple};
use pyo3::{intern, PyTraverseError};

use crate::errors::{invalid, Result};

/// A tenant field as the common case reads it.
enum Field<'py> {
    /// An exact `str` that names a tenant (1 to `max_len` characters).
    Name(Bound<'py, PyString>),
    /// Names none and needs no rule to say so: `None`, or an exact `str` that is
    /// empty or too long (`vtc.config.first_tenant` skips both).
    Skip,
    /// Anything else (an int, a `str` subclass, ...): `vtc.config.tenant_name`'s to read.
    Other,
}

/// The arrival rule of one `Tenancy`. See `vtc/_core.pyi`.
#[pyclass(module = "vtc._core", name = "TenantRule")]
pub(crate) struct PyTenantRule {
    /// `Tenancy`'s set of the tenants counted against its cap (shared, not copied:
    /// `Tenancy` changes it in place).
    known: Py<PySet>,
    /// The `extra_args` key that names the tenant (`EngineConfig.tenant_key`).
    key: Py<PyString>,
    /// `vtc.config.MAX_TENANT_LEN`.
    max_len: usize,
    forget_every: u64,
    arrivals: AtomicU64,
    /// `Tenancy._arrive(due, fields)`: every case but the common one (None once the
    /// collector cleared the cycle through it).
    slow: Option<Py<PyAny>>,
}

impl PyTenantRule {
    /// One more arrival; whether it is due a `forget_idle` (every `forget_every`-th).
    fn count(&self) -> bool {
        let n = self.arrivals.fetch_add(1, Ordering::Relaxed) + 1;
        n % self.forget_every == 0
    }

    /// How the common case reads one field's value.
    fn read<'py>(&self, value: Option<&Bound<'py, PyAny>>) -> Result<Field<'py>> {
        let Some(value) = value else {
            return Ok(Field::Skip);
        };
        if value.is_none() {
            return Ok(Field::Skip);
        }
        match value.cast_exact::<PyString>() {
            Ok(s) => {
                let n = s.len()?;
                Ok(if 0 < n && n <= self.max_len {
                    Field::Name(s.clone())
                } else {
                    Field::Skip
                })
            }
            Err(_) => Ok(Field::Other),
        }
    }

    /// `request.sampling_params.extra_args.get(key)` if `extra_args` is a dict, else
    /// None (`vtc.adapter.vllm_tenant_fields`' first field).
    fn extra_field<'py>(&self, request: &Bound<'py, PyAny>) -> Result<Option<Bound<'py, PyAny>>> {
        let py = request.py();
        let params = request.getattr(intern!(py, "sampling_params"))?;
        if params.is_none() {
            return Ok(None);
        }
        let Some(extra) = params.getattr_opt(intern!(py, "extra_args"))? else {
            return Ok(None);
        };
        let key = self.key.bind(py);
        if let Ok(d) = extra.cast_exact::<PyDict>() {
            return Ok(d.get_item(key)?);
        }
        if extra.is_instance_of::<PyDict>() {
            return Ok(Some(extra.call_method1(intern!(py, "get"), (key,))?));
        }
        Ok(None)
    }

    /// `request.lora_request.lora_name` (None without an adapter or a name).
    fn lora_field<'py>(request: &Bound<'py, PyAny>) -> Result<Option<Bound<'py, PyAny>>> {
        let py = request.py();
        let lora = request.getattr(intern!(py, "lora_request"))?;
        if lora.is_none() {
            return Ok(None);
        }
        Ok(lora.getattr_opt(intern!(py, "lora_name"))?)
    }

    /// The tenant of an arriving vLLM request, counted as an arrival once its fields
    /// are read: when no forget is due and its first field that names a tenant is
    /// a plain `str` of a known tenant, that `str`; otherwise `slow(due, (extra,
    /// lora))`'s answer. (Between the count's read and its increment only the
    /// request's `lora_request` may be read: an arrival counted meanwhile by another
    /// thread could shift one `forget_idle` by an arrival, or skip it until the next
    /// `forget_every` or the cap; no count is lost.)
    pub(crate) fn name_tenant<'py>(
        &self,
        request: &Bound<'py, PyAny>,
    ) -> Result<Bound<'py, PyAny>> {
        let py = request.py();
        let extra = self.extra_field(request)?;
        let mut lora = None; // (Some once read)
        let found = match self.read(extra.as_ref())? {
            Field::Name(s) => Some(s),
            Field::Other => None,
            Field::Skip => {
                // (read only when the first names no tenant: first_tenant stops there)
                let value = Self::lora_field(request)?;
                let second = self.read(value.as_ref())?;
                lora = Some(value);
                match second {
                    Field::Name(s) => Some(s),
                    Field::Skip | Field::Other => None,
                }
            }
        };
        // (counted once the fields are read: a request whose fields raise is no arrival)
        let due = (self.arrivals.load(Ordering::Relaxed) + 1) % self.forget_every == 0;
        if let Some(name) = found {
            if !due && self.known.bind(py).contains(&name)? {
                self.count();
                return Ok(name.into_any());
            }
        }
        let lora = match lora {
            Some(value) => value,
            None => Self::lora_field(request)?, // (the slow path is given both fields)
        };
        self.count();
        let Some(slow) = &self.slow else {
            return Err(invalid("the tenant rule was cleared".to_owned()));
        };
        let fields = PyTuple::new(py, [or_none(py, extra), or_none(py, lora)])?;
        Ok(slow.bind(py).call1((due, fields))?)
    }
}

fn or_none<'py>(py: Python<'py>, value: Option<Bound<'py, PyAny>>) -> Bound<'py, PyAny> {
    value.unwrap_or_else(|| py.None().into_bound(py))
}

#[pymethods]
impl PyTenantRule {
    #[new]
    fn new(
        known: Bound<'_, PySet>,
        key: Bound<'_, PyString>,
        forget_every: i64,
        max_len: i64,
        slow: Bound<'_, PyAny>,
    ) -> Result<Self> {
        if forget_every < 1 {
            return Err(invalid(format!(
                "forget_every must be >= 1, got {forget_every}"
            )));
        }
        if max_len < 1 {
            return Err(invalid(format!("max_len must be >= 1, got {max_len}")));
        }
        if !slow.is_callable() {
            return Err(invalid(format!("slow must be callable, got {slow:?}")));
        }
        Ok(PyTenantRule {
            known: known.unbind(),
            key: key.unbind(),
            max_len: max_len as usize,
            forget_every: forget_every as u64,
            arrivals: AtomicU64::new(0),
            slow: Some(slow.unbind()),
        })
    }

    /// Arrivals counted so far.
    #[getter]
    fn arrivals(&self) -> u64 {
        self.arrivals.load(Ordering::Relaxed)
    }

    /// Idle tenants are due a `forget_idle` every this many arrivals.
    #[getter]
    fn forget_every(&self) -> u64 {
        self.forget_every
    }

    /// Count one arrival; whether it is due a `forget_idle`.
    fn count_arrival(&self) -> bool {
        self.count()
    }

    /// `name_tenant(request)`: the rule called from Python (the vLLM queue calls
    /// `name_tenant` directly when its `tenant_of` is a `TenantRule`).
    fn __call__<'py>(&self, request: &Bound<'py, PyAny>) -> Result<Bound<'py, PyAny>> {
        self.name_tenant(request)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> std::result::Result<(), PyTraverseError> {
        visit.call(&self.known)?;
        visit.call(&self.slow)?;
        Ok(())
    }

    fn __clear__(&mut self) {
        self.slow = None;
    }
}
