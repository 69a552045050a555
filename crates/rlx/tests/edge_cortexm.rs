//! The digits models as C for Cortex-M (`rlx::cortexm`), built with `arm-none-eabi-gcc` and run
//! under QEMU (Cortex-M4 on `mps2-an386`, Cortex-M55 on `mps3-an547`): every held-out image
//! gives the host's int8 output bit for bit. `scripts/test.sh` installs the tools; without them
//! the test fails naming them.

use rlx::cortexm::qemu::{self, Core};
use rlx::cortexm::{emit_c, CModel};
use rlx::models::digits::{DigitsData, DigitsModel, PIXELS};
mod common;

use common::digits::{data, host, quantized, residual_core};
use rlx::prelude::*;
use rlx::quant::{integer_core, IntegerCore, RangeMethod};

fn model_c(model: DigitsModel, d: &DigitsData) -> (IntegerCore, CModel) {
    let params = model
        .train(d, if model == DigitsModel::Mlp { 40 } else { 15 }, 7)
        .unwrap();
    let map = model
        .calibrate(&params, &d.train_x[..256 * PIXELS], RangeMethod::MinMax)
        .unwrap();
    let core = integer_core(&model.int8(1, &params, &map).unwrap()).unwrap();
    let c = emit_c(&core).unwrap();
    (core, c)
}

fn on_qemu(model: DigitsModel) {
    let dir = std::env::temp_dir().join(format!(
        "rlx-cortexm-{}-{}",
        model.name(),
        std::process::id()
    ));
    let (_, d) = data(&dir);
    let (core, c) = model_c(model, &d);
    let inputs = quantized(&d.test_x, core.input);
    run_both_cores(model.name(), &core, &c, &inputs, &dir);
}

/// `c` (written from `core`) on the Cortex-M4 and the Cortex-M55 under QEMU: every input's
/// output equal to the host's, `smlad` in the code.
fn run_both_cores(
    name: &str,
    core: &IntegerCore,
    c: &CModel,
    inputs: &[Vec<i8>],
    dir: &std::path::Path,
) {
    assert!(
        qemu::tools_present(),
        "arm-none-eabi-gcc and qemu-system-arm are needed (scripts/test.sh installs them)"
    );
    let want = host(core, inputs);
    for core_kind in [Core::M4, Core::M55] {
        let img = qemu::build(c, inputs, core_kind, &dir.join(core_kind.cpu())).unwrap();
        let got = qemu::run(&img, inputs.len(), c.output_len).unwrap();
        let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        println!(
            "{} on {}: model flash {} B, RAM {} B (image with the inputs: text {} B, data {} B, bss {} B; arena {} B, constants {} B), {} smlad; {} of {} outputs differ",
            name,
            core_kind.cpu(),
            img.model_text,
            img.model_bss,
            img.text,
            img.data,
            img.bss,
            c.arena_bytes,
            c.constant_bytes,
            img.smlad,
            wrong,
            inputs.len()
        );
        assert_eq!(
            wrong,
            0,
            "the {} build differs from the host",
            core_kind.cpu()
        );
        assert!(img.smlad > 0, "no smlad in the {} build", core_kind.cpu());
        assert!(img.bss >= c.arena_bytes);
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `qadd` (a residual connection with ReLU) and mean pooling with padding, beside the ops the
/// digits models use: the first 200 held-out images, bit for bit on both cores.
#[test]
fn a_residual_model_with_mean_pooling_runs_bit_exact_on_cortex_m_under_qemu() {
    let dir = std::env::temp_dir().join(format!("rlx-cortexm-residual-{}", std::process::id()));
    let (_, d) = data(&dir);
    let core = residual_core(&d.train_x[..256 * PIXELS]);
    let c = emit_c(&core).unwrap();
    let inputs = quantized(&d.test_x[..200 * PIXELS], core.input);
    run_both_cores("residual", &core, &c, &inputs, &dir);
}

#[test]
fn the_digits_mlp_runs_bit_exact_on_cortex_m_under_qemu() {
    on_qemu(DigitsModel::Mlp);
}

#[test]
fn the_digits_cnn_runs_bit_exact_on_cortex_m_under_qemu() {
    on_qemu(DigitsModel::Cnn);
}

#[test]
fn an_op_the_writer_lacks_is_a_named_error() {
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
    let e = emit_c(&core).unwrap_err().to_string();
    assert!(
        e.contains("cast") && e.contains("softmax") && e.contains("%1"),
        "{e}"
    );
}
