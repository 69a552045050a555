//! `GET /metrics`: the engine's counters and the latency histograms, in Prometheus form.

use super::Shared_;
use crate::serve::engine::EngineStats;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

/// Latency histogram in Prometheus form (cumulative buckets, seconds).
#[derive(Default)]
pub(super) struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Histogram {
    pub(super) fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if secs <= b {
                *c += 1;
            }
        }
        self.sum += secs;
        self.n += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        use std::fmt::Write;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.n);
    }
}

#[derive(Default)]
pub(super) struct Metrics {
    pub(super) engine: EngineStats,
    pub(super) requests: u64,
    pub(super) rejected: u64,
    pub(super) ttft: Histogram,
    pub(super) itl: Histogram,
}

pub(super) async fn metrics(State(s): State<Shared_>) -> impl IntoResponse {
    use std::fmt::Write;
    let m = s.metrics.lock().unwrap_or_else(|e| e.into_inner());
    let e = &m.engine;
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    put(
        "rlx_requests_total",
        "counter",
        "Requests accepted.",
        m.requests as f64,
    );
    put(
        "rlx_requests_rejected_total",
        "counter",
        "Requests refused because the queue was full.",
        m.rejected as f64,
    );
    put(
        "rlx_requests_running",
        "gauge",
        "Sequences being computed.",
        e.running as f64,
    );
    put(
        "rlx_requests_waiting",
        "gauge",
        "Requests waiting for a slot (queue depth).",
        e.waiting as f64,
    );
    put(
        "rlx_prompt_tokens_total",
        "counter",
        "Prompt tokens computed (prefix-cache hits excluded).",
        e.prompt_tokens as f64,
    );
    put(
        "rlx_generated_tokens_total",
        "counter",
        "Tokens generated.",
        e.generated_tokens as f64,
    );
    put(
        "rlx_kv_blocks_in_use",
        "gauge",
        "KV-cache blocks held by sequences.",
        e.blocks_in_use as f64,
    );
    put(
        "rlx_kv_blocks_total",
        "gauge",
        "KV-cache blocks in the pool.",
        e.blocks as f64,
    );
    put(
        "rlx_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        e.pool.prefix_hit_tokens as f64,
    );
    put(
        "rlx_preemptions_total",
        "counter",
        "Sequences preempted for lack of KV blocks.",
        e.preemptions as f64,
    );
    put(
        "rlx_steps_total",
        "counter",
        "Forward passes run.",
        e.steps as f64,
    );
    put(
        "rlx_prefill_steps_total",
        "counter",
        "Forward passes that computed prompt tokens.",
        e.prefill_steps as f64,
    );
    put(
        "rlx_step_graphs_compiled_total",
        "counter",
        "Step graphs compiled (one per new step shape; at load included).",
        e.compiles as f64,
    );
    put(
        "rlx_step_graph_compile_seconds_total",
        "counter",
        "Time spent compiling step graphs while serving.",
        e.compile_us as f64 / 1e6,
    );
    put(
        "rlx_prompt_pieces_total",
        "counter",
        "Prompt pieces computed (several sequences' pieces may share a forward pass).",
        e.prompt_pieces as f64,
    );
    m.ttft.write(
        &mut out,
        "rlx_time_to_first_token_seconds",
        "Time from request to first token.",
    );
    m.itl.write(
        &mut out,
        "rlx_inter_token_latency_seconds",
        "Time between a request's tokens.",
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
