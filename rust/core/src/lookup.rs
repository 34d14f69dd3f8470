//! The engine's prefix cache as the core sees it: [`PrefixLookup`], asked on
//! demand by the locality window (`scheduler/window.rs`, docs/locality.md).
//!
//! Invariant: the core stores nothing a lookup returns and calls it only
//! while it selects; this module imports nothing from the scheduler.

/// A lookup that failed; the implementor keeps its own error (the Python
/// binding keeps the exception the callable raised) and the core reports
/// [`CoreError::PrefixLookupFailed`] with the request's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupFailed;

/// The engine's prefix cache, asked on demand: how many tokens of a waiting
/// request it holds cached now. The core calls it only for the requests the
/// locality window offers and stores nothing it returns.
pub trait PrefixLookup {
    /// The cached prefix of waiting request `request_id`, which holds
    /// `footprint` tokens (prompt and generated): an answer above
    /// `footprint` is an error ([`CoreError::InvalidPrefixHit`]).
    fn cached_prefix(
        &mut self,
        request_id: u64,
        footprint: u64,
    ) -> std::result::Result<u64, LookupFailed>;
}

impl<F> PrefixLookup for F
where
    F: FnMut(u64, u64) -> std::result::Result<u64, LookupFailed>,
{
    fn cached_prefix(
        &mut self,
        request_id: u64,
        footprint: u64,
    ) -> std::result::Result<u64, LookupFailed> {
        self(request_id, footprint)
    }
}
