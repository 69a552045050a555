//! A digits classifier as an FPGA datapath: trained, quantized to int8, written as
//! SystemVerilog with the given number of MAC lanes, simulated with Verilator on every
//! held-out image and synthesized with Yosys.
//!
//! `cargo run --release -p rlx --example digits_fpga [mlp|cnn] [lanes]`

#[path = "support/digits.rs"]
mod support;

use rlx::fpga::{emit_sv, sim};
use rlx::quant::integer_core;

fn main() -> rlx::Result<()> {
    let model = support::model_from_args();
    let lanes: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let d = support::data();
    let (params, map) = support::trained(model, &d);
    let core = integer_core(&model.int8(1, &params, &map)?)?;
    let sv = emit_sv(&core, lanes)?;
    let dir = support::root().join(format!("target/digits/{}-fpga-{lanes}", model.name()));
    std::fs::create_dir_all(&dir).map_err(|e| rlx::Error::Invalid(e.to_string()))?;
    std::fs::write(dir.join("model.sv"), &sv.source)
        .map_err(|e| rlx::Error::Invalid(e.to_string()))?;
    println!(
        "wrote {} ({lanes} MAC lanes, ROM {} bits, RAM {} bits)",
        dir.join("model.sv").display(),
        sv.rom_bits,
        sv.ram_bits
    );
    if !sim::tools_present() {
        println!("verilator or yosys is missing: scripts/test.sh installs them");
        return Ok(());
    }
    let inputs = support::quantized_inputs(&d, core.input);
    let s = sim::simulate(&sv, &inputs, &dir)?;
    let syn = sim::synthesize(&sv, &dir, true)?;
    println!(
        "Verilator: {:.2}% of {} held-out images, {} cycles per inference; Yosys: {} cells, {} multipliers, {} memory bits",
        100.0 * support::int8_accuracy(&s.outputs, &d.test_y),
        inputs.len(),
        s.cycles[0],
        syn.cells.unwrap_or(0),
        syn.multipliers,
        syn.memory_bits
    );
    Ok(())
}
