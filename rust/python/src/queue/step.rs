//! A step's charge: the step `scheduled` kept for `record_step` (`Kept`), whether
//! each of its requests samples one token (`one_token_each`), and the charge of
//! its outputs (`record_groups`, `charge`).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::{PyWaitingQueue, RELEASE_FINISHED};

/// A step `scheduled` kept for `record_step`.
pub(super) struct Kept {
    /// The engine's output of the step (`record_step` is told the same object).
    pub(super) output: Py<PyAny>,
    /// The core's `state_version` then: unchanged at `record_step`, every output
    /// is from a distinct request running in the core.
    pub(super) version: u64,
    /// The engine's `prefilling` set was empty after the step's chunks were
    /// counted: no request of the step is in a prefill chunk that samples nothing.
    pub(super) decodes_only: bool,
}

/*
 * one_token_each: whether each request of vLLM's step `output` samples one
 * token, given that none of them is in a prefill chunk that leaves its prompt
 * unfinished (`Kept::decodes_only`): its `scheduled_spec_decode_tokens` is an
 * empty dict (no drafts). vLLM's runner empties the list of a request whose
 * computed tokens stay below its tokens (a prefill chunk) and, without drafts,
 * samples one token for every other: a decode, or a chunk of any length that
 * finishes a prompt. Anything unreadable: false (the lists are read).
 */
pub(super) fn one_token_each(output: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = output.py();
    match output.getattr_opt(intern!(py, "scheduled_spec_decode_tokens"))? {
        Some(drafts) => Ok(drafts.cast_exact::<PyDict>().is_ok_and(|d| d.is_empty())),
        None => Ok(false),
    }
}

impl PyWaitingQueue {
    /// `record_outputs(outputs, finished, running, tokens)`, with `one_each`:
    /// each of the `tokens` lists is known to hold one token without reading
    /// them (`one_token_each`).
    pub(super) fn record_groups(
        slf: &Bound<'_, Self>,
        outputs: &Bound<'_, PyAny>,
        finished: Option<&Bound<'_, PyAny>>,
        running: bool,
        tokens: Option<&Bound<'_, PyAny>>,
        one_each: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let name = intern!(py, "outputs");
        // one group per API-server client: one here
        let mut groups = outputs.try_iter()?;
        let Some(first) = groups.next() else {
            return Ok(());
        };
        let first = first?.getattr(name)?;
        let outs = match groups.next() {
            None => first,
            Some(second) => {
                // several: their outputs in one list, group after group
                let all = PyList::empty(py);
                let rest = std::iter::once(second).chain(groups);
                for group in std::iter::once(Ok(first)).chain(rest.map(|g| g?.getattr(name))) {
                    for out in group?.try_iter()? {
                        all.append(out?)?;
                    }
                }
                all.into_any()
            }
        };
        if !outs.is_truthy()? {
            return Ok(());
        }
        slf.get().charge(py, &outs, running, tokens, one_each)?;
        let finished = match finished {
            Some(f) if !f.is_none() => f.clone(),
            _ => {
                // the outputs that say they finished
                let ids = PyList::empty(py);
                for out in outs.try_iter()? {
                    let out = out?;
                    if !out.getattr(intern!(py, "finish_reason"))?.is_none() {
                        ids.append(out.getattr(intern!(py, "request_id"))?)?;
                    }
                }
                ids.into_any()
            }
        };
        if finished.is_truthy()? {
            if Self::runs_own(slf, &RELEASE_FINISHED)? {
                Self::release_finished(slf, &finished)?;
            } else {
                slf.call_method1(RELEASE_FINISHED.name.get(py), (finished,))?;
            }
        }
        Ok(())
    }

    /// Charge a step's outputs `outs` as `Requests.charge_outputs(outs,
    /// running=running, tokens=tokens)` does. Its common step natively: every
    /// output from a distinct running request (`running`), each of the step's token
    /// lists `tokens` of one length, one per output, and no observer to tell;
    /// `decode_uniform` then charges it (the core counts a uniform decode), or
    /// `decode_counted` with no list read when each is known to hold one token
    /// (`one_each`). Any other step is `charge_outputs`' own, told what this call
    /// already learnt (lists not of one length, or not as many as the core runs:
    /// it need not read them again; a refused charge: it meets the same refusal
    /// and reads the step by id).
    pub(super) fn charge(
        &self,
        py: Python<'_>,
        outs: &Bound<'_, PyAny>,
        running: bool,
        tokens: Option<&Bound<'_, PyAny>>,
        one_each: bool,
    ) -> PyResult<()> {
        let requests = self.requests.bind(py);
        let charge_outputs = intern!(py, "charge_outputs");
        // `requests.charge_outputs(outs, running=running, tokens=tokens)`
        let by_outputs = |running: bool, tokens: Option<&Bound<'_, PyAny>>| {
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "running"), running)?;
            kwargs.set_item(intern!(py, "tokens"), tokens)?;
            requests
                .call_method(charge_outputs, (outs,), Some(&kwargs))
                .map(drop)
        };
        let lists = match tokens {
            Some(t) if running => t.cast_exact::<PyList>().ok(),
            _ => None,
        };
        if let Some(lists) = lists {
            if lists.len() == outs.len()?
                && !requests.getattr(intern!(py, "observers"))?.is_truthy()?
            {
                let core = self.core.get();
                // known to be one token a list: not read
                if one_each {
                    match core.decode_counted(py, lists.len(), 1) {
                        Ok(true) => return Ok(()),
                        // not as many as run: `decode_uniform` would count the
                        // same lists and refuse them too, so read by id now
                        Ok(false) => {
                            return requests.call_method1(charge_outputs, (outs,)).map(drop)
                        }
                        // refused: as below, without reading the lists first
                        Err(_) => return by_outputs(true, Some(lists.as_any())),
                    }
                }
                return match core.decode_uniform(py, lists.as_any(), None) {
                    Ok(true) => Ok(()),
                    // not uniform: read by id (what charge_outputs does next)
                    Ok(false) => requests.call_method1(charge_outputs, (outs,)).map(drop),
                    // refused: charge_outputs' own fallback, after the same refusal
                    Err(_) => by_outputs(true, Some(lists.as_any())),
                };
            }
        }
        by_outputs(running, tokens)
    }
}
