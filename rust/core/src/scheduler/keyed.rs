//! Clients by key: the scheduler's own table of the caller's names for its
//! clients (`crate::keys`), so that adding, forgetting and snapshotting a
//! client keep its key with it.
//!
//! Invariant (`ClientKeys::check`, run by `check_invariants`): either no key
//! is interned (clients come from `add_client`), or every live client has
//! exactly one key and every key names a live client. [`intern`] is the only
//! way a key comes in (it adds the client), `forget_idle` drops the keys of
//! the clients it forgets in the same call, and a snapshot stores each
//! client's key beside its state (`Scheduler::snapshot`,
//! `Restored::interned`).
//!
//! [`intern`]: Scheduler::intern

use super::Scheduler;
use crate::client::{Client, ClientId};
use crate::error::{CoreError, Result};
use crate::keys::{ClientKey, ClientKeys, KeyRef};
use crate::limits::{counter_ok, weight_ok};

impl Scheduler {
    /// The client interned under `k`, if any.
    pub fn client_of(&self, k: &KeyRef<'_>) -> Option<ClientId> {
        self.keys.lookup(k)
    }

    /// The client interned under `k`, adding a client (counter 0, weight 1)
    /// and interning it under `k` if there is none.
    pub fn intern(&mut self, k: &KeyRef<'_>) -> ClientId {
        if let Some(c) = self.keys.lookup(k) {
            return c;
        }
        let c = self.add_client();
        self.keys.insert(c, k);
        c
    }

    /// The key client `c` was interned under (`None` if `c` is not live or
    /// came from `add_client`).
    pub fn key(&self, c: ClientId) -> Option<&ClientKey> {
        self.keys.key(c)
    }

    /// The interned clients with their keys, in id order.
    pub fn keyed_clients(&self) -> impl Iterator<Item = (ClientId, &ClientKey)> {
        self.keys.live()
    }

    /// The record of the client interned under `k`, or a new client's
    /// ([`Client::NEW`]: what [`intern`](Self::intern) would add) if there
    /// is none: the views of a key never seen (counter 0, weight 1, ...).
    pub fn client_by_key(&self, k: &KeyRef<'_>) -> &Client {
        match self.keys.lookup(k) {
            Some(c) => &self.clients[c.0 as usize],
            None => &Client::NEW,
        }
    }

    /// [`submit_priority`](Self::submit_priority) for the client interned
    /// under `k`: the request is checked once, first, so a refused one adds
    /// no client; the interned client is live, so nothing after fails.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_keyed(
        &mut self,
        rid: u64,
        k: &KeyRef<'_>,
        prompt_len: i64,
        cached_len: i64,
        predicted_output: Option<i64>,
        priority: i64,
    ) -> Result<()> {
        self.check_submit_full(rid, prompt_len, cached_len, predicted_output)?;
        let c = self.intern(k);
        self.enqueue_request(rid, c, prompt_len, cached_len, predicted_output, priority);
        Ok(())
    }

    /// [`set_weight`](Self::set_weight) for the client interned under `k`;
    /// a refused weight adds no client.
    pub fn set_weight_keyed(&mut self, k: &KeyRef<'_>, weight: f64) -> Result<()> {
        if !weight_ok(weight) {
            return Err(CoreError::InvalidWeight(weight));
        }
        let c = self.intern(k);
        self.set_weight(c, weight)
    }

    /// [`raise_counter`](Self::raise_counter) for the client interned under
    /// `k`; a refused value adds no client.
    pub fn raise_counter_keyed(&mut self, k: &KeyRef<'_>, value: f64) -> Result<()> {
        if !counter_ok(value) {
            return Err(CoreError::InvalidCounter(value));
        }
        let c = self.intern(k);
        self.raise_counter(c, value)
    }

    /// [`raise_counters`](Self::raise_counters) for clients by key: every
    /// value is checked, in order, before any client is added or counter
    /// moves.
    pub fn raise_counters_keyed(&mut self, items: &[(KeyRef<'_>, f64)]) -> Result<usize> {
        if let Some(&(_, v)) = items.iter().find(|(_, v)| !counter_ok(*v)) {
            return Err(CoreError::InvalidCounter(v));
        }
        let pairs: Vec<(ClientId, f64)> = items.iter().map(|(k, v)| (self.intern(k), *v)).collect();
        self.raise_counters(&pairs)
    }

    /// Replace the key table: a restored snapshot's keys (index = client id).
    pub(crate) fn set_keys(&mut self, keys: ClientKeys) {
        self.keys = keys;
    }

    /// The invariant at the top of this module.
    pub(crate) fn check_keys(&self) -> std::result::Result<(), String> {
        self.keys
            .check(|c| self.client(c).is_ok(), self.num_clients())
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::config::Policy;

    fn s() -> Scheduler {
        Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap()
    }

    #[test]
    fn int_and_str_keys_are_distinct_clients_and_come_back() {
        let mut core = s();
        let a = core.intern(&KeyRef::Int(7));
        let b = core.intern(&KeyRef::Str(Cow::Borrowed(b"7")));
        assert_ne!(a, b);
        assert_eq!(core.intern(&KeyRef::Int(7)), a);
        assert_eq!(core.key(b), Some(&ClientKey::Str((*b"7").into())));
        assert_eq!(core.client_of(&KeyRef::Int(8)), None);
        assert_eq!(core.num_clients(), 2);
        core.check_invariants().unwrap();
    }

    #[test]
    fn a_forgotten_key_is_released_and_its_id_reused() {
        let mut core = s();
        let a = core.intern(&KeyRef::Int(1));
        let mut gone = Vec::new();
        core.forget_idle(&mut gone);
        assert_eq!(gone, vec![a]);
        assert_eq!(core.client_of(&KeyRef::Int(1)), None);
        assert_eq!(core.key(a), None);
        core.check_invariants().unwrap();
        let b = core.intern(&KeyRef::Str(Cow::Borrowed(b"x")));
        assert_eq!(b, a, "the forgotten id is reused");
        assert_eq!(core.key(b), Some(&ClientKey::Str((*b"x").into())));
        core.check_invariants().unwrap();
    }

    #[test]
    fn refused_calls_by_key_add_no_client_and_unknown_keys_read_as_new() {
        let mut core = s();
        let k = KeyRef::Int(5);
        assert!(core.submit_keyed(1, &k, -1, 0, None, 0).is_err());
        assert!(core.set_weight_keyed(&k, 0.0).is_err());
        assert!(core.raise_counter_keyed(&k, f64::NAN).is_err());
        assert!(core
            .raise_counters_keyed(&[(k.clone(), 1.0), (KeyRef::Int(6), f64::INFINITY)])
            .is_err());
        assert_eq!(core.num_clients(), 0);
        assert_eq!(core.client_by_key(&k).weight(), 1.0);
        assert_eq!(core.client_by_key(&k).counter(), 0.0);
        core.set_weight_keyed(&k, 2.0).unwrap();
        core.raise_counters_keyed(&[(k.clone(), 3.0)]).unwrap();
        assert_eq!(core.client_by_key(&k).weight(), 2.0);
        assert_eq!(core.client_by_key(&k).counter(), 3.0);
        core.submit_keyed(1, &k, 10, 0, None, 0).unwrap();
        assert_eq!(core.num_clients(), 1);
        core.check_invariants().unwrap();
    }

    #[test]
    fn a_keyed_client_beside_an_unkeyed_one_breaks_the_invariant() {
        let mut core = s();
        core.intern(&KeyRef::Int(1));
        core.add_client();
        assert!(core.check_invariants().is_err());
    }

    #[test]
    fn a_snapshot_keeps_the_keys_and_restores_them_interned() {
        let mut core = s();
        let a = core.intern(&KeyRef::Int(-3));
        let b = core.intern(&KeyRef::Str(Cow::Borrowed(b"tenant")));
        core.set_weight(b, 2.0).unwrap();
        let data = core.snapshot();
        let back = Scheduler::restore(&data).unwrap().interned().unwrap();
        back.check_invariants().unwrap();
        assert_eq!(back.client_of(&KeyRef::Int(-3)), Some(a));
        assert_eq!(
            back.client_of(&KeyRef::Str(Cow::Borrowed(b"tenant"))),
            Some(b)
        );
        assert_eq!(back.client(b).unwrap().weight(), 2.0);
        assert_eq!(back.snapshot(), data);
        // a scheduler without keys stores empty ones: not internable
        let mut bare = s();
        bare.add_client();
        let r = Scheduler::restore(&bare.snapshot()).unwrap();
        assert!(r.interned().is_err());
    }
}
