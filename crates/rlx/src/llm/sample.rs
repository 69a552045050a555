//! Token sampling: greedy, temperature, top-k, top-p, min-p and a repetition penalty, applied
//! in llama.cpp's order (penalty, top-k, top-p, min-p, temperature), with a seeded generator so
//! runs repeat exactly.

/// Sampling settings. The defaults are llama.cpp's.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently generated tokens by this (1: off).
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every token among the recent ones (0: off).
    pub presence_penalty: f32,
    /// Subtract this times its count among the recent ones from a token's logit (0: off).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Random seed.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Always the most likely token.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        }
    }
}

/// A sampler with its random state and the recent tokens it penalises.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    state: u64,
    recent: std::collections::VecDeque<u32>,
    cand: Vec<(f32, u32)>,
}

impl Sampler {
    /// A sampler for `cfg`.
    pub fn new(cfg: SamplerConfig) -> Sampler {
        Sampler {
            state: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
            cfg,
            recent: Default::default(),
            cand: Vec::new(),
        }
    }

    /// Record a token that is part of the context (prompt tokens count for the penalty).
    pub fn accept(&mut self, token: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.cfg.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// A uniform number in `[0, 1)` (splitmix64).
    fn uniform(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Pick the next token from `logits` (modified in place by the penalty) and record it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.penalize(logits);
        let tok = self.choose(logits);
        self.accept(tok);
        tok
    }

    /// Whether [`Sampler::sample`] changes the logits (a repeat, presence or frequency
    /// penalty is set); when not, [`Sampler::sample_unchanged`] takes them as they are.
    pub fn penalizes(&self) -> bool {
        let c = &self.cfg;
        c.repeat_penalty != 1.0 || c.presence_penalty != 0.0 || c.frequency_penalty != 0.0
    }

    /// [`Sampler::sample`] for a sampler that does not [penalize](Sampler::penalizes): the
    /// same token, without a copy of the logits to modify; `None` (nothing sampled) for a
    /// sampler that penalizes.
    pub fn sample_unchanged(&mut self, logits: &[f32]) -> Option<u32> {
        if self.penalizes() {
            return None;
        }
        let tok = self.choose(logits);
        self.accept(tok);
        Some(tok)
    }

    /// Apply the penalties to `logits` in place (nothing when none is set).
    fn penalize(&mut self, logits: &mut [f32]) {
        let c = &self.cfg;
        if self.penalizes() {
            // As llama.cpp's penalties sampler: each distinct recent token once, scaled by the
            // repeat penalty, then lowered by presence + frequency * count.
            let mut counts = std::collections::BTreeMap::new();
            for &t in &self.recent {
                *counts.entry(t).or_insert(0u32) += 1;
            }
            for (t, n) in counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / c.repeat_penalty
                    } else {
                        *l * c.repeat_penalty
                    };
                    *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
                }
            }
        }
    }

    fn choose(&mut self, logits: &[f32]) -> u32 {
        let r = if self.cfg.temperature > 0.0 {
            self.uniform()
        } else {
            0.0
        };
        let c = &self.cfg;
        if c.temperature <= 0.0 {
            return argmax(logits);
        }
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        let by_logit = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if c.top_k > 0 && c.top_k < cand.len() {
            cand.select_nth_unstable_by(c.top_k - 1, by_logit);
            cand.truncate(c.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let softmax = |cand: &[(f32, u32)], temp: f32| -> Vec<f32> {
            let m = cand[0].0;
            let e: Vec<f32> = cand.iter().map(|&(l, _)| ((l - m) / temp).exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|v| v / s).collect()
        };
        if c.top_p < 1.0 {
            let p = softmax(cand, 1.0);
            let mut acc = 0.0;
            let keep = p.iter().position(|&q| {
                acc += q;
                acc >= c.top_p
            });
            cand.truncate(keep.map_or(cand.len(), |k| k + 1));
        }
        if c.min_p > 0.0 {
            let p = softmax(cand, 1.0);
            let floor = c.min_p * p[0];
            let keep = p.iter().take_while(|&&q| q >= floor).count().max(1);
            cand.truncate(keep);
        }
        let p = softmax(cand, c.temperature);
        let mut acc = 0.0;
        for (q, &(_, t)) in p.iter().zip(cand.iter()) {
            acc += q;
            if r < acc {
                return t;
            }
        }
        cand.last().map_or(0, |x| x.1)
    }
}

/// Index of the largest logit (the first among equals; NaN never wins, and a NaN first logit
/// stays the answer, as a scan keeping the first strictly larger value gives).
pub fn argmax(logits: &[f32]) -> u32 {
    const L: usize = 16;
    if logits.first().is_none_or(|x| x.is_nan()) {
        return 0;
    }
    // Sixteen lanes, each the first strictly largest of its positions (a form the compiler
    // vectorizes: Gemma 3 samples 262k logits a token), then the smallest index among the
    // lanes holding the largest value.
    let mut val = [f32::NEG_INFINITY; L];
    let mut idx = [0u32; L];
    let chunks = logits.chunks_exact(L);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for k in 0..L {
            let x = chunk[k];
            let better = x > val[k];
            val[k] = if better { x } else { val[k] };
            idx[k] = if better { (c * L + k) as u32 } else { idx[k] };
        }
    }
    let mut best = 0usize;
    let mut bv = logits[0];
    for k in 0..L {
        if val[k] > bv || (val[k] == bv && (idx[k] as usize) < best) {
            bv = val[k];
            best = idx[k] as usize;
        }
    }
    let base = logits.len() - tail.len();
    for (i, &x) in tail.iter().enumerate() {
        if x > bv {
            bv = x;
            best = base + i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        /// The lane-wise argmax is the plain scan's, on values with ties, signed zeros, NaN
        /// and infinities at any position and any length.
        #[test]
        fn argmax_is_the_first_strict_maximum(
            v in proptest::collection::vec(
                prop_oneof![
                    (-4i32..4).prop_map(|x| x as f32),
                    Just(-0.0f32),
                    Just(f32::NAN),
                    Just(f32::INFINITY),
                    Just(f32::NEG_INFINITY),
                ],
                1..80,
            )
        ) {
            let mut best = 0;
            for (i, &l) in v.iter().enumerate() {
                if l > v[best] {
                    best = i;
                }
            }
            prop_assert_eq!(argmax(&v), best as u32, "{:?}", v);
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&mut [0.0, 3.0, 1.0, 3.0]), 1);
    }

    #[test]
    fn seeded_sampling_repeats_and_respects_top_k() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..SamplerConfig::default()
        };
        let logits = [1.0f32, 0.5, 0.9, -3.0];
        let run = || {
            let mut s = Sampler::new(cfg.clone());
            (0..200)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        assert!(
            a.iter().all(|&t| t == 0 || t == 2),
            "top-k 2 keeps tokens 0 and 2"
        );
        assert!(a.contains(&0) && a.contains(&2));
    }

    /// Sampling the logits as they are gives what sampling a copy gives, draw for draw, for
    /// a sampler without penalties; one with a penalty is refused.
    #[test]
    fn sampling_without_a_copy_matches_sampling_a_copy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        for cfg in [
            SamplerConfig::greedy(),
            SamplerConfig {
                temperature: 0.8,
                top_k: 10,
                top_p: 0.9,
                seed: 3,
                ..SamplerConfig::default()
            },
        ] {
            let (mut a, mut b) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
            for _ in 0..100 {
                assert_eq!(
                    a.sample_unchanged(&logits),
                    Some(b.sample(&mut logits.clone()))
                );
            }
        }
        let mut p = Sampler::new(SamplerConfig {
            frequency_penalty: 0.5,
            ..SamplerConfig::greedy()
        });
        assert!(p.penalizes() && p.sample_unchanged(&logits).is_none());
    }

    #[test]
    fn repetition_penalty_pushes_recent_tokens_down() {
        let cfg = SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg);
        s.accept(0);
        assert_eq!(s.sample(&mut [2.0, 1.5]), 1);
    }
}
