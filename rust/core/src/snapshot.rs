//! Snapshots: the fairness state that must survive an engine restart.
//!
//! A snapshot holds the configuration (M, wp, wq, policy), every client's
//! counter, delivered service and weight with an opaque key supplied by the
//! caller (the Python binding stores the tenant key there), and the client
//! that last left the backlog. Requests are not included: an engine that
//! restarts has lost its batch and resubmits what it still owes. Nor are the
//! per-client token tallies ([`Scheduler::tokens`]): they are statistics, not
//! fairness state, and a restored scheduler starts every client's tally at 0.
//!
//! Format, version 1, little-endian:
//!
//! ```text
//! magic  b"VTCSNAP\0"          8 bytes
//! version u32                  = 1
//! length  u64                  payload bytes
//! crc32   u32                  of the payload (IEEE)
//! payload:
//!   budget u64, wp f64, wq f64, policy u8 (0 vtc, 1 lcf, 2 fcfs)
//!   n_clients u64, then per client:
//!     key_len u32, key bytes, counter f64, service f64, weight f64
//!   last_left u64 (u64::MAX for none)
//! ```
//!
//! Decoding checks everything (magic, version, length, checksum, every value)
//! before it builds anything, so a truncated or corrupted snapshot is an
//! error, never a half-restored scheduler.

use crate::client::ClientId;
use crate::error::{CoreError, Result};
use crate::scheduler::{Policy, Scheduler};

const MAGIC: &[u8; 8] = b"VTCSNAP\0";
pub const SNAPSHOT_VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 4;

fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (i, t) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *t = c;
    }
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ b as u32) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

fn bad(msg: impl Into<String>) -> CoreError {
    CoreError::BadSnapshot(msg.into())
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.data.len() - self.pos < n {
            return Err(bad(format!("truncated while reading {what}")));
        }
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
    fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
}

/// One client as stored in a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRecord {
    pub key: Vec<u8>,
    pub counter: f64,
    pub service: f64,
    pub weight: f64,
}

/// A decoded snapshot: a scheduler with no requests, and each client's key
/// (index = `ClientId`).
pub struct Restored {
    pub scheduler: Scheduler,
    pub keys: Vec<Vec<u8>>,
}

impl Scheduler {
    /// Encode the fairness state; `key_of(id)` gives the caller's key bytes
    /// for each client id.
    pub fn snapshot(&self, mut key_of: impl FnMut(ClientId) -> Vec<u8>) -> Vec<u8> {
        let mut p = Vec::with_capacity(64 + self.num_clients() * 40);
        p.extend_from_slice(&self.budget().to_le_bytes());
        p.extend_from_slice(&self.wp().to_le_bytes());
        p.extend_from_slice(&self.wq().to_le_bytes());
        p.push(match self.policy() {
            Policy::Vtc => 0,
            Policy::Lcf => 1,
            Policy::Fcfs => 2,
        });
        // forgotten ids are skipped: snapshot position = restored id
        let ids: Vec<ClientId> = (0..self.client_id_bound())
            .map(ClientId)
            .filter(|&c| self.client(c).is_ok())
            .collect();
        p.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        for &id in &ids {
            let c = self.client(id).expect("live client");
            let key = key_of(id);
            p.extend_from_slice(&(key.len() as u32).to_le_bytes());
            p.extend_from_slice(&key);
            p.extend_from_slice(&c.counter().to_le_bytes());
            p.extend_from_slice(&c.service().to_le_bytes());
            p.extend_from_slice(&c.weight().to_le_bytes());
        }
        let last = self
            .last_left()
            .and_then(|l| ids.iter().position(|&c| c == l))
            .map_or(u64::MAX, |pos| pos as u64);
        p.extend_from_slice(&last.to_le_bytes());

        let mut out = Vec::with_capacity(HEADER + p.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32(&p).to_le_bytes());
        out.extend_from_slice(&p);
        out
    }

    /// Decode a snapshot made by [`snapshot`](Self::snapshot). Every
    /// client's token tally ([`tokens`](Self::tokens)) starts at 0: the
    /// format does not store it.
    pub fn restore(data: &[u8]) -> Result<Restored> {
        let mut h = Reader { data, pos: 0 };
        if h.take(8, "the magic bytes")? != MAGIC {
            return Err(bad("not a vtc snapshot (bad magic bytes)"));
        }
        let version = h.u32("the version")?;
        if version != SNAPSHOT_VERSION {
            return Err(bad(format!(
                "snapshot version {version} is not supported (this build reads {SNAPSHOT_VERSION})"
            )));
        }
        let len = h.u64("the length")?;
        let crc = h.u32("the checksum")?;
        let payload = &data[HEADER..];
        if payload.len() as u64 != len {
            return Err(bad(format!(
                "snapshot payload is {} bytes, header says {len} (truncated or padded)",
                payload.len()
            )));
        }
        if crc32(payload) != crc {
            return Err(bad("snapshot checksum mismatch (corrupted)"));
        }
        let mut r = Reader {
            data: payload,
            pos: 0,
        };
        let budget = r.u64("M")?;
        let wp = r.f64("wp")?;
        let wq = r.f64("wq")?;
        let policy = match r.u8("the policy")? {
            0 => Policy::Vtc,
            1 => Policy::Lcf,
            2 => Policy::Fcfs,
            p => return Err(bad(format!("unknown policy code {p}"))),
        };
        let budget = i64::try_from(budget).map_err(|_| bad(format!("M {budget} out of range")))?;
        let mut s = Scheduler::new(budget, wp, wq, policy).map_err(|e| bad(e.to_string()))?;
        let n = r.u64("the client count")?;
        // each client takes at least 28 bytes: a count beyond that is corrupt
        if n > (payload.len() / 28) as u64 {
            return Err(bad(format!(
                "client count {n} exceeds what the payload can hold"
            )));
        }
        let mut records = Vec::with_capacity(n as usize);
        for i in 0..n {
            let klen = r.u32("a key length")? as usize;
            let key = r.take(klen, "a key")?.to_vec();
            let counter = r.f64("a counter")?;
            let service = r.f64("a service")?;
            let weight = r.f64("a weight")?;
            if !(counter.is_finite() && service.is_finite() && service >= 0.0 && counter >= service)
            {
                return Err(bad(format!(
                    "client {i}: counter {counter} / service {service} invalid"
                )));
            }
            if !crate::limits::weight_ok(weight) {
                return Err(bad(format!("client {i}: weight {weight} invalid")));
            }
            records.push(ClientRecord {
                key,
                counter,
                service,
                weight,
            });
        }
        let last = r.u64("the last-left client")?;
        if last != u64::MAX && last >= n {
            return Err(bad(format!("last-left client {last} does not exist")));
        }
        if r.pos != payload.len() {
            return Err(bad("trailing bytes after the snapshot payload"));
        }
        let mut keys = Vec::with_capacity(records.len());
        for rec in records {
            let id = s.add_client();
            s.restore_client(id, rec.counter, rec.service, rec.weight);
            keys.push(rec.key);
        }
        s.set_last_left((last != u64::MAX).then_some(ClientId(last as u32)));
        Ok(Restored { scheduler: s, keys })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Tokens;

    fn sample() -> Scheduler {
        let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
        let a = s.add_client();
        let b = s.add_client();
        s.set_weight(b, 2.5).unwrap();
        s.submit(1, a, 100).unwrap();
        s.submit(2, b, 300).unwrap();
        s.schedule(&mut Vec::new());
        s.decode(&[1, 2], Tokens::Each(7)).unwrap();
        s.finish(1).unwrap();
        s.finish(2).unwrap();
        s
    }

    #[test]
    fn round_trip_keeps_counters_weights_and_last_left() {
        let s = sample();
        let bytes = s.snapshot(|c| format!("k{}", c.0).into_bytes());
        let r = Scheduler::restore(&bytes).unwrap();
        assert_eq!(r.keys, vec![b"k0".to_vec(), b"k1".to_vec()]);
        for i in 0..2 {
            let (x, y) = (
                s.client(ClientId(i)).unwrap(),
                r.scheduler.client(ClientId(i)).unwrap(),
            );
            assert_eq!(
                (x.counter(), x.service(), x.weight()),
                (y.counter(), y.service(), y.weight())
            );
        }
        assert_eq!(r.scheduler.last_left(), s.last_left());
        assert_eq!(
            r.scheduler.snapshot(|c| format!("k{}", c.0).into_bytes()),
            bytes
        );
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_rejected() {
        let bytes = sample().snapshot(|c| vec![c.0 as u8; 3]);
        for n in 0..bytes.len() {
            assert!(Scheduler::restore(&bytes[..n]).is_err(), "truncated at {n}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(Scheduler::restore(&b).is_err(), "flipped byte {i}");
        }
    }
}
