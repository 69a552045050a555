//! A small fork-join thread pool built for low dispatch latency: idle workers spin on a
//! generation counter for up to 2 ms (`RLX_SPIN_US`) before parking, and a dispatch allocates
//! nothing.
//! Spinning carries the workers through the host-side gap between two runs (two training
//! steps, say): on a virtual machine a parked virtual CPU is slow to wake, and the first
//! parallel ops after a park run slower than the same ops a moment later.
//!
//! Kernels call [`Pool::run`] with a task count and a closure `f(task, thread)`; the caller's
//! thread takes part. On Linux, when the process may use a CPU per thread, each worker is pinned
//! to its own CPU other than the first (`RLX_PIN=0` leaves them free). If the pool is already
//! busy (another graph is running on it, or a task dispatches again), the work runs inline on
//! the calling thread instead of waiting.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};

type Task<'a> = &'a (dyn Fn(usize, usize) + Sync);

struct Shared {
    generation: AtomicUsize,
    /// Type-erased `Task` of the current dispatch (valid while `done < workers`).
    job: Mutex<Option<(usize, usize)>>,
    tasks: AtomicUsize,
    /// The dispatching thread's instruction-set cap ([`crate::isa::with_level`]).
    cap: AtomicU8,
    next: AtomicUsize,
    done: AtomicUsize,
    stop: AtomicBool,
    panicked: AtomicBool,
    sleeping: Vec<AtomicBool>,
}

/// A fixed set of worker threads.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    handles: Vec<JoinHandle<()>>,
    busy: Mutex<()>,
}

const SPIN: usize = 1 << 11;

/// How long an idle worker spins before parking: `RLX_SPIN_US` microseconds (default 2000).
fn idle_spin() -> std::time::Duration {
    static S: OnceLock<u64> = OnceLock::new();
    std::time::Duration::from_micros(*S.get_or_init(|| {
        rlx_ir::env::get(rlx_ir::env::SPIN_US)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(2000)
    }))
}

fn erase(f: Task<'_>) -> (usize, usize) {
    // SAFETY: a fat pointer is two words; it is rebuilt only while `f` is alive (see `run`).
    unsafe { std::mem::transmute::<Task<'_>, (usize, usize)>(f) }
}

impl Pool {
    /// A pool with `threads` threads in total (the caller's included). Idle workers spin for
    /// `RLX_SPIN_US` microseconds (default 2000, like OpenMP runtimes' default spin before
    /// sleeping) before they park: across the host-side gap between two runs of a graph (a
    /// training loop's bookkeeping) they stay awake, and a woken worker (on a VM, a halted
    /// virtual CPU) costs tens of microseconds and runs slower for a while after.
    pub fn new(threads: usize) -> Pool {
        Pool::with_idle_spin(threads, idle_spin())
    }

    /// [`Pool::new`] with idle workers spinning for `idle` before they park.
    pub fn with_idle_spin(threads: usize, idle: std::time::Duration) -> Pool {
        let workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: Mutex::new(None),
            tasks: AtomicUsize::new(0),
            cap: AtomicU8::new(u8::MAX),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
        });
        let mut handles = Vec::new();
        let cpus = allowed_cpus();
        let pin = !rlx_ir::env::is_off(rlx_ir::env::PIN);
        for w in 0..workers {
            let s = shared.clone();
            // With a CPU for every thread, worker `w` keeps to the `w + 1`-th allowed CPU, so a
            // worker woken from its park never lands on the CPU of the thread that woke it
            // (the caller is not pinned and settles on the CPU left free). `RLX_PIN=0` opts out
            // (say, when other busy processes share the CPUs).
            let cpu = (pin && cpus.len() >= threads).then(|| cpus[(w + 1) % cpus.len()]);
            let h = thread::Builder::new()
                .name(format!("rlx-worker-{w}"))
                .spawn(move || {
                    if let Some(c) = cpu {
                        pin_to(c);
                    }
                    worker(s, w, idle)
                })
                .expect("spawning an RLX worker thread");
            handles.push(h);
        }
        let threads = handles.iter().map(|h| h.thread().clone()).collect();
        Pool {
            shared,
            threads,
            handles,
            busy: Mutex::new(()),
        }
    }

    /// Shared pool with `threads` threads, created on first use.
    pub fn shared(threads: usize) -> Arc<Pool> {
        static POOLS: OnceLock<Mutex<Vec<Arc<Pool>>>> = OnceLock::new();
        let pools = POOLS.get_or_init(|| Mutex::new(Vec::new()));
        let mut p = pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = p.iter().find(|q| q.threads() == threads) {
            return found.clone();
        }
        let new = Arc::new(Pool::new(threads));
        p.push(new.clone());
        new
    }

    /// Total threads, the caller's included.
    pub fn threads(&self) -> usize {
        self.handles.len() + 1
    }

    /// Run `f(task, thread)` for every task in `0..tasks`, spread over the pool; returns when all
    /// are done. `thread` is below [`Pool::threads`] and unique among concurrently running tasks.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        let guard = if tasks > 1 && !self.handles.is_empty() {
            self.busy.try_lock().ok()
        } else {
            None
        };
        let Some(_guard) = guard else {
            for t in 0..tasks {
                f(t, 0);
            }
            return;
        };
        let s = &*self.shared;
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(erase(f));
        s.tasks.store(tasks, Ordering::Relaxed);
        s.cap.store(crate::isa::thread_cap(), Ordering::Relaxed);
        s.next.store(0, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        // SeqCst on both sides of the sleep handshake: the worker stores `sleeping` then loads
        // `generation`, the dispatcher bumps `generation` then reads `sleeping`. With weaker
        // orderings both loads may see the old values (store-load reordering, allowed even on
        // x86), the worker parks and no one wakes it: a deadlock seen under load.
        s.generation.fetch_add(1, Ordering::SeqCst);
        for (i, t) in self.threads.iter().enumerate() {
            if s.sleeping[i].swap(false, Ordering::SeqCst) {
                t.unpark();
            }
        }
        let workers = self.handles.len();
        // The caller works too, as thread `workers`. A panic here must not unwind before the
        // workers are done with `f`, which lives in this frame.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            let t = s.next.fetch_add(1, Ordering::Relaxed);
            if t >= tasks {
                break;
            }
            f(t, workers);
        }));
        if mine.is_err() {
            // Stop handing out tasks, then wait for the workers as usual.
            s.next.store(tasks, Ordering::Relaxed);
        }
        // Wait for the workers. Past a short spin, yield: if the scheduler put a worker on this
        // thread's CPU (it may wake a parked worker there), spinning would only delay it.
        let mut spins = 0;
        while s.done.load(Ordering::Acquire) < workers {
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("an RLX kernel panicked on a worker thread");
        }
    }
}

/// CPUs this process may run on (empty where unknown).
fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `set` is a plain bit set the call fills in.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
            == 0
        {
            return (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect();
        }
    }
    Vec::new()
}

/// Keep the calling thread on `cpu` (best effort).
fn pin_to(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as above; a failure leaves the thread unpinned.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

fn worker(s: Arc<Shared>, me: usize, budget: std::time::Duration) {
    let mut seen = 0;
    loop {
        let mut spins = 0u32;
        let mut since = std::time::Instant::now();
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || since.elapsed() < budget {
                std::hint::spin_loop();
            } else {
                s.sleeping[me].store(true, Ordering::SeqCst);
                if s.generation.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                    thread::park();
                }
                s.sleeping[me].store(false, Ordering::Release);
                since = std::time::Instant::now();
            }
        }
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(raw) = job {
            // SAFETY: the dispatcher keeps the closure alive until every worker reports done.
            let f: Task<'_> = unsafe { std::mem::transmute::<(usize, usize), Task<'_>>(raw) };
            let tasks = s.tasks.load(Ordering::Relaxed);
            crate::isa::set_thread_cap(s.cap.load(Ordering::Relaxed));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
                let t = s.next.fetch_add(1, Ordering::Relaxed);
                if t >= tasks {
                    break;
                }
                f(t, me);
            }));
            if r.is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_after_the_workers_park_are_never_lost() {
        // Alternate dispatches with pauses long enough for the workers to park (they spin for
        // only 10 µs here), so the park / wake-up handshake runs thousands of times (a lost
        // wake-up hangs this test).
        let p = Pool::with_idle_spin(2, std::time::Duration::from_micros(10));
        let hits = AtomicUsize::new(0);
        for i in 0..3000 {
            p.run(2, &|_, _| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
            if i % 3 == 0 {
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_micros(40) {
                    std::hint::spin_loop();
                }
            }
        }
        assert_eq!(hits.load(Ordering::Relaxed), 6000);
    }

    #[test]
    fn every_task_runs_once() {
        let p = Pool::new(3);
        for n in [1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            p.run(n, &|t, th| {
                assert!(th < 3);
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
