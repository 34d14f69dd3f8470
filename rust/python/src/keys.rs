//! Client keys between Python and the core's key type (`vtc_core::ClientKey`,
//! interned by the core's `Scheduler`): reading a key argument (an int or a
//! str), turning a key back into Python.

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyString};
use pyo3::Borrowed;
use vtc_core::{ClientKey, KeyRef};

use crate::convert::{exact_int, type_error};
use crate::errors::{invalid, Result};

/// The key bytes of a str: borrowed UTF-8 when it is valid Unicode, else
/// `str.encode(s, "utf-8", "surrogatepass")` (lone surrogates).
pub(crate) fn str_key<'a>(s: Borrowed<'a, '_, PyString>) -> Result<Cow<'a, [u8]>> {
    if let Ok(t) = s.extract::<&'a str>() {
        return Ok(Cow::Borrowed(t.as_bytes()));
    }
    let py = s.py();
    let b = py
        .get_type::<PyString>()
        .call_method1("encode", (s, "utf-8", "surrogatepass"))?;
    Ok(Cow::Owned(
        b.cast::<PyBytes>()
            .map_err(PyErr::from)?
            .as_bytes()
            .to_vec(),
    ))
}

/// The Python str of key bytes made by [`str_key`].
pub(crate) fn str_of<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(b) {
        Ok(t) => Ok(PyString::new(py, t).into_any()),
        Err(_) => PyBytes::new(py, b).call_method1("decode", ("utf-8", "surrogatepass")),
    }
}

/// A client key argument: an int that fits in i64 (never a bool) or a str,
/// whose bytes are borrowed while the call lasts (the reader behind
/// `args::Client`, and each key of `raise_counters`' mapping).
pub(crate) fn client_key<'a>(obj: Borrowed<'a, '_, PyAny>) -> Result<KeyRef<'a>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(KeyRef::Str(str_key(s)?));
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        // (an exact int in i64 or u64 read in one call, as every int argument)
        let v = match exact_int(&obj) {
            Some(v) => v,
            None => obj.extract::<i128>()?,
        };
        return i64::try_from(v)
            .map(KeyRef::Int)
            .map_err(|_| invalid(format!("client id {v} does not fit in 64 bits")));
    }
    Err(type_error("client", "an int or a str", &obj))
}

pub(crate) fn key_to_py<'py>(py: Python<'py>, k: &ClientKey) -> PyResult<Bound<'py, PyAny>> {
    Ok(match k {
        ClientKey::Int(i) => i.into_pyobject(py)?.into_any(),
        ClientKey::Str(s) => str_of(py, s)?,
    })
}

/// A dict of client key -> value, built after the lock is released.
pub(crate) fn key_dict<'py, V: IntoPyObject<'py>>(
    py: Python<'py>,
    values: Vec<(ClientKey, V)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in values {
        d.set_item(key_to_py(py, &k)?, v)?;
    }
    Ok(d)
}
