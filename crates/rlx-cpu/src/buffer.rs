//! 64-byte aligned, zero-initialized heap buffers that never move.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// An aligned byte buffer.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a plain owned allocation.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

const ALIGN: usize = 64;

impl Buffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Buffer {
        if len == 0 {
            return Buffer { ptr: ALIGN as *mut u8, len: 0 };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Buffer { ptr, len }
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
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) };
        }
    }
}
