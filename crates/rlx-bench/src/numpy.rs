//! The numpy side: a subprocess running `python/numpy_ref.py` with the BLAS thread count fixed.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Numpy {
    python: PathBuf,
    script: PathBuf,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The per-repetition `values` of a reference script's JSON line.
pub fn values(v: &serde_json::Value) -> Vec<f64> {
    v["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|x| x.as_f64())
        .collect()
}

impl Numpy {
    /// The given python, or the project venv (created by scripts/setup-pyenv.sh if missing).
    pub fn find(python: Option<&str>) -> Numpy {
        let root = repo_root();
        let python = match python {
            Some(p) => PathBuf::from(p),
            None => {
                let venv = root.join(".venv/bin/python");
                if !venv.exists() {
                    eprintln!("rlx-bench: creating the Python venv with numpy (scripts/setup-pyenv.sh)...");
                    let ok = Command::new("bash")
                        .arg(root.join("scripts/setup-pyenv.sh"))
                        .status()
                        .map(|s| s.success())
                        .unwrap_or(false);
                    if !ok {
                        eprintln!("rlx-bench: could not create the venv; pass --python PATH or --no-numpy");
                        std::process::exit(1);
                    }
                }
                venv
            }
        };
        Numpy {
            python,
            script: root.join("crates/rlx-bench/python/numpy_ref.py"),
        }
    }

    fn call(&self, args: &[&str], threads: usize, reps: usize) -> serde_json::Value {
        let out = Command::new(&self.python)
            .arg(&self.script)
            .args(args)
            .args([
                "--threads",
                &threads.to_string(),
                "--reps",
                &reps.to_string(),
            ])
            // This machine's OpenBLAS overrides slow a current numpy; measure it as shipped.
            .env_remove("OPENBLAS_CORETYPE")
            .env_remove("OPENBLAS_L2_SIZE")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.python.display()));
        if !out.status.success() {
            panic!(
                "numpy_ref.py failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).expect("numpy_ref.py prints one JSON object")
    }

    /// Per-repetition metric values (GFLOP/s or GB/s).
    pub fn run(&self, args: &[&str], threads: usize, reps: usize) -> Vec<f64> {
        values(&self.call(args, threads, reps))
    }

    /// numpy version and BLAS build, from a tiny run.
    pub fn describe(&self) -> String {
        let v = self.call(&["--op", "gemm", "--size", "64"], 1, 1);
        format!(
            "numpy {}, {} {} ({} kernel)",
            v["numpy"].as_str().unwrap_or("?"),
            v["blas"]["internal_api"].as_str().unwrap_or("?"),
            v["blas"]["version"].as_str().unwrap_or("?"),
            v["blas"]["architecture"].as_str().unwrap_or("?")
        )
    }
}
