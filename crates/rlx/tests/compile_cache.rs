//! The compile cache: a second compile of the same graph (another session, or a new cache over
//! the same directory, as a new process would open) skips the passes and gives the same
//! program; corrupt and foreign entries are detected and compiled again; the fingerprint is
//! SHA-256 and so stable.

use rlx::models::{Gpt, GptConfig};
use rlx::prelude::*;
use rlx::runtime::{fingerprint, CacheStats, CompileCache};
use rlx::train::{Optimizer, Schedule, TrainConfig, Trainer};
use std::sync::Arc;

fn model() -> (Gpt, Graph) {
    let m = Gpt::new(GptConfig {
        vocab: 12,
        ctx: 8,
        dim: 32,
        heads: 2,
        layers: 1,
    })
    .unwrap();
    let g = m.training_graph(2).unwrap();
    (m, g)
}

/// Three training steps' losses of the small GPT, compiled by `session`.
fn losses(session: &Session) -> Vec<f32> {
    let (m, g) = model();
    let names: Vec<String> = m.params().into_iter().map(|p| p.0).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let cfg = TrainConfig {
        optimizer: Optimizer::adamw(0.01),
        schedule: Schedule::Constant { lr: 1e-2 },
        clip_norm: None,
    };
    let mut t = Trainer::new(&g, &refs, cfg, session).unwrap();
    for (i, (n, shape, sc)) in m.params().into_iter().enumerate() {
        let c: usize = shape.iter().product();
        let v: Vec<f32> = (0..c)
            .map(|j| match sc {
                None => 1.0,
                Some(s) => s * (((i * 31 + j * 17) % 23) as f32 / 11.0 - 1.0),
            })
            .collect();
        t.set_param(&n, &v).unwrap();
    }
    let b = |v: Vec<i32>| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let x = b((0..16).map(|i| i % 12).collect());
    let y = b((0..16).map(|i| (i + 1) % 12).collect());
    (0..3)
        .map(|_| {
            t.step_typed(&[("tokens", &x, DType::I32), ("targets", &y, DType::I32)])
                .unwrap()
        })
        .collect()
}

fn session(cache: &Arc<CompileCache>) -> Session {
    Session::new(Device::Cpu)
        .with_threads(1)
        .with_compile_cache(cache.clone())
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rlx-cache-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlxc"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_compile_in_memory_or_from_disk_gives_the_same_program() {
    let plain = losses(&Session::new(Device::Cpu).with_threads(1));
    let dir = tempdir("hit");
    let cache = CompileCache::at(&dir);
    assert_eq!(losses(&session(&cache)), plain);
    assert_eq!(cache.stats().misses, 1);
    assert_eq!(losses(&session(&cache)), plain);
    assert_eq!(cache.stats().memory_hits, 1);
    assert_eq!(entries(&dir).len(), 1);
    // A new cache over the same directory: what a new process sees.
    let fresh = CompileCache::at(&dir);
    assert_eq!(losses(&session(&fresh)), plain);
    assert_eq!(
        fresh.stats(),
        CacheStats {
            disk_hits: 1,
            ..CacheStats::default()
        }
    );
    // Other options are another entry.
    let mixed = session(&fresh).with_precision(PrecisionPolicy::AutoMixedBf16);
    losses(&mixed);
    assert_eq!(fresh.stats().misses, 1);
    assert_eq!(entries(&dir).len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_and_foreign_entries_are_compiled_again() {
    let plain = losses(&Session::new(Device::Cpu).with_threads(1));
    let dir = tempdir("bad");
    losses(&session(&CompileCache::at(&dir)));
    let path = entries(&dir).remove(0);
    let good = std::fs::read(&path).unwrap();
    let nl = good.iter().position(|&b| b == b'\n').unwrap();
    let (header, body) = (std::str::from_utf8(&good[..nl]).unwrap(), &good[nl + 1..]);
    // The header: format, version, fingerprint, then the checksum of the body.
    let (fields, checksum) = header.rsplit_once(' ').unwrap();
    assert_eq!(checksum, fingerprint(&[body]));
    let key = &fields[fields.len() - 64..];
    // An entry of `fields` and `body` with the checksum made anew (what only the later checks
    // can refuse).
    let resealed = |fields: &str, body: &[u8]| {
        let mut b = format!("{fields} {}\n", fingerprint(&[body])).into_bytes();
        b.extend_from_slice(body);
        b
    };
    // The body is postcard's form of the graph, then the pass records and the plan: edit the
    // graph, keep the rest.
    let (graph, rest): (Graph, &[u8]) = postcard::take_from_bytes(body).unwrap();
    let edited = |edit: &dyn Fn(usize, &mut rlx::ir::Node) -> bool| {
        let mut g = Graph::new(graph.name());
        let mut done = false;
        for (i, n) in graph.nodes().iter().enumerate() {
            let mut n = n.clone();
            done = done || edit(i, &mut n);
            g.push_unchecked(n.op, n.inputs, n.shape);
        }
        assert!(done, "the entry's graph holds what the edit changes");
        g.set_outputs_unchecked(graph.outputs().to_vec());
        let mut b = postcard::to_stdvec(&g).unwrap();
        b.extend_from_slice(rest);
        b
    };
    // The first constant's first byte changed: a graph that verifies, wrong values.
    let changed = edited(&|_, n| match &mut n.op {
        Op::Constant { data } if !data.is_empty() => {
            data[0] ^= 1;
            true
        }
        _ => false,
    });
    // The first product's result shape with one more row: a graph that does not verify.
    let unverified = edited(&|_, n| match n.op {
        Op::MatMul => {
            let mut dims = n.shape.static_dims().unwrap();
            dims[0] += 1;
            n.shape = Shape::new(&dims, n.shape.dtype());
            true
        }
        _ => false,
    });
    let with_checksum = |body: &[u8]| {
        let mut b = format!("{header}\n").into_bytes();
        b.extend_from_slice(body);
        b
    };
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\xffnot an entry".to_vec()),
        ("empty", Vec::new()),
        ("truncated", good[..good.len() / 2].to_vec()),
        (
            "another fingerprint",
            resealed(&fields.replace(key, &"0".repeat(64)), body),
        ),
        (
            "another version",
            resealed(
                &fields.replace(env!("CARGO_PKG_VERSION"), "0.0.0-other"),
                body,
            ),
        ),
        // A changed constant under the old checksum: it decodes and verifies, wrong values.
        ("a changed constant", with_checksum(&changed)),
        // A graph that does not verify, checksum made anew.
        (
            "a graph that does not verify",
            resealed(fields, &unverified),
        ),
        // Bytes that do not decode, checksum made anew.
        (
            "a body that does not decode",
            resealed(fields, &body[..body.len() / 3]),
        ),
    ];
    for (what, bytes) in bad {
        std::fs::write(&path, &bytes).unwrap();
        let cache = CompileCache::at(&dir);
        assert_eq!(losses(&session(&cache)), plain, "{what}");
        let s = cache.stats();
        assert_eq!(
            (s.rejected, s.misses, s.disk_hits),
            (1, 1, 0),
            "{what}: {s:?}"
        );
        // The entry was rewritten and is good again.
        let again = CompileCache::at(&dir);
        losses(&session(&again));
        assert_eq!(again.stats().disk_hits, 1, "{what}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_fingerprint_is_sha256_of_length_prefixed_parts() {
    // python3 -c "import hashlib,struct; print(hashlib.sha256(struct.pack('<Q',3)+b'abc'+struct.pack('<Q',0)).hexdigest())"
    assert_eq!(
        fingerprint(&[b"abc", b""]),
        "3e2f8940c3a0e0fd6f6e07bbf07f015dd7c147431e5fa14bf3f225d782641540"
    );
    assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
}

/// `try_compile_built` runs its build only when the cache has nothing for the key: a training
/// step found in the cache is not differentiated again, and gives the same losses.
#[test]
fn a_cached_built_graph_is_not_built_again() {
    let dir = tempdir("built");
    let builds = std::cell::Cell::new(0);
    let compile = |cache: &Arc<CompileCache>, key: &str| {
        let (_, g) = model();
        let c = session(cache)
            .try_compile_built(
                key,
                || {
                    builds.set(builds.get() + 1);
                    Ok(g.clone())
                },
                &[],
            )
            .unwrap();
        c.graph().len()
    };
    let first = compile(&CompileCache::at(&dir), "small gpt");
    assert_eq!(builds.get(), 1);
    // A new process: read from disk, not built.
    let fresh = CompileCache::at(&dir);
    assert_eq!(compile(&fresh, "small gpt"), first);
    assert_eq!((builds.get(), fresh.stats().disk_hits), (1, 1));
    // Another key is another graph: built.
    compile(&fresh, "small gpt, another key");
    assert_eq!(builds.get(), 2);
    // Without a cache the build always runs.
    let (_, g) = model();
    Session::new(Device::Cpu)
        .try_compile_built("small gpt", || Ok(g), &[])
        .unwrap();
    assert_eq!(builds.get(), 2);
    // A build that fails is the compile's error; one without outputs is refused.
    let err = session(&fresh)
        .try_compile_built("fails", || Err(rlx::Error::Invalid("no model".into())), &[])
        .err()
        .unwrap();
    assert!(err.to_string().contains("no model"), "{err}");
    let err = session(&fresh)
        .try_compile_built("empty", || Ok(Graph::new("empty")), &[])
        .err()
        .unwrap();
    assert!(err.to_string().contains("has no outputs"), "{err}");
    // The training step goes through it: the second trainer over the directory builds nothing
    // and trains alike (losses checked against a session without a cache).
    let plain = losses(&Session::new(Device::Cpu).with_threads(1));
    let dir2 = tempdir("built-trainer");
    assert_eq!(losses(&session(&CompileCache::at(&dir2))), plain);
    let again = CompileCache::at(&dir2);
    assert_eq!(losses(&session(&again)), plain);
    assert_eq!((again.stats().disk_hits, again.stats().misses), (1, 0));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&dir2).unwrap();
}
