//! Liveness-based memory planning: pack buffers with known lifetimes into one arena.

/// A buffer to place: `size` bytes, live from step `start` through step `end` (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRequest {
    /// Bytes needed.
    pub size: usize,
    /// First step at which the buffer is written.
    pub start: usize,
    /// Last step at which it is read.
    pub end: usize,
}

/// Where each buffer lives in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Byte offset of each request, in request order.
    pub offsets: Vec<usize>,
    /// Total arena bytes.
    pub arena_size: usize,
}

/// Greedy best-fit by decreasing size: each buffer takes the lowest aligned offset that does not
/// overlap any already-placed buffer whose lifetime intersects its own.
pub fn plan_memory(reqs: &[BufferRequest], align: usize) -> MemoryPlan {
    let align = align.max(1);
    let round = |n: usize| n.div_ceil(align) * align;
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(reqs[i].size), reqs[i].start, i));
    let mut offsets = vec![0usize; reqs.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(reqs.len());
    let mut arena = 0;
    for i in order {
        let r = reqs[i];
        let size = round(r.size);
        // Occupied address ranges of buffers alive at the same time, sorted by offset.
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| reqs[j].start <= r.end && r.start <= reqs[j].end)
            .map(|&j| (offsets[j], offsets[j] + round(reqs[j].size)))
            .collect();
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut cursor = 0;
        for &(lo, hi) in &busy {
            if lo >= cursor + size {
                let gap = lo - cursor;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(hi);
        }
        let off = best.map(|(_, o)| o).unwrap_or(cursor);
        offsets[i] = off;
        arena = arena.max(off + size);
        placed.push(i);
    }
    MemoryPlan {
        offsets,
        arena_size: arena,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn live_buffers_never_overlap(raw in proptest::collection::vec((1usize..5000, 0usize..40, 0usize..10), 0..60)) {
            let reqs: Vec<BufferRequest> = raw.iter().map(|&(size, start, len)| BufferRequest { size, start, end: start + len }).collect();
            let plan = plan_memory(&reqs, 64);
            for (i, a) in reqs.iter().enumerate() {
                prop_assert_eq!(plan.offsets[i] % 64, 0);
                prop_assert!(plan.offsets[i] + a.size <= plan.arena_size);
                for (j, b) in reqs.iter().enumerate().skip(i + 1) {
                    let live = a.start <= b.end && b.start <= a.end;
                    let mem = plan.offsets[i] < plan.offsets[j] + b.size && plan.offsets[j] < plan.offsets[i] + a.size;
                    prop_assert!(!(live && mem), "buffers {} and {} overlap", i, j);
                }
            }
            // Never worse than giving every buffer its own space.
            let total: usize = reqs.iter().map(|r| r.size.div_ceil(64) * 64).sum();
            prop_assert!(plan.arena_size <= total);
        }
    }

    #[test]
    fn disjoint_lifetimes_share_memory() {
        let reqs = [
            BufferRequest {
                size: 100,
                start: 0,
                end: 1,
            },
            BufferRequest {
                size: 100,
                start: 2,
                end: 3,
            },
        ];
        assert_eq!(plan_memory(&reqs, 64).arena_size, 128);
    }
}
