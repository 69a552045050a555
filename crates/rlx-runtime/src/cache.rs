//! The compile cache: what the backend-independent part of a compile decides (the graph after
//! the precision, simplification, CSE, constant-folding, DCE and decomposition passes and after
//! fusion, with the lowering plan's side tables and every pass's record), keyed by a fingerprint
//! of everything that decides it, kept in memory and optionally on disk, so a later compile of
//! the same graph with the same options (in this process or a new one) goes straight to the
//! backend's lowering.
//!
//! The fingerprint is SHA-256 over a format tag, the RLX version, the program's build (its
//! executable's path, size and modification time: a rebuilt program does not read entries an
//! older build of the same version wrote), the backend and device, the session's options
//! (threads, optimizations, precision policy, bound updates, lowering options after the
//! environment's overrides) and the graph's canonical text form: the same inputs give the same
//! fingerprint in every run and with every Rust release, unlike `DefaultHasher`. A disk entry is a header line naming the format,
//! the RLX version, the fingerprint and the SHA-256 of the rest, then the graph, the plan and
//! the pass records in postcard's binary serde form (constants as raw bytes; for Gemma 3's
//! decode graph a quarter of JSON's bytes, decoded about three times faster). An entry whose header does not match, whose checksum does not
//! (a changed byte anywhere, a constant's included), that does not parse, whose graph does not
//! verify or whose plan does not fit its graph ([`LoweringPlan::check`]) is not used: the graph is
//! compiled again and the entry rewritten (written to a temporary file and renamed, so readers
//! never see half an entry). A directory holds at most a limit of entries (256 MiB unless
//! [`CompileCache::at_with_limit`] says otherwise): writing one removes the least recently used
//! others (a read refreshes an entry's modification time). Lowering (kernel choice, memory
//! plan, kernels) runs on every compile: its result holds the backend's code and addresses.

use rlx_ir::Graph;
use rlx_opt::{LoweringPlan, PassRecord};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The on-disk format; a change of format (or of RLX's version) makes old entries foreign.
const FORMAT: &str = "rlx-compile-cache 3";

/// What a compile stores: the graph to lower (optimized and fused), what each pass did (fusion
/// included) and the lowering plan.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Entry {
    pub(crate) graph: Graph,
    pub(crate) records: Vec<PassRecord>,
    pub(crate) plan: Arc<LoweringPlan>,
}

/// How often the cache answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Compiles answered from memory.
    pub memory_hits: usize,
    /// Compiles answered from disk.
    pub disk_hits: usize,
    /// Compiles that found nothing and ran the passes.
    pub misses: usize,
    /// Disk entries found corrupt or foreign (then compiled again and rewritten).
    pub rejected: usize,
}

/// A compile cache shared by sessions (see the module documentation). Clone the `Arc` to share
/// it; `Session::with_compile_cache` uses it.
#[derive(Debug, Default)]
pub struct CompileCache {
    dir: Option<PathBuf>,
    /// Most bytes of entries kept in `dir` (see [`CompileCache::at_with_limit`]).
    max_bytes: u64,
    memory: Mutex<HashMap<String, Arc<Entry>>>,
    memory_hits: AtomicUsize,
    disk_hits: AtomicUsize,
    misses: AtomicUsize,
    rejected: AtomicUsize,
}

/// A stable fingerprint: the lowercase hex SHA-256 of `parts`, each prefixed by its length so
/// that no two lists of parts hash alike by concatenation.
pub fn fingerprint(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    rlx_ir::hex::encode(&h.finalize())
}

impl CompileCache {
    /// A cache kept in this process's memory only.
    pub fn in_memory() -> Arc<CompileCache> {
        Arc::new(CompileCache::default())
    }

    /// A cache kept in memory and in `dir` (created when first written), holding at most
    /// [`CompileCache::DEFAULT_MAX_BYTES`] of entries there.
    pub fn at(dir: impl Into<PathBuf>) -> Arc<CompileCache> {
        Self::at_with_limit(dir, Self::DEFAULT_MAX_BYTES)
    }

    /// The directory limit of [`CompileCache::at`] and [`CompileCache::on_disk`]: 256 MiB
    /// (an entry is tens of KB).
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

    /// [`CompileCache::at`] holding at most `max_bytes` of entries in `dir`: after writing an
    /// entry, the least recently used others (by modification time, which a read refreshes)
    /// are removed until the directory's entries fit.
    pub fn at_with_limit(dir: impl Into<PathBuf>, max_bytes: u64) -> Arc<CompileCache> {
        Arc::new(CompileCache {
            dir: Some(dir.into()),
            max_bytes,
            ..CompileCache::default()
        })
    }

    /// The RLX cache directory's `compile/` folder: `RLX_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/rlx`, else `~/.cache/rlx` (the models' cache), then `compile`.
    pub fn default_dir() -> Option<PathBuf> {
        Some(rlx_ir::env::cache_dir()?.join("compile"))
    }

    /// A cache in memory and in [`CompileCache::default_dir`] (memory only when there is none).
    pub fn on_disk() -> Arc<CompileCache> {
        match Self::default_dir() {
            Some(d) => Self::at(d),
            None => Self::in_memory(),
        }
    }

    /// The directory entries are kept in, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// How often the cache answered so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.rlxc")))
    }

    /// The header's fields before the checksum: format, version, fingerprint.
    fn header(key: &str) -> String {
        format!("{FORMAT} {} {key} ", env!("CARGO_PKG_VERSION"))
    }

    /// An entry's bytes: the header, the checksum of `body`, a newline, `body`.
    fn encode(key: &str, e: &Entry) -> std::result::Result<Vec<u8>, postcard::Error> {
        let body = postcard::to_stdvec(e)?;
        let mut bytes = Self::header(key).into_bytes();
        bytes.extend(fingerprint(&[&body]).into_bytes());
        bytes.push(b'\n');
        bytes.extend(body);
        Ok(bytes)
    }

    /// The entry of `key`, from memory or disk.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Entry>> {
        if let Some(e) = self.memory.lock().ok()?.get(key) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Some(e.clone());
        }
        let path = self.path(key)?;
        let bytes = std::fs::read(&path).ok()?;
        match Self::decode(key, &bytes) {
            Ok(e) => {
                // Used now: the last to be evicted (best effort; a read-only cache still reads).
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(std::time::SystemTime::now());
                }
                let e = Arc::new(e);
                if let Ok(mut m) = self.memory.lock() {
                    m.insert(key.to_string(), e.clone());
                }
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                Some(e)
            }
            Err(why) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                if rlx_ir::env::is_set(rlx_ir::env::VERBOSE) {
                    eprintln!(
                        "rlx: compile cache entry {} not used: {why}",
                        path.display()
                    );
                }
                None
            }
        }
    }

    /// Read an entry, checking that it is of this format and version, for `key`, that its
    /// graph verifies and that its plan fits the graph.
    fn decode(key: &str, bytes: &[u8]) -> std::result::Result<Entry, String> {
        let header = Self::header(key);
        let rest = bytes
            .strip_prefix(header.as_bytes())
            .ok_or("its header names another format, RLX version or fingerprint")?;
        let sum = fingerprint(&[]).len();
        let (checksum, body) = (rest.get(..sum), rest.get(sum + 1..));
        let (Some(checksum), Some(body)) = (checksum, body) else {
            return Err("it ends inside its header".into());
        };
        if rest[sum] != b'\n' || checksum != fingerprint(&[body]).as_bytes() {
            return Err("its checksum does not match its contents (the file is corrupt)".into());
        }
        let e: Entry = postcard::from_bytes(body).map_err(|e| format!("not valid: {e}"))?;
        rlx_ir::verify(&e.graph).map_err(|e| format!("its graph does not verify: {e}"))?;
        e.plan
            .check(&e.graph)
            .map_err(|e| format!("its plan does not fit its graph: {e}"))?;
        Ok(e)
    }

    /// Keep `entry` under `key` (in memory, and on disk when the cache has a directory; a disk
    /// that cannot be written only costs the next process a compile).
    pub(crate) fn put(&self, key: &str, entry: Entry) -> Arc<Entry> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        let e = Arc::new(entry);
        if let Ok(mut m) = self.memory.lock() {
            m.insert(key.to_string(), e.clone());
        }
        if let Some(path) = self.path(key) {
            if let Err(err) = self.write(&path, key, &e) {
                if rlx_ir::env::is_set(rlx_ir::env::VERBOSE) {
                    eprintln!(
                        "rlx: cannot write compile cache entry {}: {err}",
                        path.display()
                    );
                }
            }
        }
        e
    }

    fn write(&self, path: &Path, key: &str, e: &Entry) -> std::io::Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let bytes = Self::encode(key, e).map_err(std::io::Error::other)?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, path)?;
        self.evict(path)
    }

    /// Remove the least recently used entries of the cache's directory (oldest modification
    /// time first, never `keep`) until the entries add up to at most `max_bytes`.
    fn evict(&self, keep: &Path) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let mut entries = Vec::new();
        let mut total = 0u64;
        for item in std::fs::read_dir(dir)? {
            let item = item?;
            let path = item.path();
            if path.extension().is_none_or(|x| x != "rlxc") {
                continue;
            }
            let Ok(meta) = item.metadata() else {
                continue;
            };
            total += meta.len();
            let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            entries.push((used, meta.len(), path));
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path != keep && std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
        Ok(())
    }
}

/// The fingerprint of compiling `graph` with these options.
pub(crate) fn key(graph: &Graph, backend: &str, device: &str, options: &str) -> String {
    key_of("graph", &graph.to_text(), backend, device, options)
}

/// What tells this program's build apart from another build of the same RLX version (a binary
/// rebuilt with changed passes or kernels must not read the old one's entries, and a version
/// number does not change with every build): the executable's path, size and modification
/// time, asked once a process; empty where the system does not say.
fn build_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let id = || -> std::io::Result<String> {
            let exe = std::env::current_exe()?;
            let meta = std::fs::metadata(&exe)?;
            let modified = meta
                .modified()?
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            Ok(format!("{} {} {modified}", exe.display(), meta.len()))
        };
        id().unwrap_or_default()
    })
}

/// The fingerprint of compiling what `text` names (of `kind`: `graph` for a graph's canonical
/// text, `built` for a caller's description of the graph it builds) with these options, in
/// this build of the program.
pub(crate) fn key_of(kind: &str, text: &str, backend: &str, device: &str, options: &str) -> String {
    key_in_build(build_id(), kind, text, backend, device, options)
}

/// [`key_of`] for the build `build`.
fn key_in_build(
    build: &str,
    kind: &str,
    text: &str,
    backend: &str,
    device: &str,
    options: &str,
) -> String {
    fingerprint(&[
        FORMAT.as_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
        build.as_bytes(),
        backend.as_bytes(),
        device.as_bytes(),
        options.as_bytes(),
        kind.as_bytes(),
        text.as_bytes(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rlx_ir::{DType, Shape};

    fn entry_bytes(key: &str) -> Vec<u8> {
        entry_bytes_with(key, |_| {})
    }

    /// The bytes of [`entry_with`]'s entry under `key`.
    fn entry_bytes_with(key: &str, edit: impl FnOnce(&mut LoweringPlan)) -> Vec<u8> {
        CompileCache::encode(key, &entry_with(edit)).unwrap()
    }

    /// A small entry (a product plus a constant) whose valid plan `edit` may spoil.
    fn entry_with(edit: impl FnOnce(&mut LoweringPlan)) -> Entry {
        let mut g = Graph::new("t");
        let x = g.input("x", Shape::new(&[2, 3], DType::F32));
        let w = g.param("w", Shape::new(&[3, 4], DType::F32));
        let y = g.dot(x, w);
        let c = g.constant_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let y = g.add(y, c);
        g.set_outputs(vec![y]);
        let mut plan = LoweringPlan::default();
        plan.skips.insert(2, rlx_opt::Skip::RowMax(0));
        plan.permuted_stores.insert(2, vec![1, 0]);
        edit(&mut plan);
        Entry {
            graph: g,
            records: Vec::new(),
            plan: Arc::new(plan),
        }
    }

    /// Another build of the program (same RLX version) has other keys, so it never reads
    /// entries made by code that may have changed since.
    #[test]
    fn another_build_has_other_keys() {
        let key = |build| key_in_build(build, "graph", "g", "cpu", "cpu", "o");
        assert_ne!(key("a 1 2"), key("a 1 3"));
        assert_eq!(
            key_of("graph", "g", "cpu", "cpu", "o"),
            key(build_id()),
            "keys are made in this build"
        );
        assert!(!build_id().is_empty(), "the test binary knows its build");
    }

    /// A directory past its limit loses its least recently used entries, a read counting as
    /// a use; the entry just written stays even when it alone is over the limit.
    #[test]
    fn the_least_recently_used_entries_are_evicted() {
        let dir = std::env::temp_dir().join(format!("rlx-cache-evict-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let entry = || entry_with(|_| {});
        let size = entry_bytes(&fingerprint(&[b"a"])).len() as u64;
        let keys: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|k| fingerprint(&[k.as_bytes()]))
            .collect();
        let age = |key: &str, secs: u64| {
            let f = std::fs::File::options()
                .write(true)
                .open(dir.join(format!("{key}.rlxc")))
                .unwrap();
            f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(secs))
                .unwrap();
        };
        let on_disk = |key: &str| dir.join(format!("{key}.rlxc")).exists();
        let cache = CompileCache::at_with_limit(&dir, 2 * size + size / 2);
        cache.put(&keys[0], entry());
        age(&keys[0], 30);
        cache.put(&keys[1], entry());
        age(&keys[1], 20);
        // Read "a" from disk (a new cache, so not from memory): now the most recently used.
        let reader = CompileCache::at_with_limit(&dir, 2 * size + size / 2);
        assert!(reader.get(&keys[0]).is_some());
        assert_eq!(reader.stats().disk_hits, 1);
        cache.put(&keys[2], entry());
        assert!(on_disk(&keys[0]) && !on_disk(&keys[1]) && on_disk(&keys[2]));
        // A limit below one entry keeps only the newest.
        CompileCache::at_with_limit(&dir, 1).put(&keys[1], entry());
        assert!(!on_disk(&keys[0]) && on_disk(&keys[1]) && !on_disk(&keys[2]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_written_entry_reads_back() {
        let key = fingerprint(&[b"k"]);
        let e = CompileCache::decode(&key, &entry_bytes(&key)).unwrap();
        assert_eq!(e.graph.len(), 5);
        assert!(CompileCache::decode(&fingerprint(&[b"other"]), &entry_bytes(&key)).is_err());
    }

    /// A changed digit of a constant still parses and verifies; the checksum refuses it.
    #[test]
    fn an_entry_with_a_changed_constant_is_refused() {
        let key = fingerprint(&[b"k"]);
        let mut b = entry_bytes(&key);
        let at = b
            .windows(4)
            .position(|w| w == 1.0f32.to_le_bytes())
            .expect("the constant's 1.0f32");
        b[at + 2] = 0x81;
        let err = CompileCache::decode(&key, &b).unwrap_err();
        assert!(err.contains("checksum does not match"), "{err}");
        // The same edit with the checksum made anew is read (what the checksum alone catches).
        let again = resealed(&key, &b);
        assert!(CompileCache::decode(&key, &again).is_ok());
    }

    /// `bytes` with the checksum made anew for its (possibly edited) body.
    fn resealed(key: &str, bytes: &[u8]) -> Vec<u8> {
        let body_at = CompileCache::header(key).len() + fingerprint(&[]).len() + 1;
        let body = &bytes[body_at.min(bytes.len())..];
        let mut again = CompileCache::header(key).into_bytes();
        again.extend(fingerprint(&[body]).into_bytes());
        again.push(b'\n');
        again.extend(body);
        again
    }

    /// A plan that would make a backend address the wrong bytes is refused, with the reason.
    #[test]
    fn an_entry_whose_plan_does_not_fit_its_graph_is_refused() {
        let key = fingerprint(&[b"k"]);
        type Edit = fn(&mut LoweringPlan);
        let spoilt: [(Edit, &str); 6] = [
            (
                |p| _ = p.permuted_stores.insert(2, vec![0, 0]),
                "does not permute",
            ),
            (
                |p| _ = p.permuted_stores.insert(3, vec![1, 0]),
                "does not permute",
            ),
            (
                |p| _ = p.skips.insert(99, rlx_opt::Skip::RowMin(0)),
                "names node %99",
            ),
            (
                |p| _ = p.skips.insert(2, rlx_opt::Skip::ColMin(isize::MIN)),
                "not a skip",
            ),
            (
                |p| _ = p.panel_params.insert(0, 16),
                "do not fit a 2-D param",
            ),
            (
                |p| {
                    p.donations.push(rlx_opt::Donation {
                        output: 0,
                        param: "nope".into(),
                    })
                },
                "names no output or param",
            ),
        ];
        for (edit, why) in spoilt {
            let err = CompileCache::decode(&key, &entry_bytes_with(&key, edit)).unwrap_err();
            assert!(
                err.contains("its plan does not fit") && err.contains(why),
                "{err}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]
        /// Edited, truncated or extended entries never panic the reader: either they still
        /// hold a graph that verifies, or they are refused. With `reseal`, the edits fall in
        /// the body and the checksum is made anew (a forged entry, or one a format bug spoilt
        /// before sealing): the binary body is then decoded without a panic or an allocation
        /// its bytes do not hold, and used only if it verifies.
        #[test]
        fn edited_entries_decode_to_a_verified_graph_or_are_refused(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<Option<usize>>(),
            tail in proptest::collection::vec(any::<u8>(), 0..16),
            reseal in any::<bool>(),
        ) {
            let key = fingerprint(&[b"k"]);
            let mut b = entry_bytes(&key);
            let from = if reseal {
                CompileCache::header(&key).len() + fingerprint(&[]).len() + 1
            } else {
                0
            };
            for (at, v) in edits {
                let i = from + at % (b.len() - from);
                b[i] = v;
            }
            if let Some(c) = cut {
                b.truncate(from + c % (b.len() - from + 1));
            }
            b.extend(tail);
            if reseal {
                b = resealed(&key, &b);
            }
            if let Ok(e) = CompileCache::decode(&key, &b) {
                prop_assert!(rlx_ir::verify(&e.graph).is_ok());
                prop_assert!(e.plan.check(&e.graph).is_ok());
            }
        }
    }
}
