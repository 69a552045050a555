//! The device side of [`super::compile`]: the arena's layout and buffers, the params buffers,
//! and each step's meta words, pipeline and bind group.

use super::kernel::Kernel;
use super::meta::{encode, Groups, Words};
use super::{pieces, GpuProgram, Step};
use crate::shaders::{self, Bound, Memory, ARENA_CHUNK, PARAMS_CHUNK, PARAMS_CHUNKS};
use crate::values::{to_words, Form};
use crate::Gpu;
use rlx_ir::{Error, Graph, NodeId, Result};
use rlx_opt::{plan_memory, BufferRequest, MemoryPlan};
use std::sync::Arc;

/// Meta words per step are padded to this many (256 bytes, the storage offset alignment).
const META_ALIGN: usize = 64;

/// Where the arena's requests go, and what the kernels bind.
pub(super) struct Layout {
    /// Each request's byte offset.
    pub(super) plan: MemoryPlan,
    /// Buffers of the arena.
    chunks: usize,
    /// What the kernels bind (a step binds the halves only where it touches an f16 value).
    pub(super) memory: Memory,
}

/// Lay out the arena of `reqs`: in one buffer, or (larger than one binding may be) in buffers
/// of `ARENA_CHUNK` bytes, as many as the adapter lets a shader bind beside the meta and params
/// buffers.
pub(super) fn layout(
    gpu: &Gpu,
    g: &Graph,
    reqs: &[BufferRequest],
    form: &[Form],
) -> Result<Layout> {
    let plan = plan_memory(reqs, 16);
    let limit = gpu
        .limits
        .max_storage_buffer_binding_size
        .min(gpu.limits.max_buffer_size);
    let size = plan.arena_size as u64;
    let chunks = if size <= limit {
        1
    } else {
        size.div_ceil(ARENA_CHUNK) as usize
    };
    let memory = Memory {
        arena_chunks: chunks,
        half: form.contains(&Form::Half),
    };
    let bindable = gpu.limits.max_storage_buffers_per_shader_stage as usize;
    if memory.bindings().len() > bindable || (chunks > 1 && limit < ARENA_CHUNK) {
        return Err(Error::Invalid(format!(
            "graph \"{}\" needs {:.1} MiB of device memory, {} buffers of at most {:.1} MiB; the adapter binds {} storage buffers of at most {:.1} MiB to a shader{}",
            g.name(),
            size as f64 / 1048576.0,
            chunks,
            ARENA_CHUNK.min(limit) as f64 / 1048576.0,
            bindable,
            limit as f64 / 1048576.0,
            if memory.half { " (f16 storage binds each twice; RLX_WGPU_F16_STORAGE=0 does not)" } else { "" },
        )));
    }
    Ok(Layout {
        plan,
        chunks,
        memory,
    })
}

/// A storage buffer of `size` bytes that the host writes and reads back.
fn storage(gpu: &Gpu, label: &str, size: u64) -> wgpu::Buffer {
    gpu.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// The arena's buffers.
pub(super) fn arena(gpu: &Gpu, l: &Layout) -> Vec<wgpu::Buffer> {
    let (size, chunks) = (l.plan.arena_size as u64, l.chunks);
    (0..chunks as u64)
        .map(|c| {
            let size = if chunks == 1 {
                size.max(4).next_multiple_of(4)
            } else {
                size.saturating_sub(c * ARENA_CHUNK).clamp(16, ARENA_CHUNK)
            };
            storage(gpu, "rlx arena", size)
        })
        .collect()
}

/// The params buffers: those of `share`, or new ones for `pbuf_size` bytes of params.
pub(super) fn params(
    gpu: &Gpu,
    g: &Graph,
    share: Option<&GpuProgram>,
    pbuf_size: u64,
) -> Result<Arc<Vec<wgpu::Buffer>>> {
    if let Some(o) = share {
        return Ok(o.pbuf.clone());
    }
    let cap = PARAMS_CHUNK * PARAMS_CHUNKS as u64;
    if pbuf_size > cap {
        return Err(Error::Invalid(format!(
            "graph \"{}\" has {:.1} MiB of params; the GPU backend holds at most {:.1} MiB",
            g.name(),
            pbuf_size as f64 / 1048576.0,
            cap as f64 / 1048576.0
        )));
    }
    Ok(Arc::new(
        (0..PARAMS_CHUNKS as u64)
            .map(|c| {
                let size = pbuf_size
                    .saturating_sub(c * PARAMS_CHUNK)
                    .clamp(16, PARAMS_CHUNK);
                storage(gpu, "rlx params", size)
            })
            .collect::<Vec<_>>(),
    ))
}

/// Write the constants (arena request, bytes, form) into the arena.
pub(super) fn write_consts(
    gpu: &Gpu,
    arena: &[wgpu::Buffer],
    offsets: &[usize],
    consts: &[(usize, Vec<u8>, Form)],
) {
    for (r, data, f) in consts {
        let words = to_words(*f, data);
        for (buf, at, start, n) in pieces(arena, offsets[*r] as u64, words.len() as u64) {
            gpu.queue.write_buffer(buf, at, &words[start..start + n]);
        }
    }
}

/// A step before binding: its pipeline, its meta words `at..end`, workgroups, and what it
/// binds.
pub(super) struct Planned {
    node: usize,
    op: &'static str,
    pipeline: Arc<wgpu::ComputePipeline>,
    at: usize,
    end: usize,
    groups: Groups,
    memory: Memory,
}

/// The meta words of every step of `pending` and its pipeline.
pub(super) fn pipelines(
    gpu: &Gpu,
    g: &Graph,
    pending: &[(usize, Kernel)],
    w: &Words,
    memory: Memory,
) -> Result<(Vec<u32>, Vec<Planned>)> {
    let mut meta: Vec<u32> = Vec::new();
    let mut planned: Vec<Planned> = Vec::new();
    for (node, k) in pending {
        let id = NodeId(*node as u32);
        let at = meta.len();
        let (source, groups) = encode(g, w, *node, k, &mut meta)?;
        meta.resize(meta.len().next_multiple_of(META_ALIGN), 0);
        // Only the kernels that touch an f16 value bind the halves (less code to compile).
        let memory = Memory {
            half: memory.half
                && std::iter::once(*node)
                    .chain(g.node(id).inputs.iter().map(|x| x.index()))
                    .chain(k.extra().iter().copied())
                    .any(|v| w.form[v] == Form::Half),
            ..memory
        };
        let source = shaders::finish(&source, &memory);
        let pipeline = gpu.pipeline(&source).map_err(|e| Error::Unsupported {
            backend: "wgpu".into(),
            op: g.node(id).op.name().into(),
            node: id,
            msg: format!("shader rejected: {e}"),
        })?;
        planned.push(Planned {
            node: *node,
            op: g.node(id).op.step_name(),
            pipeline,
            at,
            end: meta.len(),
            groups,
            memory,
        });
    }
    Ok((meta, planned))
}

/// The steps: `meta` in one buffer, each step's slice of it bound with the arena and params
/// buffers.
pub(super) fn bind(
    gpu: &Gpu,
    meta: &[u32],
    planned: Vec<Planned>,
    arena: &[wgpu::Buffer],
    pbuf: &[wgpu::Buffer],
) -> Vec<Step> {
    let meta_buf = gpu.create_buffer(&wgpu::BufferDescriptor {
        label: Some("rlx meta"),
        size: (meta.len().max(META_ALIGN) * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bytes: Vec<u8> = meta.iter().flat_map(|w| w.to_le_bytes()).collect();
    gpu.queue.write_buffer(&meta_buf, 0, &bytes);
    fn whole(binding: u32, b: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
        wgpu::BindGroupEntry {
            binding,
            resource: b.as_entire_binding(),
        }
    }
    planned
        .into_iter()
        .enumerate()
        .map(|(s, p)| {
            let layout = p.pipeline.get_bind_group_layout(0);
            let meta = wgpu::BindGroupEntry {
                binding: 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &meta_buf,
                    offset: (p.at * 4) as u64,
                    size: wgpu::BufferSize::new(((p.end - p.at) * 4) as u64),
                }),
            };
            let entries: Vec<wgpu::BindGroupEntry> = (0u32..)
                .zip(p.memory.bindings())
                .map(|(k, b)| match b {
                    Bound::Meta => meta.clone(),
                    Bound::Arena(c) | Bound::HalfArena(c) => whole(k, &arena[c]),
                    Bound::Params(c) | Bound::HalfParams(c) => whole(k, &pbuf[c]),
                })
                .collect();
            let bind = gpu.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&format!("step {s}")),
                layout: &layout,
                entries: &entries,
            });
            Step {
                pipeline: p.pipeline,
                bind,
                groups: p.groups,
                node: p.node,
                op: p.op,
            }
        })
        .collect()
}
