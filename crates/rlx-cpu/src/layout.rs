//! Strided layouts: shape, strides and offset in elements. Transpose, narrow, broadcast and
//! (on contiguous data) reshape are layout changes only; no data moves.

/// Highest rank a CPU kernel handles.
pub const MAX_RANK: usize = 8;

/// A strided view: element `(i0, i1, ...)` lives at `offset + Σ i_k * strides[k]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    rank: usize,
    dims: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    /// Element offset of index zero.
    pub offset: usize,
}

impl Layout {
    /// Row-major contiguous layout of `dims` (rank ≤ [`MAX_RANK`], checked by the compiler).
    pub fn contiguous(dims: &[usize]) -> Layout {
        let mut l = Layout {
            rank: dims.len(),
            dims: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            offset: 0,
        };
        let mut s = 1;
        for i in (0..dims.len()).rev() {
            l.dims[i] = dims[i];
            l.strides[i] = s;
            s *= dims[i];
        }
        l
    }

    /// A layout with explicit strides (`None` when the rank exceeds [`MAX_RANK`]).
    pub fn strided(dims: &[usize], strides: &[usize], offset: usize) -> Option<Layout> {
        if dims.len() > MAX_RANK || strides.len() != dims.len() {
            return None;
        }
        let mut l = Layout {
            rank: dims.len(),
            dims: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            offset,
        };
        l.dims[..dims.len()].copy_from_slice(dims);
        l.strides[..dims.len()].copy_from_slice(strides);
        Some(l)
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank]
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// Row-major contiguous (ignoring size-1 axes).
    pub fn is_contiguous(&self) -> bool {
        let mut s = 1;
        for i in (0..self.rank).rev() {
            if self.dims[i] != 1 && self.strides[i] != s {
                return false;
            }
            s *= self.dims[i];
        }
        true
    }

    /// Permute axes.
    pub fn permute(&self, perm: &[usize]) -> Layout {
        let mut l = *self;
        for (i, &p) in perm.iter().enumerate() {
            l.dims[i] = self.dims[p];
            l.strides[i] = self.strides[p];
        }
        l
    }

    /// Slice `[start, start + len)` of `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Layout {
        let mut l = *self;
        l.offset += start * self.strides[axis];
        l.dims[axis] = len;
        l
    }

    /// Broadcast to `dims` (right-aligned; size-1 and new axes get stride 0).
    pub fn broadcast_to(&self, dims: &[usize]) -> Layout {
        let mut l = Layout {
            rank: dims.len(),
            dims: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            offset: self.offset,
        };
        let shift = dims.len() - self.rank;
        for (i, &d) in dims.iter().enumerate() {
            l.dims[i] = d;
            l.strides[i] = if i < shift || self.dims[i - shift] != d {
                0
            } else {
                self.strides[i - shift]
            };
        }
        l
    }

    /// The same elements under new `dims`, if possible without copying: always for a contiguous
    /// layout; for a strided one when every group of old axes that merges or splits into new
    /// axes is itself contiguous (say, splitting the last axis of a narrowed or transposed view
    /// into heads).
    pub fn reshape(&self, dims: &[usize]) -> Option<Layout> {
        if self.is_contiguous() || self.numel() == 0 {
            let mut l = Layout::contiguous(dims);
            l.offset = self.offset;
            return Some(l);
        }
        if dims.len() > MAX_RANK || dims.iter().product::<usize>() != self.numel() {
            return None;
        }
        // Size-1 axes carry no stride information; match the rest in groups of equal product.
        let old: Vec<(usize, usize)> = (0..self.rank)
            .filter(|&i| self.dims[i] != 1)
            .map(|i| (self.dims[i], self.strides[i]))
            .collect();
        let mut strides = [0usize; MAX_RANK];
        let (mut oi, mut ni) = (0, 0);
        while ni < dims.len() {
            if dims[ni] == 1 {
                ni += 1;
                continue;
            }
            let (mut op, mut np) = (old[oi].0, dims[ni]);
            let (mut oj, mut nj) = (oi + 1, ni + 1);
            while op != np {
                if op < np {
                    op *= old[oj].0;
                    oj += 1;
                } else {
                    np *= dims[nj];
                    nj += 1;
                }
            }
            if (oi..oj - 1).any(|k| old[k].1 != old[k + 1].1 * old[k + 1].0) {
                return None;
            }
            let mut st = old[oj - 1].1;
            for k in (ni..nj).rev() {
                strides[k] = st;
                st *= dims[k];
            }
            (oi, ni) = (oj, nj);
        }
        Layout::strided(dims, &strides[..dims.len()], self.offset)
    }

    /// Drop axis `axis` (used to iterate "everything but one axis").
    pub fn remove_axis(&self, axis: usize) -> Layout {
        let mut l = *self;
        for i in axis..self.rank - 1 {
            l.dims[i] = self.dims[i + 1];
            l.strides[i] = self.strides[i + 1];
        }
        l.rank -= 1;
        l
    }
}

/// Iterate the multi-index space `dims` in row-major order, calling `f` with the element offset
/// of each of `N` layouts (which all have dims `dims`) for every contiguous inner run. The
/// closure receives `(offsets, run_length, inner_strides)`. Axes that are contiguous for every
/// operand are merged first, so dense operands see one long run.
pub fn for_each_run<const N: usize>(
    dims: &[usize],
    layouts: [&Layout; N],
    range: std::ops::Range<usize>,
    mut f: impl FnMut([usize; N], usize, [usize; N]),
) {
    // Coalesce axes: merge axis i into i+1 when every operand steps contiguously across them.
    let mut cd = [0usize; MAX_RANK];
    let mut cs = [[0usize; MAX_RANK]; N];
    let mut r = 0;
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        if r > 0 && (0..N).all(|k| cs[k][r - 1] == layouts[k].strides[i] * d) {
            cd[r - 1] *= d;
            for k in 0..N {
                cs[k][r - 1] = layouts[k].strides[i];
            }
            continue;
        }
        cd[r] = d;
        for k in 0..N {
            cs[k][r] = layouts[k].strides[i];
        }
        r += 1;
    }
    if dims.contains(&0) {
        return;
    }
    let base: [usize; N] = std::array::from_fn(|k| layouts[k].offset);
    if r == 0 {
        if !range.is_empty() {
            f(base, 1, [0; N]);
        }
        return;
    }
    // `range` counts elements of the flattened space; split into the inner axis and the rest.
    let inner = cd[r - 1];
    let inner_strides: [usize; N] = std::array::from_fn(|k| cs[k][r - 1]);
    let mut pos = range.start;
    while pos < range.end {
        let row = pos / inner;
        let col = pos % inner;
        let len = (inner - col).min(range.end - pos);
        // Offsets of `row` in the outer axes.
        let mut offs = base;
        let mut rem = row;
        for ax in (0..r - 1).rev() {
            let i = rem % cd[ax];
            rem /= cd[ax];
            for k in 0..N {
                offs[k] += i * cs[k][ax];
            }
        }
        for k in 0..N {
            offs[k] += col * inner_strides[k];
        }
        f(offs, len, inner_strides);
        pos += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_transposed_view() {
        let src = Layout::contiguous(&[2, 3]).permute(&[1, 0]);
        let dst = Layout::contiguous(&[3, 2]);
        let mut seen = Vec::new();
        for_each_run(&[3, 2], [&dst, &src], 0..6, |[o, i], n, [so, si]| {
            for j in 0..n {
                seen.push((o + j * so, i + j * si));
            }
        });
        assert_eq!(seen, vec![(0, 0), (1, 3), (2, 1), (3, 4), (4, 2), (5, 5)]);
    }

    #[test]
    fn partial_ranges_split_rows() {
        let a = Layout::contiguous(&[4, 5]).permute(&[1, 0]);
        let d = Layout::contiguous(&[5, 4]);
        let mut all = Vec::new();
        for (s, e) in [(0, 7), (7, 13), (13, 20)] {
            for_each_run(&[5, 4], [&d, &a], s..e, |[o, i], n, [so, si]| {
                for j in 0..n {
                    all.push((o + j * so, i + j * si));
                }
            });
        }
        let mut whole = Vec::new();
        for_each_run(&[5, 4], [&d, &a], 0..20, |[o, i], n, [so, si]| {
            for j in 0..n {
                whole.push((o + j * so, i + j * si));
            }
        });
        assert_eq!(all, whole);
        assert_eq!(whole.len(), 20);
    }

    /// Element offsets of `l` in row-major order of its dims.
    fn offsets(l: &Layout) -> Vec<usize> {
        let d = Layout::contiguous(l.dims());
        let mut v = Vec::new();
        for_each_run(l.dims(), [&d, l], 0..l.numel(), |[_, i], n, [_, si]| {
            v.extend((0..n).map(|j| i + j * si))
        });
        v
    }

    #[test]
    fn strided_reshapes_are_views_exactly_when_the_merged_axes_are_contiguous() {
        // [16, 64, 384] narrowed to 128 columns, split into 4 heads of 32 (a view), and back.
        let q = Layout::contiguous(&[16, 64, 384]).narrow(2, 128, 128);
        let heads = q
            .reshape(&[16, 64, 4, 32])
            .expect("splitting a contiguous axis is a view");
        assert_eq!(offsets(&heads), offsets(&q));
        let back = heads.reshape(&[16, 64, 128]).expect("merging it back too");
        assert_eq!(offsets(&back), offsets(&q));
        // With size-1 axes anywhere.
        let odd = q.reshape(&[1, 16, 64, 1, 128, 1]).unwrap();
        assert_eq!(offsets(&odd), offsets(&q));
        // Its rows merge (uniformly 384 apart); rows and columns do not (128 wide, 384 apart).
        let rows = q.reshape(&[1024, 128]).unwrap();
        assert_eq!(offsets(&rows), offsets(&q));
        assert!(q.reshape(&[16, 8192]).is_none());
        // A transposed matrix cannot be flattened, but can split its (strided) outer axis.
        let t = Layout::contiguous(&[6, 4]).permute(&[1, 0]);
        assert!(t.reshape(&[24]).is_none());
        let split = t.reshape(&[2, 2, 6]).unwrap();
        assert_eq!(offsets(&split), offsets(&t));
    }
}
