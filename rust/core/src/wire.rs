//! The shared counters' sync script's text (`vtc.distributed.RedisStore`):
//! the push's services argument built from a [`SyncLedger`], and the reply's
//! changed counters read back, so that neither walks every tenant in Python.
//!
//! The push is one JSON array of strings `["<key>", "<amount>", ...]`: keys
//! as the store names tenants (`i:<int>`, `s:<str>`), each amount the
//! shortest text that reads back as its float (the script's `tonumber` reads
//! it). The reply's changed counters are a JSON array of keys (`cjson`'s
//! encoding: `{}` when empty) and their values comma-separated (`%.17g`).
//! A value that is not a counter (not a number in `[0, MAX_COUNTER]`: a
//! corrupt or hostile store) is dropped, never used, as
//! `vtc.distributed.stored_number` drops it; a reply that cannot be read
//! (not JSON, a key that is no key, fewer or more values than keys) is an
//! error, which the caller treats as a store fault.

use std::io::Write;

use crate::keys::ClientKey;
use crate::ledger::SyncLedger;
use crate::limits::MAX_COUNTER;

/// Append `key` as the store names it, a JSON string (`"i:<int>"` or
/// `"s:<str>"`), to `out`: `"`, `\` and control characters escaped, the
/// rest as its bytes (what `json.dumps(..., ensure_ascii=False)` sends; a
/// lone surrogate stays its three bytes, as the key holds it).
pub fn push_json_key(out: &mut Vec<u8>, key: &ClientKey) {
    out.push(b'"');
    match key {
        ClientKey::Int(i) => {
            let _ = write!(out, "i:{i}");
        }
        ClientKey::Str(s) => {
            out.extend_from_slice(b"s:");
            for &b in s.iter() {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    0..=0x1f => {
                        const HEX: &[u8; 16] = b"0123456789abcdef";
                        out.extend_from_slice(b"\\u00");
                        out.push(HEX[(b >> 4) as usize]);
                        out.push(HEX[(b & 15) as usize]);
                    }
                    _ => out.push(b),
                }
            }
        }
    }
    out.push(b'"');
}

/// The ledger's unacknowledged amounts as the sync script's services
/// argument (see the module doc), in `out` (cleared first). Returns how
/// many tenants it holds.
pub fn push_json(ledger: &SyncLedger, out: &mut Vec<u8>) -> usize {
    out.clear();
    out.push(b'[');
    let mut n = 0;
    for (key, amount) in ledger.unacked() {
        if n > 0 {
            out.push(b',');
        }
        push_json_key(out, key);
        let _ = write!(out, ",\"{amount:?}\"");
        n += 1;
    }
    out.push(b']');
    n
}

/// The reply's changed counters: `keys`, a JSON array of stored keys, and
/// `values`, their counters comma-separated; appended to `out` as
/// `(tenant, counter)`, the values that are no counter left out. Returns
/// how many were left out. `Err` (nothing appended) when the reply cannot
/// be read.
pub fn parse_changed(
    keys: &[u8],
    values: &[u8],
    out: &mut Vec<(ClientKey, f64)>,
) -> Result<usize, String> {
    let start = out.len();
    let mut parsed = Vec::new();
    if let Err(e) = parse_keys(keys, &mut parsed) {
        return Err(format!(
            "store answered changed keys that are not a JSON list: {e}"
        ));
    }
    if parsed.is_empty() {
        return Ok(0);
    }
    let n = values.split(|&b| b == b',').count();
    if n != parsed.len() {
        return Err(format!(
            "store answered {n} changed counters for {} tenants",
            parsed.len()
        ));
    }
    let mut dropped = 0;
    for (key, raw) in parsed.into_iter().zip(values.split(|&b| b == b',')) {
        match stored_number(raw) {
            Some(v) => out.push((key, v)),
            None => dropped += 1,
        }
    }
    debug_assert!(out.len() - start + dropped == n);
    Ok(dropped)
}

/// A stored counter: a number in `[0, MAX_COUNTER]`, else `None`.
pub fn stored_number(raw: &[u8]) -> Option<f64> {
    let x: f64 = std::str::from_utf8(raw).ok()?.parse().ok()?;
    (0.0..=MAX_COUNTER).contains(&x).then_some(x)
}

/// A stored key (`i:<int>` an int key; anything else a str key, its text
/// after the first two characters, as `vtc.distributed.decode` reads it).
fn stored_key(b: Vec<u8>) -> Result<ClientKey, String> {
    if let Some(rest) = b.strip_prefix(b"i:") {
        let text = std::str::from_utf8(rest).map_err(|_| "an int key that is not text")?;
        return text
            .parse::<i64>()
            .map(ClientKey::Int)
            .map_err(|_| format!("int key {text:?}"));
    }
    // two characters off, as Python slices the decoded text
    let skip = match std::str::from_utf8(&b) {
        Ok(t) => t.chars().take(2).map(char::len_utf8).sum(),
        Err(_) => b.len().min(2),
    };
    let rest = &b[skip.min(b.len())..];
    if crate::keys::str_key_ok(rest) {
        Ok(ClientKey::Str(rest.into()))
    } else {
        // bytes that are no text (a corrupt store): as Python's "replace" reads them
        let text = String::from_utf8_lossy(rest).into_owned();
        Ok(ClientKey::Str(text.into_bytes().into_boxed_slice()))
    }
}

/// A JSON array of strings (or `{}`, cjson's empty table) into keys.
fn parse_keys(json: &[u8], out: &mut Vec<ClientKey>) -> Result<(), String> {
    let mut p = Parser { b: json, i: 0 };
    p.ws();
    match p.peek() {
        Some(b'{') => {
            p.i += 1;
            p.ws();
            p.expect(b'}')?;
        }
        Some(b'[') => {
            p.i += 1;
            p.ws();
            if p.peek() == Some(b']') {
                p.i += 1;
            } else {
                loop {
                    p.ws();
                    out.push(stored_key(p.string()?)?);
                    p.ws();
                    match p.next() {
                        Some(b',') => continue,
                        Some(b']') => break,
                        _ => return Err(format!("',' or ']' expected at {}", p.i)),
                    }
                }
            }
        }
        _ => return Err("'[' expected".into()),
    }
    p.ws();
    if p.i != json.len() {
        return Err(format!("trailing bytes at {}", p.i));
    }
    Ok(())
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek();
        self.i += 1;
        c
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.next() == Some(c) {
            Ok(())
        } else {
            Err(format!("{:?} expected at {}", c as char, self.i - 1))
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.b.get(self.i..self.i + 4).ok_or("a short \\u escape")?;
        let text = std::str::from_utf8(digits).map_err(|_| "a bad \\u escape")?;
        let v = u32::from_str_radix(text, 16).map_err(|_| format!("\\u{text}"))?;
        self.i += 4;
        Ok(v)
    }

    /// A JSON string's bytes: escapes decoded, a `\u` surrogate pair as its
    /// code point, a lone surrogate as its three bytes (how the core keeps
    /// it), other bytes as they are.
    fn string(&mut self) -> Result<Vec<u8>, String> {
        self.expect(b'"')?;
        let mut out = Vec::new();
        loop {
            let c = self.next().ok_or("an unterminated string")?;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = self.next().ok_or("an unterminated escape")?;
                    let byte = match e {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 8,
                        b'f' => 12,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xD800..0xDC00).contains(&cp)
                                && self.b.get(self.i..self.i + 2) == Some(b"\\u")
                            {
                                let save = self.i;
                                self.i += 2;
                                let low = self.hex4()?;
                                if (0xDC00..0xE000).contains(&low) {
                                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                                } else {
                                    self.i = save; // a lone high surrogate, then another escape
                                }
                            }
                            push_code_point(&mut out, cp);
                            continue;
                        }
                        _ => return Err(format!("escape \\{}", e as char)),
                    };
                    out.push(byte);
                }
                0..=0x1f => {
                    return Err(format!("a control character in a string at {}", self.i - 1))
                }
                _ => out.push(c),
            }
        }
    }
}

/// UTF-8 of `cp`, surrogates included (three bytes, as `surrogatepass`).
fn push_code_point(out: &mut Vec<u8>, cp: u32) {
    match cp {
        0..=0x7f => out.push(cp as u8),
        0x80..=0x7ff => out.extend_from_slice(&[0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3f) as u8]),
        0x800..=0xffff => out.extend_from_slice(&[
            0xE0 | (cp >> 12) as u8,
            0x80 | ((cp >> 6) & 0x3f) as u8,
            0x80 | (cp & 0x3f) as u8,
        ]),
        _ => out.extend_from_slice(&[
            0xF0 | (cp >> 18) as u8,
            0x80 | ((cp >> 12) & 0x3f) as u8,
            0x80 | ((cp >> 6) & 0x3f) as u8,
            0x80 | (cp & 0x3f) as u8,
        ]),
    }
}
