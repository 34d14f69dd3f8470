//! The structural invariants every other module keeps, checked from scratch
//! in O(n) by `check_invariants` (tests and fuzzing).
//!
//! Invariant: checking changes nothing.

use super::request::Slot;
use super::Scheduler;
use crate::band::QueueEntry;
use crate::band::NO_ENTITY;
use crate::cost::{Pending, RunSums};
use crate::heap::NOT_IN_HEAP;

impl Scheduler {
    /// The bands: ordered by priority, each heap in order over entities of
    /// that band, every live entity in exactly one heap.
    fn check_bands(&self) -> std::result::Result<(), String> {
        let mut entities = 0;
        for (i, &b) in self.order.iter().enumerate() {
            let band = &self.bands[b as usize];
            if i > 0 && self.bands[self.order[i - 1] as usize].priority >= band.priority {
                return Err(format!("band {} out of priority order", band.priority));
            }
            band.heap.check(&self.entities[..])?;
            if band.heap.len() != band.n_entities || band.n_entities == 0 {
                return Err(format!(
                    "band {}: {} in its heap, {} entities",
                    band.priority,
                    band.heap.len(),
                    band.n_entities
                ));
            }
            entities += band.n_entities;
        }
        if entities + self.free_entities.len() != self.entities.len() {
            return Err(format!(
                "{entities} entities in bands, {} free, {} in all",
                self.free_entities.len(),
                self.entities.len()
            ));
        }
        if self.order.len() + self.free_bands.len() != self.bands.len() {
            return Err("a band is neither ordered nor free".into());
        }
        Ok(())
    }

    /// One entity of live client `c`: its queue, head and key; how many
    /// requests it holds.
    fn check_entity(&self, c: u32, e: u32) -> std::result::Result<usize, String> {
        let en = &self.entities[e as usize];
        let band = &self.bands[en.band as usize];
        if en.client != c || !self.order.contains(&en.band) {
            return Err(format!(
                "client {c}: entity {e} is not its own or has no band"
            ));
        }
        // a key may be stale (select): never above the true key, and its seq the head's
        let held = (en.heap_pos != NOT_IN_HEAP).then(|| band.heap.key_at(en.heap_pos));
        let key = self.key_of(e);
        if held.is_none_or(|h| h.seq != key.seq || h.counter > key.counter) {
            return Err(format!(
                "client {c}: entity {e} out of its heap or its key past the true one"
            ));
        }
        if band.heap.top().map(|(t, _)| t) == Some(e) && held != Some(key) {
            return Err(format!(
                "client {c}: entity {e} tops its band with a stale key"
            ));
        }
        let live: Vec<&QueueEntry> = en.queue.iter().filter(|q| self.entry_live(q)).collect();
        if live.len() != en.n_waiting || en.n_waiting == 0 {
            return Err(format!(
                "client {c}, band {}: n_waiting {} != live entries {}",
                band.priority,
                en.n_waiting,
                live.len()
            ));
        }
        if live.iter().any(|q| {
            let r = &self.requests[q.slot as usize];
            r.client != c || r.priority != band.priority
        }) {
            return Err(format!(
                "client {c}, band {}: queues a request of another client or band",
                band.priority
            ));
        }
        let front = en.queue.front().expect("non-empty");
        if !self.entry_live(front) || front.seq != en.head_seq {
            return Err(format!(
                "client {c}, band {}: front entry is not the live head",
                band.priority
            ));
        }
        let mut x = en.next;
        while x != NO_ENTITY {
            if self.entities[x as usize].band == en.band {
                return Err(format!(
                    "client {c}: two entities in band {}",
                    band.priority
                ));
            }
            x = self.entities[x as usize].next;
        }
        Ok(en.n_waiting)
    }

    /// Weighted bands: one share per priority with live requests, sorted,
    /// counting them; every backlogged band has one.
    fn check_shares(&self) -> std::result::Result<(), String> {
        let Some(sh) = &self.shares else {
            return Ok(());
        };
        let mut live: Vec<(i64, u64)> = Vec::new();
        for r in self.requests.iter().filter(|r| r.state != Slot::Free) {
            match live.binary_search_by_key(&r.priority, |x| x.0) {
                Ok(i) => live[i].1 += 1,
                Err(i) => live.insert(i, (r.priority, 1)),
            }
        }
        let have: Vec<(i64, u64)> = sh.live.iter().map(|x| (x.priority, x.live)).collect();
        if have != live {
            return Err(format!(
                "band shares {have:?} != live requests by band {live:?}"
            ));
        }
        if sh.live.iter().any(|x| x.pending != Pending::default()) || !sh.touched.is_empty() {
            return Err("band shares hold a decode call's sums".into());
        }
        Ok(())
    }

    /// Check every structural invariant (tests and fuzzing; O(n)).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.check_bands()?;
        self.check_shares()?;
        self.check_running_sums()?;
        self.check_keys()?;
        self.check_changes()?;
        let mut occ = 0u128;
        let mut prev = 0u64;
        for &s in &self.running {
            let r = &self.requests[s as usize];
            if r.state != Slot::Running {
                return Err(format!("request {} in running list is not running", r.rid));
            }
            if r.admit_seq <= prev {
                return Err("running list out of admission order".into());
            }
            prev = r.admit_seq;
            occ += u128::from(r.footprint(self.uniform));
        }
        if occ != self.occupancy {
            return Err(format!(
                "occupancy {} != sum of footprints {occ}",
                self.occupancy
            ));
        }
        if self.running_index.len() != self.running.len()
            || self
                .running
                .iter()
                .any(|&s| self.running_index.get(self.requests[s as usize].rid) != Some(s))
        {
            return Err("running index disagrees with the running list".into());
        }
        self.running_index.check()?;
        let mut waiting = 0usize;
        let mut aside = vec![0usize; self.clients.len()];
        for r in self.requests.iter().filter(|r| r.state == Slot::Aside) {
            aside[r.client as usize] += 1;
        }
        let mut running = vec![0usize; self.clients.len()];
        let mut occ_of = vec![0u128; self.clients.len()];
        for &s in &self.running {
            let r = &self.requests[s as usize];
            running[r.client as usize] += 1;
            occ_of[r.client as usize] += u128::from(r.footprint(self.uniform));
        }
        for (i, cl) in self.clients.iter().enumerate() {
            if !cl.live {
                if cl.n_waiting + cl.num_running() + cl.n_aside != 0 || cl.entities != NO_ENTITY {
                    return Err(format!("forgotten client {i} still has requests"));
                }
                continue;
            }
            let mut queued = 0;
            let mut e = cl.entities;
            while e != NO_ENTITY {
                queued += self.check_entity(i as u32, e)?;
                e = self.entities[e as usize].next;
            }
            if queued != cl.n_waiting {
                return Err(format!(
                    "client {i}: n_waiting {} != live entries {queued}",
                    cl.n_waiting
                ));
            }
            if cl.num_running() != running[i] {
                return Err(format!(
                    "client {i}: n_running {} != {}",
                    cl.n_running, running[i]
                ));
            }
            if cl.n_aside != aside[i] {
                return Err(format!(
                    "client {i}: n_aside {} != {}",
                    cl.n_aside, aside[i]
                ));
            }
            if cl.occupancy != occ_of[i] {
                return Err(format!(
                    "client {i}: occupancy {} != {}",
                    cl.occupancy, occ_of[i]
                ));
            }
            waiting += cl.n_waiting;
            // Rounding is monotone, so equal charges keep counter >= service exactly.
            if cl.counter < cl.service {
                return Err(format!(
                    "client {i}: counter {} below service {}",
                    cl.counter, cl.service
                ));
            }
        }
        if waiting != self.num_waiting {
            return Err(format!("num_waiting {} != {waiting}", self.num_waiting));
        }
        let backlogged = self
            .clients
            .iter()
            .filter(|c| c.live && c.n_waiting > 0)
            .count();
        if backlogged != self.n_backlogged {
            return Err(format!(
                "n_backlogged {} != {backlogged}",
                self.n_backlogged
            ));
        }
        // active_clients: the per-client counts it reads, summed, are the
        // queues, the set-aside requests and the running list.
        let (mut w, mut r, mut n) = (0usize, 0usize, 0usize);
        for (c, (cw, cr)) in self.active_clients() {
            if !self.clients[c.0 as usize].live || cw + cr == 0 {
                return Err(format!("active_clients lists idle client {}", c.0));
            }
            (w, r, n) = (w + cw, r + cr, n + 1);
        }
        let with_requests = self
            .clients
            .iter()
            .enumerate()
            .filter(|&(i, cl)| cl.live && (cl.n_waiting > 0 || running[i] > 0 || aside[i] > 0))
            .count();
        let aside_total: usize = aside.iter().sum();
        if w != self.num_waiting + aside_total || r != self.running.len() || n != with_requests {
            return Err(format!(
                "active_clients: waiting {w}, running {r} over {n} clients, but {} waiting, \
                 {aside_total} set aside, {} running over {with_requests} clients",
                self.num_waiting,
                self.running.len()
            ));
        }
        let live = self
            .requests
            .iter()
            .filter(|r| r.state != Slot::Free)
            .count();
        if live != self.index.len() {
            return Err(format!(
                "{} live slots but {} indexed ids",
                live,
                self.index.len()
            ));
        }
        Ok(())
    }

    /// The running sums, `running_clients`, `n_predicting` and `gen_hi`
    /// against the running list (the invariant of `running`).
    fn check_running_sums(&self) -> std::result::Result<(), String> {
        let mut sums = vec![RunSums::default(); self.clients.len()];
        let mut bands: Vec<(i64, RunSums)> = Vec::new();
        let mut predicting = 0;
        for &s in &self.running {
            let r = &self.requests[s as usize];
            let g = r.generated(self.uniform);
            sums[r.client as usize].enter(r.prompt, g);
            match bands.iter_mut().find(|(p, _)| *p == r.priority) {
                Some((_, b)) => b.enter(r.prompt, g),
                None => {
                    let mut b = RunSums::default();
                    b.enter(r.prompt, g);
                    bands.push((r.priority, b));
                }
            }
            predicting += usize::from(r.predicted > g);
            if g > self.gen_hi {
                return Err(format!(
                    "request {} generated {g} > gen_hi {}",
                    r.rid, self.gen_hi
                ));
            }
        }
        if predicting != self.n_predicting {
            return Err(format!(
                "n_predicting {} != {predicting}",
                self.n_predicting
            ));
        }
        let mut listed = 0;
        for (i, cl) in self.clients.iter().enumerate() {
            let run = RunSums {
                n: u64::from(cl.n_running),
                prompt: cl.run_prompt,
                gen: cl.occupancy.wrapping_sub(cl.run_prompt),
            };
            if run != sums[i] {
                return Err(format!("client {i}: running sums {run:?} != {:?}", sums[i]));
            }
            if cl.n_running > 0 {
                listed += 1;
                if self.running_clients.get(cl.run_pos as usize) != Some(&(i as u32)) {
                    return Err(format!("client {i} is not at its run_pos {}", cl.run_pos));
                }
            }
        }
        if let Some((i, _)) = self
            .clients
            .iter()
            .enumerate()
            .find(|(_, cl)| cl.n_running == 0 && cl.run_pos != u32::MAX)
        {
            return Err(format!("client {i} has no running request but a run_pos"));
        }
        if listed != self.running_clients.len() {
            return Err(format!(
                "running_clients holds {} clients, {listed} have running requests",
                self.running_clients.len()
            ));
        }
        if let Some(sh) = &self.shares {
            for share in &sh.live {
                let want = bands
                    .iter()
                    .find(|(p, _)| *p == share.priority)
                    .map_or(RunSums::default(), |b| b.1);
                if share.run != want {
                    return Err(format!(
                        "band {}: running sums {:?} != {want:?}",
                        share.priority, share.run
                    ));
                }
            }
        }
        Ok(())
    }
}
