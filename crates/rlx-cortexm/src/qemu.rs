//! Build a [`CModel`] into a test image for a QEMU board and run it there: the model, a
//! harness holding the inputs (in flash) that prints each output as hex through semihosting,
//! and a minimal startup (`qemu/startup.c` with the board's linker script). Needs
//! `arm-none-eabi-gcc` (with newlib, for `memcpy`) and `qemu-system-arm`; the tests' script
//! installs them (Debian's `gcc-arm-none-eabi`, `libnewlib-arm-none-eabi`, `qemu-system-arm`).

use crate::CModel;
use rlx_ir::{Error, Result};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A core and the QEMU board that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    /// Cortex-M4 (ARMv7E-M, DSP and FPv4-SP) on `mps2-an386`.
    M4,
    /// Cortex-M55 (ARMv8.1-M with the DSP extension and Helium) on `mps3-an547`.
    M55,
}

impl Core {
    /// GCC's `-mcpu`.
    pub fn cpu(self) -> &'static str {
        match self {
            Core::M4 => "cortex-m4",
            Core::M55 => "cortex-m55",
        }
    }

    /// QEMU's `-M`.
    pub fn machine(self) -> &'static str {
        match self {
            Core::M4 => "mps2-an386",
            Core::M55 => "mps3-an547",
        }
    }

    fn linker_script(self) -> &'static str {
        match self {
            Core::M4 => include_str!("../qemu/an386.ld"),
            Core::M55 => include_str!("../qemu/an547.ld"),
        }
    }
}

/// A built image and what it takes.
#[derive(Clone, Debug)]
pub struct Image {
    /// The ELF file.
    pub elf: PathBuf,
    /// The core it is built for.
    pub core: Core,
    /// Bytes of code and read-only data (flash), as `arm-none-eabi-size` counts `text`.
    pub text: usize,
    /// Bytes of initialized data.
    pub data: usize,
    /// Bytes of zeroed data (RAM: the arena and the harness's output row).
    pub bss: usize,
    /// How many `smlad` instructions the model's code holds (the DSP products).
    pub smlad: usize,
    /// The model's own flash (its object's `text`: kernels and constants, no harness).
    pub model_text: usize,
    /// The model's own RAM (its object's `bss`: the arena).
    pub model_bss: usize,
}

fn tool(name: &str) -> Command {
    Command::new(name)
}

fn run_tool(mut c: Command, what: &str) -> Result<String> {
    let out = c
        .output()
        .map_err(|e| Error::Invalid(format!("{what}: cannot run it ({e}); install gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")))?;
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the cross compiler and QEMU are on the `PATH`.
pub fn tools_present() -> bool {
    ["arm-none-eabi-gcc", "qemu-system-arm"].iter().all(|t| {
        tool(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The harness: `inputs` in flash, each run through `rlx_model_run` and its output printed as
/// one line of hex.
fn harness(model: &CModel, inputs: &[Vec<i8>]) -> Result<String> {
    let mut c = String::from(
        "#include <stdint.h>\nvoid rlx_model_run(const int8_t *input, int8_t *output);\nvoid rlx_print(const char *s);\n",
    );
    let _ = write!(
        c,
        "static const int8_t inputs[{}][{}] = {{",
        inputs.len().max(1),
        model.input_len.max(1)
    );
    for x in inputs {
        if x.len() != model.input_len {
            return Err(Error::Invalid(format!(
                "an input of {} values for a model taking {}",
                x.len(),
                model.input_len
            )));
        }
        c.push_str("\n    {");
        for v in x {
            let _ = write!(c, "{v},");
        }
        c.push_str("},");
    }
    let _ = write!(
        c,
        "\n}};\nstatic int8_t output[{o}];\nstatic char line[{o} * 2 + 2];\n\
         int main(void) {{\n    static const char hex[] = \"0123456789abcdef\";\n\
         for (int i = 0; i < {n}; i++) {{\n        rlx_model_run(inputs[i], output);\n\
         for (int j = 0; j < {o}; j++) {{\n            uint8_t b = (uint8_t)output[j];\n\
         line[2 * j] = hex[b >> 4];\n            line[2 * j + 1] = hex[b & 15];\n        }}\n\
         line[2 * {o}] = '\\n';\n        line[2 * {o} + 1] = 0;\n        rlx_print(line);\n    }}\n\
         return 0;\n}}\n",
        o = model.output_len,
        n = inputs.len()
    );
    Ok(c)
}

/// Compile `model` with a harness over `inputs` for `core` in `dir`
/// (`arm-none-eabi-gcc -mcpu=<core> -mthumb -mfloat-abi=hard -O2`).
pub fn build(model: &CModel, inputs: &[Vec<i8>], core: Core, dir: &Path) -> Result<Image> {
    let io = |e: std::io::Error| {
        Error::Invalid(format!(
            "writing the image's sources in {}: {e}",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let files = [
        ("model.c", model.source.clone()),
        ("harness.c", harness(model, inputs)?),
        ("startup.c", include_str!("../qemu/startup.c").to_string()),
        ("board.ld", core.linker_script().to_string()),
    ];
    for (name, text) in &files {
        std::fs::write(dir.join(name), text).map_err(io)?;
    }
    let elf = dir.join(format!("model-{}.elf", core.cpu()));
    let mut cc = tool("arm-none-eabi-gcc");
    cc.current_dir(dir).args([
        &format!("-mcpu={}", core.cpu()),
        "-mthumb",
        "-mfloat-abi=hard",
        "-O2",
        "-std=c11",
        "-Wall",
        "-Werror",
        "-ffunction-sections",
        "-fdata-sections",
        "-nostartfiles",
        "--specs=nano.specs",
        "-T",
        "board.ld",
        "startup.c",
        "harness.c",
        "model.c",
        "-Wl,--gc-sections",
        "-o",
    ]);
    cc.arg(&elf);
    run_tool(cc, "arm-none-eabi-gcc")?;
    let [text, data, bss] = sizes(&elf)?;
    // The model alone, as an object.
    let obj = dir.join(format!("model-{}.o", core.cpu()));
    let mut cc = tool("arm-none-eabi-gcc");
    cc.current_dir(dir)
        .args([
            &format!("-mcpu={}", core.cpu()),
            "-mthumb",
            "-mfloat-abi=hard",
            "-O2",
            "-std=c11",
        ])
        .args([
            "-ffunction-sections",
            "-fdata-sections",
            "-c",
            "model.c",
            "-o",
        ])
        .arg(&obj);
    run_tool(cc, "arm-none-eabi-gcc")?;
    let [model_text, _, model_bss] = sizes(&obj)?;
    let mut dis = tool("arm-none-eabi-objdump");
    dis.arg("-d").arg(&elf);
    let smlad = run_tool(dis, "arm-none-eabi-objdump")?
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == "smlad"))
        .count();
    Ok(Image {
        elf,
        core,
        text,
        data,
        bss,
        smlad,
        model_text,
        model_bss,
    })
}

/// `text`, `data` and `bss` of an ELF file or object (`arm-none-eabi-size`).
fn sizes(file: &Path) -> Result<[usize; 3]> {
    let mut size = tool("arm-none-eabi-size");
    size.arg(file);
    let out = run_tool(size, "arm-none-eabi-size")?;
    let nums: Vec<usize> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect();
    <[usize; 3]>::try_from(nums)
        .map_err(|_| Error::Invalid(format!("arm-none-eabi-size printed {out:?}")))
}

/// Run `image` under QEMU (`qemu-system-arm -M <board> -semihosting`) and read back one output
/// per input.
pub fn run(image: &Image, outputs: usize, output_len: usize) -> Result<Vec<Vec<i8>>> {
    let mut q = tool("qemu-system-arm");
    q.args([
        "-M",
        image.core.machine(),
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-kernel",
    ]);
    q.arg(&image.elf);
    let out = q.output().map_err(|e| {
        Error::Invalid(format!(
            "qemu-system-arm: cannot run it ({e}); install qemu-system-arm"
        ))
    })?;
    // Semihosting writes to QEMU's standard error; anything else QEMU says is not hex rows.
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "qemu-system-arm -M {} failed ({}):\n{text}",
            image.core.machine(),
            out.status
        )));
    }
    let hex_row = |l: &str| l.len() == 2 * output_len && l.bytes().all(|b| b.is_ascii_hexdigit());
    let rows: Vec<Vec<i8>> = text
        .lines()
        .filter(|l| hex_row(l))
        .map(|l| {
            (0..output_len)
                .filter_map(|i| u8::from_str_radix(&l[2 * i..2 * i + 2], 16).ok())
                .map(|b| b as i8)
                .collect()
        })
        .collect();
    if rows.len() != outputs || rows.iter().any(|r| r.len() != output_len) {
        return Err(Error::Invalid(format!(
            "the image printed {} lines where {outputs} outputs of {output_len} values were due:\n{text}",
            rows.len()
        )));
    }
    Ok(rows)
}
