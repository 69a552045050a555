//! A digits classifier as C for a Cortex-M microcontroller: trained, quantized to int8,
//! written as one C file, built with `arm-none-eabi-gcc` for the Cortex-M4 and run under QEMU
//! (`mps2-an386`) on every held-out image.
//!
//! `cargo run --release -p rlx --example digits_cortexm [mlp|cnn]`

#[path = "support/digits.rs"]
mod support;

use rlx::cortexm::emit_c;
use rlx::cortexm::qemu::{self, Core};
use rlx::quant::integer_core;

fn main() -> rlx::Result<()> {
    let model = support::model_from_args();
    let d = support::data();
    let (params, map) = support::trained(model, &d);
    let core = integer_core(&model.int8(1, &params, &map)?)?;
    let c = emit_c(&core)?;
    let dir = support::root().join(format!("target/digits/{}-cortexm", model.name()));
    std::fs::create_dir_all(&dir).map_err(|e| rlx::Error::Invalid(e.to_string()))?;
    std::fs::write(dir.join("model.c"), &c.source)
        .map_err(|e| rlx::Error::Invalid(e.to_string()))?;
    println!(
        "wrote {} (arena {} B, constants {} B)",
        dir.join("model.c").display(),
        c.arena_bytes,
        c.constant_bytes
    );
    if !qemu::tools_present() {
        println!("arm-none-eabi-gcc or qemu-system-arm is missing: scripts/test.sh installs them");
        return Ok(());
    }
    let inputs = support::quantized_inputs(&d, core.input);
    let img = qemu::build(&c, &inputs, Core::M4, &dir)?;
    let outs = qemu::run(&img, inputs.len(), c.output_len)?;
    println!(
        "Cortex-M4 under QEMU: {:.2}% of {} held-out images; model flash {} B, RAM {} B, {} smlad",
        100.0 * support::int8_accuracy(&outs, &d.test_y),
        inputs.len(),
        img.model_text,
        img.model_bss,
        img.smlad
    );
    Ok(())
}
