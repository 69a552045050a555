//! Samples, medians, spreads and the machine report.

/// Measured values of one configuration.
#[derive(Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, v: f64) {
        self.0.push(v)
    }

    pub fn extend(&mut self, v: impl IntoIterator<Item = f64>) {
        self.0.extend(v)
    }

    pub fn median(&self) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// `median [min–max]`, or `–` when empty.
    pub fn show(&self, digits: usize) -> String {
        match self.median() {
            None => "–".into(),
            Some(m) => {
                let lo = self.0.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{m:.digits$} [{lo:.digits$}–{hi:.digits$}]")
            }
        }
    }
}

/// Ratio of medians, `a / b`.
pub fn ratio(a: &Samples, b: &Samples) -> String {
    match (a.median(), b.median()) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}×", x / y),
        _ => "–".into(),
    }
}

/// CPU model, core count and load average, so a reader can judge the numbers.
pub fn machine_report() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1: f64 = load
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0.0);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let isa = rlx_cpu::gemm::Isa::current();
    let mut s = format!(
        "machine: {cpu}, {cores} cores, load average {}; RLX GEMM kernel: {isa:?}",
        load.trim()
    );
    if load1 > 0.5 {
        s.push_str(
            "\nwarning: the machine is not idle (1-minute load > 0.5); numbers will be noisy",
        );
    }
    s
}
