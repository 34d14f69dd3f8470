//! Client keys: the caller's names for clients (an int or a str) interned to
//! the scheduler's dense [`ClientId`]s, and back.
//!
//! Invariant (checked by [`ClientKeys::check`]): for every id `c` below
//! `keys.len()`, `keys[c]` is `Some(k)` exactly when the scheduler's client
//! `c` is live and was interned under `k`, and then `k`'s map (`ints` or
//! `strs`) maps `k` to `c`; the maps hold nothing else. So the live keys, the
//! map entries and the scheduler's live clients are the same set, one to
//! one. [`ClientKeys::intern`] adds a client with
//! [`Scheduler::add_client`], which reuses the id of a forgotten client
//! first (the core's free list); [`ClientKeys::release`] drops the keys of
//! the clients [`Scheduler::forget_idle`] forgot, so a forgotten key asked
//! for again is a new client, and its id may now belong to another key. A
//! map whose capacity is over four times its length plus 1,024 shrinks at a
//! release, so a burst of clients does not hold memory for ever.
//!
//! In snapshots a key is its bytes ([`ClientKey::encode`]): tag 0 and the
//! int as 8 little-endian bytes, or tag 1 and the str's bytes.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::client::ClientId;
use crate::error::CoreError;
use crate::scheduler::Scheduler;

/// A client key: an int, or a str kept as its UTF-8 bytes (the Python
/// binding encodes a str holding a lone surrogate, which is not valid UTF-8,
/// with `surrogatepass`, so that every Python str is a key).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClientKey {
    Int(i64),
    Str(Box<[u8]>),
}

/// A key as an argument: a str's bytes borrowed when they can be.
#[derive(Clone, Debug)]
pub enum KeyRef<'a> {
    Int(i64),
    Str(Cow<'a, [u8]>),
}

impl ClientKey {
    /// Snapshot key bytes: tag 0 + i64 (little-endian) or tag 1 + the bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ClientKey::Int(i) => {
                let mut v = vec![0u8];
                v.extend_from_slice(&i.to_le_bytes());
                v
            }
            ClientKey::Str(s) => {
                let mut v = vec![1u8];
                v.extend_from_slice(s);
                v
            }
        }
    }

    /// The key of bytes made by [`encode`](Self::encode); `None` if malformed.
    pub fn decode(raw: &[u8]) -> Option<ClientKey> {
        match raw.split_first()? {
            (0, rest) => Some(ClientKey::Int(i64::from_le_bytes(rest.try_into().ok()?))),
            (1, rest) => Some(ClientKey::Str(rest.into())),
            _ => None,
        }
    }
}

/// The interning table: key -> client id, and client id -> key.
#[derive(Debug, Default)]
pub struct ClientKeys {
    ints: HashMap<i64, u32>,
    strs: HashMap<Box<[u8]>, u32>,
    /// Key of each client id; `None` for ids the core forgot (free for reuse).
    keys: Vec<Option<ClientKey>>,
}

impl ClientKeys {
    pub fn new() -> Self {
        Self::default()
    }

    /// The client id of `k`, if it is interned.
    pub fn lookup(&self, k: &KeyRef<'_>) -> Option<ClientId> {
        match k {
            KeyRef::Int(i) => self.ints.get(i),
            KeyRef::Str(s) => self.strs.get(s.as_ref()),
        }
        .map(|&c| ClientId(c))
    }

    /// The client id of `k`, adding a client to `core` if it is new.
    pub fn intern(&mut self, core: &mut Scheduler, k: &KeyRef<'_>) -> ClientId {
        if let Some(c) = self.lookup(k) {
            return c;
        }
        let c = core.add_client();
        let key = match k {
            KeyRef::Int(i) => {
                self.ints.insert(*i, c.0);
                ClientKey::Int(*i)
            }
            KeyRef::Str(s) => {
                let b: Box<[u8]> = s.as_ref().into();
                self.strs.insert(b.clone(), c.0);
                ClientKey::Str(b)
            }
        };
        let id = c.0 as usize;
        if id >= self.keys.len() {
            self.keys.resize(id + 1, None);
        }
        self.keys[id] = Some(key); // a new id, or a forgotten one reused
        c
    }

    /// The key of client `c`, if it is live.
    pub fn key(&self, c: ClientId) -> Option<&ClientKey> {
        self.keys.get(c.0 as usize).and_then(Option::as_ref)
    }

    /// Live clients as (id, key), in id order.
    pub fn live(&self) -> impl Iterator<Item = (ClientId, &ClientKey)> {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| k.as_ref().map(|k| (ClientId(i as u32), k)))
    }

    /// How many keys are interned.
    pub fn len(&self) -> usize {
        self.ints.len() + self.strs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop the keys of clients the core forgot (`Scheduler::forget_idle`'s
    /// list); their ids are free for the core to reuse.
    pub fn release(&mut self, gone: &[ClientId]) {
        for c in gone {
            match self.keys.get_mut(c.0 as usize).and_then(Option::take) {
                Some(ClientKey::Int(i)) => {
                    self.ints.remove(&i);
                }
                Some(ClientKey::Str(s)) => {
                    self.strs.remove(&s);
                }
                None => {}
            }
        }
        if self.ints.capacity() > 4 * self.ints.len() + 1024 {
            self.ints.shrink_to_fit();
        }
        if self.strs.capacity() > 4 * self.strs.len() + 1024 {
            self.strs.shrink_to_fit();
        }
    }

    /// The table of a restored snapshot's keys (index = client id), each
    /// decoded and accepted by `valid` (what the caller can represent), in
    /// order; a malformed key or one that appears twice is
    /// [`CoreError::BadSnapshot`].
    pub fn from_snapshot_keys(
        raw: &[Vec<u8>],
        mut valid: impl FnMut(&ClientKey) -> bool,
    ) -> Result<ClientKeys, CoreError> {
        let mut t = ClientKeys {
            keys: Vec::with_capacity(raw.len()),
            ..ClientKeys::default()
        };
        for (i, raw) in raw.iter().enumerate() {
            let key = ClientKey::decode(raw)
                .filter(|k| valid(k))
                .ok_or_else(|| CoreError::BadSnapshot(format!("client {i} has a malformed key")))?;
            let dup = match &key {
                ClientKey::Int(v) => t.ints.insert(*v, i as u32).is_some(),
                ClientKey::Str(v) => t.strs.insert(v.clone(), i as u32).is_some(),
            };
            if dup {
                return Err(CoreError::BadSnapshot(format!(
                    "client key {key:?} appears twice"
                )));
            }
            t.keys.push(Some(key));
        }
        Ok(t)
    }

    /// The invariant at the top of this module, against `core`.
    pub fn check(&self, core: &Scheduler) -> Result<(), String> {
        let live = self.live().count();
        if live != core.num_clients() || self.len() != live {
            return Err("client interning out of sync".into());
        }
        for (c, k) in self.live() {
            let mapped = match k {
                ClientKey::Int(i) => self.ints.get(i),
                ClientKey::Str(s) => self.strs.get(s),
            };
            if mapped != Some(&c.0) || core.client(c).is_err() {
                return Err("client interning out of sync".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Policy;

    fn s() -> Scheduler {
        Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap()
    }

    #[test]
    fn int_and_str_keys_are_distinct_clients_and_come_back() {
        let mut core = s();
        let mut t = ClientKeys::new();
        let a = t.intern(&mut core, &KeyRef::Int(7));
        let b = t.intern(&mut core, &KeyRef::Str(Cow::Borrowed(b"7")));
        assert_ne!(a, b);
        assert_eq!(t.intern(&mut core, &KeyRef::Int(7)), a);
        assert_eq!(t.key(b), Some(&ClientKey::Str((*b"7").into())));
        assert_eq!(t.lookup(&KeyRef::Int(8)), None);
        assert_eq!(core.num_clients(), 2);
        t.check(&core).unwrap();
    }

    #[test]
    fn a_forgotten_key_is_released_and_its_id_reused() {
        let mut core = s();
        let mut t = ClientKeys::new();
        let a = t.intern(&mut core, &KeyRef::Int(1));
        let mut gone = Vec::new();
        core.forget_idle(&mut gone);
        assert_eq!(gone, vec![a]);
        t.release(&gone);
        assert_eq!(t.lookup(&KeyRef::Int(1)), None);
        t.check(&core).unwrap();
        let b = t.intern(&mut core, &KeyRef::Str(Cow::Borrowed(b"x")));
        assert_eq!(b, a, "the forgotten id is reused");
        assert_eq!(t.key(b), Some(&ClientKey::Str((*b"x").into())));
        t.check(&core).unwrap();
    }

    #[test]
    fn snapshot_keys_round_trip_and_bad_ones_are_refused() {
        let keys = [
            ClientKey::Int(-3),
            ClientKey::Str((*b"\xed\xa0\x80").into()),
        ];
        let raw: Vec<Vec<u8>> = keys.iter().map(ClientKey::encode).collect();
        let t = ClientKeys::from_snapshot_keys(&raw, |_| true).unwrap();
        assert_eq!(t.key(ClientId(1)), Some(&keys[1]));
        for bad in [vec![], vec![2], vec![0, 1, 2]] {
            let e = ClientKeys::from_snapshot_keys(&[bad], |_| true).unwrap_err();
            assert!(
                e.to_string().contains("client 0 has a malformed key"),
                "{e}"
            );
        }
        let e = ClientKeys::from_snapshot_keys(&[raw[0].clone(), raw[0].clone()], |_| true)
            .unwrap_err();
        assert!(e.to_string().contains("appears twice"), "{e}");
        let e =
            ClientKeys::from_snapshot_keys(&raw, |k| matches!(k, ClientKey::Int(_))).unwrap_err();
        assert!(
            e.to_string().contains("client 1 has a malformed key"),
            "{e}"
        );
    }
}
