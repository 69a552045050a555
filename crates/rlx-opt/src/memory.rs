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

/// Lists of buffer indices in one allocation, each list's room known in advance: list `k` is
/// `items[from[k]..from[k] + len[k]]`.
struct Lists {
    from: Vec<usize>,
    len: Vec<usize>,
    items: Vec<usize>,
}

impl Lists {
    /// Room for `counts[k]` items in list `k`.
    fn with_room(counts: &[usize]) -> Lists {
        let mut from = Vec::with_capacity(counts.len());
        let mut total = 0;
        for &c in counts {
            from.push(total);
            total += c;
        }
        Lists {
            from,
            len: vec![0; counts.len()],
            items: vec![0; total],
        }
    }

    fn push(&mut self, k: usize, item: usize) {
        self.items[self.from[k] + self.len[k]] = item;
        self.len[k] += 1;
    }

    fn get(&self, k: usize) -> &[usize] {
        &self.items[self.from[k]..self.from[k] + self.len[k]]
    }
}

/// The nodes of a segment tree over `leaves` leaves (a power of two; node 1 the root, leaf `p`
/// node `leaves + p`) whose ranges exactly cover `first..=last`, at most two a level.
fn cover(leaves: usize, first: usize, last: usize, mut f: impl FnMut(usize)) {
    let (mut l, mut r) = (first + leaves, last + leaves + 1);
    while l < r {
        if l & 1 == 1 {
            f(l);
            l += 1;
        }
        if r & 1 == 1 {
            r -= 1;
            f(r);
        }
        l >>= 1;
        r >>= 1;
    }
}

/// Greedy best-fit by decreasing size: each buffer takes the smallest gap (lowest offset among
/// equals) between already-placed buffers whose lifetimes intersect its own, or the end of
/// them. Lifetimes are ranks of a segment tree: a placed buffer is kept at the tree nodes that
/// cover its lifetime and under the rank it starts at, so those meeting `first..=last` are
/// found without a scan of every placed buffer, each once — those alive at `first` on the path
/// from leaf `first` to the root, then those starting in `first + 1..=last` — in
/// O(log steps + lifetime + found).
pub fn plan_memory(reqs: &[BufferRequest], align: usize) -> MemoryPlan {
    let align = align.max(1);
    // Sizes rounded up to the alignment.
    let sizes: Vec<usize> = reqs
        .iter()
        .map(|r| r.size.div_ceil(align) * align)
        .collect();
    // Largest first, then earliest; the index makes every key distinct, so an unstable sort
    // gives the stable order.
    let mut keys: Vec<(std::cmp::Reverse<usize>, usize, usize)> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| (std::cmp::Reverse(r.size), r.start, i))
        .collect();
    keys.sort_unstable();
    // Lifetimes as ranks among the steps where some buffer starts or ends (two lifetimes meet
    // exactly when their ranks do), so the tree has at most twice the buffers' leaves whatever
    // the step numbers are.
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
    let leaves = marks.len().max(1).next_power_of_two();
    let (mut at_node, mut at_start) = (vec![0usize; 2 * leaves], vec![0usize; leaves]);
    for &(first, last) in &spans {
        cover(leaves, first, last, |n| at_node[n] += 1);
        at_start[first] += 1;
    }
    let (mut by_node, mut by_start) = (Lists::with_room(&at_node), Lists::with_room(&at_start));
    let mut offsets = vec![0usize; reqs.len()];
    let mut busy: Vec<(usize, usize)> = Vec::new();
    let mut arena = 0;
    for (_, _, i) in keys {
        let size = sizes[i];
        // Occupied address ranges of buffers alive at the same time, sorted by offset.
        busy.clear();
        let (first, last) = spans[i];
        let mut node = first + leaves;
        while node >= 1 {
            busy.extend(
                by_node
                    .get(node)
                    .iter()
                    .map(|&j| (offsets[j], offsets[j] + sizes[j])),
            );
            node >>= 1;
        }
        for k in first + 1..=last {
            busy.extend(
                by_start
                    .get(k)
                    .iter()
                    .map(|&j| (offsets[j], offsets[j] + sizes[j])),
            );
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
        cover(leaves, first, last, |n| by_node.push(n, i));
        by_start.push(first, i);
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
        /// Finding the buffers a lifetime meets through the segment tree changes how they are
        /// found, not the plan (short and long lifetimes, some sizes equal after rounding).
        #[test]
        fn the_plan_equals_the_scanning_plan(raw in proptest::collection::vec((1usize..5000, 0usize..40, prop_oneof![0usize..4, 0usize..40]), 0..120), far in any::<bool>()) {
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
