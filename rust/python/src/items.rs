//! An exact list's items read in place: the hot batch readers (`decode`'s
//! ids and tokens, an engine step's sampled token lists) visit every item of
//! a list once, with no Python code running.
//!
//! Under the stable ABI (`abi3`) a list is opaque and each item is a call to
//! `PyList_GetItem` (its own type and bounds checks, ~10 instructions an
//! item; bench/README.md, optimisation 35). Every CPython this extension
//! loads in (3.10 to 3.14, with the GIL: the stable ABI has no free-threaded
//! build before 3.15) lays a list out as its variable-size header followed by
//! the pointer to its items, which is what the version-specific API's
//! `PyList_GET_ITEM` reads. So for those versions, and only after a probe
//! list has shown at module import that the layout is that one, the items are
//! read as that array; otherwise (a newer version, a layout that differs) as
//! the API gives them. Either way the caller sees the same items.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// `PyListObject` as CPython 3.10 to 3.14 (GIL builds) define it.
#[repr(C)]
struct RawList {
    ob_base: ffi::PyVarObject,
    ob_item: *mut *mut ffi::PyObject,
}

/// The items may be read as [`RawList`]'s array (set once, at import).
static IN_PLACE: AtomicBool = AtomicBool::new(false);

/// Decide at module import whether lists are read in place: only on a
/// version whose layout is known, and only if a probe list of two distinct
/// items reads the same through the layout as through the API.
pub(crate) fn check_layout(py: Python<'_>) -> PyResult<()> {
    let v = py.version_info();
    let cpython = py
        .import("sys")?
        .getattr("implementation")?
        .getattr("name")?
        .extract::<String>()?
        == "cpython";
    let known = cpython && (v.major, v.minor) >= (3, 10) && (v.major, v.minor) <= (3, 14);
    let ok = known && {
        let probe = PyList::new(py, [py.None(), py.Ellipsis()])?;
        let p = probe.as_ptr();
        // SAFETY: on these versions `p` points to a `PyListObject`, which
        // begins with `RawList`'s fields; the two items read through it are
        // compared to the API's before any is used.
        unsafe {
            let raw = p.cast::<RawList>();
            let items = (*raw).ob_item;
            (*raw).ob_base.ob_size == 2
                && !items.is_null()
                && *items == ffi::PyList_GetItem(p, 0)
                && *items.add(1) == ffi::PyList_GetItem(p, 1)
        }
    };
    IN_PLACE.store(ok, Ordering::Relaxed);
    Ok(())
}

/// Whether [`check_layout`] found lists read in place (for the tests).
pub(crate) fn in_place() -> bool {
    IN_PLACE.load(Ordering::Relaxed)
}

/// Call `f(i, item)` for each item of `list` in order, each a borrowed
/// pointer to a live object, until it breaks; its break, or `Continue` after
/// the last item.
///
/// # Safety
/// The GIL is held and `f` runs no Python code (nothing that could change
/// `list` or free its items): the items are not owned here.
#[inline(always)]
pub(crate) unsafe fn try_for_each_item<B>(
    list: &Bound<'_, PyList>,
    mut f: impl FnMut(usize, *mut ffi::PyObject) -> ControlFlow<B>,
) -> ControlFlow<B> {
    let p = list.as_ptr();
    if IN_PLACE.load(Ordering::Relaxed) {
        // SAFETY: the layout was checked at import; the list's size and
        // array are read once, and `f` cannot change them (the caller's
        // promise). A list of no items may have no array.
        let items: &[*mut ffi::PyObject] = unsafe {
            let raw = p.cast::<RawList>();
            let n = (*raw).ob_base.ob_size as usize;
            if n == 0 {
                &[]
            } else {
                std::slice::from_raw_parts((*raw).ob_item, n)
            }
        };
        for (i, &item) in items.iter().enumerate() {
            f(i, item)?;
        }
    } else {
        for i in 0..list.len() {
            // SAFETY: the GIL is held and `i` is below the list's length,
            // which `f` cannot change: the item exists.
            let item = unsafe { ffi::PyList_GetItem(p, i as ffi::Py_ssize_t) };
            debug_assert!(!item.is_null());
            f(i, item)?;
        }
    }
    ControlFlow::Continue(())
}

/// The length of an exact list given as a borrowed pointer.
///
/// # Safety
/// `p` is a live exact list and the GIL is held.
#[inline(always)]
pub(crate) unsafe fn list_len(p: *mut ffi::PyObject) -> usize {
    // SAFETY: a list is a variable-size object in every layout (its size is
    // `Py_SIZE`, part of the stable ABI)
    unsafe { ffi::Py_SIZE(p) as usize }
}
