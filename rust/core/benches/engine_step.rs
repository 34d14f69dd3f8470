//! Engine-step benchmark of the core, against a bare `BinaryHeap` floor.
//!
//! Std-only harness (`harness = false`): no extra dev-dependencies, so it adds
//! nothing to `cargo test` compile time. Each configuration runs a warm-up,
//! then times every step with `Instant` and reports the median and mean.
//!
//! One engine step (engine mode, as `bench/test_engine_step.py` drives it
//! from Python):
//! 1. `decode(running, Each(1))`: every running request generated one token;
//! 2. `finish` each request that reached its output length (U[32, 384]);
//! 3. `submit` one new request (random client, prompt U[64, 512]) per finish;
//! 4. `schedule`: admit until the KV budget `M` is full.
//!
//! The floor replays, step by step, the number of heap operations the core
//! had to do in that step (one re-key per distinct backlogged client charged
//! by the decode, one per admission, one per submit that made a client
//! backlogged) as `pop` + `push` pairs on a `std::collections::BinaryHeap`
//! holding one entry per client.
//!
//! Run with `cargo bench -p vtc-core` (`-- --quick` for fewer steps,
//! `-- --clients 10000` for one configuration).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hint::black_box;
use std::time::Instant;

use vtc_core::{ClientId, Policy, Scheduler, Tokens};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

struct Engine {
    s: Scheduler,
    clients: Vec<ClientId>,
    rng: Rng,
    next_rid: u64,
    t: u64,
    /// step -> requests finishing then
    calendar: HashMap<u64, Vec<u64>>,
    running: Vec<u64>,
    slot: HashMap<u64, usize>,
    client_of: HashMap<u64, u32>,
    admitted: Vec<u64>,
    stamp: Vec<u64>,
    waiting_of: Vec<u32>,
}

impl Engine {
    fn new(c: usize, budget: i64, waiting: usize) -> Engine {
        let mut s = Scheduler::new(budget, 1.0, 2.0, Policy::Vtc).unwrap();
        let clients = (0..c).map(|_| s.add_client()).collect();
        let mut e = Engine {
            s,
            clients,
            rng: Rng(0x9E37_79B9_7F4A_7C15),
            next_rid: 0,
            t: 0,
            calendar: HashMap::new(),
            running: Vec::new(),
            slot: HashMap::new(),
            client_of: HashMap::new(),
            admitted: Vec::new(),
            stamp: vec![0; c],
            waiting_of: vec![0; c],
        };
        for i in 0..waiting {
            e.submit(i % c);
        }
        e.admit();
        e
    }

    /// Queue one request for client `c` (untimed); returns whether the client
    /// was idle (the core then pushes it on its heap).
    fn submit(&mut self, c: usize) -> bool {
        let (rid, prompt) = self.new_request(c);
        self.s.submit(rid, self.clients[c], prompt).unwrap();
        self.waiting_of[c] == 1
    }

    fn new_request(&mut self, c: usize) -> (u64, i64) {
        let rid = self.next_rid;
        self.next_rid += 1;
        self.client_of.insert(rid, c as u32);
        self.waiting_of[c] += 1;
        (rid, self.rng.range(64, 512) as i64)
    }

    fn admit(&mut self) -> usize {
        self.admitted.clear();
        let n = self.s.schedule(&mut self.admitted);
        self.record_admitted();
        n
    }

    fn record_admitted(&mut self) {
        for i in 0..self.admitted.len() {
            let rid = self.admitted[i];
            let out = self.rng.range(32, 384);
            self.slot.insert(rid, self.running.len());
            self.running.push(rid);
            self.calendar.entry(self.t + out).or_default().push(rid);
            self.waiting_of[self.client_of[&rid] as usize] -= 1;
        }
    }

    /// Distinct clients charged by a decode of the batch that are backlogged
    /// (the core re-keys exactly those in its heap).
    fn charged_backlogged(&mut self) -> usize {
        let mut n = 0;
        let epoch = self.t + 1;
        for rid in &self.running {
            let c = self.client_of[rid] as usize;
            if self.stamp[c] != epoch {
                self.stamp[c] = epoch;
                n += usize::from(self.waiting_of[c] > 0);
            }
        }
        n
    }

    /// One engine step. Only the scheduler calls are timed (four timed
    /// regions: decode, the finishes, the submits, schedule); the driver's
    /// bookkeeping happens between them. Returns (ns in the scheduler, heap
    /// operations the core performed apart from the decode re-keys).
    fn step(&mut self) -> (u64, usize) {
        let t0 = Instant::now();
        self.s.decode(&self.running, Tokens::Each(1)).unwrap();
        let mut ns = t0.elapsed().as_nanos() as u64;
        self.t += 1;
        let done = self.calendar.remove(&self.t).unwrap_or_default();
        let t0 = Instant::now();
        for &rid in &done {
            self.s.finish(rid).unwrap();
        }
        ns += t0.elapsed().as_nanos() as u64;
        let mut subs = Vec::with_capacity(done.len());
        let mut ops = 0;
        for rid in done {
            let k = self.slot.remove(&rid).unwrap();
            self.running.swap_remove(k);
            if k < self.running.len() {
                self.slot.insert(self.running[k], k);
            }
            self.client_of.remove(&rid);
            let c = (self.rng.next() % self.clients.len() as u64) as usize;
            let (rid, prompt) = self.new_request(c);
            ops += usize::from(self.waiting_of[c] == 1);
            subs.push((rid, self.clients[c], prompt));
        }
        let t0 = Instant::now();
        for &(rid, c, prompt) in &subs {
            self.s.submit(rid, c, prompt).unwrap();
        }
        ns += t0.elapsed().as_nanos() as u64;
        self.admitted.clear();
        let t0 = Instant::now();
        let n = self.s.schedule(&mut self.admitted);
        ns += t0.elapsed().as_nanos() as u64;
        self.record_admitted();
        (ns, ops + n)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

struct Row {
    c: usize,
    waiting: usize,
    running: usize,
    ops: f64,
    step_med: f64,
    step_mean: f64,
    floor_med: f64,
    floor_mean: f64,
    floor2_mean: f64,
}

fn run(c: usize, waiting: usize, budget: i64, steps: usize) -> Row {
    let mut e = Engine::new(c, budget, waiting);
    for _ in 0..300 {
        e.step();
    }
    // The driver's own work (running-list upkeep, calendar, RNG) is timed
    // separately: counting heap ops walks the batch, so it stays outside.
    let mut step_ns = Vec::with_capacity(steps);
    let mut ops_per_step = Vec::with_capacity(steps);
    let mut running = 0;
    let mut batches: Vec<Vec<u32>> = Vec::with_capacity(steps);
    let mut admin_ops = Vec::with_capacity(steps);
    for _ in 0..steps {
        let rekeys = e.charged_backlogged();
        batches.push(e.running.iter().map(|r| e.client_of[r]).collect());
        let (ns, ops) = e.step();
        step_ns.push(ns as f64);
        ops_per_step.push(rekeys + ops);
        admin_ops.push(ops);
        running += e.running.len();
    }
    black_box(&e.s);

    // Floor: a BinaryHeap of one entry per client, the same number of
    // (pop + push) pairs per step as the core's heap operations.
    let mut rng = Rng(42);
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = (0..c as u32)
        .map(|i| Reverse((rng.range(0, 1 << 20), i)))
        .collect();
    let mut floor_ns = Vec::with_capacity(steps);
    for &ops in &ops_per_step {
        let t0 = Instant::now();
        for _ in 0..ops {
            let Reverse((k, id)) = heap.pop().unwrap();
            heap.push(Reverse((k + 1 + (rng.next() & 1023), id)));
        }
        floor_ns.push(t0.elapsed().as_nanos() as f64);
    }
    black_box(&heap);

    // Floor 2, the minimal work of a step: add the decode charge to each
    // batch member's counter in a flat Vec (no re-keying at all), plus one
    // pop + push per admission / idle submit.
    let mut counters = vec![0.0f64; c];
    let mut floor2_ns = Vec::with_capacity(steps);
    for (batch, &ops) in batches.iter().zip(&admin_ops) {
        let t0 = Instant::now();
        for &cl in batch {
            counters[cl as usize] += 2.0;
        }
        for _ in 0..ops {
            let Reverse((k, id)) = heap.pop().unwrap();
            heap.push(Reverse((k + 1 + (rng.next() & 1023), id)));
        }
        floor2_ns.push(t0.elapsed().as_nanos() as f64);
    }
    black_box(&counters);
    black_box(&heap);

    let ops = ops_per_step.iter().sum::<usize>() as f64 / steps as f64;
    Row {
        c,
        waiting,
        running: running / steps,
        ops,
        step_med: median(&mut step_ns.clone()),
        step_mean: mean(&step_ns),
        floor_med: median(&mut floor_ns.clone()),
        floor_mean: mean(&floor_ns),
        floor2_mean: mean(&floor2_ns),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; anything else is a filter we ignore.
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let steps = if quick { 500 } else { 5_000 };
    // `--clients N`: only that configuration (for profiling under callgrind).
    let only: Option<usize> = args
        .iter()
        .position(|a| a == "--clients")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    // budget 200,000 tokens: about 500 running requests in steady state
    let configs: &[(usize, usize)] = &[
        (100, 100_000),
        (1_000, 100_000),
        (10_000, 100_000),
        (100_000, 1_000_000),
    ];
    println!("vtc-core engine step vs BinaryHeap floor ({steps} timed steps each; times in µs)");
    println!(
        "{:>8} {:>9} {:>6} {:>9} {:>9} {:>9} {:>10} {:>10} {:>11} {:>12} {:>12}",
        "C",
        "waiting",
        "B",
        "heap ops",
        "step med",
        "step mean",
        "floor med",
        "floor mean",
        "floor2 mean",
        "core/floor",
        "core/floor2"
    );
    for &(c, waiting) in configs.iter().filter(|(c, _)| only.is_none_or(|o| o == *c)) {
        let r = run(c, waiting, 200_000, steps);
        println!(
            "{:>8} {:>9} {:>6} {:>9.1} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>11.2} {:>11.2}x {:>11.2}x",
            r.c,
            r.waiting,
            r.running,
            r.ops,
            r.step_med / 1e3,
            r.step_mean / 1e3,
            r.floor_med / 1e3,
            r.floor_mean / 1e3,
            r.floor2_mean / 1e3,
            r.step_mean / r.floor_mean,
            r.step_mean / r.floor2_mean
        );
    }
}
