//! Run an [`SvModel`] under Verilator and synthesize it with Yosys. Needs `verilator` (with a
//! C++ compiler and `make`) and `yosys`; the tests' script installs them (Debian's `verilator`
//! and `yosys`).

use crate::SvModel;
use rlx_ir::{Error, Result};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether Verilator and Yosys are on the `PATH`.
pub fn tools_present() -> bool {
    [("verilator", "--version"), ("yosys", "-V")]
        .iter()
        .all(|(t, a)| {
            Command::new(t)
                .arg(a)
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

fn run(mut c: Command, what: &str) -> Result<String> {
    let out = c.output().map_err(|e| {
        Error::Invalid(format!(
            "{what}: cannot run it ({e}); install verilator and yosys"
        ))
    })?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "{what} failed ({}):\n{text}",
            out.status
        )));
    }
    Ok(text)
}

/// A Verilator testbench for `model`: it reads inputs (one line of hex per inference) from
/// the file named by its first argument, streams each through `rlx_model` (valid / ready),
/// and prints each output as a line of hex followed by the cycles from the first input value
/// accepted to the last output value taken.
pub fn testbench_cpp(model: &SvModel) -> String {
    let mut c = String::new();
    let _ = write!(
        c,
        r#"#include "Vrlx_model.h"
#include "verilated.h"
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

static Vrlx_model *m;
static uint64_t cycles = 0;

static void tick() {{
    m->clk = 0;
    m->eval();
    m->clk = 1;
    m->eval();
    cycles++;
}}

int main(int argc, char **argv) {{
    Verilated::commandArgs(argc, argv);
    m = new Vrlx_model;
    FILE *f = fopen(argv[1], "r");
    if (!f) return 2;
    m->rst = 1;
    m->in_valid = 0;
    m->out_ready = 0;
    tick();
    tick();
    m->rst = 0;
    char line[{cap}];
    while (fgets(line, sizeof line, f)) {{
        if (strlen(line) < {inlen2}) continue;
        std::vector<uint8_t> in({inlen});
        for (int i = 0; i < {inlen}; i++) {{
            unsigned v;
            sscanf(line + 2 * i, "%2x", &v);
            in[i] = (uint8_t)v;
        }}
        uint64_t start = cycles;
        int sent = 0, got = 0;
        char out[{outlen2} + 1];
        while (sent < {inlen}) {{
            m->in_valid = 1;
            m->in_data = in[sent];
            m->clk = 0;
            m->eval();
            bool fire = m->in_ready;
            tick();
            if (fire) sent++;
        }}
        m->in_valid = 0;
        m->out_ready = 1;
        while (got < {outlen}) {{
            m->clk = 0;
            m->eval();
            bool fire = m->out_valid;
            uint8_t v = m->out_data;
            tick();
            if (fire) {{
                snprintf(out + 2 * got, 3, "%02x", v);
                got++;
            }}
            if (cycles - start > 100000000ull) {{
                printf("timeout\n");
                return 3;
            }}
        }}
        m->out_ready = 0;
        printf("%s %llu\n", out, (unsigned long long)(cycles - start));
    }}
    m->final();
    delete m;
    return 0;
}}
"#,
        cap = 2 * model.input_len + 16,
        inlen = model.input_len,
        inlen2 = 2 * model.input_len,
        outlen = model.output_len,
        outlen2 = 2 * model.output_len,
    );
    c
}

/// The outputs and cycles of a simulation.
#[derive(Clone, Debug)]
pub struct Simulation {
    /// One output per input.
    pub outputs: Vec<Vec<i8>>,
    /// Cycles per inference, streaming in and out included.
    pub cycles: Vec<u64>,
}

/// Build `model` with Verilator in `dir` and run `inputs` through it.
pub fn simulate(model: &SvModel, inputs: &[Vec<i8>], dir: &Path) -> Result<Simulation> {
    let io = |e: std::io::Error| {
        Error::Invalid(format!("writing the simulation in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join("model.sv"), &model.source).map_err(io)?;
    std::fs::write(dir.join("tb.cpp"), testbench_cpp(model)).map_err(io)?;
    let mut hex = String::new();
    for x in inputs {
        if x.len() != model.input_len {
            return Err(Error::Invalid(format!(
                "an input of {} values for a model taking {}",
                x.len(),
                model.input_len
            )));
        }
        for v in x {
            let _ = write!(hex, "{:02x}", *v as u8);
        }
        hex.push('\n');
    }
    std::fs::write(dir.join("inputs.hex"), hex).map_err(io)?;
    let mut v = Command::new("verilator");
    v.current_dir(dir).args([
        "--cc",
        "--exe",
        "--build",
        "-j",
        "2",
        "--top-module",
        "rlx_model",
        "-Wno-fatal",
        "-Wno-WIDTH",
        "--Mdir",
        "obj",
        "-o",
        "vtb",
        "model.sv",
        "tb.cpp",
    ]);
    // The generated C++ is compiled without optimization: a testbench of a few thousand
    // cycles per inference runs in moments either way, and compiling is what takes time.
    v.env("OPT_FAST", "-O0")
        .env("OPT_SLOW", "-O0")
        .env("OPT_GLOBAL", "-O0");
    run(v, "verilator")?;
    let bin: PathBuf = dir.join("obj/vtb");
    let mut t = Command::new(&bin);
    t.arg(dir.join("inputs.hex"));
    let text = run(t, "the Verilator testbench")?;
    let mut outputs = Vec::new();
    let mut cycles = Vec::new();
    for l in text.lines() {
        let mut parts = l.split_whitespace();
        let (Some(h), Some(c)) = (parts.next(), parts.next()) else {
            continue;
        };
        if h.len() != 2 * model.output_len {
            continue;
        }
        outputs.push(
            (0..model.output_len)
                .filter_map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).ok())
                .map(|b| b as i8)
                .collect(),
        );
        cycles.push(c.parse().unwrap_or(0));
    }
    if outputs.len() != inputs.len() {
        return Err(Error::Invalid(format!(
            "the simulation gave {} outputs for {} inputs:\n{text}",
            outputs.len(),
            inputs.len()
        )));
    }
    Ok(Simulation { outputs, cycles })
}

/// What Yosys makes of a model.
#[derive(Clone, Debug)]
pub struct Synthesis {
    /// Multiplier cells (`$mul`) of the coarse netlist: the MAC lanes, the requantization
    /// unit's, and address products with one constant operand.
    pub multipliers: usize,
    /// Memory bits (`$mem_v2` cells, after Yosys narrowed their words).
    pub memory_bits: usize,
    /// Cells after the full generic `synth` (gates, flip-flops and multiplexers), when asked.
    pub cells: Option<usize>,
}

fn stat_number(log: &str, key: &str) -> Option<usize> {
    log.lines().rev().find_map(|l| {
        l.trim()
            .strip_prefix(key)
            .and_then(|r| r.trim().parse().ok())
    })
}

fn cell_count(log: &str, cell: &str) -> usize {
    log.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(cell)).then(|| w.next().and_then(|n| n.parse::<usize>().ok()))?
        })
        .sum()
}

/// `Σ SIZE · WIDTH` over the memories of a `dump t:$mem_v2`.
fn memory_bits(dump: &str) -> usize {
    let param = |key: &str| -> Vec<usize> {
        dump.lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix(key)
                    .and_then(|r| r.trim().parse().ok())
            })
            .collect()
    };
    param("parameter \\SIZE ")
        .iter()
        .zip(param("parameter \\WIDTH "))
        .map(|(s, w)| s * w)
        .sum()
}

/// Synthesize `model` with Yosys in `dir`: the coarse netlist (procedures, flattening,
/// optimization, memories inferred) for the multipliers and memory bits, and with `full` the
/// generic `synth -top rlx_model` for the cell count (slower).
pub fn synthesize(model: &SvModel, dir: &Path, full: bool) -> Result<Synthesis> {
    let io = |e: std::io::Error| {
        Error::Invalid(format!("writing the synthesis in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(dir.join("model.sv"), &model.source).map_err(io)?;
    let mut y = Command::new("yosys");
    y.current_dir(dir).args([
        "-q",
        "-p",
        "read_verilog -sv model.sv; hierarchy -top rlx_model; proc; flatten; opt_expr; opt_clean; opt; \
         wreduce; memory -nomap; opt_clean; tee -o coarse.txt stat; tee -o memories.txt dump t:$mem_v2",
    ]);
    run(y, "yosys")?;
    let coarse = std::fs::read_to_string(dir.join("coarse.txt")).map_err(io)?;
    let mems = std::fs::read_to_string(dir.join("memories.txt")).map_err(io)?;
    let cells = if full {
        let mut y = Command::new("yosys");
        y.current_dir(dir).args([
            "-q",
            "-p",
            "read_verilog -sv model.sv; synth -top rlx_model; tee -o full.txt stat",
        ]);
        run(y, "yosys")?;
        let f = std::fs::read_to_string(dir.join("full.txt")).map_err(io)?;
        stat_number(&f, "Number of cells:")
    } else {
        None
    };
    Ok(Synthesis {
        multipliers: cell_count(&coarse, "$mul"),
        memory_bits: memory_bits(&mems),
        cells,
    })
}
