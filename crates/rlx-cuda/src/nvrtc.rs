//! NVRTC, loaded at run time: CUDA C to a CUBIN for one exact architecture (`sm_90`, ...), never
//! PTX (a driver refuses PTX from a newer NVRTC than itself), cached on disk.
//!
//! The library is found through `RLX_NVRTC` (a path to `libnvrtc.so.*`; its
//! `libnvrtc-builtins` beside it is loaded first, so a library outside the loader's path
//! works, e.g. the one of the PyPI wheel `nvidia-cuda-nvrtc`), else by name through the system
//! loader (`libnvrtc.so.13`, `.12`, `libnvrtc.so`). CUBINs are kept under
//! `<cache dir>/cuda/<hash>.cubin`, keyed by the source, the architecture and NVRTC's version
//! (`RLX_CACHE_DIR` moves the cache directory; `RLX_CUDA_KERNEL_CACHE=0` turns it off).

use rlx_ir::{Error, Result};
use sha2::{Digest, Sha256};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

type Prog = *mut c_void;
type Status = c_int;

/// The NVRTC entry points RLX uses.
pub struct Nvrtc {
    version: (i32, i32),
    path: String,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Prog) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    _libs: Vec<libloading::Library>,
}

fn failed(msg: String) -> Error {
    Error::Device {
        backend: "cuda".into(),
        msg,
    }
}

impl Nvrtc {
    /// The library, loaded once per process; the error says where it was looked for.
    pub fn get() -> Result<&'static Nvrtc> {
        static LIB: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
        LIB.get_or_init(Nvrtc::load)
            .as_ref()
            .map_err(|e| failed(e.clone()))
    }

    fn load() -> std::result::Result<Nvrtc, String> {
        let mut libs = Vec::new();
        let mut tried = Vec::new();
        let mut main = None;
        if let Some(path) = rlx_ir::env::get(rlx_ir::env::NVRTC) {
            let p = PathBuf::from(&path);
            // The builtins library NVRTC opens by name: loaded from beside it first.
            if let Some(dir) = p.parent() {
                if let Ok(rd) = std::fs::read_dir(dir) {
                    for e in rd.flatten() {
                        let name = e.file_name().to_string_lossy().to_string();
                        if name.starts_with("libnvrtc-builtins.so") {
                            // SAFETY: loading NVRTC's own builtins library, which has no
                            // initialisers with preconditions.
                            if let Ok(l) = unsafe { libloading::Library::new(e.path()) } {
                                libs.push(l);
                            }
                        }
                    }
                }
            }
            // SAFETY: as above, the NVRTC library the user named.
            match unsafe { libloading::Library::new(&p) } {
                Ok(l) => main = Some((l, path)),
                Err(e) => tried.push(format!("RLX_NVRTC={path}: {e}")),
            }
        }
        if main.is_none() {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                // SAFETY: as above.
                match unsafe { libloading::Library::new(name) } {
                    Ok(l) => {
                        main = Some((l, name.to_string()));
                        break;
                    }
                    Err(e) => tried.push(format!("{name}: {e}")),
                }
            }
        }
        let Some((lib, path)) = main else {
            return Err(format!(
                "NVRTC (libnvrtc) was not found, so CUDA kernels cannot be compiled; install the CUDA toolkit's NVRTC or the PyPI wheel nvidia-cuda-nvrtc and set RLX_NVRTC to its libnvrtc.so.13 (tried: {})",
                tried.join("; ")
            ));
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature of NVRTC's public API (nvrtc.h) that
                // the field's type spells out.
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "{path} has no {}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
                })?
            };
        }
        let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status =
            sym!(b"nvrtcVersion\0");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { version_fn(&mut major, &mut minor) };
        let n = Nvrtc {
            version: (major, minor),
            path: path.clone(),
            create: sym!(b"nvrtcCreateProgram\0"),
            compile: sym!(b"nvrtcCompileProgram\0"),
            cubin_size: sym!(b"nvrtcGetCUBINSize\0"),
            cubin: sym!(b"nvrtcGetCUBIN\0"),
            log_size: sym!(b"nvrtcGetProgramLogSize\0"),
            log: sym!(b"nvrtcGetProgramLog\0"),
            destroy: sym!(b"nvrtcDestroyProgram\0"),
            error_string: sym!(b"nvrtcGetErrorString\0"),
            _libs: {
                libs.push(lib);
                libs
            },
        };
        Ok(n)
    }

    /// NVRTC's version (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn status(&self, s: Status, what: &str) -> Result<()> {
        if s == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static string for any status.
        let text = unsafe { CStr::from_ptr((self.error_string)(s)) }
            .to_string_lossy()
            .to_string();
        Err(failed(format!("NVRTC {what}: {text}")))
    }

    /// `source` compiled to a CUBIN for `arch` (e.g. 90 for `sm_90`), from the disk cache when
    /// it holds it. A kernel NVRTC rejects gives its log.
    pub fn cubin(&self, source: &str, arch: u32) -> Result<Vec<u8>> {
        let file = cache_file(source, arch, self.version);
        if let Some(f) = &file {
            if let Ok(b) = std::fs::read(f) {
                if !b.is_empty() {
                    return Ok(b);
                }
            }
        }
        let bin = self.compile_uncached(source, arch)?;
        if let Some(f) = &file {
            if let Some(dir) = f.parent() {
                let _ = std::fs::create_dir_all(dir);
                let tmp = f.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &bin).is_ok() {
                    let _ = std::fs::rename(&tmp, f);
                }
            }
        }
        Ok(bin)
    }

    /// Check that every one of `sources` compiles for `arch`, without keeping the CUBINs: the
    /// check that no kernel reaches a user uncompiled, made cheaply. Sources already compiled
    /// or checked (the disk cache) are skipped; the rest are compiled in batches, each batch one
    /// program holding its kernels in namespaces of their own (the kernel entry `extern "C"
    /// __global__ void k(` without its C linkage, each source's macros undefined after it, so
    /// no kernel sees another's names), the batches on every core. A batch that fails is
    /// compiled kernel by kernel, so an error is always one kernel's, with its log and source,
    /// and a batch that fails only as a batch (a limit of one program) passes kernel by kernel.
    pub fn check_all(&self, sources: &[&str], arch: u32) -> Result<()> {
        let todo: Vec<&str> = sources
            .iter()
            .copied()
            .filter(|s| {
                cache_file(s, arch, self.version)
                    .is_none_or(|f| !f.exists() && !f.with_extension("checked").exists())
            })
            .collect();
        let (alone, batched): (Vec<&str>, Vec<&str>) =
            todo.into_iter().partition(|s| !s.contains(KERNEL_ENTRY));
        let mut chunks: Vec<Vec<&str>> = batched.chunks(CHECK_BATCH).map(<[_]>::to_vec).collect();
        chunks.extend(alone.into_iter().map(|s| vec![s]));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(chunks.len());
        let run = || -> Result<()> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(chunk) = chunks.get(i) else {
                    return Ok(());
                };
                let ok = chunk.len() > 1 && self.compile_uncached(&batch(chunk), arch).is_ok();
                if !ok {
                    for src in chunk {
                        self.compile_uncached(src, arch)?;
                    }
                }
                // A marker beside where the CUBIN would be cached: this source compiled.
                if let Some(dir) = cache_file(chunk[0], arch, self.version)
                    .as_deref()
                    .and_then(std::path::Path::parent)
                {
                    let _ = std::fs::create_dir_all(dir);
                }
                for f in chunk
                    .iter()
                    .filter_map(|s| cache_file(s, arch, self.version))
                {
                    let _ = std::fs::write(f.with_extension("checked"), b"");
                }
            }
        };
        std::thread::scope(|scope| {
            let handles: Vec<_> = (1..workers).map(|_| scope.spawn(run)).collect();
            let mut result = run();
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(failed("an NVRTC check thread panicked".into())));
                result = result.and(r);
            }
            result
        })
    }

    /// `source` compiled to a CUBIN for `arch`, not cached.
    pub fn compile_uncached(&self, source: &str, arch: u32) -> Result<Vec<u8>> {
        let src =
            CString::new(source).map_err(|_| failed("a kernel source holds a NUL byte".into()))?;
        let name = c"rlx_kernel.cu";
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: valid C strings, no headers; `prog` receives the program.
        self.status(
            unsafe {
                (self.create)(
                    &mut prog,
                    src.as_ptr(),
                    name.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            },
            "could not create a program",
        )?;
        let opts: Vec<CString> = [format!("-arch=sm_{arch}"), "--std=c++17".to_string()]
            .into_iter()
            .map(|o| CString::new(o).expect("options hold no NUL"))
            .collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog` is live; the options outlive the call.
        let compiled = unsafe { (self.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
        let result = if compiled != 0 {
            let mut size = 0usize;
            // SAFETY: `prog` is live; the buffer has the size NVRTC reported.
            let log = unsafe {
                (self.log_size)(prog, &mut size);
                let mut buf = vec![0u8; size.max(1)];
                (self.log)(prog, buf.as_mut_ptr() as *mut c_char);
                String::from_utf8_lossy(&buf[..size.saturating_sub(1)]).to_string()
            };
            self.status(compiled, &format!("rejected a kernel for sm_{arch}"))
                .map_err(|e| failed(format!("{e}\n{log}\n--- source ---\n{source}")))
                .map(|_| Vec::new())
        } else {
            let mut size = 0usize;
            // SAFETY: `prog` is live and compiled; the buffer has the size NVRTC reported.
            unsafe {
                self.status((self.cubin_size)(prog, &mut size), "CUBIN size")
                    .and_then(|_| {
                        let mut buf = vec![0u8; size];
                        self.status((self.cubin)(prog, buf.as_mut_ptr() as *mut c_char), "CUBIN")
                            .map(|_| buf)
                    })
            }
        };
        // SAFETY: `prog` was created above and is destroyed once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }
}

/// How every kernel RLX generates opens its entry point.
const KERNEL_ENTRY: &str = "extern \"C\" __global__ void k(";

/// Kernels compiled together by [`Nvrtc::check_all`]: large enough to share NVRTC's cost of a
/// program, small enough to spread over the cores.
const CHECK_BATCH: usize = 24;

/// One program of `sources` (each holding [`KERNEL_ENTRY`]), each in a namespace of its own
/// with its entry point's C linkage dropped and its macros undefined after it.
fn batch(sources: &[&str]) -> String {
    let mut tu = String::new();
    for (i, src) in sources.iter().enumerate() {
        tu.push_str(&format!(
            "namespace rlx_check_{i} {{\n{}\n}}\n",
            src.replacen(KERNEL_ENTRY, "__global__ void k(", 1)
        ));
        for line in src.lines() {
            if let Some(name) = line
                .trim_start()
                .strip_prefix("#define ")
                .and_then(|r| r.split(|c: char| !(c.is_alphanumeric() || c == '_')).next())
            {
                tu.push_str(&format!("#undef {name}\n"));
            }
        }
    }
    tu
}

/// The cache file of `source` for `arch` under NVRTC `version`, unless the cache is off.
fn cache_file(source: &str, arch: u32, version: (i32, i32)) -> Option<PathBuf> {
    if rlx_ir::env::is_off(rlx_ir::env::CUDA_KERNEL_CACHE) {
        return None;
    }
    let mut h = Sha256::new();
    h.update(format!("nvrtc {}.{} sm_{arch}\n", version.0, version.1));
    h.update(source.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Some(
        rlx_ir::env::cache_dir()?
            .join("cuda")
            .join(format!("{hex}.cubin")),
    )
}
