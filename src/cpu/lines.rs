//! Buffers whose values start on a 64-byte cache line, for the data the CPU kernels
//! stream through in whole lines: the KV cache ([`super::kv_cache`]) and the tile
//! plans' token values ([`super::tile`]). A `Vec`'s values start 16 bytes into a line,
//! so a 64-byte load or a row of 128 bytes touched one line more than it needs, and the
//! lines asked for ahead left part of each row to wait (figures in docs/perf.md, "The
//! CPU engine at depth").

use super::ops::zeroed;

/// `len` zeroed values from the first line boundary of a vector of its own.
pub struct LineBuf<T> {
    /// Owned for `ptr`'s sake.
    _vec: Vec<T>,
    /// Read as a raw slice: a `Deref` through checked slicing or casts at every panel
    /// and row attention reads ran prompts at depth 0.83-0.87x as fast.
    ptr: *mut T,
    len: usize,
}

// SAFETY: `ptr` points into `_vec`, which the buffer owns; shared and exclusive access
// go through `&self` and `&mut self` as for the vector itself.
unsafe impl<T: Send> Send for LineBuf<T> {}
unsafe impl<T: Sync> Sync for LineBuf<T> {}

impl<T: bytemuck::Zeroable> LineBuf<T> {
    /// `n` zeros on a line, or `None` when the allocation fails (instead of aborting).
    /// A large buffer's zeroed pages come from the system on first use, so it costs
    /// nothing until it is used.
    pub fn zeroed(n: usize) -> Option<LineBuf<T>> {
        let pad = 64 / std::mem::size_of::<T>().max(1);
        let mut vec = zeroed::<T>(n.checked_add(pad)?)?;
        let off = vec.as_ptr().align_offset(64).min(pad);
        // SAFETY: off <= pad, so off + n values are in the vector.
        let ptr = unsafe { vec.as_mut_ptr().add(off) };
        Some(LineBuf {
            _vec: vec,
            ptr,
            len: n,
        })
    }
}

impl<T> Default for LineBuf<T> {
    fn default() -> Self {
        LineBuf {
            _vec: Vec::new(),
            ptr: std::ptr::NonNull::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl<T> std::ops::Deref for LineBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is aligned and valid for `len` values of the owned vector (or
        // dangling with `len` 0).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T> std::ops::DerefMut for LineBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_start_on_a_line_and_are_zero() {
        for n in [0, 1, 31, 1000, 1 << 20] {
            let b = LineBuf::<u16>::zeroed(n).unwrap();
            assert_eq!(b.len(), n);
            assert_eq!(b.as_ptr() as usize % 64, 0);
            assert!(b.iter().all(|&x| x == 0));
            let c = LineBuf::<i8>::zeroed(n).unwrap();
            assert_eq!((c.len(), c.as_ptr() as usize % 64), (n, 0));
        }
        assert_eq!(LineBuf::<f32>::default().len(), 0);
    }
}
