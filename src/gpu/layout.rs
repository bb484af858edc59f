//! How weights are laid out in GPU memory.
//!
//! Types whose blocks are a multiple of 16 bytes (Q4_K, Q5_K, F16) keep their file
//! encoding. The others (Q4_0 18 bytes, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34, Q6_K 210)
//! are stored planar within each row: the quants of all the row's blocks first, then
//! each smaller field of all its blocks (high bits, scales), the row padded to 16
//! bytes. The quants then sit on 16-byte boundaries and the decoders read them as
//! aligned vec4s (`wq`), which costs CPU-hosted drivers a quarter of the loads of
//! straddling u32 reads and lets real GPUs coalesce them; the bytes read per row are
//! the same. The values are unchanged: only the order of a row's bytes moves, except
//! that Q8_0's quants are held offset by 128 (each byte's top bit flipped, [`write_row`]),
//! so that its decoders read them as unsigned bytes in place: one operation a byte
//! where a signed byte takes two (`shaders/common/quant/q8_0.wgsl`).

use crate::quant::GgmlType;

/// A planar type's fields, as (offset in the file block, bytes), in the order their
/// planes follow one another in a row. The first plane's field is a multiple of 16
/// bytes; the others are multiples of 2 and are read as parts of u32 words.
pub fn planes(ty: GgmlType) -> Option<&'static [(usize, usize)]> {
    use GgmlType::*;
    Some(match ty {
        // f16 d; u8 qs[16]
        Q4_0 => &[(2, 16), (0, 2)],
        // f16 d, m; u8 qs[16]
        Q4_1 => &[(4, 16), (0, 4)],
        // f16 d; u8 qh[4]; u8 qs[16]
        Q5_0 => &[(6, 16), (2, 4), (0, 2)],
        // f16 d, m; u8 qh[4]; u8 qs[16]
        Q5_1 => &[(8, 16), (4, 4), (0, 4)],
        // f16 d; i8 qs[32]
        Q8_0 => &[(2, 32), (0, 2)],
        // u8 ql[128], qh[64]; i8 scales[16]; f16 d
        Q6_K => &[(0, 208), (208, 2)],
        _ => return None,
    })
}

/// Bytes of one row of `n_cols` elements on the GPU, None if the row is not whole
/// blocks.
pub fn row_bytes(ty: GgmlType, n_cols: u64) -> Option<u64> {
    let file = ty.row_bytes(n_cols)?;
    Some(match planes(ty) {
        Some(_) => file.next_multiple_of(16),
        None => file,
    })
}

/// Writes one file row `src` in the GPU layout into `dst` (`row_bytes` long; padding
/// is left as it is, zero in a fresh buffer).
pub fn write_row(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let Some(planes) = planes(ty) else {
        dst[..src.len()].copy_from_slice(src);
        return;
    };
    let block = ty.type_size();
    let n_blocks = src.len() / block;
    let mut at = 0;
    for &(off, len) in planes {
        let plane = &mut dst[at..at + n_blocks * len];
        // Field sizes as constants, so each field is a fixed-size move rather than a
        // memcpy call (the reordering then costs little next to the copy itself).
        match len {
            2 => gather::<2>(src, plane, off, block),
            4 => gather::<4>(src, plane, off, block),
            16 => gather::<16>(src, plane, off, block),
            32 => gather::<32>(src, plane, off, block),
            _ => {
                for (b, out) in plane.chunks_exact_mut(len).enumerate() {
                    out.copy_from_slice(&src[b * block + off..b * block + off + len]);
                }
            }
        }
        at += n_blocks * len;
    }
    if ty == GgmlType::Q8_0 {
        // i8 q as the u8 q + 128: its top bit flipped.
        for q in &mut dst[..n_blocks * 32] {
            *q ^= 0x80;
        }
    }
}

/// Field `off .. off + N` of every `block`-byte block of `src`, one after another.
fn gather<const N: usize>(src: &[u8], plane: &mut [u8], off: usize, block: usize) {
    for (blk, out) in src.chunks_exact(block).zip(plane.chunks_exact_mut(N)) {
        out.copy_from_slice(&blk[off..off + N]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each planar type's planes cover its block exactly once, and the first is
    /// 16-byte sized so the quants stay aligned.
    #[test]
    fn planes_partition_the_block() {
        for ty in GgmlType::ALL {
            let Some(planes) = planes(ty) else { continue };
            let block = ty.type_size();
            let mut seen = vec![0u8; block];
            for &(off, len) in planes {
                for s in &mut seen[off..off + len] {
                    *s += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{ty}: {seen:?}");
            assert_eq!(planes[0].1 % 16, 0, "{ty}");
        }
    }

    /// A row written planar holds every byte of the file row, each plane in order.
    #[test]
    fn write_row_moves_every_byte() {
        let ty = GgmlType::Q5_0;
        let n_cols = 96; // 3 blocks of 22 bytes
        let src: Vec<u8> = (0..66).collect();
        let n = row_bytes(ty, n_cols).unwrap() as usize;
        assert_eq!(n, 80);
        let mut dst = vec![0xaa; n];
        write_row(ty, &src, &mut dst);
        let qs: Vec<u8> = [6u8, 28, 50].iter().flat_map(|&b| b..b + 16).collect();
        assert_eq!(&dst[..48], &qs[..]);
        assert_eq!(&dst[48..60], &[2, 3, 4, 5, 24, 25, 26, 27, 46, 47, 48, 49]);
        assert_eq!(&dst[60..66], &[0, 1, 22, 23, 44, 45]);
        assert!(dst[66..].iter().all(|&b| b == 0xaa));
    }

    /// Q8_0's quants go first, each i8 as the u8 q + 128; its scales keep their bytes.
    #[test]
    fn q8_0_quants_are_offset() {
        let ty = GgmlType::Q8_0;
        // Two blocks: d = [1, 2] and [3, 4]; quants -128, -1, 0, 1, 127 and on.
        let quant = |b: usize, j: usize| [-128i8, -1, 0, 1, 127][(b + j) % 5];
        let mut src = Vec::new();
        for b in 0..2 {
            src.extend([1 + 2 * b as u8, 2 + 2 * b as u8]);
            src.extend((0..32).map(|j| quant(b, j) as u8));
        }
        let mut dst = vec![0; row_bytes(ty, 64).unwrap() as usize];
        write_row(ty, &src, &mut dst);
        for b in 0..2 {
            for j in 0..32 {
                assert_eq!(
                    dst[b * 32 + j] as i32 - 128,
                    quant(b, j) as i32,
                    "block {b} quant {j}"
                );
            }
        }
        assert_eq!(&dst[64..68], &[1, 2, 3, 4]);
    }
}
