//! The per-tenant metrics' choice of the tenants with a label of their own
//! (`vtc.metrics`, `TenantMetrics._relabel` with more tenants than labels),
//! from a [`FairnessWindow`]'s gains over its last refresh's window, in one
//! call: the labelled tenants' gains, the candidates above the bar, their
//! order and the swaps, which Python made with one object per candidate and
//! two sorts (~0.2 ms a refresh at 1,000 tenants; issue 16 item 6).
//!
//! The rule, as the Python computed it (`max(g, 0)` of a labelled tenant's
//! gain `g`: a tenant forgotten and back has less than at its start):
//!
//! 1. Over `limit`, the least served labelled tenants go (ties: by label
//!    value, a name before an int key), least served first.
//! 2. The bar: `-inf` while a label is free (or none is held), else the
//!    least gain of the labelled tenants times `factor` (`1 + LABEL_MARGIN`).
//! 3. The candidates: the keyed clients not labelled that gained more than
//!    the bar, most served first (ties: by label value, a name before an int
//!    key), less those whose label value (a name, an int key's decimal form)
//!    a labelled tenant or an earlier candidate holds, or that is `reserved`
//!    (the metrics' `_other`, which sums the tenants without a label)
//!    (`clash`: the first passed over, for the metrics' warning).
//! 4. The first candidates take the free labels; each next one takes the
//!    label of the least served labelled tenant left (ties: the last by label
//!    value first) while it gained more than `factor` times as much.
//!
//! Gains are not NaN for a labelled tenant the scheduler has; any other value
//! orders without panicking (NaN below every number).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use crate::fairness::FairnessWindow;
use crate::keys::{ClientKey, KeyRef};
use crate::scheduler::Scheduler;

/// Who holds the label value a candidate passed over has.
#[derive(Debug, Clone, PartialEq)]
pub enum Holder<'c> {
    /// The labelled tenant at this index of the `labelled` argument.
    Labelled(usize),
    /// A candidate that took it before.
    Candidate(&'c ClientKey),
    /// Nobody: the value is reserved.
    Reserved,
}

/// What [`FairnessWindow::relabel`] decides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Relabel<'c> {
    /// Indices into `labelled` of the tenants over the limit, in the order
    /// they go.
    pub dropped: Vec<usize>,
    /// The tenants that take the free labels, in order.
    pub taken: Vec<&'c ClientKey>,
    /// `(tenant, index into labelled of the tenant whose label it takes)`.
    pub swaps: Vec<(&'c ClientKey, usize)>,
    /// The first candidate passed over for its label value, and its holder.
    pub clash: Option<(Holder<'c>, &'c ClientKey)>,
}

/// A tenant's label value as bytes: a name's own, an int key's decimal form.
fn label_of_ref<'a>(k: &'a KeyRef<'_>) -> Cow<'a, [u8]> {
    match k {
        KeyRef::Int(i) => Cow::Owned(i.to_string().into_bytes()),
        KeyRef::Str(s) => Cow::Borrowed(s),
    }
}

fn label_of(k: &ClientKey) -> Cow<'_, [u8]> {
    match k {
        ClientKey::Int(i) => Cow::Owned(i.to_string().into_bytes()),
        ClientKey::Str(s) => Cow::Borrowed(s),
    }
}

/// A total order of gains: NaN below every number, `-0.0 == 0.0`.
fn by_gain(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// `max(g, 0.0)` as Python's `max` takes it (NaN stays NaN).
fn clamp(g: f64) -> f64 {
    if 0.0 > g {
        0.0
    } else {
        g
    }
}

struct Candidate<'c> {
    gain: f64,
    label: Cow<'c, [u8]>,
    int: bool,
    key: &'c ClientKey,
}

impl FairnessWindow {
    /// The labels' changes for `labelled` (the tenants with a label, each a
    /// key of `core` or not) at most `limit` labels, and `factor` the margin
    /// a candidate must beat; no candidate takes the label value `reserved`
    /// (see the module doc). Never fails.
    pub fn relabel<'c>(
        &self,
        core: &'c Scheduler,
        labelled: &[KeyRef<'_>],
        limit: usize,
        factor: f64,
        reserved: Option<&[u8]>,
    ) -> Relabel<'c> {
        let mut out = Relabel::default();
        let got: Vec<f64> = self.gains(core, labelled).into_iter().map(clamp).collect();
        let labels: Vec<Cow<'_, [u8]>> = labelled.iter().map(label_of_ref).collect();
        let name = |i: usize| (&labels[i][..], matches!(labelled[i], KeyRef::Int(_)));
        let mut kept: Vec<usize> = (0..labelled.len()).collect();
        if kept.len() > limit {
            kept.sort_by(|&a, &b| by_gain(got[a], got[b]).then_with(|| name(a).cmp(&name(b))));
            out.dropped = kept.drain(..kept.len() - limit).collect();
            kept.sort_unstable();
        }
        let free = limit - kept.len();
        let bar = match kept.split_first() {
            Some((&first, rest)) if free == 0 => {
                // Python's min: the first value, replaced by each one below it
                let low = rest.iter().fold(
                    got[first],
                    |low, &i| {
                        if got[i] < low {
                            got[i]
                        } else {
                            low
                        }
                    },
                );
                low * factor
            }
            _ => f64::NEG_INFINITY,
        };
        let excluded: HashSet<u32> = kept
            .iter()
            .filter_map(|&i| core.client_of(&labelled[i]).map(|c| c.0))
            .collect();
        let mut candidates: Vec<Candidate<'c>> = core
            .keyed_clients()
            .filter(|(c, _)| !excluded.contains(&c.0))
            .filter_map(|(c, key)| {
                let cl = core.client(c).ok()?;
                let gain = self.gain(c, key, cl.service());
                (gain > bar).then(|| Candidate {
                    gain,
                    label: label_of(key),
                    int: matches!(key, ClientKey::Int(_)),
                    key,
                })
            })
            .collect();
        if let Some(value) = reserved {
            candidates.retain(|c| {
                let free = c.label[..] != *value;
                if !free && out.clash.is_none() {
                    out.clash = Some((Holder::Reserved, c.key));
                }
                free
            });
        }
        if candidates.is_empty() {
            return out;
        }
        let order = |a: &Candidate<'_>, b: &Candidate<'_>| {
            by_gain(b.gain, a.gain)
                .then_with(|| a.label.cmp(&b.label))
                .then_with(|| a.int.cmp(&b.int))
        };
        // Label values clash only between an int key and a name: without int keys
        // no candidate is passed over, and at most `limit` of them (the free
        // labels, then one per incumbent) can take a label, so only those are
        // ordered.
        let ints = candidates.iter().any(|c| c.int)
            || kept.iter().any(|&i| matches!(labelled[i], KeyRef::Int(_)));
        let mut claimed = Vec::with_capacity(candidates.len().min(limit));
        if !ints {
            if candidates.len() > limit {
                if limit == 0 {
                    return out;
                }
                candidates.select_nth_unstable_by(limit - 1, order);
                candidates.truncate(limit);
            }
            candidates.sort_by(order);
            claimed.extend(candidates.iter().map(|c| (c.gain, c.key)));
        } else {
            candidates.sort_by(order);
            let mut held: HashMap<Cow<'_, [u8]>, Holder<'c>> = kept
                .iter()
                .map(|&i| (labels[i].clone(), Holder::Labelled(i)))
                .collect();
            for cand in &candidates {
                if let Some(holder) = held.get(&cand.label[..]) {
                    if out.clash.is_none() {
                        out.clash = Some((holder.clone(), cand.key));
                    }
                    continue;
                }
                held.insert(cand.label.clone(), Holder::Candidate(cand.key));
                claimed.push((cand.gain, cand.key));
            }
        }
        out.taken = claimed.iter().take(free).map(|&(_, k)| k).collect();
        // the labelled tenants, least served first (ties: the last by name first)
        let mut incumbents = kept;
        incumbents.sort_by(|&a, &b| by_gain(got[a], got[b]).then_with(|| name(b).cmp(&name(a))));
        for (&(gain, key), &old) in claimed.iter().skip(free).zip(&incumbents) {
            if gain <= got[old] * factor {
                break; // and every later pair: candidates decrease, incumbents increase
            }
            out.swaps.push((key, old));
        }
        out
    }
}
