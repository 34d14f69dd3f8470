//! The Scheduler's calls that change requests: submit, the built-in loop
//! (`schedule`, `decode()`), and engine mode (`peek`/`pop`, `decode` with
//! ids, `decode_all`, `decode_outputs`, `set_aside`/`put_back`, `preempt`,
//! `finish`, `cancel`). Each reads its arguments (`convert`), takes the
//! lock, calls the core and converts the result.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString};
use vtc_core::{CoreError, KeyRef, RequestState, Tokens};

use crate::args::{
    CachedLen, Client, Int, PredictedOutput, Priority, PromptLen, RequestId, TokenCount,
};
use crate::convert::{
    int_arg_sat, read_exact_ints, rid_of, sized_len, token_count_arg, tokens_of, Ints,
};
use crate::errors::{invalid, Error, Result};
use crate::keys::str_key;
use crate::lookup::PyLookup;
use crate::outputs::{missing_arg, uniform_count, Outputs};
use crate::{Guard, PyScheduler, DETACH_MIN};

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

impl PyScheduler {
    /// The core's head popped, under the held lock `g`, with `cached` of its
    /// prompt tokens cached (the core checks the range), through `lookup`, the
    /// locality window's prefix lookup while it is on: the lookup's failure is
    /// its own error, every other failure the core's.
    fn pop_locked(
        g: &mut Guard<'_>,
        lookup: Option<&mut PyLookup<'_, '_>>,
        cached: i64,
    ) -> Result<Option<u64>> {
        match lookup {
            None => g.core.pop_cached(Some(cached)).map_err(Error::Core),
            Some(l) => g.core.pop_with(Some(cached), l).map_err(|e| match e {
                CoreError::InvalidCached { .. } => Error::Core(e),
                e => l.error(e),
            }),
        }
    }

    /// `pop(cached)` for native callers (`cached` an i64): the request admitted,
    /// None if none waits.
    pub(crate) fn pop_head(&self, py: Python<'_>, cached: i64) -> Result<Option<u64>> {
        let mut g = self.lock(py)?;
        let window = g.window_lookup(py);
        let mut lookup = window.as_ref().map(PyLookup::new);
        Self::pop_locked(&mut g, lookup.as_mut(), cached)
    }

    /// `submit(rid, tenant, prompt_len, priority=priority)` for native callers.
    pub(crate) fn submit_str(
        &self,
        py: Python<'_>,
        rid: u64,
        tenant: &Bound<'_, PyString>,
        prompt_len: i64,
        priority: i64,
    ) -> Result<()> {
        let key = KeyRef::Str(str_key(tenant.as_borrowed())?);
        let mut g = self.lock(py)?;
        Ok(g.core
            .submit_keyed(rid, &key, prompt_len, 0, None, priority)?)
    }

    /// A finished request leaves the core, as `vtc.adapter.Requests` releases it:
    /// `finish` if it runs, else `cancel` if the core holds it.
    pub(crate) fn finish_or_cancel(&self, py: Python<'_>, rid: u64) -> Result<()> {
        let mut g = self.lock(py)?;
        match g.core.status(rid) {
            Some(RequestState::Running) => g.core.finish(rid)?,
            Some(_) => g.core.cancel(rid)?,
            None => {}
        }
        Ok(())
    }

    /// `decode_all(t)` of a step known to hold `n` outputs of `t` tokens each, one
    /// per distinct running request (the caller knows both; neither is read here):
    /// charged, and true, when `t >= 1` and `n` is the core's `num_running`; else
    /// nothing is charged, and false (the caller then reads the step by id).
    pub(crate) fn decode_counted(&self, py: Python<'_>, n: usize, t: i64) -> Result<bool> {
        let mut g = self.lock(py)?;
        if t < 1 || n != g.core.num_running() {
            return Ok(false);
        }
        if n >= DETACH_MIN {
            // as `decode_all`: inside predictions it walks the requests
            py.detach(|| g.core.decode_all(t))?;
        } else {
            g.core.decode_all(t)?;
        }
        Ok(true)
    }

    /// `decode([rid], [tokens])` for native callers.
    pub(crate) fn decode_one(&self, py: Python<'_>, rid: u64, tokens: i64) -> Result<()> {
        self.lock(py)?.core.decode(&[rid], Tokens::Each(tokens))?;
        Ok(())
    }

    /// The common engine-form call, `decode(ids, tokens)` with `ids` an exact
    /// list of exact ints in [0, 2**63) and `tokens` absent, an exact int in
    /// i64 or an exact list of as many exact ints in i64: the lists are read
    /// under the lock straight into the scratch buffers the core reads
    /// (`read_exact_ints`: no Python code runs, so taking the lock first
    /// changes no order of errors). `None` when the call is not of that shape
    /// (nothing observable has happened then): the general path reads it.
    fn decode_exact_lists<'py>(
        &self,
        py: Python<'py>,
        ids: Option<&Bound<'py, PyAny>>,
        tokens: Option<&Bound<'py, PyAny>>,
    ) -> Option<Result<Bound<'py, PyList>>> {
        let ids = ids?.cast_exact::<PyList>().ok()?;
        let (each, per) = match tokens {
            None => (Some(1), None),
            Some(t) => match t.cast_exact::<PyInt>() {
                Ok(t) => (Some(t.extract::<i64>().ok()?), None),
                Err(_) => (None, Some(t.cast_exact::<PyList>().ok()?)),
            },
        };
        let mut g = match self.lock(py) {
            Ok(g) => g,
            Err(e) => return Some(Err(e)),
        };
        let inner = &mut *g;
        let scratch = &mut inner.scratch;
        if !read_exact_ints(ids, &mut scratch.ids, |v| u64::try_from(v).ok()) {
            return None;
        }
        let toks = match (each, per) {
            (Some(e), _) => Tokens::Each(e),
            (None, Some(per)) => {
                if per.len() != scratch.ids.len()
                    || !read_exact_ints(per, &mut scratch.tokens, Some)
                {
                    return None;
                }
                Tokens::PerRequest(&scratch.tokens)
            }
            (None, None) => return None,
        };
        let done = decode_batch(py, &mut inner.core, &scratch.ids, toks);
        drop(g);
        Some(done.map(|()| PyList::empty(py)))
    }
}

#[pymethods]
impl PyScheduler {
    #[pyo3(signature = (request_id, client, prompt_len, cached_len = None, predicted_output = None, priority = None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        request_id: RequestId,
        client: Client<'_>,
        prompt_len: Int<PromptLen>,
        cached_len: Option<Int<CachedLen>>,
        predicted_output: Option<Int<PredictedOutput>>,
        priority: Option<Int<Priority>>,
    ) -> Result<()> {
        let cached = cached_len.map_or(0, |c| c.0);
        let predicted = predicted_output.map(|p| p.0);
        let priority = priority.map_or(0, |p| p.0);
        Ok(self.lock(py)?.core.submit_keyed(
            request_id.0,
            &client.0,
            prompt_len.0,
            cached,
            predicted,
            priority,
        )?)
    }

    fn schedule<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyList>> {
        let mut out = Vec::new();
        {
            let mut g = self.lock(py)?;
            match g.window_lookup(py) {
                None => {
                    g.core.schedule(&mut out);
                }
                Some(f) => {
                    let mut lookup = PyLookup::new(&f);
                    g.core
                        .schedule_with(&mut out, &mut lookup)
                        .map_err(|e| lookup.error(e))?;
                }
            }
        }
        Ok(PyList::new(py, out)?)
    }

    #[pyo3(signature = (request_ids = None, tokens = None))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        request_ids: Option<&Bound<'py, PyAny>>,
        tokens: Option<&Bound<'py, PyAny>>,
    ) -> Result<Bound<'py, PyList>> {
        if let Some(done) = self.decode_exact_lists(py, request_ids, tokens) {
            return done;
        }
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
                Toks::Each(token_count_arg(t))
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
    fn decode_all(&self, py: Python<'_>, tokens: Option<TokenCount>) -> Result<()> {
        let t = tokens.map_or(1, |t| t.0);
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
    /// `key_id(key)` (with `missing="hash-str"`, only for a `str` key). One
    /// call with no Python-level loop; all or nothing.
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
        let missing = missing_arg(missing)?;
        // Never sized from `len(outputs)` (it may lie); an iterable other
        // than a list is read up to one more output than there are running
        // requests (more is an error whatever they hold).
        let limit = if outputs.is_exact_instance_of::<PyList>() {
            usize::MAX
        } else {
            self.lock(py)?.core.num_running().saturating_add(1)
        };
        let read = Outputs::read(outputs, request_ids, missing, id_attr, tokens_attr, limit)?;
        let mut g = self.lock(py)?;
        if read.more {
            g.core
                .check_decode(&read.rids, Tokens::PerRequest(&read.tokens))?;
            return Err(invalid(format!(
                "outputs has more than {limit} items, more than there are running requests"
            )));
        }
        decode_batch(
            py,
            &mut g.core,
            &read.rids,
            Tokens::PerRequest(&read.tokens),
        )
    }

    /// Engine form of `decode_all` for an engine step's output objects whose
    /// requests the caller knows to be distinct running requests (the ids
    /// are not read, so this is not checked): if `outputs` is a list of
    /// exactly `num_running` objects that each hold the same number `t >= 1`
    /// of tokens (`uniform_count`), charges `decode_all(t)`, the charges of
    /// `decode_outputs` for them, and returns true; otherwise charges
    /// nothing and returns false (the caller then reads the ids:
    /// `decode_outputs`). O(outputs) attribute reads, O(running clients) in
    /// the core. `tokens_attr=None`: each item of `outputs` is itself its
    /// tokens (a list of token lists, as an engine's sampler returns them).
    #[pyo3(
        signature = (outputs, /, *, tokens_attr = Some("new_token_ids")),
        text_signature = "(self, outputs, /, *, tokens_attr='new_token_ids')"
    )]
    pub(crate) fn decode_uniform(
        &self,
        py: Python<'_>,
        outputs: &Bound<'_, PyAny>,
        tokens_attr: Option<&str>,
    ) -> Result<bool> {
        // read before the lock: attribute reads may run Python code
        let Some((n, t)) = uniform_count(outputs, tokens_attr) else {
            return Ok(false);
        };
        self.decode_counted(py, n, t)
    }

    fn finish(&self, py: Python<'_>, request_id: RequestId) -> Result<()> {
        self.lock(py)?.core.finish(request_id.0)?;
        Ok(())
    }

    fn cancel(&self, py: Python<'_>, request_id: RequestId) -> Result<()> {
        self.lock(py)?.core.cancel(request_id.0)?;
        Ok(())
    }

    fn preempt(&self, py: Python<'_>, request_id: RequestId) -> Result<()> {
        self.lock(py)?.core.preempt(request_id.0)?;
        Ok(())
    }

    pub(crate) fn peek(&self, py: Python<'_>) -> Result<Option<u64>> {
        let mut g = self.lock(py)?;
        match g.window_lookup(py) {
            None => Ok(g.core.peek()),
            Some(f) => {
                let mut lookup = PyLookup::new(&f);
                g.core.peek_with(&mut lookup).map_err(|e| lookup.error(e))
            }
        }
    }

    fn set_aside(&self, py: Python<'_>) -> Result<Option<u64>> {
        let mut g = self.lock(py)?;
        match g.window_lookup(py) {
            None => Ok(g.core.set_aside()),
            Some(f) => {
                let mut lookup = PyLookup::new(&f);
                g.core
                    .set_aside_with(&mut lookup)
                    .map_err(|e| lookup.error(e))
            }
        }
    }

    fn put_back(&self, py: Python<'_>, request_id: RequestId) -> Result<()> {
        self.lock(py)?.core.put_back(request_id.0)?;
        Ok(())
    }

    #[pyo3(signature = (cached_len = None))]
    fn pop(&self, py: Python<'_>, cached_len: Option<&Bound<'_, PyAny>>) -> Result<Option<u64>> {
        // As in `vtc.reference`, `cached_len` is checked only when there is
        // a request to pop, after the selection (and its prefix lookups): on
        // an empty queue any argument returns None.
        let cached = cached_len.map(|c| int_arg_sat("cached_len", c));
        let mut g = self.lock(py)?;
        let window = g.window_lookup(py);
        let mut lookup = window.as_ref().map(PyLookup::new);
        let sat = match cached {
            None => {
                return match &mut lookup {
                    None => Ok(g.core.pop_cached(None)?),
                    Some(l) => g.core.pop_with(None, l).map_err(|e| l.error(e)),
                }
            }
            Some(Ok(x)) => x,
            Some(Err(e)) => {
                // a bad cached_len: the selection first, then its error
                let next = match &mut lookup {
                    None => g.core.peek(),
                    Some(l) => g.core.peek_with(l).map_err(|e| l.error(e))?,
                };
                return match next {
                    None => Ok(None),
                    Some(_) => Err(e),
                };
            }
        };
        let v = sat.v;
        // A value outside i64 is outside [0, prompt_len] too: the core
        // rejects its clamped stand-in, and the message names the real one.
        let clamped = i64::try_from(v).unwrap_or(if v < 0 { -1 } else { i64::MAX });
        Self::pop_locked(&mut g, lookup.as_mut(), clamped).map_err(|e| match e {
            Error::Core(CoreError::InvalidCached { prompt_len, .. })
                if i128::from(clamped) != v =>
            {
                invalid(format!(
                    "cached_len must be between 0 and prompt_len={prompt_len}, got {}",
                    sat.text()
                ))
            }
            e => e,
        })
    }
}
