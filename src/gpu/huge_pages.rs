//! Huge pages for a CPU-hosted device's memory.
//!
//! On a CPU-hosted driver (lavapipe) device memory is the process's own anonymous
//! memory, which Linux maps in 4 KiB pages unless asked otherwise. A decode step
//! streams every weight through it once: with 4 KiB pages each page costs a TLB miss,
//! and the hardware prefetchers stop at every page boundary. Backed by 2 MiB pages,
//! Gemma 3's Q8_0 output head reads in 18.0-18.5 ms instead of 21.4-22.3, and its
//! decode steps run 1.12x faster (docs/perf.md, "Huge pages for lavapipe's memory").
//!
//! The driver allocates that memory itself and cannot be told to ask for huge pages.
//! So after creating resources, and before filling them, the loader calls
//! [`advise`]: where the address space changed since the last call, it marks the
//! process's large anonymous regions `MADV_HUGEPAGE`, and the kernel serves the first
//! touch of each 2 MiB range there with one huge page. Pages already touched stay as
//! they are, and so does memory where the kernel has no huge page to give (it falls
//! back to small pages) or THP is off.
//!
//! `WGLLM_HUGE_PAGES=off` turns this off; `on` asks for it on any device (for
//! measuring it where the default leaves it off).

use crate::error::Result;

/// Environment variable overriding whether [`advise`] runs: `on` or `off`.
pub const ENV: &str = "WGLLM_HUGE_PAGES";

/// Whether device memory should be backed by huge pages: as `WGLLM_HUGE_PAGES` says
/// if set, else on CPU-hosted devices only (a GPU's memory is not the host's).
pub fn wanted(device_type: wgpu::DeviceType) -> Result<bool> {
    super::context::cpu_hosted_switch(ENV, device_type)
}

/// Ask for huge pages in the process's large anonymous regions (device memory on a
/// CPU-hosted driver) if the address space changed since the last call: pages first
/// touched after this come as 2 MiB pages. Call it after allocating device memory and
/// before filling it. A no-op where the platform has no such call.
pub fn advise() {
    #[cfg(target_os = "linux")]
    if linux::address_space_changed() {
        linux::mark_large_regions(libc::MADV_HUGEPAGE);
    }
}

/// Ask for small pages again in the process's large anonymous regions: memory first
/// touched from now on (caches and activations, which fill a little at a time) comes
/// in 4 KiB pages, while what [`advise`] made huge stays so.
pub fn end() {
    #[cfg(target_os = "linux")]
    {
        linux::mark_large_regions(libc::MADV_NOHUGEPAGE);
        // The next load's first `advise` marks them again, whatever the size then.
        linux::forget_address_space();
    }
}

/// The address ranges of the anonymous, private, writable mappings in `maps` (the
/// text of `/proc/self/maps`) that span at least `min` bytes, neighbours merged.
pub fn large_anonymous_regions(maps: &str, min: usize) -> Vec<std::ops::Range<usize>> {
    let mut regions: Vec<std::ops::Range<usize>> = Vec::new();
    for line in maps.lines() {
        let Some(range) = anonymous_writable(line) else {
            continue;
        };
        match regions.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => regions.push(range),
        }
    }
    regions.retain(|r| r.len() >= min);
    regions
}

/// The range of one `/proc/self/maps` line when it is anonymous (no path, not a
/// named region such as `[stack]`), private and writable.
fn anonymous_writable(line: &str) -> Option<std::ops::Range<usize>> {
    let mut fields = line.split_ascii_whitespace();
    let (range, perms) = (fields.next()?, fields.next()?);
    // offset, device, inode, then the path if any.
    let inode = fields.nth(2)?;
    let private_rw = perms.starts_with("rw") && perms.ends_with('p');
    if fields.next().is_some() || inode != "0" || !private_rw {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (end > start).then_some(start..end)
}

#[cfg(target_os = "linux")]
mod linux {
    use super::large_anonymous_regions;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Regions below this size are left alone: thread stacks (8 MiB) and the
    /// allocator's per-thread heaps are sparse, and a huge page there would be mostly
    /// empty memory made resident. wgpu's device memory blocks are 128-256 MiB and its
    /// large textures have their own allocation, merged with their neighbours in the
    /// address space.
    const MIN_REGION: usize = 32 << 20;

    /// The process's virtual size in pages at the last [`address_space_changed`]; 0:
    /// none since the start or the last [`forget_address_space`].
    static SEEN: AtomicU64 = AtomicU64::new(0);

    /// Whether the process's virtual size changed since the last call (the first
    /// call: true). Reading `/proc/self/statm` costs a few microseconds where the list
    /// of mappings costs tens, and most parts of a model fit memory already mapped.
    pub(super) fn address_space_changed() -> bool {
        let pages = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_ascii_whitespace().next()?.parse::<u64>().ok());
        match pages {
            Some(pages) => SEEN.swap(pages, Ordering::Relaxed) != pages,
            None => true,
        }
    }

    /// Make the next [`address_space_changed`] true.
    pub(super) fn forget_address_space() {
        SEEN.store(0, Ordering::Relaxed);
    }

    /// Give every anonymous region of at least [`MIN_REGION`] bytes `advice`
    /// (`MADV_HUGEPAGE` or `MADV_NOHUGEPAGE`; again, for those already marked: the
    /// call is idempotent).
    pub(super) fn mark_large_regions(advice: libc::c_int) {
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return;
        };
        for region in large_anonymous_regions(&maps, MIN_REGION) {
            // SAFETY: either advice only changes how later faults in the range are
            // served; the contents stay as they are. A refusal changes nothing.
            unsafe {
                libc::madvise(region.start as *mut libc::c_void, region.len(), advice);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55e0a1000000-55e0a1200000 r-xp 00000000 fd:01 1234 /usr/bin/wgllm
55e0a3000000-55e0a5000000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0002000000 rw-p 00000000 00:00 0
7f0002000000-7f0004000000 rw-p 00000000 00:00 0
7f0004000000-7f0004800000 ---p 00000000 00:00 0
7f0010000000-7f0010800000 rw-p 00000000 00:00 0
7f0020000000-7f0030000000 r--p 00000000 fd:01 99 /models/m.gguf
7f0040000000-7f0042000000 rw-s 00000000 00:05 77 /memfd:x (deleted)
7f0050000000-7f0052000000 rw-p 00000000 00:00 0
7ffd00000000-7ffd04000000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn large_anonymous_regions_merge_neighbours_and_skip_the_rest() {
        let got = large_anonymous_regions(MAPS, 48 << 20);
        // Two 32 MiB neighbours make one 64 MiB region; the 8 MiB one, the file map,
        // the shared memfd, the heap and the stack are left out.
        assert_eq!(got, vec![0x7f0000000000..0x7f0004000000]);
        let got = large_anonymous_regions(MAPS, 32 << 20);
        assert_eq!(
            got,
            vec![
                0x7f0000000000..0x7f0004000000,
                0x7f0050000000..0x7f0052000000
            ]
        );
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let maps = "zz-7f00 rw-p 0 00:00 0\n7f0000000000-7f0004000000 rw-p 0 00:00\n\
                    7f0004000000-7f0000000000 rw-p 0 00:00 0\n";
        assert!(large_anonymous_regions(maps, 0).is_empty());
    }

    /// The `VmFlags` of the mapping holding `addr`, from `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn vm_flags_at(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some(range) = line.split_ascii_whitespace().next() {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.trim().to_string());
                }
            }
        }
        None
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_large_fresh_allocation_is_marked_for_huge_pages() {
        // 64 MiB of zeros: the allocator maps them fresh, untouched.
        let block = vec![0u8; 64 << 20];
        let at = block.as_ptr() as usize + (32 << 20);
        let before = vm_flags_at(at).expect("the block is mapped");
        assert!(!before.split(' ').any(|f| f == "hg"), "{before}");
        advise();
        let after = vm_flags_at(at).expect("the block is mapped");
        assert!(after.split(' ').any(|f| f == "hg"), "{after}");
        assert_eq!(block[at - block.as_ptr() as usize], 0);
    }
}
