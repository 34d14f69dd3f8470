//! Priority bands and the entities the band heaps order.
//!
//! A request carries a priority (smaller is more urgent). A *band* holds the
//! clients with waiting requests of one priority; an *entity* is one client's
//! waiting requests of one priority: the FIFO of them, the submit sequence of
//! its head, and its position in the band's heap (as in dmclock's
//! `ClientRec::heap_data`). A client waiting in two bands has two entities,
//! linked from the client record; both are keyed by the client's one counter.
//! With every request at the default priority there is one band and one
//! entity per backlogged client.
//!
//! An entity exists exactly while it holds a waiting request, and a band
//! exactly while it holds an entity, so memory follows the waiting requests
//! whatever priorities an engine hands over.

use std::collections::VecDeque;

use crate::client::QueueEntry;
use crate::heap::{IndexedHeap, Positions, NOT_IN_HEAP};

/// End of a client's entity list.
pub(crate) const NO_ENTITY: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct Entity {
    pub client: u32,
    /// Index of its band in `Scheduler::bands`.
    pub band: u32,
    /// Waiting requests of this priority, oldest first; the front entry is
    /// always live (`n_waiting > 0` while the entity exists).
    pub queue: VecDeque<QueueEntry>,
    /// Live entries in `queue`.
    pub n_waiting: usize,
    /// Submit sequence of the head request.
    pub head_seq: u64,
    /// Position in the band heap, or `NOT_IN_HEAP` (only while
    /// `Scheduler::schedule` has parked a client at its cap).
    pub heap_pos: u32,
    /// The client's next entity, or `NO_ENTITY`.
    pub next: u32,
}

impl Entity {
    pub fn new(client: u32, band: u32) -> Self {
        Entity {
            client,
            band,
            queue: VecDeque::new(),
            n_waiting: 0,
            head_seq: 0,
            heap_pos: NOT_IN_HEAP,
            next: NO_ENTITY,
        }
    }
}

impl Positions for [Entity] {
    #[inline(always)]
    fn set_pos(&mut self, id: u32, pos: u32) {
        self[id as usize].heap_pos = pos;
    }
    #[inline(always)]
    fn pos(&self, id: u32) -> u32 {
        self[id as usize].heap_pos
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Band {
    pub priority: i64,
    /// The band's entities keyed by (client counter, head seq).
    pub heap: IndexedHeap,
    /// Entities in this band (in the heap, or parked by a capped schedule).
    pub n_entities: usize,
}
