//! 64-byte aligned, zero-initialized buffers that never move. On Linux, buffers of 2 MiB and
//! more are anonymous mappings aligned to 2 MiB and advised for transparent huge pages: the
//! arena and the weights are then covered by a few TLB entries instead of thousands, which
//! spares page walks in kernels that stream several megabytes (GEMM packing, elementwise
//! passes). Pages are still zero-filled lazily by the kernel.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// An aligned byte buffer.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// The whole mapping (start, length) when the buffer is a huge-page mapping.
    map: Option<(*mut u8, usize)>,
}

// SAFETY: a plain owned allocation.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

const ALIGN: usize = 64;

/// Size (and alignment) of a transparent huge page on x86-64 and most aarch64 kernels.
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

impl Buffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Buffer {
        if len == 0 {
            return Buffer {
                ptr: ALIGN as *mut u8,
                len: 0,
                map: None,
            };
        }
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            if let Some(b) = Buffer::huge(len) {
                return b;
            }
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Buffer {
            ptr,
            len,
            map: None,
        }
    }

    /// `len` zero bytes in a 2 MiB-aligned anonymous mapping advised for huge pages (`None` if
    /// the mapping fails; the caller falls back to the heap).
    #[cfg(target_os = "linux")]
    fn huge(len: usize) -> Option<Buffer> {
        let map_len = len.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let ptr = (base as usize).next_multiple_of(HUGE) as *mut u8;
        // SAFETY: `ptr..ptr + len` lies inside the mapping. The advice is only a hint: if the
        // kernel declines it, the buffer works with normal pages.
        unsafe { libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        Some(Buffer {
            ptr,
            len,
            map: Some((base as *mut u8, map_len)),
        })
    }

    /// A copy of `data`.
    pub fn from_bytes(data: &[u8]) -> Buffer {
        let b = Buffer::zeroed(data.len());
        // SAFETY: `b` has `data.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr, data.len()) };
        b
    }

    /// Base address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some((base, map_len)) = self.map {
            // SAFETY: the mapping made in `huge`, unmapped once.
            unsafe { libc::munmap(base as *mut libc::c_void, map_len) };
            return;
        }
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) };
        }
    }
}
