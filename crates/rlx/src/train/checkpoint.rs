//! Checkpoints in the safetensors format: every param and optimizer slot, plus the step count
//! in the header metadata.

use rlx_ir::{DType, Error, Result};
use rlx_runtime::CompiledGraph;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;

fn to_st(d: DType) -> Result<Dtype> {
    Ok(match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F64 => Dtype::F64,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::Bool => Dtype::BOOL,
        DType::C64 => {
            return Err(Error::Invalid(
                "c64 params cannot be stored in safetensors".into(),
            ))
        }
    })
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("checkpoint {}: {e}", path.display()))
}

pub(super) fn save(c: &CompiledGraph, step: u64, path: &Path) -> Result<()> {
    let mut data = Vec::new();
    for slot in c.params() {
        let (bytes, dt) = c.try_get_param_typed(&slot.name)?;
        let dims = slot.shape.static_dims().unwrap_or_default();
        data.push((slot.name.clone(), bytes, to_st(dt)?, dims));
    }
    let views = data
        .iter()
        .map(|(n, b, d, s)| TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| io(path, e))?;
    let meta = HashMap::from([
        ("step".to_string(), step.to_string()),
        ("format".to_string(), "rlx".to_string()),
    ]);
    // Write to a temporary file first so an interrupted save never truncates a good checkpoint.
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::tensor::serialize_to_file(views, Some(meta), &tmp).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))
}

pub(super) fn load(c: &mut CompiledGraph, path: &Path) -> Result<u64> {
    let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
    load_bytes(c, &bytes, path)
}

/// Load checkpoint bytes (`path` only names the source in errors). Malformed or foreign files
/// are errors, never panics; nothing is written unless every tensor matches.
pub(super) fn load_bytes(c: &mut CompiledGraph, bytes: &[u8], path: &Path) -> Result<u64> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| io(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| io(path, e))?;
    let step = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("step"))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io(
                path,
                "no step count in the metadata; was it written by Trainer::save?",
            )
        })?;
    let params: Vec<(String, rlx_ir::Shape)> = c
        .params()
        .iter()
        .map(|s| (s.name.clone(), s.shape.clone()))
        .collect();
    let mut found = Vec::with_capacity(params.len());
    for (name, shape) in &params {
        let t = st
            .tensor(name)
            .map_err(|_| io(path, format!("no tensor \"{name}\"")))?;
        let want = shape.static_dims().unwrap_or_default();
        if t.dtype() != to_st(shape.dtype())? || t.shape() != want.as_slice() {
            return Err(io(
                path,
                format!(
                    "tensor \"{name}\" is {:?}{:?}, the model has {shape}",
                    t.dtype(),
                    t.shape()
                ),
            ));
        }
        found.push(t);
    }
    for ((name, shape), t) in params.iter().zip(found) {
        c.try_set_param_typed(name, t.data(), shape.dtype())?;
    }
    Ok(step)
}
