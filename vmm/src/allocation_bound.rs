//! The fuzz targets' allocation bound: this crate's test binary counts, per
//! thread, the bytes its allocations hold, and `within_allocation_bound`
//! fails a case whose peak exceeds `CASE_ALLOCATION_LIMIT`. A device or
//! decoder that sizes a buffer by what the guest or a snapshot claims
//! (rather than by what it holds) fails the case instead of going unseen.
//!
//! Proptest runs a property's cases one after another on the test's thread,
//! so a thread's count is its case's. A single allocation over
//! `HARD_LIMIT` is refused outright (the binary aborts with "memory
//! allocation failed"): counting it would first need the memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The most one case (decoding, restoring and the guest's accesses after)
/// may hold at once, beyond what it held when it began. The largest inputs
/// the targets generate are a few hundred KiB; each device buffers at most
/// a few (the console's `MAX_PENDING_OUTPUT`, the block device's `CHUNK`).
pub const CASE_ALLOCATION_LIMIT: usize = 16 << 20;
/// No single allocation in a test may be larger.
const HARD_LIMIT: usize = 1 << 30;

thread_local! {
    /// Bytes this thread's allocations hold now (less what it freed of
    /// other threads' allocations, hence signed), and the peak since the
    /// case began.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn account(delta: isize) {
    // `try_with`: a thread being torn down may still allocate.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

struct Counting;

// SAFETY: every call forwards to the system allocator with the caller's
// arguments; the bookkeeping around it touches only const-initialised,
// destructor-free thread locals, which never allocate. Refusing a request
// (a null pointer) is allowed by `GlobalAlloc`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract (a non-zero size) is passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            account(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout` (every allocation
        // here is made there).
        unsafe { System.dealloc(ptr, layout) };
        account(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > HARD_LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `dealloc`, and the caller's `new_size` contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            account(new_size as isize - layout.size() as isize);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `case` and fails (panics) if it held more than
/// `CASE_ALLOCATION_LIMIT` bytes at once beyond what was held before it.
pub fn within_allocation_bound<R>(case: impl FnOnce() -> R) -> R {
    let start = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(start));
    let result = case();
    let grew = PEAK.with(Cell::get) - start;
    assert!(
        grew <= CASE_ALLOCATION_LIMIT as isize,
        "the case held {grew} bytes at once; the bound is {CASE_ALLOCATION_LIMIT}"
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_allocation_bound_fails_a_case_that_allocates_too_much() {
        within_allocation_bound(|| vec![0u8; CASE_ALLOCATION_LIMIT / 2]);
        let too_much = std::panic::catch_unwind(|| {
            within_allocation_bound(|| vec![0u8; CASE_ALLOCATION_LIMIT + 1].len())
        });
        assert!(too_much.is_err());
    }
}
