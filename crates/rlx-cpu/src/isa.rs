//! Which instruction-set level the CPU kernels use.
//!
//! The best level is detected once per process; [`with_level`] lowers it for the calling thread
//! (and for the pool workers running that thread's dispatches) for the duration of a closure, so
//! a test can run the same graph through the AVX-512, AVX2 and portable kernels of one machine.
//! `RLX_ISA=portable|avx2|avx2-vnni|avx512` caps the level for the whole process
//! (`RLX_NO_AVX512=1` is `RLX_ISA=avx2-vnni`).

use std::cell::Cell;
use std::sync::OnceLock;

/// An instruction-set level; each one allows the features of those below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Plain Rust for the build target (what runs where the CPU has no AVX2).
    Portable = 0,
    /// AVX2 with FMA and F16C: the 6×16 GEMM, 8-lane elementwise and `maddubs` integer dots.
    Avx2 = 1,
    /// AVX2 plus AVX-VNNI (the VEX `vpdpbusd`) for the quantized products, where the CPU has it.
    Avx2Vnni = 2,
    /// Everything the CPU has: AVX-512F (the 12×32 GEMM, 16-lane loops) and its VNNI form.
    Avx512 = 3,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 4] = [Level::Portable, Level::Avx2, Level::Avx2Vnni, Level::Avx512];

    /// The level's name as `RLX_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx2Vnni => "avx2-vnni",
            Level::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can execute the level's defining instructions.
    fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            match self {
                Level::Portable => true,
                Level::Avx2 => avx2,
                Level::Avx2Vnni => avx2 && std::is_x86_feature_detected!("avxvnni"),
                Level::Avx512 => avx2 && std::is_x86_feature_detected!("avx512f"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Level::Portable
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The highest level this CPU supports, capped by `RLX_ISA` / `RLX_NO_AVX512`.
pub fn best() -> Level {
    static BEST: OnceLock<Level> = OnceLock::new();
    *BEST.get_or_init(|| {
        let cap = match rlx_ir::env::get(rlx_ir::env::ISA).as_deref().map(str::trim) {
            Some("portable") => Level::Portable,
            Some("avx2") => Level::Avx2,
            Some("avx2-vnni") => Level::Avx2Vnni,
            _ if rlx_ir::env::is_set(rlx_ir::env::NO_AVX512) => Level::Avx2Vnni,
            _ => Level::Avx512,
        };
        Level::ALL
            .into_iter()
            .rev()
            .find(|l| *l <= cap && l.supported())
            .unwrap_or(Level::Portable)
    })
}

/// Every level this CPU can execute (within `RLX_ISA`), lowest first, each distinct in what it
/// runs: [`Level::Avx2Vnni`] appears only where the CPU has AVX-VNNI.
pub fn levels() -> impl Iterator<Item = Level> + Clone {
    let best = best();
    Level::ALL
        .into_iter()
        .filter(move |l| *l <= best && l.supported())
}

thread_local! {
    static CAP: Cell<u8> = const { Cell::new(u8::MAX) };
}

/// The level kernels use on this thread now: [`best`], lowered by an enclosing [`with_level`].
#[inline]
pub fn current() -> Level {
    let cap = CAP.with(|c| c.get());
    let best = best();
    if (cap as usize) < best as usize {
        // Below the best: the highest supported level under the cap (a machine without AVX-VNNI
        // asked for `Avx2Vnni` runs `Avx2`).
        Level::ALL[..=cap as usize]
            .iter()
            .rev()
            .copied()
            .find(|l| l.supported())
            .unwrap_or(Level::Portable)
    } else {
        best
    }
}

/// Run `f` with kernels restricted to `level` (or to [`best`], if that is lower) on this thread
/// and on the pool workers that run its dispatches. Graphs run inside `f` (wherever compiled) use only
/// that level's instructions. Nested calls restore the outer level when they return.
pub fn with_level<R>(level: Level, f: impl FnOnce() -> R) -> R {
    struct Restore(u8);
    impl Drop for Restore {
        fn drop(&mut self) {
            CAP.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CAP.with(|c| c.replace(level as u8)));
    f()
}

/// Run `f(level)` once at every level of [`levels`], inside [`with_level`]: how tests cover the
/// AVX-512, AVX2 and portable kernels on one machine. A failure names the level.
pub fn for_each_level(mut f: impl FnMut(Level)) {
    for level in levels() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_level(level, || f(level))
        }));
        if let Err(e) = r {
            eprintln!("(the failure above ran at instruction-set level {level})");
            std::panic::resume_unwind(e);
        }
    }
}

/// The raw cap of this thread, for the pool to hand to its workers with a dispatch.
pub(crate) fn thread_cap() -> u8 {
    CAP.with(|c| c.get())
}

/// Set this thread's raw cap (a pool worker taking a dispatch); returns the previous one.
pub(crate) fn set_thread_cap(cap: u8) -> u8 {
    CAP.with(|c| c.replace(cap))
}

/// Whether AVX2, FMA and F16C may be used now.
#[inline]
pub fn avx2() -> bool {
    current() >= Level::Avx2
}

/// Whether AVX-512F may be used now.
#[inline]
pub fn avx512() -> bool {
    current() >= Level::Avx512
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_level_lowers_and_restores_the_thread_level() {
        let best = best();
        assert_eq!(current(), best);
        with_level(Level::Portable, || {
            assert_eq!(current(), Level::Portable);
            assert!(!avx2() && !avx512());
            with_level(Level::Avx512, || {
                assert_eq!(current(), best, "a cap above the best is the best")
            });
            assert_eq!(current(), Level::Portable);
        });
        assert_eq!(current(), best);
        let all: Vec<Level> = levels().collect();
        assert_eq!(all.first(), Some(&Level::Portable));
        assert_eq!(all.last(), Some(&best));
        for l in all {
            assert_eq!(
                with_level(l, current),
                l,
                "every listed level runs as itself"
            );
        }
    }

    #[test]
    fn pool_workers_run_the_dispatching_threads_level() {
        let pool = crate::pool::Pool::new(2);
        let seen: Vec<std::sync::atomic::AtomicU8> = (0..64)
            .map(|_| std::sync::atomic::AtomicU8::new(9))
            .collect();
        with_level(Level::Portable, || {
            pool.run(64, &|t, _| {
                seen[t].store(current() as u8, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_micros(50));
            })
        });
        assert!(seen
            .iter()
            .all(|s| s.load(std::sync::atomic::Ordering::Relaxed) == Level::Portable as u8));
        // And after the scope, the workers are back at the best level.
        pool.run(64, &|t, _| {
            seen[t].store(current() as u8, std::sync::atomic::Ordering::Relaxed)
        });
        assert!(seen
            .iter()
            .all(|s| s.load(std::sync::atomic::Ordering::Relaxed) == best() as u8));
    }
}
