//! Argument shapes: every Python value an argument may be, read into plain
//! Rust values before the lock is taken (a length is never trusted, every
//! numpy integer dtype is read). The values themselves are the core's to
//! check.

use std::ops::ControlFlow;

use numpy::{PyArrayDescrMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyMapping, PyTuple};
use vtc_core::{ClientCap, CoreError};

use crate::errors::{invalid, Error, Result};
use crate::items::try_for_each_item;
use crate::PyScheduler;

/// Whether the type of `obj` defines the special method `name` (an
/// exception raised *by* such a method is the caller's and propagates).
pub(crate) fn has_special(obj: &Bound<'_, PyAny>, name: &str) -> bool {
    obj.get_type().hasattr(name).unwrap_or(false)
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unrepresentable>".into())
}

pub(crate) fn type_error(what: &str, expected: &str, obj: &Bound<'_, PyAny>) -> Error {
    Error::Py(PyTypeError::new_err(format!(
        "{what} must be {expected}, got {} of type {}",
        repr(obj),
        type_name(obj)
    )))
}

/// `obj` as a `vtc.Scheduler` (the classes that read or change one take it as an
/// argument), else `TypeError`.
pub(crate) fn scheduler_arg<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
) -> Result<&'a Bound<'py, PyScheduler>> {
    obj.cast::<PyScheduler>()
        .map_err(|_| type_error("scheduler", "a vtc.Scheduler", obj))
}

/// The Python int an integer argument stands for: an int or anything with
/// `__index__` (numpy integers), never a bool. An exception raised inside the
/// caller's `__index__` is theirs: it propagates.
pub(crate) fn index_of<'py>(what: &str, obj: &Bound<'py, PyAny>) -> Result<Bound<'py, PyAny>> {
    if obj.is_instance_of::<PyBool>() {
        return Err(type_error(what, "an int", obj));
    }
    if obj.is_instance_of::<PyInt>() {
        Ok(obj.clone())
    } else if has_special(obj, "__index__") {
        Ok(obj.call_method0("__index__")?)
    } else {
        Err(type_error(what, "an int", obj))
    }
}

/// The usual integer argument read in one call: an exact `int` that fits in
/// i64, or in u64 (a core request id, half of which are past i64). `None`
/// for anything else, which the general path reads. Runs no Python code:
/// `PyLong_AsLongLongAndOverflow` reports an overflow without raising, and
/// `PyLong_AsUnsignedLongLong` (asked only of an int past i64) raises
/// OverflowError only for an int past u64, which is cleared here.
#[inline]
pub(crate) fn exact_int(obj: &Bound<'_, PyAny>) -> Option<i128> {
    // SAFETY: `obj` is a live object and holding it means the GIL is held
    unsafe { exact_int_at(obj.py(), obj.as_ptr()) }
}

/// [`exact_int`] on a borrowed pointer (an item read in place from a list).
///
/// # Safety
/// `p` is a live object and stays so for the call; the GIL is held.
#[inline]
pub(crate) unsafe fn exact_int_at(py: Python<'_>, p: *mut pyo3::ffi::PyObject) -> Option<i128> {
    // SAFETY: `p` is a live object (the caller's promise)
    if unsafe { pyo3::ffi::PyLong_CheckExact(p) } == 0 {
        return None;
    }
    let mut overflow: std::os::raw::c_int = 0;
    // SAFETY: `p` is a live exact int (above)
    let v = unsafe { pyo3::ffi::PyLong_AsLongLongAndOverflow(p, &mut overflow) };
    if overflow == 0 {
        return Some(i128::from(v));
    }
    if overflow < 0 {
        return None;
    }
    // SAFETY: as above; an int past u64 raises OverflowError and returns
    // u64::MAX, which is never taken for a value without checking the error
    let u = unsafe { pyo3::ffi::PyLong_AsUnsignedLongLong(p) };
    if u == u64::MAX && PyErr::take(py).is_some() {
        return None;
    }
    Some(i128::from(u))
}

/// An integer argument (see [`index_of`]) in i128.
pub(crate) fn int_arg(what: &str, obj: &Bound<'_, PyAny>) -> Result<i128> {
    if let Some(v) = exact_int(obj) {
        return Ok(v);
    }
    index_of(what, obj)?
        .extract::<i128>()
        .map_err(|_| invalid(format!("{what} {} is out of range", repr(obj))))
}

/// An integer argument (see [`index_of`]) for which every value out of i64
/// is refused the same way: its value saturated to i128's range, and the
/// text that names it in a message.
pub(crate) struct SatInt {
    pub(crate) v: i128,
    /// The int's own text when `v` is saturated (None: `v` is the value)
    text: Option<String>,
}

impl SatInt {
    /// The argument as its message names it: the int's own digits.
    pub(crate) fn text(&self) -> String {
        self.text.clone().unwrap_or_else(|| self.v.to_string())
    }
}

/// [`int_arg`] saturated (see [`SatInt`]); the int's text is made only for
/// a value past i128, so the usual argument costs no string.
pub(crate) fn int_arg_sat(what: &str, obj: &Bound<'_, PyAny>) -> Result<SatInt> {
    if let Some(v) = exact_int(obj) {
        return Ok(SatInt { v, text: None });
    }
    let idx = index_of(what, obj)?;
    Ok(match idx.extract::<i128>() {
        Ok(v) => SatInt { v, text: None },
        Err(_) => SatInt {
            v: if idx.gt(0)? { i128::MAX } else { i128::MIN },
            text: Some(idx.str().map(|s| s.to_string()).unwrap_or_default()),
        },
    })
}

pub(crate) fn request_id_arg(obj: &Bound<'_, PyAny>) -> Result<u64> {
    let v = int_arg("request_id", obj)?;
    u64::try_from(v).map_err(|_| invalid(format!("request_id must be in [0, 2**64), got {v}")))
}

pub(crate) fn i64_arg(what: &str, obj: &Bound<'_, PyAny>) -> Result<i64> {
    let v = int_arg(what, obj)?;
    i64::try_from(v).map_err(|_| invalid(format!("{what} {v} does not fit in 64 bits")))
}

/// The `(key, value)` pairs of a dict or any other mapping, in its order; a
/// TypeError naming `what` and `expected` for anything else.
pub(crate) fn mapping_items<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    expected: &str,
) -> Result<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return Ok(d.iter().collect());
    }
    if let Ok(m) = obj.cast::<PyMapping>() {
        return Ok(m
            .items()?
            .iter()
            .map(|t| t.extract())
            .collect::<PyResult<_>>()?);
    }
    Err(type_error(what, expected, obj))
}

/// `band_weights`: None (strict bands) or a mapping of priority to weight,
/// each pair checked in order (the priority, then its weight).
pub(crate) fn band_weights_arg(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<Vec<(i64, f64)>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let items = mapping_items(obj, "band_weights", "a mapping of priority to weight")?;
    let mut out = Vec::with_capacity(items.len());
    for (p, w) in &items {
        let p = i64_arg("priority", p)?;
        let w = float_arg("weight", w)?;
        if !vtc_core::limits::weight_ok(w) {
            // the core's rule, applied as each pair is read (a bad weight
            // comes before a later pair's bad shape)
            return Err(CoreError::InvalidWeight(w).into());
        }
        out.push((p, w));
    }
    Ok(Some(out))
}

/// A real-number argument. The rule (the same in `vtc.reference`): an int
/// (never a bool), a float, or any other `numbers.Real` (`Fraction`, numpy
/// floats and ints) is converted with `float()`; anything else (`Decimal`,
/// str, None) is a TypeError. An int too large for a float is a value error
/// (InvalidArgumentError naming it), not a type error.
pub(crate) fn float_arg(what: &str, obj: &Bound<'_, PyAny>) -> Result<f64> {
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        return Ok(f.value());
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(type_error(what, "a number", obj));
    }
    let real = obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>() || {
        let py = obj.py();
        let real = py.import("numbers")?.getattr("Real")?;
        obj.is_instance(&real)?
    };
    if !real {
        return Err(type_error(what, "a number", obj));
    }
    obj.extract::<f64>().map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            invalid(format!("{what} {} is out of range", repr(obj)))
        } else {
            Error::Py(e)
        }
    })
}

/// The items of a list, tuple or other iterable argument, read with bounded
/// memory: never allocated from a `__len__` (which may lie), and an iterable
/// other than a list or tuple is read up to a limit the caller derives from
/// the scheduler (a batch longer than that is an error whatever it holds).
pub(crate) struct Read {
    /// The values, up to the first item that is not an int (in i128).
    pub(crate) vals: Vec<i128>,
    /// That item's position and error, raised in position order (see
    /// `decode`): a later check of an earlier item may win.
    pub(crate) err: Option<(usize, Error)>,
    /// How many items were read (those after `err` are counted, not converted).
    pub(crate) len: usize,
    /// There are more than `len` items (only an iterable is cut short).
    pub(crate) more: bool,
}

impl Read {
    pub(crate) fn empty() -> Self {
        Read {
            vals: Vec::new(),
            err: None,
            len: 0,
            more: false,
        }
    }

    pub(crate) fn push(&mut self, what: &str, item: &Bound<'_, PyAny>) {
        if self.err.is_none() {
            match int_arg(what, item) {
                Ok(v) => self.vals.push(v),
                Err(e) => self.err = Some((self.len, e)),
            }
        }
        self.len += 1;
    }

    /// The items of an exact list as it is at the call (as `vtc.reference`
    /// reads it: a copy, then each item converted). The common item, an
    /// exact int in i64 or u64, is read in place: borrowed from the list and
    /// converted by [`exact_int_at`], which runs no Python code and leaves no
    /// error set, so no reference count per item. At the first
    /// other item, whose `__index__` may run Python code that changes the
    /// list, the items left are copied (references of our own) and read
    /// through [`push`](Self::push).
    fn read_list(&mut self, what: &str, list: &Bound<'_, PyList>) {
        let py = list.py();
        let read = |i, p| {
            // SAFETY: `p` is a live item of the list
            match unsafe { exact_int_at(py, p) } {
                Some(v) => {
                    self.vals.push(v);
                    self.len += 1;
                    ControlFlow::Continue(())
                }
                None => ControlFlow::Break(i),
            }
        };
        // SAFETY: `read` runs no Python code (`exact_int_at` runs none)
        let stop = unsafe { try_for_each_item(list, read) };
        if let ControlFlow::Break(i) = stop {
            // the items left, held before any of them runs Python code
            let rest: Vec<Bound<'_, PyAny>> = (i..list.len())
                .filter_map(|j| list.get_item(j).ok())
                .collect();
            for item in &rest {
                self.push(what, item);
            }
        }
    }

    /// Read `obj`: a list or tuple whole, any other iterable up to `limit`
    /// items. An exception raised by the iterator itself propagates.
    pub(crate) fn new(what: &str, obj: &Bound<'_, PyAny>, limit: usize) -> Result<Self> {
        let mut r = Read::empty();
        if let Ok(list) = obj.cast_exact::<PyList>() {
            r.vals.reserve(list.len()); // a list's length is its real one
            r.read_list(what, list);
            return Ok(r);
        }
        if let Ok(t) = obj.cast_exact::<PyTuple>() {
            r.vals.reserve(t.len());
            for item in t.iter() {
                r.push(what, &item);
            }
            return Ok(r);
        }
        let iter = obj
            .try_iter()
            .map_err(|_| type_error(what, "a sequence of ints", obj))?;
        for item in iter {
            let item = item?;
            if r.len == limit {
                r.more = true;
                break;
            }
            r.push(what, &item);
        }
        Ok(r)
    }
}

/// Read an exact list whose every item is an exact `int` that `conv` takes
/// (from i64) straight into `out`, in place: each item borrowed from the list
/// and converted by `PyLong_AsSsize_t` (fewer instructions than
/// `PyLong_AsLongLongAndOverflow`: no reference taken), which runs no Python
/// code for an exact int; one outside `Py_ssize_t` raises OverflowError,
/// which is cleared, and it and a -1 are read by the general path.
/// No staging buffer, no reference count per item. `false` at the first
/// other item (a bool, a numpy integer, an `__index__` object, an int out of
/// i64 or refused by `conv`): `out` then holds a prefix, nothing else ran,
/// and the caller reads the call the general way ([`Ints`]). Since no Python
/// code runs, the list read is the list at the call.
#[inline]
pub(crate) fn read_exact_ints<T>(
    list: &Bound<'_, PyList>,
    out: &mut Vec<T>,
    conv: impl Fn(i64) -> Option<T>,
) -> bool {
    out.clear();
    out.reserve(list.len());
    let py = list.py();
    let read = |_, p| {
        // SAFETY: `p` is a live item of the list
        if unsafe { pyo3::ffi::PyLong_CheckExact(p) } == 0 {
            return ControlFlow::Break(());
        }
        // SAFETY: `p` is a live exact int (above). For an exact int this
        // runs no Python code; one out of range raises OverflowError and
        // returns -1. A -1 (an error or the int -1, never a valid id) is
        // left to the general path, which reads it again.
        let v = unsafe { pyo3::ffi::PyLong_AsSsize_t(p) } as i64;
        match conv(v) {
            Some(x) if v != -1 => {
                out.push(x);
                ControlFlow::Continue(())
            }
            _ => {
                drop(PyErr::take(py)); // the OverflowError, if any
                ControlFlow::Break(())
            }
        }
    };
    // SAFETY: `read` runs no Python code (see above)
    let stop = unsafe { try_for_each_item(list, read) };
    stop.is_continue()
}

/// The real length of a batch argument whose length can be trusted: an exact
/// list or tuple, or a 1-d numpy array (`None` for any other object, whose
/// `__len__` may lie).
pub(crate) fn sized_len(obj: &Bound<'_, PyAny>) -> Option<usize> {
    if let Ok(l) = obj.cast_exact::<PyList>() {
        return Some(l.len());
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        return Some(t.len());
    }
    match obj.cast::<numpy::PyUntypedArray>() {
        Ok(a) if a.ndim() == 1 => Some(a.len()),
        _ => None,
    }
}

/// A batch argument as given: a 1-d numpy array of an integer dtype (copied
/// into [`Scratch`] under the lock, running no Python code; dtypes other
/// than u64/i64/i32 in native byte order are converted by numpy first), or
/// anything else, read into a [`Read`] before the lock is taken (that may
/// run Python code, e.g. `__index__`, which could call back in).
pub(crate) enum Ints<'py> {
    U64(PyReadonlyArray1<'py, u64>),
    I64(PyReadonlyArray1<'py, i64>),
    I32(PyReadonlyArray1<'py, i32>),
    Other(Read),
}

impl<'py> Ints<'py> {
    pub(crate) fn new(what: &str, obj: &Bound<'py, PyAny>, limit: usize) -> Result<Self> {
        if obj.is_exact_instance_of::<PyList>() {
            // the common case: skip the numpy attempts (each builds an error)
            return Ok(Ints::Other(Read::new(what, obj, limit)?));
        }
        if let Ok(a) = obj.cast::<numpy::PyUntypedArray>() {
            if a.ndim() == 1 {
                if a.len() == 0 {
                    return Ok(Ints::Other(Read::empty())); // of any dtype
                }
                if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, u64>>() {
                    return Ok(Ints::U64(a));
                }
                if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i64>>() {
                    return Ok(Ints::I64(a));
                }
                if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i32>>() {
                    return Ok(Ints::I32(a));
                }
                match a.dtype().kind() {
                    // other widths and byte orders: a native 64-bit copy
                    b'i' => {
                        let c = obj.call_method1("astype", ("int64",))?;
                        return Ok(Ints::I64(c.extract()?));
                    }
                    b'u' => {
                        let c = obj.call_method1("astype", ("uint64",))?;
                        return Ok(Ints::U64(c.extract()?));
                    }
                    _ => {} // bool, float, object: item by item (a TypeError in place)
                }
            } else {
                return Err(Error::Py(PyTypeError::new_err(format!(
                    "{what} must be a 1-d integer array, got a {}-d array of dtype {}",
                    a.ndim(),
                    a.dtype()
                ))));
            }
        }
        Ok(Ints::Other(Read::new(what, obj, limit)?))
    }

    /// Items read (for an array, its length).
    pub(crate) fn len(&self) -> usize {
        match self {
            Ints::U64(a) => a.len(),
            Ints::I64(a) => a.len(),
            Ints::I32(a) => a.len(),
            Ints::Other(r) => r.len,
        }
    }

    /// More items than read (an iterable cut at its limit).
    pub(crate) fn more(&self) -> bool {
        matches!(self, Ints::Other(r) if r.more)
    }

    /// Replace `out`'s contents with the values, each converted by `conv`,
    /// up to the first one that fails (to convert, or to be read): returns
    /// its position and error.
    pub(crate) fn copy_into<T: Copy>(
        &mut self,
        out: &mut Vec<T>,
        conv: impl Fn(i128) -> Result<T>,
    ) -> Option<(usize, Error)> {
        out.clear();
        let mut push = |x: i128| -> std::result::Result<(), (usize, Error)> {
            let i = out.len();
            out.push(conv(x).map_err(|e| (i, e))?);
            Ok(())
        };
        let r = match self {
            Ints::U64(a) => match a.as_slice() {
                Ok(xs) => xs.iter().try_for_each(|&x| push(x as i128)),
                Err(_) => a.as_array().iter().try_for_each(|&x| push(x as i128)),
            },
            Ints::I64(a) => match a.as_slice() {
                Ok(xs) => xs.iter().try_for_each(|&x| push(x as i128)),
                Err(_) => a.as_array().iter().try_for_each(|&x| push(x as i128)),
            },
            Ints::I32(a) => a.as_array().iter().try_for_each(|&x| push(x as i128)),
            Ints::Other(r) => match r.vals.iter().try_for_each(|&x| push(x)) {
                Ok(()) => match r.err.take() {
                    Some(e) => Err(e),
                    None => Ok(()),
                },
                Err(e) => Err(e),
            },
        };
        r.err()
    }
}

pub(crate) fn rid_of(v: i128) -> Result<u64> {
    u64::try_from(v).map_err(|_| invalid(format!("request_id must be in [0, 2**64), got {v}")))
}

/// A `tokens` argument given as one count for every request (`decode`'s
/// int form, `decode_all`): an int in `[0, MAX_TOKENS_PER_CALL]`.
pub(crate) fn token_count_arg(obj: &Bound<'_, PyAny>) -> Result<i64> {
    int_arg("tokens", obj).and_then(tokens_of)
}

pub(crate) fn tokens_of(v: i128) -> Result<i64> {
    i64::try_from(v).map_err(|_| {
        if v < 0 {
            invalid(format!("tokens must be >= 0, got {v}"))
        } else {
            invalid(format!(
                "tokens {v} exceeds {}",
                vtc_core::MAX_TOKENS_PER_CALL
            ))
        }
    })
}

pub(crate) fn coef(what: &str, obj: Option<&Bound<'_, PyAny>>, default: f64) -> Result<f64> {
    obj.map(|o| float_arg(what, o))
        .transpose()
        .map(|v| v.unwrap_or(default))
}

/// A `client_cap=` argument: an int number of tokens, or a float fraction of M
/// (the core's rule, `ClientCap`, checks the values).
pub(crate) fn client_cap_arg(obj: &Bound<'_, PyAny>) -> Result<ClientCap> {
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        // any positive int: the core clamps a cap above M to M
        return match obj.extract::<i128>() {
            Ok(v) if v >= 1 => Ok(ClientCap::Tokens(u64::try_from(v).unwrap_or(u64::MAX))),
            Ok(v) if v >= i128::from(i64::MIN) => Err(CoreError::InvalidClientCap(v as i64).into()),
            Err(_) if obj.gt(0)? => Ok(ClientCap::Tokens(u64::MAX)),
            _ => Err(invalid(format!(
                "client_cap must be a positive number of tokens (or a fraction of M in (0, 1]), got {}",
                repr(obj)
            ))),
        };
    }
    Ok(ClientCap::Fraction(float_arg("client_cap", obj)?))
}
