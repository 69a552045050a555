//! Post-training int8 quantization: a digits classifier trained with RLX, calibrated, folded
//! into integer ops and run on the CPU, float against int8 on the held-out images.
//!
//! `cargo run --release -p rlx --example digits_int8 [mlp|cnn]`

#[path = "support/digits.rs"]
mod support;

use rlx::models::digits::{accuracy, PIXELS};
use rlx::prelude::*;
use rlx::quant::{insert_q_dq, quant_propagate, QuantMap};

fn main() -> rlx::Result<()> {
    let model = support::model_from_args();
    let d = support::data();
    let (params, map) = support::trained(model, &d);
    let n = d.test_y.len();
    // The float model and its int8 form at the held-out batch.
    let float = model.specialized(n, &params)?;
    let qdq = insert_q_dq(&float, &map)?;
    let int8 = quant_propagate(&qdq)?;
    let run = |g: Graph| -> rlx::Result<Vec<f32>> {
        let mut c = Session::new(Device::Cpu).try_compile(g)?;
        Ok(c.try_run(&[("x", &d.test_x[..n * PIXELS])])?.remove(0))
    };
    let (f, q) = (run(float)?, run(int8)?);
    println!(
        "{}: float {:.2}%, int8 {:.2}% on {n} held-out images",
        model.name(),
        100.0 * accuracy(&f, &d.test_y),
        100.0 * accuracy(&q, &d.test_y)
    );
    // The integer graph at batch 1, and the map (JSON) it came from.
    println!("\n{}", model.int8(1, &params, &map)?);
    let path = support::root().join(format!("target/digits/{}.quant.json", model.name()));
    std::fs::write(&path, map.to_json()).map_err(|e| rlx::Error::Invalid(e.to_string()))?;
    assert_eq!(
        QuantMap::from_json(&std::fs::read_to_string(&path).unwrap_or_default())?,
        map
    );
    println!("quantization map: {}", path.display());
    Ok(())
}
