//! Client keys: the caller's names for clients (an int or a str) interned to
//! the scheduler's dense [`ClientId`]s, and back. The table is the
//! scheduler's own (`Scheduler::intern`, `Scheduler::client_of`,
//! `Scheduler::key`): it adds and forgets clients and keys together, so the
//! two cannot drift apart. This module imports nothing from the scheduler.
//!
//! Invariant (checked by [`ClientKeys::check`], from
//! `Scheduler::check_invariants`): for every id `c` below `keys.len()`,
//! `keys[c]` is `Some(k)` only when client `c` is live and was interned under
//! `k`, and then `k`'s map (`ints` or `strs`) maps `k` to `c`; the maps hold
//! nothing else. Either no key is interned (a scheduler whose clients come
//! from `Scheduler::add_client`) or every live client has one: so the live
//! keys, the map entries and the scheduler's live clients are the same set,
//! one to one. A client gets its key when interned ([`ClientKeys::insert`],
//! after `Scheduler::add_client`, which reuses the id of a forgotten client
//! first); [`ClientKeys::release`] drops the keys of the clients
//! `Scheduler::forget_idle` forgets, in the same call, so a forgotten key
//! asked for again is a new client, and its id may now belong to another
//! key. A map whose capacity is over four times its length plus 1,024
//! shrinks at a release, so a burst of clients does not hold memory for
//! ever.
//!
//! In snapshots a key is its bytes ([`ClientKey::encode`]): tag 0 and the
//! int as 8 little-endian bytes, or tag 1 and the str's bytes.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::client::ClientId;
use crate::error::CoreError;

/// A client key: an int, or a str kept as its UTF-8 bytes, where a
/// surrogate code point (U+D800 to U+DFFF) may stand alone, as three bytes
/// (Python's `surrogatepass`: the binding encodes a str holding a lone
/// surrogate that way, so that every Python str is a key; [`str_key_ok`]
/// says which bytes are one).
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

impl From<&KeyRef<'_>> for ClientKey {
    /// The owned key of an argument (a str's bytes copied).
    fn from(k: &KeyRef<'_>) -> Self {
        match k {
            KeyRef::Int(i) => ClientKey::Int(*i),
            KeyRef::Str(s) => ClientKey::Str(s.as_ref().into()),
        }
    }
}

impl ClientKey {
    /// The key as an argument, its bytes borrowed.
    pub fn as_key_ref(&self) -> KeyRef<'_> {
        match self {
            ClientKey::Int(i) => KeyRef::Int(*i),
            ClientKey::Str(s) => KeyRef::Str(Cow::Borrowed(s)),
        }
    }

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

    /// The key of bytes made by [`encode`](Self::encode); `None` if malformed
    /// (a str's bytes included: see [`str_key_ok`]).
    pub fn decode(raw: &[u8]) -> Option<ClientKey> {
        match raw.split_first()? {
            (0, rest) => Some(ClientKey::Int(i64::from_le_bytes(rest.try_into().ok()?))),
            (1, rest) if str_key_ok(rest) => Some(ClientKey::Str(rest.into())),
            _ => None,
        }
    }
}

/// Whether `b` are the bytes of a str key: UTF-8 in which a surrogate code
/// point may also appear, encoded alone as `ED A0..=BF 80..=BF` (exactly the
/// bytes Python decodes with `bytes.decode("utf-8", "surrogatepass")`).
pub fn str_key_ok(mut b: &[u8]) -> bool {
    loop {
        match std::str::from_utf8(b) {
            Ok(_) => return true,
            Err(e) => match &b[e.valid_up_to()..] {
                [0xED, 0xA0..=0xBF, 0x80..=0xBF, rest @ ..] => b = rest,
                _ => return false,
            },
        }
    }
}

/// The interning table: key -> client id, and client id -> key.
#[derive(Debug, Default, Clone)]
pub struct ClientKeys {
    ints: HashMap<i64, u32>,
    strs: HashMap<Box<[u8]>, u32>,
    /// Key of each client id; `None` for ids the core forgot (free for reuse).
    keys: Vec<Option<ClientKey>>,
}

impl ClientKeys {
    /// The client id of `k`, if it is interned.
    pub fn lookup(&self, k: &KeyRef<'_>) -> Option<ClientId> {
        match k {
            KeyRef::Int(i) => self.ints.get(i),
            KeyRef::Str(s) => self.strs.get(s.as_ref()),
        }
        .map(|&c| ClientId(c))
    }

    /// Intern `k` as client `c`: a client the scheduler just added (a new
    /// id, or a forgotten one reused), and `k` not interned.
    pub(crate) fn insert(&mut self, c: ClientId, k: &KeyRef<'_>) {
        debug_assert!(self.lookup(k).is_none(), "key interned twice");
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
        self.keys[id] = Some(key);
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

    /// Drop the keys of clients the scheduler forgot (in
    /// `Scheduler::forget_idle`); their ids are free for it to reuse.
    pub(crate) fn release(&mut self, gone: &[ClientId]) {
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
    /// decoded in order; a malformed key or one that appears twice is
    /// [`CoreError::BadSnapshot`].
    pub(crate) fn from_snapshot_keys(raw: &[Vec<u8>]) -> Result<ClientKeys, CoreError> {
        let mut t = ClientKeys {
            keys: Vec::with_capacity(raw.len()),
            ..ClientKeys::default()
        };
        for (i, raw) in raw.iter().enumerate() {
            let key = ClientKey::decode(raw)
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

    /// The invariant at the top of this module, against the scheduler's
    /// clients: `live(c)` says whether client `c` is live, `num_clients`
    /// how many are.
    pub(crate) fn check(
        &self,
        live: impl Fn(ClientId) -> bool,
        num_clients: usize,
    ) -> Result<(), String> {
        let n = self.live().count();
        if self.len() != n || (n != 0 && n != num_clients) {
            return Err("client interning out of sync".into());
        }
        for (c, k) in self.live() {
            let mapped = match k {
                ClientKey::Int(i) => self.ints.get(i),
                ClientKey::Str(s) => self.strs.get(s),
            };
            if mapped != Some(&c.0) || !live(c) {
                return Err("client interning out of sync".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_keys_round_trip_and_bad_ones_are_refused() {
        let keys = [
            ClientKey::Int(-3),
            ClientKey::Str((*b"\xed\xa0\x80").into()),
        ];
        let raw: Vec<Vec<u8>> = keys.iter().map(ClientKey::encode).collect();
        let t = ClientKeys::from_snapshot_keys(&raw).unwrap();
        assert_eq!(t.key(ClientId(1)), Some(&keys[1]));
        for bad in [vec![], vec![2], vec![0, 1, 2], vec![1, 0xff]] {
            let e = ClientKeys::from_snapshot_keys(&[bad]).unwrap_err();
            assert!(
                e.to_string().contains("client 0 has a malformed key"),
                "{e}"
            );
        }
        let e = ClientKeys::from_snapshot_keys(&[raw[0].clone(), raw[0].clone()]).unwrap_err();
        assert!(e.to_string().contains("appears twice"), "{e}");
    }

    #[test]
    fn str_keys_are_utf8_with_lone_surrogates() {
        for ok in [
            &b""[..],
            b"abc",
            "\u{e9}\u{20ac}\u{1f600}".as_bytes(),
            b"\xed\xa0\x80",
            b"a\xed\xbf\xbfb\xed\xa0\xbd\xed\xb8\x80",
        ] {
            assert!(str_key_ok(ok), "{ok:?}");
        }
        for bad in [
            &b"\xff"[..],
            b"\xed\xa0",
            b"\xed\x9f",
            b"\xc0\x80",
            b"\xed\xc0\x80",
            b"a\xed\xa0\x80\x80",
            b"\xf4\x90\x80\x80",
        ] {
            assert!(!str_key_ok(bad), "{bad:?}");
        }
    }
}
