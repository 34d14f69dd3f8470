//! Client keys as Python gives them (an int or a str) and their bytes in
//! snapshots: reading a key argument, turning key bytes back into Python.

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyString};

use crate::convert::type_error;
use crate::errors::{invalid, Result};

/// A client key as Python gave it: an int or a str. A str is kept as its
/// UTF-8 bytes, encoded with `surrogatepass` so that every Python str (even
/// one holding a lone surrogate, which is not valid UTF-8) is a key.
#[derive(Clone, Debug)]
pub(crate) enum Key {
    Int(i64),
    Str(Box<[u8]>),
}

pub(crate) enum KeyRef<'a> {
    Int(i64),
    Str(Cow<'a, [u8]>),
}

/// The key bytes of a str: borrowed UTF-8 when it is valid Unicode, else
/// `str.encode(s, "utf-8", "surrogatepass")` (lone surrogates).
pub(crate) fn str_key<'a>(s: &'a Bound<'_, PyString>) -> Result<Cow<'a, [u8]>> {
    if let Ok(t) = s.to_str() {
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

pub(crate) fn client_arg<'a>(obj: &'a Bound<'_, PyAny>) -> Result<KeyRef<'a>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(KeyRef::Str(str_key(s)?));
    }
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        let v: i128 = obj.extract()?;
        return i64::try_from(v)
            .map(KeyRef::Int)
            .map_err(|_| invalid(format!("client id {v} does not fit in 64 bits")));
    }
    Err(type_error("client", "an int or a str", obj))
}

/// Snapshot key bytes: tag 0 + i64 (little-endian) or tag 1 + UTF-8.
pub(crate) fn encode_key(k: &Key) -> Vec<u8> {
    match k {
        Key::Int(i) => {
            let mut v = vec![0u8];
            v.extend_from_slice(&i.to_le_bytes());
            v
        }
        Key::Str(s) => {
            let mut v = vec![1u8];
            v.extend_from_slice(s);
            v
        }
    }
}

pub(crate) fn decode_key(raw: &[u8]) -> Option<Key> {
    match raw.split_first()? {
        (0, rest) => Some(Key::Int(i64::from_le_bytes(rest.try_into().ok()?))),
        (1, rest) => Some(Key::Str(rest.into())),
        _ => None,
    }
}

pub(crate) fn key_to_py<'py>(py: Python<'py>, k: &Key) -> PyResult<Bound<'py, PyAny>> {
    Ok(match k {
        Key::Int(i) => i.into_pyobject(py)?.into_any(),
        Key::Str(s) => str_of(py, s)?,
    })
}

/// A dict of client key -> value, built after the lock is released.
pub(crate) fn key_dict<'py, V: IntoPyObject<'py>>(
    py: Python<'py>,
    values: Vec<(Key, V)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in values {
        d.set_item(key_to_py(py, &k)?, v)?;
    }
    Ok(d)
}
