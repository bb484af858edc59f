// Byte-addressed reads from a weight buffer bound as `w: array<u32>`.
// GGUF blocks are not word aligned (Q4_0 is 18 bytes, Q8_0 34), so a block's fields can
// straddle words; these helpers reassemble them. A read of the word after the last one
// is clamped by the robust-access rules and its bits are discarded.

fn w_u32(byte: u32) -> u32 {
    let i = byte >> 2u;
    let s = (byte & 3u) * 8u;
    if (s == 0u) {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

fn w_u16(byte: u32) -> u32 {
    return w_u32(byte) & 0xffffu;
}

fn w_f16(byte: u32) -> f32 {
    return unpack2x16float(w_u16(byte)).x;
}

// Four signed bytes of `v` as floats.
fn i8x4(v: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(v));
}

// Four unsigned bytes of `v` as floats.
fn u8x4(v: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(v));
}

// Low and high nibbles of the four bytes of `v`.
fn lo4(v: u32) -> vec4<f32> {
    return u8x4(v & 0x0f0f0f0fu);
}
fn hi4(v: u32) -> vec4<f32> {
    return u8x4((v >> 4u) & 0x0f0f0f0fu);
}
