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

/// Greedy best-fit by decreasing size: each buffer takes the smallest gap (lowest offset among
/// equals) between already-placed buffers whose lifetimes intersect its own, or the end of
/// them. The buffers alive at each step are kept per step, so finding those a buffer meets
/// costs its own lifetime's worth of steps rather than a scan of every placed buffer.
pub fn plan_memory(reqs: &[BufferRequest], align: usize) -> MemoryPlan {
    let align = align.max(1);
    let round = |n: usize| n.div_ceil(align) * align;
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    // The index makes every key distinct, so an unstable sort gives the stable order.
    order.sort_unstable_by_key(|&i| (std::cmp::Reverse(reqs[i].size), reqs[i].start, i));
    // Lifetimes as ranks among the steps where some buffer starts or ends (two lifetimes meet
    // exactly when their ranks do), so the per-step lists number at most twice the buffers
    // whatever the step numbers are.
    let mut marks: Vec<usize> = reqs
        .iter()
        .flat_map(|r| [r.start, r.end.max(r.start)])
        .collect();
    marks.sort_unstable();
    marks.dedup();
    let rank = |t: usize| marks.partition_point(|&m| m < t);
    let spans: Vec<(usize, usize)> = reqs
        .iter()
        .map(|r| (rank(r.start), rank(r.end.max(r.start))))
        .collect();
    // The placed buffers alive at each rank, in one allocation: rank `k`'s list is
    // `alive[from[k]..from[k] + len[k]]`, with room for every buffer whose lifetime covers it.
    let mut cover = vec![0isize; marks.len() + 1];
    for &(first, last) in &spans {
        cover[first] += 1;
        cover[last + 1] -= 1;
    }
    let mut from = vec![0usize; marks.len() + 1];
    let (mut total, mut depth) = (0usize, 0isize);
    for k in 0..marks.len() {
        depth += cover[k];
        from[k] = total;
        total += depth as usize;
    }
    from[marks.len()] = total;
    let mut alive = vec![0usize; total];
    let mut len = vec![0usize; marks.len()];
    // Which buffer last saw each placed one (to take a buffer alive over several ranks once).
    let mut seen = vec![usize::MAX; reqs.len()];
    let mut offsets = vec![0usize; reqs.len()];
    let mut busy: Vec<(usize, usize)> = Vec::new();
    let mut arena = 0;
    for i in order {
        let r = reqs[i];
        let size = round(r.size);
        // Occupied address ranges of buffers alive at the same time, sorted by offset.
        busy.clear();
        let (first, last) = spans[i];
        for k in first..=last {
            for &j in &alive[from[k]..from[k] + len[k]] {
                if std::mem::replace(&mut seen[j], i) != i {
                    busy.push((offsets[j], offsets[j] + round(reqs[j].size)));
                }
            }
        }
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
        for k in first..=last {
            alive[from[k] + len[k]] = i;
            len[k] += 1;
        }
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

    /// The plan as first written: every placed buffer scanned for each new one.
    fn plan_by_scanning(reqs: &[BufferRequest], align: usize) -> MemoryPlan {
        let round = |n: usize| n.div_ceil(align) * align;
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(reqs[i].size), reqs[i].start, i));
        let (mut offsets, mut placed, mut arena) = (vec![0; reqs.len()], Vec::new(), 0);
        for i in order {
            let (r, size) = (reqs[i], round(reqs[i].size));
            let mut busy: Vec<(usize, usize)> = placed
                .iter()
                .filter(|&&j: &&usize| reqs[j].start <= r.end && r.start <= reqs[j].end)
                .map(|&j| (offsets[j], offsets[j] + round(reqs[j].size)))
                .collect();
            busy.sort_unstable();
            let (mut best, mut cursor): (Option<(usize, usize)>, usize) = (None, 0);
            for &(lo, hi) in &busy {
                if lo >= cursor + size && best.is_none_or(|(g, _)| lo - cursor < g) {
                    best = Some((lo - cursor, cursor));
                }
                cursor = cursor.max(hi);
            }
            offsets[i] = best.map(|(_, o)| o).unwrap_or(cursor);
            arena = arena.max(offsets[i] + size);
            placed.push(i);
        }
        MemoryPlan {
            offsets,
            arena_size: arena,
        }
    }

    proptest! {
        /// Keeping the buffers alive per step changes how they are found, not the plan.
        #[test]
        fn the_plan_equals_the_scanning_plan(raw in proptest::collection::vec((1usize..5000, 0usize..40, 0usize..10), 0..80), far in any::<bool>()) {
            // Far-apart step numbers too (ranks, not steps, index the lists).
            let at = |t: usize| if far { t * (usize::MAX / 128) } else { t };
            let reqs: Vec<BufferRequest> = raw.iter().map(|&(size, start, len)| BufferRequest { size, start: at(start), end: at(start + len) }).collect();
            prop_assert_eq!(plan_memory(&reqs, 64), plan_by_scanning(&reqs, 64));
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
