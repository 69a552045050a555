//! Values converted for a library call: the operands cuBLAS multiplies.

use super::{compute, fit, grid_kernel, load, storage, store};
use rlx_ir::DType;

/// Words of a conversion: `[n, x, out]`.
pub const CONVERT_WORDS: usize = 3;

/// `x` (of `from`) as `to`, rounded to nearest even, a thread per element.
pub fn convert(from: DType, to: DType) -> Option<String> {
    let (sf, st) = (storage(from)?, storage(to)?);
    if !matches!(compute(from)?, "float" | "double") || !matches!(compute(to)?, "float") {
        return None;
    }
    let v = store(
        to,
        &fit(
            to,
            format!("(float){}", load(from, &format!("(({sf}*)m.w[1])[i]"))),
        ),
    );
    Some(grid_kernel(
        CONVERT_WORDS,
        &format!("        (({st}*)m.w[2])[i] = {v};\n"),
    ))
}
