//! Lowering cached and paged attention: one launch for decode over a cache whose scores fit
//! in shared memory, otherwise three launches over a scratch of scores.

use super::{blocks, broadcast_strides, dims, imm, row_grid, Lowering, Pending, BLOCK};
use crate::source;
use rlx_ir::{MaskKind, NodeId, Result};

impl Lowering<'_> {
    /// `Op::Attention` in one launch (`source::attention`): a block per batch, head and
    /// `ATTENTION_ROWS` query rows.
    pub(super) fn attention(&mut self, id: NodeId, mask: MaskKind, scale: f32) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let (q, k, v) = (node.inputs[0], node.inputs[1], node.inputs[2]);
        let (qd, kd, vd) = (dims(g, q)?, dims(g, k)?, dims(g, v)?);
        let (kind, window) = match mask {
            MaskKind::None => (0, 0),
            MaskKind::Causal => (1, 0),
            MaskKind::SlidingWindow(w) => (2, w),
            MaskKind::Custom => (3, 0),
        };
        let tiles = qd[2].div_ceil(source::ATTENTION_ROWS);
        let nblocks = qd[0] * qd[1] * tiles;
        let mut words = vec![
            imm(nblocks),
            imm(qd[1]),
            imm(qd[2]),
            imm(qd[3]),
            imm(vd[3]),
            imm(kd[1]),
            imm(kd[2]),
            self.val(q),
            self.val(k),
            self.val(v),
            self.val(id),
            Pending::Imm(scale.to_bits() as i32 as i64),
            imm(kind),
            imm(window),
        ];
        // The custom mask's strides over [B, Hq, Sq, Sk] (zero on broadcast axes).
        match node.inputs.get(3) {
            Some(&m) if mask == MaskKind::Custom => {
                let full = [qd[0], qd[1], qd[2], kd[2]];
                words.push(self.val(m));
                words.extend(broadcast_strides(&dims(g, m)?, &full).into_iter().map(imm));
            }
            _ => words.extend((0..5).map(|_| imm(0))),
        }
        let threads = 32 * source::ATTENTION_ROWS as u32;
        let grid = [blocks(nblocks, 1), 1, 1];
        self.launch(id, Some(source::attention()), grid, threads, words)
    }

    /// Cached attention: decode (a few query rows) over a cache whose scores fit in shared memory
    /// in one launch; otherwise three steps over a scratch of `[S, Hq, T]` scores: the scaled
    /// scores (masked keys -inf), the weights in place, the weighted values.
    pub(super) fn cached_attention(
        &mut self,
        id: NodeId,
        scale: f32,
        window: Option<usize>,
    ) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let (q, k, v, pos) = (
            node.inputs[0],
            node.inputs[1],
            node.inputs[2],
            node.inputs[3],
        );
        let (qd, kd, vd) = (dims(g, q)?, dims(g, k)?, dims(g, v)?);
        let (rows, t) = (qd[0] * qd[1], kd[0]);
        let cache = g.shape(k).dtype();
        // Decode (a few query rows) over a cache whose scores fit in shared memory: one
        // launch, a block per query row and head, reading only the keys the row sees.
        if qd[0] < rlx_ir::QuantScheme::MATRIX_ATTENTION_ROWS && t <= source::ATTENTION_STAGE {
            let words = vec![
                imm(rows),
                imm(qd[1]),
                imm(qd[2]),
                imm(t),
                imm(kd[1]),
                self.val(q),
                self.val(k),
                self.val(v),
                self.val(pos),
                self.val(id),
                imm(window.unwrap_or(0)),
                Pending::Imm(scale.to_bits() as i32 as i64),
                imm(vd[2]),
            ];
            let (qt, pt) = (g.shape(q).dtype(), g.shape(pos).dtype());
            let src = source::attention_decode(qt, cache, pt, node.shape.dtype());
            let grid = [blocks(rows, 1), 1, 1];
            return self.launch(id, src, grid, source::ATTENTION_THREADS, words);
        }
        let r = self.scratch((rows * t).max(1) * 4);
        let scores = vec![
            imm(rows * t),
            imm(qd[1]),
            imm(qd[2]),
            imm(t),
            imm(kd[1]),
            self.val(q),
            self.val(k),
            self.val(pos),
            Pending::Scratch(r),
            imm(window.unwrap_or(0)),
            Pending::Imm(scale.to_bits() as i32 as i64),
        ];
        // Decode (a few query rows): a warp per score, so the GPU has enough threads.
        let warp = qd[0] < rlx_ir::QuantScheme::MATRIX_ATTENTION_ROWS;
        let src = source::attention_scores(g.shape(q).dtype(), cache, g.shape(pos).dtype(), warp);
        let per = if warp { BLOCK / 32 } else { BLOCK };
        self.launch(
            id,
            src,
            [blocks(rows * t, per as usize), 1, 1],
            BLOCK,
            scores,
        )?;
        self.attention_weights(id, rows, t, r, cache)?;
        let dv = vd[2];
        let values = vec![
            imm(rows * dv),
            imm(qd[1]),
            imm(dv),
            imm(t),
            imm(vd[1]),
            self.val(v),
            Pending::Scratch(r),
            self.val(id),
        ];
        // Few query rows (decode): bigger blocks, so more threads share each row's keys.
        let threads = if rows < 64 { 1024 } else { BLOCK };
        let src = source::attention_values(g.shape(v).dtype(), node.shape.dtype(), threads);
        self.launch(id, src, [blocks(rows, 1), 1, 1], threads, values)?;
        self.until_now(r);
        Ok(())
    }

    /// Paged attention in three steps over a scratch of `[S, Hq, M * block]` scores, as cached
    /// attention, each position's cache row looked up in the query's block-table row.
    pub(super) fn paged_attention(
        &mut self,
        id: NodeId,
        scale: f32,
        window: Option<usize>,
        block: usize,
    ) -> Result<()> {
        let g = self.g;
        let node = g.node(id);
        let [q, k, v, pos, table] = [0, 1, 2, 3, 4].map(|i| node.inputs[i]);
        let (qd, kd, vd, td) = (dims(g, q)?, dims(g, k)?, dims(g, v)?, dims(g, table)?);
        let (rows, m, blocks_) = (qd[0] * qd[1], td[1], kd[0] / block.max(1));
        let l = m * block;
        let cache = g.shape(k).dtype();
        let r = self.scratch((rows * l).max(1) * 4);
        let scores = vec![
            imm(rows * l),
            imm(qd[1]),
            imm(qd[2]),
            imm(l),
            imm(kd[1]),
            self.val(q),
            self.val(k),
            self.val(pos),
            self.val(table),
            Pending::Scratch(r),
            imm(window.unwrap_or(0)),
            Pending::Imm(scale.to_bits() as i32 as i64),
            imm(block),
            imm(m),
            imm(blocks_),
        ];
        let src = source::paged_scores(g.shape(q).dtype(), cache);
        self.launch(
            id,
            src,
            [blocks(rows * l, BLOCK as usize), 1, 1],
            BLOCK,
            scores,
        )?;
        self.attention_weights(id, rows, l, r, cache)?;
        let dv = vd[2];
        let values = vec![
            imm(rows * dv),
            imm(qd[1]),
            imm(dv),
            imm(l),
            imm(vd[1]),
            self.val(v),
            Pending::Scratch(r),
            self.val(id),
            self.val(table),
            imm(block),
            imm(m),
            imm(blocks_),
        ];
        let src = source::paged_values(g.shape(v).dtype(), node.shape.dtype());
        self.launch(
            id,
            src,
            [blocks(rows * dv, BLOCK as usize), 1, 1],
            BLOCK,
            values,
        )?;
        self.until_now(r);
        Ok(())
    }

    /// Step 2 of cached and paged attention: the `rows` rows of `t` scores in scratch `r`
    /// turned into softmax weights in place (rounded to the cache's dtype).
    fn attention_weights(
        &mut self,
        id: NodeId,
        rows: usize,
        t: usize,
        r: usize,
        cache: rlx_ir::DType,
    ) -> Result<()> {
        let tt = source::row_threads(t, rows);
        let weights = vec![imm(rows), imm(t), Pending::Scratch(r)];
        let src = source::attention_weights(cache, tt);
        self.launch(id, src, row_grid(rows, tt), BLOCK, weights)
    }
}
