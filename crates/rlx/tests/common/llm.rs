//! The llama.cpp goldens of the LLM tests (`golden/llm/<model>.json`) and helpers to read them.

use serde_json::Value;

/// The golden file of `name` (smollm2, gemma3).
pub fn golden(name: &str) -> Value {
    // From the crate's folder; a test binary moved to another machine (scripts/gpu-check.sh)
    // finds the file under the repository root it runs in.
    let p = format!(
        "{}/tests/golden/llm/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(p)
        .or_else(|_| std::fs::read_to_string(format!("crates/rlx/tests/golden/llm/{name}.json")))
        .expect("golden file");
    serde_json::from_str(&text).expect("json")
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// A JSON array of floats.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

/// The index of the largest logit (the first among equals).
pub fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

/// Two candidate tokens this close in logits are a near-tie, where two correct implementations
/// may pick either: llama.cpp and RLX (`llm_parity.rs`), the GPU and the CPU (`gpu_llm.rs`).
/// Token by token RLX computes llama.cpp's logits exactly (`llm_parity.rs`'s `forced_stepwise`
/// asserts it); prompts, though, are evaluated in batches, where both sides use other kernels
/// (RLX an f32 GEMM on dequantized weights, llama.cpp tiled GEMMs with int8 activations), so
/// logits move by ~0.1 — llama.cpp's own batched and token-by-token runs of the teacher-forced
/// text differ by 0.13 on average and agree on 302 of 310 top-1 tokens.
pub const NEAR_TIE: f32 = 0.5;

/// The index of the second largest logit (the first among equals, the largest's index excluded).
pub fn runner_up(l: &[f32]) -> usize {
    let top = argmax(l);
    (0..l.len())
        .filter(|&i| i != top)
        .fold(None, |b: Option<usize>, i| match b {
            Some(b) if l[b] >= l[i] => Some(b),
            _ => Some(i),
        })
        .expect("two logits or more")
}

/// Whether a decoder's pick `got`, parting from a reference's top token, is a near-tie: `got` is
/// the reference's runner-up, the reference's margin between its top two logits is under
/// [`NEAR_TIE`], and so is the decoder's own margin for `got` over the reference's token.
pub fn is_near_tie(got: u32, runner_up: u32, reference_margin: f32, own_margin: f32) -> bool {
    got == runner_up && reference_margin < NEAR_TIE && own_margin < NEAR_TIE
}

/// What [`compare_random`] found: positions compared, top-1 agreements and the largest logit
/// difference relative to the CPU's logits' standard deviation.
pub struct Compared {
    pub positions: usize,
    pub agree: usize,
    pub worst_relative: f32,
}

impl Compared {
    /// Say what was found (`what`: which model where) and hold it to the bounds: random logits
    /// lie close together (near-ties are common; [`compare_random`] checked each to be one), and
    /// prompts round activations to 8 bits on CUDA but not on the CPU (an f32 product), while a
    /// wrong kernel moves logits by about their whole spread.
    pub fn check(&self, what: &str) {
        eprintln!(
            "{what}: {}/{} positions agree with the CPU, logits within {:.2e} of its standard \
             deviation",
            self.agree, self.positions, self.worst_relative
        );
        assert!(
            5 * self.agree >= 4 * self.positions,
            "{what}: {} of {}",
            self.agree,
            self.positions
        );
        assert!(
            self.worst_relative < 0.3,
            "{what}: logits differ by {} sd",
            self.worst_relative
        );
    }
}

/// A seeded token sequence of `n` ids below `vocab` (random models have no text to read).
pub fn seeded_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// `other` against `cpu` (the same random-weight model): `forced` seeded tokens teacher-forced
/// in one prompt, then `steps` greedy decode steps from the first 8 of them. Every top-1
/// difference must be a near-tie ([`is_near_tie`]).
pub fn compare_random(
    cpu: &mut rlx::llm::Llm,
    other: &mut rlx::llm::Llm,
    forced: usize,
    steps: usize,
) -> Compared {
    let v = cpu.config.vocab;
    let tokens = seeded_tokens(forced, v, 7);
    let mut out = Compared {
        positions: 0,
        agree: 0,
        worst_relative: 0.0,
    };
    let check = |rc: &[f32], rg: &[f32], at: &str, out: &mut Compared| -> bool {
        let n = rc.len() as f32;
        let mean = rc.iter().sum::<f32>() / n;
        let sd = (rc.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n).sqrt();
        let worst = rc
            .iter()
            .zip(rg)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst.is_finite(), "{at}: logits not finite");
        out.worst_relative = out.worst_relative.max(worst / sd.max(1e-6));
        out.positions += 1;
        let (c, g, second) = (argmax(rc), argmax(rg), runner_up(rc));
        if c == g {
            out.agree += 1;
            return true;
        }
        assert!(
            is_near_tie(g as u32, second as u32, rc[c] - rc[second], rg[g] - rg[c]),
            "{at}: CPU {c}, other {g}: not a near-tie"
        );
        false
    };
    cpu.reset();
    other.reset();
    let (lc, lg) = (
        cpu.forward_all(&tokens).unwrap(),
        other.forward_all(&tokens).unwrap(),
    );
    for i in 0..tokens.len() {
        let (rc, rg) = (&lc[i * v..(i + 1) * v], &lg[i * v..(i + 1) * v]);
        check(rc, rg, &format!("forced position {i}"), &mut out);
    }
    cpu.reset();
    other.reset();
    let prompt = &tokens[..8.min(tokens.len())];
    let (mut lc, mut lg) = (cpu.forward(prompt).unwrap(), other.forward(prompt).unwrap());
    for step in 0..steps {
        if !check(&lc, &lg, &format!("greedy step {step}"), &mut out) {
            break;
        }
        let next = argmax(&lc) as u32;
        lc = cpu.forward(&[next]).unwrap();
        lg = other.forward(&[next]).unwrap();
    }
    out
}

/// The random-weight model of `m`'s shapes (`rlx::llm::ensure_random`, seed 0) loaded on
/// `device` with a cache of `ctx` positions and prompt chunks of `batch`.
pub fn load_random(
    m: rlx::hub::KnownModel,
    device: rlx::Device,
    ctx: usize,
    batch: usize,
) -> rlx::llm::Llm {
    let path = rlx::llm::ensure_random(m, 0).expect("random model written");
    rlx::llm::Llm::load(
        &path,
        rlx::llm::LoadOptions {
            ctx: Some(ctx),
            batch,
            device,
            ..rlx::llm::LoadOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("random {m:?} on {device}: {e}"))
}
