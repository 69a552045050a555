//! 64-byte aligned, zero-initialized buffers that never move. On Linux, buffers of 2 MiB and
//! more are anonymous mappings aligned to 2 MiB and advised for transparent huge pages: the
//! arena and the weights are then covered by a few TLB entries instead of thousands, which
//! spares page walks in kernels that stream several megabytes (GEMM packing, elementwise
//! passes). Buffers from 128 KiB up are anonymous mappings too (page-aligned, normal pages):
//! their pages are zero-filled lazily by the kernel when first written, so making a buffer costs
//! no time in proportion to its size. A compile allocates every weight before any is loaded;
//! from the heap, each was zeroed there and then (Gemma 3 270M's decode graph: 33 of its
//! 45 ms of compile went to zeroing weight buffers that loading then overwrote).

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// An aligned byte buffer.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// The whole mapping (start, length) when the buffer is an anonymous mapping.
    map: Option<(*mut u8, usize)>,
}

// SAFETY: a plain owned allocation.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

const ALIGN: usize = 64;

/// Size (and alignment) of a transparent huge page on x86-64 and most aarch64 kernels.
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

/// Buffers of this size and more are anonymous mappings (see the module documentation).
#[cfg(target_os = "linux")]
const LAZY: usize = 128 << 10;

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
        if len >= LAZY {
            if let Some(b) = Buffer::mapped(len, len >= HUGE) {
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

    /// `len` zero bytes in an anonymous mapping, with `huge` 2 MiB-aligned and advised for
    /// huge pages (`None` if the mapping fails; the caller falls back to the heap).
    #[cfg(target_os = "linux")]
    fn mapped(len: usize, huge: bool) -> Option<Buffer> {
        let map_len = if huge { len.checked_add(HUGE)? } else { len };
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
        if !huge {
            // Page-aligned, so aligned to `ALIGN`.
            return Some(Buffer {
                ptr: base as *mut u8,
                len,
                map: Some((base as *mut u8, map_len)),
            });
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
            // SAFETY: the mapping made in `mapped`, unmapped once.
            unsafe { libc::munmap(base as *mut libc::c_void, map_len) };
            return;
        }
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every allocation path (heap, plain mapping, huge-page mapping) gives aligned zero bytes
    /// that can be written and read back, and frees without fault.
    #[test]
    fn buffers_of_every_size_are_aligned_zeroed_and_writable() {
        for len in [
            0,
            1,
            4096,
            (128 << 10) - 1,
            128 << 10,
            1 << 20,
            (2 << 20) + 7,
        ] {
            let b = Buffer::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.ptr() as usize % ALIGN, 0, "{len} bytes misaligned");
            // SAFETY: `b` holds `len` bytes.
            let s = unsafe { std::slice::from_raw_parts_mut(b.ptr(), len) };
            assert!(s.iter().all(|&x| x == 0), "{len} bytes not zero");
            for (i, x) in s.iter_mut().enumerate().step_by(4093) {
                *x = i as u8 | 1;
            }
            assert!(s
                .iter()
                .enumerate()
                .step_by(4093)
                .all(|(i, &x)| x == i as u8 | 1));
            let c = Buffer::from_bytes(s);
            // SAFETY: `c` holds `len` bytes.
            assert_eq!(unsafe { std::slice::from_raw_parts(c.ptr(), len) }, &s[..]);
        }
    }
}
