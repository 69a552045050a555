//! cuBLAS, loaded at run time for the products a [`crate::gemm::Gemm`] describes.
//!
//! The library is found through `RLX_CUBLAS` (a path to `libcublas.so.*`; the `libcublasLt`
//! beside it is loaded first, so a library outside the loader's path works, e.g. the one in
//! PyTorch's `site-packages/nvidia/cu13/lib`), else by name through the system loader
//! (`libcublas.so.13`, `.12`, `libcublas.so`), else under `/usr/local/cuda/lib64`.
//! `RLX_CUBLAS=0` keeps RLX's own kernels. Without the library every product runs
//! on those kernels: cuBLAS is never required.

use crate::gemm::ColumnMajor;
use rlx_ir::{DType, Error, Result};
use std::ffi::{c_int, c_longlong, c_void};
use std::sync::OnceLock;

type Handle = *mut c_void;
type Status = c_int;

/// The cuBLAS entry points RLX uses.
pub(crate) struct Cublas {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    set_workspace: unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status,
    set_math_mode: unsafe extern "C" fn(Handle, c_int) -> Status,
    #[allow(clippy::type_complexity)]
    gemm: unsafe extern "C" fn(
        Handle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const c_void,
        *const c_void,
        c_int,
        c_int,
        c_longlong,
        *const c_void,
        c_int,
        c_int,
        c_longlong,
        *const c_void,
        *mut c_void,
        c_int,
        c_int,
        c_longlong,
        c_int,
        c_int,
        c_int,
    ) -> Status,
    _libs: Vec<libloading::Library>,
}

fn failed(what: &str, status: Status) -> Error {
    Error::Device {
        backend: "cuda".into(),
        msg: format!("{what}: cuBLAS status {status}"),
    }
}

/// Bytes of the workspace each program gives cuBLAS (NVIDIA's advice for Hopper), so that
/// nothing is allocated while a run is captured as a CUDA graph.
pub(crate) const WORKSPACE: usize = 32 << 20;

impl Cublas {
    /// The library, loaded once per process; `None` where it is turned off or not found.
    pub(crate) fn get() -> Option<&'static Cublas> {
        static LIB: OnceLock<Option<Cublas>> = OnceLock::new();
        LIB.get_or_init(|| {
            if rlx_ir::env::is_off(rlx_ir::env::CUBLAS) {
                return None;
            }
            Cublas::load()
        })
        .as_ref()
    }

    fn load() -> Option<Cublas> {
        let mut libs = Vec::new();
        let mut names: Vec<String> = Vec::new();
        if let Some(p) = rlx_ir::env::get(rlx_ir::env::CUBLAS) {
            let path = std::path::PathBuf::from(&p);
            if let Some(dir) = path.parent() {
                for lt in ["libcublasLt.so.13", "libcublasLt.so.12"] {
                    // SAFETY: NVIDIA's library, loaded so that libcublas finds it by soname.
                    if let Ok(l) = unsafe { libloading::Library::new(dir.join(lt)) } {
                        libs.push(l);
                        break;
                    }
                }
            }
            names.push(p);
        }
        names.extend(
            [
                "libcublas.so.13",
                "libcublas.so.12",
                "libcublas.so",
                "/usr/local/cuda/lib64/libcublas.so",
            ]
            .map(String::from),
        );
        // SAFETY: loading NVIDIA's cuBLAS, whose initialisers are the library's own.
        let lib = names
            .iter()
            .find_map(|n| unsafe { libloading::Library::new(n) }.ok())?;
        // SAFETY: each symbol is resolved with the signature cuBLAS's headers declare; the
        // library is kept loaded with the pointers.
        unsafe {
            let create = *lib.get(b"cublasCreate_v2\0").ok()?;
            let destroy = *lib.get(b"cublasDestroy_v2\0").ok()?;
            let set_stream = *lib.get(b"cublasSetStream_v2\0").ok()?;
            let set_workspace = *lib.get(b"cublasSetWorkspace_v2\0").ok()?;
            let set_math_mode = *lib.get(b"cublasSetMathMode\0").ok()?;
            let gemm = *lib.get(b"cublasGemmStridedBatchedEx\0").ok()?;
            libs.push(lib);
            Some(Cublas {
                create,
                destroy,
                set_stream,
                set_workspace,
                set_math_mode,
                gemm,
                _libs: libs,
            })
        }
    }
}

/// A cuBLAS handle bound to one program's stream and workspace.
pub(crate) struct BlasHandle {
    lib: &'static Cublas,
    handle: Handle,
}

// SAFETY: a handle is used by one thread at a time (its program's `&mut self` runs).
unsafe impl Send for BlasHandle {}

impl BlasHandle {
    /// A handle issuing work on `stream` with `workspace` (`WORKSPACE` bytes of device memory
    /// that outlive the handle), in the default math mode (no TF32: f32 products stay f32).
    pub(crate) fn new(lib: &'static Cublas, stream: *mut c_void, workspace: u64) -> Result<Self> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: an out-pointer for the new handle.
        let s = unsafe { (lib.create)(&mut handle) };
        if s != 0 {
            return Err(failed("cublasCreate", s));
        }
        let h = BlasHandle { lib, handle };
        // SAFETY: a live handle; the stream and workspace outlive it (the program owns them);
        // the stream is set first since setting it resets the workspace.
        unsafe {
            let s = (lib.set_stream)(handle, stream);
            if s != 0 {
                return Err(failed("cublasSetStream", s));
            }
            let s = (lib.set_workspace)(handle, workspace as *mut c_void, WORKSPACE);
            if s != 0 {
                return Err(failed("cublasSetWorkspace", s));
            }
            let s = (lib.set_math_mode)(handle, 0);
            if s != 0 {
                return Err(failed("cublasSetMathMode", s));
            }
        }
        Ok(h)
    }

    /// Issue `call` with its operands at device addresses `at` (`A`, `B`, `C`).
    pub(crate) fn gemm(&self, call: &ColumnMajor, at: [u64; 3]) -> Result<()> {
        // cudaDataType values of cuBLAS's headers.
        let ty = |dt: DType| match dt {
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 14,
            _ => 0,
        };
        // CUBLAS_COMPUTE_64F or CUBLAS_COMPUTE_32F (never TF32).
        let compute = if call.dtype == DType::F64 { 70 } else { 68 };
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta) = if call.dtype == DType::F64 {
            (
                &one64 as *const f64 as *const c_void,
                &zero64 as *const f64 as *const c_void,
            )
        } else {
            (
                &one32 as *const f32 as *const c_void,
                &zero32 as *const f32 as *const c_void,
            )
        };
        let t = ty(call.dtype);
        // SAFETY: the operands are device addresses in the program's allocations holding the
        // elements the call reads and writes (the lowering sized them); alpha and beta are host
        // scalars read before the call returns.
        let s = unsafe {
            (self.lib.gemm)(
                self.handle,
                0,
                0,
                call.m,
                call.n,
                call.k,
                alpha,
                at[0] as *const c_void,
                t,
                call.a.1,
                call.a.2,
                at[1] as *const c_void,
                t,
                call.b.1,
                call.b.2,
                beta,
                at[2] as *mut c_void,
                t,
                call.c.1,
                call.c.2,
                call.batches,
                compute,
                -1,
            )
        };
        if s != 0 {
            return Err(failed("cublasGemmStridedBatchedEx", s));
        }
        Ok(())
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { (self.lib.destroy)(self.handle) };
    }
}
