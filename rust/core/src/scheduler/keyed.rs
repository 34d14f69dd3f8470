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
use crate::client::ClientId;
use crate::keys::{ClientKey, ClientKeys, KeyRef};

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

    /// Replace the key table: a restored snapshot's keys (index = client id).
    pub(crate) fn set_keys(&mut self, keys: ClientKeys) {
        self.keys = keys;
    }

    /// The invariant at the top of this module.
    pub(crate) fn check_keys(&self) -> Result<(), String> {
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
