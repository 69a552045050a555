//! The digits models as SystemVerilog datapaths (`rlx::fpga`), simulated with Verilator at both
//! ends of the MAC-lane parameter (one lane, and one per output channel of the widest layer):
//! every held-out image gives the host's int8 output bit for bit. Yosys synthesizes each and
//! reports cells, multipliers and memory bits. `scripts/test.sh` installs the tools; without
//! them the test fails naming them.

use rlx::fpga::{emit_sv, sim};
use rlx::models::digits::{DigitsModel, PIXELS};
mod common;

use common::digits::{data, host, quantized, residual_core};
use rlx::prelude::*;
use rlx::quant::{integer_core, IntegerCore, RangeMethod};

fn on_verilator(model: DigitsModel, widest: usize) {
    let dir =
        std::env::temp_dir().join(format!("rlx-fpga-{}-{}", model.name(), std::process::id()));
    let (_, d) = data(&dir);
    let params = model
        .train(&d, if model == DigitsModel::Mlp { 40 } else { 15 }, 7)
        .unwrap();
    let map = model
        .calibrate(&params, &d.train_x[..256 * PIXELS], RangeMethod::MinMax)
        .unwrap();
    let core = integer_core(&model.int8(1, &params, &map).unwrap()).unwrap();
    let inputs = quantized(&d.test_x, core.input);
    simulate_both_ends(model.name(), &core, &inputs, widest, &dir);
}

/// `core` at one MAC lane and at `widest`, every input through Verilator against the host, bit
/// for bit; Yosys's cells for each; more lanes take fewer cycles.
fn simulate_both_ends(
    name: &str,
    core: &IntegerCore,
    inputs: &[Vec<i8>],
    widest: usize,
    dir: &std::path::Path,
) {
    assert!(
        sim::tools_present(),
        "verilator and yosys are needed (scripts/test.sh installs them)"
    );
    let want = host(core, inputs);
    let mut cycles = Vec::new();
    for macs in [1, widest] {
        let sv = emit_sv(core, macs).unwrap();
        let at = dir.join(format!("macs{macs}"));
        let s = sim::simulate(&sv, inputs, &at).unwrap();
        let wrong = s.outputs.iter().zip(&want).filter(|(a, b)| a != b).count();
        let syn = sim::synthesize(&sv, &at, false).unwrap();
        let c = s.cycles[0];
        println!(
            "{} with {macs} MAC lane(s): {c} cycles per inference (schedule: {} compute), {} multipliers, {} memory bits (ROM {} + RAM {}); {wrong} of {} outputs differ",
            name,
            sv.compute_cycles,
            syn.multipliers,
            syn.memory_bits,
            sv.rom_bits,
            sv.ram_bits,
            inputs.len()
        );
        assert_eq!(
            wrong, 0,
            "the datapath with {macs} lanes differs from the host"
        );
        assert!(
            s.cycles.iter().all(|&x| x == c),
            "cycles vary with the input"
        );
        assert!(
            syn.multipliers >= macs,
            "{} multipliers for {macs} lanes",
            syn.multipliers
        );
        // Yosys narrows words whose top bits never vary (multipliers below 2^30), so the bits it
        // keeps are at most the ROM's and RAM's.
        assert!(
            syn.memory_bits > sv.rom_bits / 2 && syn.memory_bits <= sv.rom_bits + sv.ram_bits,
            "memory bits {} against ROM {} and RAM {}",
            syn.memory_bits,
            sv.rom_bits,
            sv.ram_bits
        );
        cycles.push(c);
    }
    assert!(
        cycles[1] * 2 < cycles[0],
        "more lanes did not cut the cycles: {cycles:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_digits_mlp_runs_bit_exact_as_a_datapath_under_verilator() {
    on_verilator(DigitsModel::Mlp, 64);
}

#[test]
fn the_digits_cnn_runs_bit_exact_as_a_datapath_under_verilator() {
    on_verilator(DigitsModel::Cnn, 32);
}

/// `qadd` (a residual connection with ReLU) and mean pooling with padding, beside the ops the
/// digits models use: the first 200 held-out images, bit for bit at both ends of the parameter.
#[test]
fn a_residual_model_with_mean_pooling_runs_bit_exact_under_verilator() {
    let dir = std::env::temp_dir().join(format!("rlx-fpga-residual-{}", std::process::id()));
    let (_, d) = data(&dir);
    let core = residual_core(&d.train_x[..256 * PIXELS]);
    let inputs = quantized(&d.test_x[..200 * PIXELS], core.input);
    simulate_both_ends("residual", &core, &inputs, 10, &dir);
}

#[test]
fn an_op_the_datapath_lacks_is_a_named_error() {
    let mut g = Graph::new("soft");
    let x = g.input("x", Shape::new(&[1, 4], DType::I8));
    let f = g.cast(x, DType::F32);
    let s = g.softmax(f, 1);
    let q = g.cast(s, DType::I8);
    g.set_outputs(vec![q]);
    let core = IntegerCore {
        graph: g,
        input: (1.0, 0),
        output: (1.0, 0),
    };
    let e = emit_sv(&core, 4).unwrap_err().to_string();
    assert!(
        e.contains("cast") && e.contains("softmax") && e.contains("%1"),
        "{e}"
    );
}
