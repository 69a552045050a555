//! The edge suite: the digits models quantized to int8 (`rlx::quant`) as C for Cortex-M
//! (flash and RAM from `arm-none-eabi-size`, against the float weights' bytes) and as FPGA
//! datapaths at both ends of the MAC-lane parameter (cycles per inference from Verilator,
//! cells, multipliers and memory bits from Yosys's generic synthesis).

use crate::die;
use rlx::cortexm::qemu::{self, Core};
use rlx::fpga::{emit_sv, sim};
use rlx::models::digits::{DigitsModel, PIXELS};
use rlx::quant::{integer_core, RangeMethod};

/// Run the suite (no reference: sizes and cycles are RLX's own).
pub fn suite() {
    if !qemu::tools_present() || !sim::tools_present() {
        die("the edge suite needs arm-none-eabi-gcc, qemu-system-arm, verilator and yosys (scripts/test.sh installs them)");
    }
    let dir = std::env::temp_dir().join(format!("rlx-bench-edge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| die(&e.to_string()));
    let (_, d) = crate::int8::digits(&dir);
    let mut cm = Vec::new();
    let mut fpga = Vec::new();
    for (model, epochs, widest) in [(DigitsModel::Mlp, 40, 64), (DigitsModel::Cnn, 15, 32)] {
        let params = model
            .train(&d, epochs, 7)
            .unwrap_or_else(|e| die(&e.to_string()));
        let map = model
            .calibrate(&params, &d.train_x[..256 * PIXELS], RangeMethod::MinMax)
            .unwrap_or_else(|e| die(&e.to_string()));
        let g = model
            .int8(1, &params, &map)
            .unwrap_or_else(|e| die(&e.to_string()));
        let core = integer_core(&g).unwrap_or_else(|e| die(&e.to_string()));
        let float_bytes: usize = model
            .params()
            .iter()
            .map(|(_, d)| 4 * d.iter().product::<usize>())
            .sum();
        let c = rlx::cortexm::emit_c(&core).unwrap_or_else(|e| die(&e.to_string()));
        let one = vec![vec![0i8; c.input_len]];
        for core_kind in [Core::M4, Core::M55] {
            let img = qemu::build(
                &c,
                &one,
                core_kind,
                &dir.join(format!("{}-{}", model.name(), core_kind.cpu())),
            )
            .unwrap_or_else(|e| die(&e.to_string()));
            cm.push(format!(
                "| {} | {} | {} | {} | {float_bytes} | {:.2}× |",
                model.name(),
                core_kind.cpu(),
                img.model_text,
                img.model_bss,
                float_bytes as f64 / img.model_text as f64
            ));
        }
        let x: Vec<Vec<i8>> = vec![vec![0i8; c.input_len]];
        for lanes in [1, widest] {
            let sv = emit_sv(&core, lanes).unwrap_or_else(|e| die(&e.to_string()));
            let at = dir.join(format!("{}-fpga-{lanes}", model.name()));
            let s = sim::simulate(&sv, &x, &at).unwrap_or_else(|e| die(&e.to_string()));
            let syn = sim::synthesize(&sv, &at, true).unwrap_or_else(|e| die(&e.to_string()));
            fpga.push(format!(
                "| {} | {lanes} | {} | {} | {} | {} |",
                model.name(),
                s.cycles[0],
                syn.cells.unwrap_or(0),
                syn.multipliers,
                syn.memory_bits
            ));
        }
    }
    println!("\n### Cortex-M: the int8 model's flash and RAM (`arm-none-eabi-size` of its object) against the float weights\n");
    println!("| model | core | flash (B) | RAM (B) | float weights (B) | float / flash |");
    println!("|---|---|---:|---:|---:|---:|");
    cm.iter().for_each(|l| println!("{l}"));
    println!("\n### FPGA: cycles per inference (Verilator; streaming in and out included) and Yosys's generic synthesis at both ends of the MAC lanes\n");
    println!("| model | MAC lanes | cycles | cells | multipliers ($mul) | memory bits |");
    println!("|---|---:|---:|---:|---:|---:|");
    fpga.iter().for_each(|l| println!("{l}"));
    std::fs::remove_dir_all(&dir).ok();
}
