//! An engine step's output objects (`Scheduler.decode_outputs`), read in one
//! place: the request each names and the tokens it generated. Everything
//! that may run Python code (attribute getters, `__len__`, `__hash__`)
//! happens here, before the caller takes the lock. Also `key_id`, the
//! request id `missing="hash"` gives a key.

use std::ops::ControlFlow;

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString, PyTuple};

use crate::convert::{has_special, i64_arg, repr, request_id_arg, type_error};
use crate::errors::{invalid, Error, Kind, Result};
use crate::items::{list_len, try_for_each_item};

/// The request id `Scheduler.decode_outputs(..., missing="hash")` gives a key
/// its request id mapping does not hold: `hash(key) % 2**64`. An engine that
/// submits each request as `key_id(its key)` needs no id mapping of its own
/// (only for the rare key whose id is taken by another live request). Python
/// salts str hashes per process, so such ids are not stable across processes.
/// A str caches its hash, so this reads no more memory than the key.
#[pyfunction]
#[pyo3(signature = (key, /))]
pub(crate) fn key_id(key: &Bound<'_, PyAny>) -> Result<u64> {
    Ok(key.hash()? as u64)
}

/// `decode_outputs`'s `missing=`: what names the request of a key its
/// mapping does not hold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Nothing: an `UnknownRequestError`.
    Error,
    /// `key_id(key)`, whatever the key's type.
    Hash,
    /// `key_id(key)` for an exact `str` key, else an `UnknownRequestError`.
    /// A str's hash is salted per process (SipHash), so a key no live request
    /// was submitted under names one only by a 64-bit collision; an int's hash
    /// is the int itself (mod `2**61 - 1`), so an untracked int key can name a
    /// live request of another key (`1` and `2**61`).
    HashStr,
}

pub(crate) fn missing_arg(missing: &str) -> Result<Missing> {
    match missing {
        "error" => Ok(Missing::Error),
        "hash" => Ok(Missing::Hash),
        "hash-str" => Ok(Missing::HashStr),
        other => Err(invalid(format!(
            "missing must be \"error\", \"hash\" or \"hash-str\", got {other:?}"
        ))),
    }
}

/// An engine step's output objects (`decode_outputs`), read in one place:
/// for each object, the request its key `obj.<id_attr>` names and the
/// tokens it generated (`len(obj.<tokens_attr>)`, or the int it holds).
pub(crate) struct Outputs {
    pub(crate) rids: Vec<u64>,
    pub(crate) tokens: Vec<i64>,
    /// There are more than `limit` objects (only an iterable other than a
    /// list is cut short): the objects after them were not read.
    pub(crate) more: bool,
}

impl Outputs {
    /// Read `outputs` (a list whole, any other iterable up to `limit`
    /// objects): the key of each is looked up in `request_ids`, or if not
    /// there (or the mapping is empty, then not consulted) named as `missing`
    /// says. Everything that may run Python code
    /// (attribute getters, `__len__`, `__hash__`) happens here, before the
    /// caller takes the lock.
    pub(crate) fn read(
        outputs: &Bound<'_, PyAny>,
        request_ids: &Bound<'_, PyDict>,
        missing: Missing,
        id_attr: &str,
        tokens_attr: &str,
        limit: usize,
    ) -> Result<Outputs> {
        let py = outputs.py();
        let consult = missing == Missing::Error || !request_ids.is_empty();
        let id_name = PyString::intern(py, id_attr);
        let tokens_name = PyString::intern(py, tokens_attr);
        let mut o = Outputs {
            rids: Vec::new(),
            tokens: Vec::new(),
            more: false,
        };
        let mut read = |i: usize, out: Bound<'_, PyAny>| -> Result<()> {
            let key = output_attr(i, &out, &id_name)?;
            let found = if consult {
                request_ids.get_item(&key)?
            } else {
                None
            };
            let rid = match found {
                Some(rid) => request_id_arg(&rid)?,
                None if missing == Missing::Hash => key_id(&key)?,
                None if missing == Missing::HashStr && key.is_exact_instance_of::<PyString>() => {
                    key_id(&key)?
                }
                None => {
                    return Err(Error::Arg(
                        Kind::UnknownRequest,
                        format!(
                            "outputs[{i}].{id_attr} = {} is not in request_ids",
                            repr(&key)
                        ),
                    ))
                }
            };
            let produced = output_attr(i, &out, &tokens_name)?;
            // The usual object, an exact list (vLLM's `new_token_ids`), is
            // sized without the type lookups of the general path (which
            // looks `__len__` up by name on each object's type: most of
            // the cost of reading an output).
            let n = if let Ok(list) = produced.cast_exact::<PyList>() {
                list.len() as i64
            } else if let Ok(tuple) = produced.cast_exact::<PyTuple>() {
                tuple.len() as i64
            } else if let Ok(n) = produced.cast_exact::<PyInt>() {
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
            o.rids.push(rid);
            o.tokens.push(n);
            Ok(())
        };
        if let Ok(list) = outputs.cast_exact::<PyList>() {
            for (i, out) in list.iter().enumerate() {
                read(i, out)?;
            }
            return Ok(o);
        }
        let iter = outputs
            .try_iter()
            .map_err(|_| type_error("outputs", "an iterable of output objects", outputs))?;
        for (i, out) in iter.enumerate() {
            let out = out?;
            if i == limit {
                o.more = true;
                break;
            }
            read(i, out)?;
        }
        Ok(o)
    }
}

/// `out.<name>` of `outputs[i]`, or a TypeError naming both.
fn output_attr<'py>(
    i: usize,
    out: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> Result<Bound<'py, PyAny>> {
    out.getattr(name).map_err(|e| {
        if e.is_instance_of::<PyAttributeError>(out.py()) {
            Error::Py(PyTypeError::new_err(format!(
                "outputs[{i}] has no attribute {name}: {}",
                repr(out)
            )))
        } else {
            Error::Py(e) // raised by a getter: not ours to rename
        }
    })
}

/// [`uniform_count`] of a list of token lists (`tokens_attr=None`, the
/// shape an engine's sampler returns) read with no reference taken: each item
/// borrowed from the list and its length read in place. `Some(answer)` when
/// every item up to the answer is an exact list (the answer is then
/// `uniform_count`'s); `None` at the first item that is not, left to the
/// general loop. No Python code runs here, so the list cannot change while it
/// is read. A step's sampled lists are read once each with caches cold
/// (bench/README.md, optimisation 26): no refcount writes, no iterator.
fn uniform_list_lens(list: &Bound<'_, PyList>) -> Option<Option<(usize, i64)>> {
    let mut first: Option<usize> = None;
    let read = |_, p| {
        // SAFETY: `p` is a live item of the list
        if unsafe { pyo3::ffi::PyList_CheckExact(p) } == 0 {
            return ControlFlow::Break(None);
        }
        // SAFETY: `p` is a live exact list (above)
        let len = unsafe { list_len(p) };
        match first {
            None => first = Some(len),
            Some(t) if t != len => return ControlFlow::Break(Some(None)),
            Some(_) => {}
        }
        ControlFlow::Continue(())
    };
    // SAFETY: `read` runs no Python code
    let stop = unsafe { try_for_each_item(list, read) };
    match stop {
        ControlFlow::Break(answer) => answer,
        ControlFlow::Continue(()) => Some(first.map(|t| (list.len(), t as i64))),
    }
}

/// The number of tokens every output object in `outputs` holds, if it is
/// the same for all, with the number of objects: `(len(outputs), t)`. Only
/// the shapes read without running Python code beyond the attribute reads:
/// `outputs` an exact list, each `obj.<tokens_attr>` (each item itself when
/// `tokens_attr` is `None`) an exact list or tuple (its length) or an exact
/// int. `None` for anything else, a count that differs from the first, an
/// empty list, or an attribute that cannot be read (its error is left to
/// `Outputs::read`, which reads it again). Stops at the first object that
/// differs.
pub(crate) fn uniform_count(
    outputs: &Bound<'_, PyAny>,
    tokens_attr: Option<&str>,
) -> Option<(usize, i64)> {
    let list = outputs.cast_exact::<PyList>().ok()?;
    if tokens_attr.is_none() {
        if let Some(uniform) = uniform_list_lens(list) {
            return uniform;
        }
    }
    let name = tokens_attr.map(|a| PyString::intern(outputs.py(), a));
    let mut first = None;
    for out in list.iter() {
        let produced = match &name {
            Some(name) => out.getattr(name).ok()?,
            None => out,
        };
        let n = if let Ok(l) = produced.cast_exact::<PyList>() {
            l.len() as i64
        } else if let Ok(t) = produced.cast_exact::<PyTuple>() {
            t.len() as i64
        } else {
            produced.cast_exact::<PyInt>().ok()?.extract::<i64>().ok()?
        };
        match first {
            None => first = Some(n),
            Some(t) if t != n => return None,
            Some(_) => {}
        }
    }
    Some((list.len(), first?))
}
