//! The cost objects (`LinearCost`, `QuadraticCost`, `ContextCost`): Python
//! views of `vtc_core::Cost`, with the core's defaults.

use pyo3::prelude::*;
use pyo3::types::PyString;
use vtc_core::Cost;

use crate::convert::{coef, type_error};
use crate::errors::Result;

/// Linear cost `wp * n_p + wq * n_q` (the default).
#[pyclass(frozen, eq, module = "vtc", name = "LinearCost")]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyLinearCost {
    #[pyo3(get)]
    pub(crate) wp: f64,
    #[pyo3(get)]
    pub(crate) wq: f64,
}

#[pymethods]
impl PyLinearCost {
    #[new]
    #[pyo3(signature = (wp = None, wq = None))]
    pub(crate) fn new(
        wp: Option<&Bound<'_, PyAny>>,
        wq: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self> {
        let c = PyLinearCost {
            wp: coef("wp", wp, Cost::DEFAULT_WP)?,
            wq: coef("wq", wq, Cost::DEFAULT_WQ)?,
        };
        c.cost().validate()?;
        Ok(c)
    }
    pub(crate) fn __repr__(&self) -> String {
        format!("LinearCost(wp={:?}, wq={:?})", self.wp, self.wq)
    }
    pub(crate) fn __hash__(&self) -> u64 {
        hash_f64s(&[0.0, self.wp, self.wq])
    }
}

impl PyLinearCost {
    pub(crate) fn cost(&self) -> Cost {
        Cost::Linear {
            wp: self.wp,
            wq: self.wq,
        }
    }
}

/// Profiled cost `a_p*n_p + a_q*n_q + a_pq*n_p*n_q + a_qq*n_q**2 + c` (the paper's defaults).
#[pyclass(frozen, eq, module = "vtc", name = "QuadraticCost")]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyQuadraticCost {
    #[pyo3(get)]
    pub(crate) a_p: f64,
    #[pyo3(get)]
    pub(crate) a_q: f64,
    #[pyo3(get)]
    pub(crate) a_pq: f64,
    #[pyo3(get)]
    pub(crate) a_qq: f64,
    #[pyo3(get)]
    pub(crate) c: f64,
}

#[pymethods]
impl PyQuadraticCost {
    #[new]
    #[pyo3(signature = (a_p = None, a_q = None, a_pq = None, a_qq = None, c = None))]
    pub(crate) fn new(
        a_p: Option<&Bound<'_, PyAny>>,
        a_q: Option<&Bound<'_, PyAny>>,
        a_pq: Option<&Bound<'_, PyAny>>,
        a_qq: Option<&Bound<'_, PyAny>>,
        c: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self> {
        let Cost::Quadratic {
            a_p: d_p,
            a_q: d_q,
            a_pq: d_pq,
            a_qq: d_qq,
            c: d_c,
        } = Cost::PAPER_QUADRATIC
        else {
            unreachable!("the paper's cost is quadratic")
        };
        let q = PyQuadraticCost {
            a_p: coef("a_p", a_p, d_p)?,
            a_q: coef("a_q", a_q, d_q)?,
            a_pq: coef("a_pq", a_pq, d_pq)?,
            a_qq: coef("a_qq", a_qq, d_qq)?,
            c: coef("c", c, d_c)?,
        };
        q.cost().validate()?;
        Ok(q)
    }
    pub(crate) fn __repr__(&self) -> String {
        format!(
            "QuadraticCost(a_p={:?}, a_q={:?}, a_pq={:?}, a_qq={:?}, c={:?})",
            self.a_p, self.a_q, self.a_pq, self.a_qq, self.c
        )
    }
    pub(crate) fn __hash__(&self) -> u64 {
        hash_f64s(&[1.0, self.a_p, self.a_q, self.a_pq, self.a_qq, self.c])
    }
}

impl PyQuadraticCost {
    pub(crate) fn cost(&self) -> Cost {
        Cost::Quadratic {
            a_p: self.a_p,
            a_q: self.a_q,
            a_pq: self.a_pq,
            a_qq: self.a_qq,
            c: self.c,
        }
    }
}

/// Context-aware decode: `wp` per computed prompt token, `wq + beta * context_len` per
/// generated token (context_len = prompt + tokens generated before it).
#[pyclass(frozen, eq, module = "vtc", name = "ContextCost")]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyContextCost {
    #[pyo3(get)]
    pub(crate) wp: f64,
    #[pyo3(get)]
    pub(crate) wq: f64,
    #[pyo3(get)]
    pub(crate) beta: f64,
}

#[pymethods]
impl PyContextCost {
    #[new]
    #[pyo3(signature = (wp = None, wq = None, beta = None))]
    pub(crate) fn new(
        wp: Option<&Bound<'_, PyAny>>,
        wq: Option<&Bound<'_, PyAny>>,
        beta: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self> {
        let c = PyContextCost {
            wp: coef("wp", wp, Cost::DEFAULT_WP)?,
            wq: coef("wq", wq, Cost::DEFAULT_WQ)?,
            beta: coef("beta", beta, Cost::DEFAULT_BETA)?,
        };
        c.cost().validate()?;
        Ok(c)
    }
    pub(crate) fn __repr__(&self) -> String {
        format!(
            "ContextCost(wp={:?}, wq={:?}, beta={:?})",
            self.wp, self.wq, self.beta
        )
    }
    pub(crate) fn __hash__(&self) -> u64 {
        hash_f64s(&[2.0, self.wp, self.wq, self.beta])
    }
}

impl PyContextCost {
    pub(crate) fn cost(&self) -> Cost {
        Cost::Context {
            wp: self.wp,
            wq: self.wq,
            beta: self.beta,
        }
    }
}

pub(crate) fn hash_f64s(v: &[f64]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for x in v {
        // +0.0 and -0.0 compare equal: hash them alike
        (if *x == 0.0 { 0.0f64 } else { *x }).to_bits().hash(&mut h);
    }
    h.finish()
}

/// A `cost=` argument: a cost object or one of the names "linear", "quadratic",
/// "context" (default coefficients).
pub(crate) fn cost_arg(obj: &Bound<'_, PyAny>) -> Result<Cost> {
    if let Ok(c) = obj.cast::<PyLinearCost>() {
        return Ok(c.get().cost());
    }
    if let Ok(c) = obj.cast::<PyQuadraticCost>() {
        return Ok(c.get().cost());
    }
    if let Ok(c) = obj.cast::<PyContextCost>() {
        return Ok(c.get().cost());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Cost::named(s.to_str()?)?);
    }
    Err(type_error(
        "cost",
        "a LinearCost, QuadraticCost, ContextCost or a cost name",
        obj,
    ))
}

pub(crate) fn cost_to_py(py: Python<'_>, cost: Cost) -> PyResult<Py<PyAny>> {
    Ok(match cost {
        Cost::Linear { wp, wq } => Py::new(py, PyLinearCost { wp, wq })?.into_any(),
        Cost::Quadratic {
            a_p,
            a_q,
            a_pq,
            a_qq,
            c,
        } => Py::new(
            py,
            PyQuadraticCost {
                a_p,
                a_q,
                a_pq,
                a_qq,
                c,
            },
        )?
        .into_any(),
        Cost::Context { wp, wq, beta } => Py::new(py, PyContextCost { wp, wq, beta })?.into_any(),
    })
}

pub(crate) fn cost_repr(cost: Cost) -> String {
    match cost {
        Cost::Linear { wp, wq } => PyLinearCost { wp, wq }.__repr__(),
        Cost::Quadratic {
            a_p,
            a_q,
            a_pq,
            a_qq,
            c,
        } => PyQuadraticCost {
            a_p,
            a_q,
            a_pq,
            a_qq,
            c,
        }
        .__repr__(),
        Cost::Context { wp, wq, beta } => PyContextCost { wp, wq, beta }.__repr__(),
    }
}
