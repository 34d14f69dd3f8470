//! Snapshots: the scheduler's state that must survive an engine restart.
//!
//! Invariant: decoding checks everything (magic, version, length, checksum,
//! every value, the stored configuration as [`Config::validate`] checks it)
//! before it builds anything, so a truncated or corrupted snapshot is a
//! [`CoreError::BadSnapshot`] naming what is wrong, never a panic and never
//! a half-restored scheduler; and `restore(snapshot(s))` re-encodes to the
//! same bytes.
//!
//! A version 2 snapshot (what [`Scheduler::snapshot`] writes) holds the whole
//! configuration ([`Scheduler::config`]: budget, cost, policy, client cap in
//! tokens, predictor, locality quantum, band weights), every client's
//! counter, delivered service, weight, refund credit and the `mean`
//! predictor's moving average, with the client's key
//! ([`ClientKey::encode`] of its interned key, or the caller's bytes with
//! [`Scheduler::snapshot_with`]), and the client that last left the backlog. A version 1 snapshot
//! (budget, wp, wq, policy; counter, service and weight per client) still
//! loads: the rest of the configuration takes its defaults, credits and
//! averages start empty. Requests are not included: an engine that restarts
//! has lost its batch and resubmits what it still owes. Nor are the
//! per-client token tallies ([`Scheduler::tokens`]) or the band counters:
//! they start at 0.
//!
//! Format, little-endian:
//!
//! ```text
//! magic  b"VTCSNAP\0"          8 bytes
//! version u32                  = 2 (1 is still read)
//! length  u64                  payload bytes
//! crc32   u32                  of the payload (IEEE)
//! payload, version 2:
//!   budget u64, policy u8 (0 vtc, 1 lcf, 2 fcfs)
//!   cost u8: 0 linear (wp, wq f64) | 1 quadratic (a_p, a_q, a_pq, a_qq, c f64)
//!            | 2 context (wp, wq, beta f64)
//!   client_cap u64 (tokens; 0 for none), predictor u8 (0 none, 1 mean)
//!   locality_quantum f64
//!   n_bands u32 (u32::MAX: strict bands), then per band: priority i64, weight f64
//!   n_clients u64, then per client:
//!     key_len u32, key bytes, counter f64, service f64, weight f64,
//!     credit f64, has_mean u8 (0 or 1), mean f64 (0.0 without one)
//!   last_left u64 (u64::MAX for none)
//! payload, version 1:
//!   budget u64, wp f64, wq f64, policy u8
//!   n_clients u64, then per client:
//!     key_len u32, key bytes, counter f64, service f64, weight f64
//!   last_left u64 (u64::MAX for none)
//! ```

use crate::client::ClientId;
use crate::config::{ClientCap, Config, Overrides, Policy, Predictor};
use crate::cost::Cost;
use crate::error::{CoreError, Result};
use crate::keys::{ClientKey, ClientKeys};
use crate::scheduler::Scheduler;

const MAGIC: &[u8; 8] = b"VTCSNAP\0";
/// The version [`Scheduler::snapshot`] writes.
pub const SNAPSHOT_VERSION: u32 = 2;
const HEADER: usize = 8 + 4 + 8 + 4;
/// The fewest payload bytes a client takes (an empty key): version 1, 2.
const CLIENT_MIN_V1: usize = 4 + 3 * 8;
const CLIENT_MIN_V2: usize = 4 + 4 * 8 + 1 + 8;

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

/// One client as stored in a snapshot (version 1: no credit, no mean).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRecord {
    pub key: Vec<u8>,
    pub counter: f64,
    pub service: f64,
    pub weight: f64,
    pub credit: f64,
    pub mean: Option<f64>,
}

/// A decoded snapshot: a scheduler with no requests, each client's key
/// (index = `ClientId`), and the version it was read from (1: only budget,
/// cost and policy were stored, the rest of the configuration is default).
pub struct Restored {
    pub scheduler: Scheduler,
    pub keys: Vec<Vec<u8>>,
    pub version: u32,
}

fn policy_code(p: Policy) -> u8 {
    match p {
        Policy::Vtc => 0,
        Policy::Lcf => 1,
        Policy::Fcfs => 2,
    }
}

fn policy_of(code: u8) -> Result<Policy> {
    match code {
        0 => Ok(Policy::Vtc),
        1 => Ok(Policy::Lcf),
        2 => Ok(Policy::Fcfs),
        p => Err(bad(format!("unknown policy code {p}"))),
    }
}

fn put_f64s(p: &mut Vec<u8>, values: &[f64]) {
    for v in values {
        p.extend_from_slice(&v.to_le_bytes());
    }
}

impl Scheduler {
    /// Encode the state (format version 2), each client with its interned
    /// key ([`ClientKey::encode`]; empty bytes for a client from
    /// [`add_client`](Self::add_client), which has none):
    /// [`Restored::interned`] takes the keys back.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_with(|c| self.key(c).map_or_else(Vec::new, ClientKey::encode))
    }

    /// [`snapshot`](Self::snapshot) with the caller's key bytes for each
    /// client id (`key_of(id)`) in place of the interned keys.
    pub fn snapshot_with(&self, mut key_of: impl FnMut(ClientId) -> Vec<u8>) -> Vec<u8> {
        let config = self.config();
        let mut p = Vec::with_capacity(96 + self.num_clients() * 64);
        p.extend_from_slice(&self.budget().to_le_bytes());
        p.push(policy_code(config.policy));
        match config.cost {
            Cost::Linear { wp, wq } => {
                p.push(0);
                put_f64s(&mut p, &[wp, wq]);
            }
            Cost::Quadratic {
                a_p,
                a_q,
                a_pq,
                a_qq,
                c,
            } => {
                p.push(1);
                put_f64s(&mut p, &[a_p, a_q, a_pq, a_qq, c]);
            }
            Cost::Context { wp, wq, beta } => {
                p.push(2);
                put_f64s(&mut p, &[wp, wq, beta]);
            }
        }
        let cap = self.client_cap().unwrap_or(0);
        p.extend_from_slice(&cap.to_le_bytes());
        p.push(match config.predictor {
            Predictor::None => 0,
            Predictor::Mean => 1,
        });
        p.extend_from_slice(&config.locality_quantum.to_le_bytes());
        match &config.band_weights {
            None => p.extend_from_slice(&u32::MAX.to_le_bytes()),
            Some(w) => {
                p.extend_from_slice(&(w.len() as u32).to_le_bytes());
                for &(prio, weight) in w {
                    p.extend_from_slice(&prio.to_le_bytes());
                    p.extend_from_slice(&weight.to_le_bytes());
                }
            }
        }
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
            put_f64s(&mut p, &[c.counter(), c.service(), c.weight(), c.credit()]);
            let mean = self.mean(id);
            p.push(mean.is_some() as u8);
            p.extend_from_slice(&mean.unwrap_or(0.0).to_le_bytes());
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

    /// Decode a snapshot made by [`snapshot`](Self::snapshot) or
    /// [`snapshot_with`](Self::snapshot_with), of version 2 or 1 (the keys
    /// as stored: [`Restored::interned`] interns them). Every client's token tally ([`tokens`](Self::tokens)) starts
    /// at 0: the format does not store it.
    pub fn restore(data: &[u8]) -> Result<Restored> {
        let mut h = Reader { data, pos: 0 };
        if h.take(8, "the magic bytes")? != MAGIC {
            return Err(bad("not a vtc snapshot (bad magic bytes)"));
        }
        let version = h.u32("the version")?;
        if version != 1 && version != SNAPSHOT_VERSION {
            return Err(bad(format!(
                "snapshot version {version} is not supported (this build reads 1 and {SNAPSHOT_VERSION})"
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
        let config = if version == 1 {
            read_config_v1(&mut r)?
        } else {
            read_config_v2(&mut r)?
        };
        let mut s = Scheduler::with_config(&config)
            .map_err(|e| bad(format!("the stored configuration is invalid: {e}")))?;
        let n = r.u64("the client count")?;
        let least = if version == 1 {
            CLIENT_MIN_V1
        } else {
            CLIENT_MIN_V2
        };
        if n > (payload.len() / least) as u64 {
            return Err(bad(format!(
                "client count {n} exceeds what the payload can hold"
            )));
        }
        let mut records = Vec::with_capacity(n as usize);
        for i in 0..n {
            records.push(read_client(&mut r, i, version)?);
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
            s.restore_client(
                id,
                (rec.counter, rec.service, rec.weight),
                rec.credit,
                rec.mean,
            );
            keys.push(rec.key);
        }
        s.set_last_left((last != u64::MAX).then_some(ClientId(last as u32)));
        Ok(Restored {
            scheduler: s,
            keys,
            version,
        })
    }
}

impl Restored {
    /// Replace the stored configuration values `o` gives, in this order:
    /// the cost, the client cap (a fraction is of the restored `M`), the
    /// predictor, the band weights, the locality quantum. The first bad
    /// value is the error (the scheduler is then to be dropped: the values
    /// before it are replaced).
    pub fn override_config(&mut self, o: Overrides) -> Result<()> {
        let s = &mut self.scheduler;
        if let Some(cost) = o.cost {
            s.set_cost(cost)?;
        }
        if let Some(cap) = o.client_cap {
            let tokens = cap.tokens(s.budget())?;
            s.set_client_cap(Some(tokens))?;
        }
        if let Some(p) = o.predictor {
            s.set_predictor(p);
        }
        if let Some(w) = o.band_weights {
            s.set_band_weights(Some(&w))?;
        }
        if let Some(q) = o.locality_quantum {
            s.set_locality_quantum(q)?;
        }
        Ok(())
    }

    /// The restored scheduler with the stored keys interned (index = client
    /// id), each decoded ([`ClientKey::decode`]): a malformed key (a str's
    /// included, see [`str_key_ok`](crate::keys::str_key_ok)) or one that
    /// appears twice is [`CoreError::BadSnapshot`].
    pub fn interned(self) -> Result<Scheduler> {
        let keys = ClientKeys::from_snapshot_keys(&self.keys)?;
        let mut s = self.scheduler;
        s.set_keys(keys);
        Ok(s)
    }
}

fn read_config_v1(r: &mut Reader<'_>) -> Result<Config> {
    let budget = r.u64("M")?;
    let wp = r.f64("wp")?;
    let wq = r.f64("wq")?;
    let policy = policy_of(r.u8("the policy")?)?;
    let budget = i64::try_from(budget).map_err(|_| bad(format!("M {budget} out of range")))?;
    Ok(Config {
        cost: Cost::Linear { wp, wq },
        policy,
        ..Config::new(budget)
    })
}

fn read_config_v2(r: &mut Reader<'_>) -> Result<Config> {
    let budget = r.u64("M")?;
    let budget = i64::try_from(budget).map_err(|_| bad(format!("M {budget} out of range")))?;
    let policy = policy_of(r.u8("the policy")?)?;
    let cost = match r.u8("the cost kind")? {
        0 => Cost::Linear {
            wp: r.f64("wp")?,
            wq: r.f64("wq")?,
        },
        1 => Cost::Quadratic {
            a_p: r.f64("a_p")?,
            a_q: r.f64("a_q")?,
            a_pq: r.f64("a_pq")?,
            a_qq: r.f64("a_qq")?,
            c: r.f64("c")?,
        },
        2 => Cost::Context {
            wp: r.f64("wp")?,
            wq: r.f64("wq")?,
            beta: r.f64("beta")?,
        },
        k => return Err(bad(format!("unknown cost code {k}"))),
    };
    let cap = r.u64("the client cap")?;
    let predictor = match r.u8("the predictor")? {
        0 => Predictor::None,
        1 => Predictor::Mean,
        p => return Err(bad(format!("unknown predictor code {p}"))),
    };
    let locality_quantum = r.f64("the locality quantum")?;
    let n_bands = r.u32("the band count")?;
    let band_weights = if n_bands == u32::MAX {
        None
    } else {
        if n_bands as usize > r.data.len() / 16 {
            return Err(bad(format!(
                "band count {n_bands} exceeds what the payload can hold"
            )));
        }
        let mut w = Vec::with_capacity(n_bands as usize);
        for _ in 0..n_bands {
            let prio = r.u64("a band's priority")? as i64;
            w.push((prio, r.f64("a band's weight")?));
        }
        Some(w)
    };
    Ok(Config {
        budget,
        cost,
        policy,
        // a stored cap above M would be cut to M: refuse it instead
        client_cap: match cap {
            0 => None,
            t if t > budget as u64 => {
                return Err(bad(format!("client cap {t} exceeds M {budget}")))
            }
            t => Some(ClientCap::Tokens(t)),
        },
        predictor,
        band_weights,
        locality_quantum,
    })
}

fn read_client(r: &mut Reader<'_>, i: u64, version: u32) -> Result<ClientRecord> {
    let klen = r.u32("a key length")? as usize;
    let key = r.take(klen, "a key")?.to_vec();
    let counter = r.f64("a counter")?;
    let service = r.f64("a service")?;
    let weight = r.f64("a weight")?;
    if !(counter.is_finite() && service.is_finite() && service >= 0.0 && counter >= service) {
        return Err(bad(format!(
            "client {i}: counter {counter} / service {service} invalid"
        )));
    }
    if !crate::limits::weight_ok(weight) {
        return Err(bad(format!("client {i}: weight {weight} invalid")));
    }
    let (credit, mean) = if version == 1 {
        (0.0, None)
    } else {
        let credit = r.f64("a credit")?;
        if !(credit.is_finite() && credit >= 0.0) {
            return Err(bad(format!("client {i}: credit {credit} invalid")));
        }
        let has_mean = r.u8("a mean flag")?;
        let mean = r.f64("a mean")?;
        let mean = match has_mean {
            0 if mean.to_bits() == 0 => None,
            1 if mean.is_finite() && mean >= 0.0 => Some(mean),
            _ => {
                return Err(bad(format!(
                    "client {i}: mean {mean} (flag {has_mean}) invalid"
                )))
            }
        };
        (credit, mean)
    };
    Ok(ClientRecord {
        key,
        counter,
        service,
        weight,
        credit,
        mean,
    })
}
