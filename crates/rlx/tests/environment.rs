//! Every environment variable RLX reads is in `rlx_ir::env::VARS` (read through it), and
//! `docs/environment.md` holds exactly that table (`RLX_BLESS=1` rewrites it).

use rlx::ir::env::{markdown_table, TEST_VARS, VARS};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The `RLX_...` names in `text` (inside string literals or docs alike).
fn names(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("RLX_") {
        let s = i + at;
        let mut e = s + 4;
        while e < b.len() && (b[e].is_ascii_uppercase() || b[e].is_ascii_digit() || b[e] == b'_') {
            e += 1;
        }
        let prev_ok = s == 0 || !(b[s - 1].is_ascii_alphanumeric() || b[s - 1] == b'_');
        if prev_ok && e > s + 4 {
            out.push(text[s..e].trim_end_matches('_').to_string());
        }
        i = e;
    }
    out
}

#[test]
fn every_variable_the_code_names_is_in_the_table() {
    let known: Vec<&str> = VARS.iter().chain(TEST_VARS).map(|v| v.name).collect();
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    assert!(files.len() > 10, "found the sources");
    let mut unknown = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for n in names(&text) {
            if !known.contains(&n.as_str()) {
                unknown.push(format!("{} in {}", n, f.display()));
            }
        }
    }
    assert!(unknown.is_empty(), "not in rlx_ir::env::VARS: {unknown:#?}");
    // The names are distinct.
    for (i, a) in known.iter().enumerate() {
        assert!(!known[i + 1..].contains(a), "{a} is listed twice");
    }
}

#[test]
fn the_environment_page_holds_the_table() {
    let path = root().join("docs/environment.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    let table = markdown_table();
    if rlx::ir::env::get(rlx::ir::env::BLESS).as_deref() == Some("1") {
        let (head, tail) = match (doc.find("| variable |"), doc.find("<!-- end of table -->")) {
            (Some(s), Some(e)) => (doc[..s].to_string(), doc[e..].to_string()),
            _ => panic!("docs/environment.md needs the table and its end marker"),
        };
        std::fs::write(&path, format!("{head}{table}{tail}")).unwrap();
        return;
    }
    assert!(
        doc.contains(&table),
        "docs/environment.md does not hold rlx_ir::env's table; run \
         RLX_BLESS=1 cargo test -p rlx --test environment"
    );
}

/// The record of GPU runs (`docs/gpu-runs.md`, written by `scripts/gpu-record.py`) lists every
/// test that needs a CUDA device, and every such test is `#[ignore]`d (so `cargo test` never
/// reports it `ok` without a device): a new device test regenerates the record.
#[test]
fn the_gpu_record_lists_every_device_test() {
    let record = std::fs::read_to_string(root().join("docs/gpu-runs.md")).unwrap();
    let mut files = Vec::new();
    rust_files(&root().join("crates"), &mut files);
    let mut found = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix("fn needs_cuda_device_") else {
                continue;
            };
            let name = format!("needs_cuda_device_{}", rest.split('(').next().unwrap());
            assert!(
                i > 0 && lines[i - 1].contains("#[ignore = \"needs a CUDA device"),
                "{}: {name} is not #[ignore = \"needs a CUDA device ...\"]",
                f.display()
            );
            assert!(
                record.contains(&format!("`{name}`")),
                "docs/gpu-runs.md does not list {name}: run scripts/gpu-record.py render"
            );
            found += 1;
        }
    }
    assert!(found >= 11, "only {found} device tests found");
}
