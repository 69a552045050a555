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
use std::sync::Arc;

/// An aligned byte buffer.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// The whole mapping (start, length) when the buffer is an anonymous mapping.
    map: Option<(*mut u8, usize)>,
    /// The buffer this one is a part of (see [`Buffer::part`]), kept alive by it.
    owner: Option<Arc<Buffer>>,
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
    /// `len` zero bytes; aborts as the standard allocator does when the memory cannot be had
    /// (see [`Buffer::try_zeroed`]).
    pub fn zeroed(len: usize) -> Buffer {
        Buffer::try_zeroed(len).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(
                Layout::from_size_align(len.max(1), ALIGN).unwrap_or(Layout::new::<u8>()),
            )
        })
    }

    /// `len` zero bytes, or `None` when the system cannot give them (compiles answer a named
    /// error then).
    pub fn try_zeroed(len: usize) -> Option<Buffer> {
        if len == 0 {
            return Some(Buffer {
                ptr: ALIGN as *mut u8,
                len: 0,
                map: None,
                owner: None,
            });
        }
        #[cfg(target_os = "linux")]
        if len >= LAZY {
            if let Some(b) = Buffer::mapped(len, len >= HUGE) {
                return Some(b);
            }
        }
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        Some(Buffer {
            ptr,
            len,
            map: None,
            owner: None,
        })
    }

    /// Bytes `offset..offset + len` of `whole` as a buffer of their own, which keeps `whole`
    /// alive. Many small buffers carved from one large one share its huge pages: a compile puts
    /// all its weights in one (each weight matrix of a small model is under 2 MiB, and a GEMM
    /// streaming one from normal pages walks the page table for every few rows it reads).
    ///
    /// # Panics
    /// If the range is not inside `whole` or `offset` is not a multiple of 64.
    pub fn part(whole: &Arc<Buffer>, offset: usize, len: usize) -> Buffer {
        assert!(
            offset.is_multiple_of(ALIGN) && offset.checked_add(len).is_some_and(|e| e <= whole.len),
            "part {offset}+{len} of a {}-byte buffer",
            whole.len
        );
        Buffer {
            // SAFETY: inside `whole` (checked above).
            ptr: unsafe { whole.ptr.add(offset) },
            len,
            map: None,
            owner: Some(whole.clone()),
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
                owner: None,
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
            owner: None,
        })
    }

    /// A copy of `data`.
    pub fn from_bytes(data: &[u8]) -> Buffer {
        let b = Buffer::zeroed(data.len());
        // SAFETY: `b` has `data.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr, data.len()) };
        b
    }

    /// `len` zero bytes for `what`, or the named error a compile answers when they cannot be
    /// had.
    pub fn for_compile(len: usize, what: impl FnOnce() -> String) -> rlx_ir::Result<Buffer> {
        Buffer::try_zeroed(len).ok_or_else(|| rlx_ir::Error::OutOfMemory {
            backend: "cpu".into(),
            what: what(),
            bytes: len,
        })
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
        if self.owner.is_some() {
            // A part: the whole buffer is freed with its last part.
            return;
        }
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

    /// Parts of one buffer are disjoint views that keep it alive after it is dropped, and
    /// a range outside it is refused.
    #[test]
    fn parts_share_the_whole_and_keep_it_alive() {
        let whole = Arc::new(Buffer::zeroed(3 << 20));
        let a = Buffer::part(&whole, 0, 1 << 20);
        let b = Buffer::part(&whole, 1 << 20, (2 << 20) - 64);
        drop(whole);
        // SAFETY: each part holds its length in bytes.
        unsafe {
            std::ptr::write_bytes(a.ptr(), 1, a.len());
            std::ptr::write_bytes(b.ptr(), 2, b.len());
            assert!(std::slice::from_raw_parts(a.ptr(), a.len())
                .iter()
                .all(|&x| x == 1));
            assert!(std::slice::from_raw_parts(b.ptr(), b.len())
                .iter()
                .all(|&x| x == 2));
        }
        assert_eq!(b.ptr() as usize - a.ptr() as usize, 1 << 20);
        let whole = Arc::new(Buffer::zeroed(4096));
        assert!(std::panic::catch_unwind(|| Buffer::part(&whole, 64, 4096)).is_err());
        assert!(std::panic::catch_unwind(|| Buffer::part(&whole, 8, 16)).is_err());
    }
}
