// Byte-addressed reads from a weight buffer bound as `w: array<u32>`.
// GGUF blocks are not word aligned (Q4_0 is 18 bytes, Q8_0 34), so a block's fields can
// straddle words; these helpers reassemble them. A read of the word after the last one
// is clamped by the robust-access rules and its bits are discarded.

fn w_u32(byte: u32) -> u32 {
    let i = byte >> 2u;
    let s = (byte & 3u) * 8u;
    if (s == 0u) {
        return wu(i);
    }
    return (wu(i) >> s) | (wu(i + 1u) << (32u - s));
}

// The f16 at an even byte (every GGUF block and every f16 field in one starts on an
// even byte, so it never straddles words): one load.
fn w_f16(byte: u32) -> f32 {
    return unpack2x16float(wu(byte >> 2u) >> ((byte & 2u) * 8u)).x;
}

// Consecutive u32 from byte offset `byte` with one aligned load per word plus one,
// joined without a branch (a shift by 32 is a shift by 0 in WGSL, hence the select).
// Straddling fields cost two loads each through `w_u32`; a run of N costs N + 1.
fn w_join(a: u32, b: u32, s: u32) -> u32 {
    return select((a >> s) | (b << (32u - s)), a, s == 0u);
}

fn w_u32x4(byte: u32) -> array<u32, 4> {
    let i = byte >> 2u;
    let s = (byte & 3u) * 8u;
    let a0 = wu(i);
    let a1 = wu(i + 1u);
    let a2 = wu(i + 2u);
    let a3 = wu(i + 3u);
    let a4 = wu(i + 4u);
    return array<u32, 4>(w_join(a0, a1, s), w_join(a1, a2, s), w_join(a2, a3, s), w_join(a3, a4, s));
}

fn w_u32x5(byte: u32) -> array<u32, 5> {
    let i = byte >> 2u;
    let s = (byte & 3u) * 8u;
    let a0 = wu(i);
    let a1 = wu(i + 1u);
    let a2 = wu(i + 2u);
    let a3 = wu(i + 3u);
    let a4 = wu(i + 4u);
    let a5 = wu(i + 5u);
    return array<u32, 5>(
        w_join(a0, a1, s), w_join(a1, a2, s), w_join(a2, a3, s), w_join(a3, a4, s), w_join(a4, a5, s),
    );
}

fn w_u32x8(byte: u32) -> array<u32, 8> {
    let i = byte >> 2u;
    let s = (byte & 3u) * 8u;
    var o: array<u32, 8>;
    var a = wu(i);
    for (var k = 0u; k < 8u; k++) {
        let b = wu(i + k + 1u);
        o[k] = w_join(a, b, s);
        a = b;
    }
    return o;
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

// Bits j .. j + 3 of `qh` as bit 4 of four bytes (the fifth bits of Q5_0 / Q5_1
// quants). The product puts copies of the four bits 7 apart, so that bit i lands on
// bit 8 i, and no two copies overlap: one multiply instead of four shifts and a convert
// per element.
fn bit4x4(qh: u32, j: u32) -> u32 {
    return ((((qh >> j) & 0xfu) * 0x00204081u) & 0x01010101u) << 4u;
}

// Five-bit quants: the low or high nibbles of the four bytes of `v`, with the fifth
// bits j .. j + 3 of `qh`.
fn q5_lo(v: u32, qh: u32, j: u32) -> vec4<f32> {
    return u8x4((v & 0x0f0f0f0fu) | bit4x4(qh, j));
}
fn q5_hi(v: u32, qh: u32, j: u32) -> vec4<f32> {
    return u8x4(((v >> 4u) & 0x0f0f0f0fu) | bit4x4(qh, j));
}

// Fields read where they sit ("in place"), for the products' dots (`wdot32_pre`,
// `wdot64_pre`). A field masked in its word is the field times two to the power of its
// lowest bit, an integer exact in f32 (at most 8 significant bits); dotted with
// activations divided by those powers beforehand (`x_pre`, once per chunk of
// activations a kernel loads, not once per row), each product is the field's times its
// activation exactly, and the sums are bit for bit those of extracted fields. A mask
// is one operation per field where extracting a field takes two or three (shift, mask,
// sign extension), and the unpacking is most of a single token's arithmetic on
// CPU-hosted drivers (docs/perf.md). A field that reaches bit 31 is shifted down to
// bit 0 instead (in place it would read as negative), its power then 1.

// The four bytes of `v` in place (factors `PLACE_BYTES`).
fn bytes_placed(v: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(vec4<u32>(v & 0xffu, v & 0xff00u, v & 0xff0000u, v >> 24u)));
}
const PLACE_BYTES = vec4<f32>(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0);

// Low nibbles of the four bytes of `v` in place (factors `PLACE_LO4`) and high ones
// (`PLACE_HI4`).
fn lo4_placed(v: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(vec4<u32>(v & 0xfu, v & 0xf00u, v & 0xf0000u, v & 0xf000000u)));
}
fn hi4_placed(v: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(vec4<u32>(v & 0xf0u, v & 0xf000u, v & 0xf00000u, v >> 28u)));
}
const PLACE_LO4 = vec4<f32>(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0);
const PLACE_HI4 = vec4<f32>(1.0 / 16.0, 1.0 / 4096.0, 1.0 / 1048576.0, 1.0);

// The eight vec4s of a chunk of activations times `f` (`x_pre` for types whose fields
// sit alike in every word).
fn x_times(xc: array<vec4<f32>, 8>, f: vec4<f32>) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        xc[0] * f, xc[1] * f, xc[2] * f, xc[3] * f, xc[4] * f, xc[5] * f, xc[6] * f, xc[7] * f,
    );
}

// `x_pre` of Q4_0 and Q4_1, whose chunk is 16 bytes: elements 0 .. 15 their low
// nibbles, 16 .. 31 their high ones.
fn nibbles_pre(xc: array<vec4<f32>, 8>) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        xc[0] * PLACE_LO4, xc[1] * PLACE_LO4, xc[2] * PLACE_LO4, xc[3] * PLACE_LO4,
        xc[4] * PLACE_HI4, xc[5] * PLACE_HI4, xc[6] * PLACE_HI4, xc[7] * PLACE_HI4,
    );
}

// sum_j q_j x_j over a chunk of Q4_0 or Q4_1: its 16 bytes of nibbles `q` read in
// place, the activations from `nibbles_pre`.
fn nibbles_dot(q: vec4<u32>, xp: array<vec4<f32>, 8>) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        s += dot(lo4_placed(q[k]), xp[k]) + dot(hi4_placed(q[k]), xp[k + 4u]);
    }
    return s;
}

// sum_j q_j x_j over a chunk of Q5_0 or Q5_1: nibbles `q` and fifth bits `qh` joined
// in their bytes (`q5_lo`, `q5_hi`) and read in place, the activations times
// `PLACE_BYTES`.
fn q5_dot(q: vec4<u32>, qh: u32, xp: array<vec4<f32>, 8>) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        s += dot(bytes_placed((q[k] & 0x0f0f0f0fu) | bit4x4(qh, 4u * k)), xp[k]);
        s += dot(bytes_placed(((q[k] >> 4u) & 0x0f0f0f0fu) | bit4x4(qh, 16u + 4u * k)), xp[k + 4u]);
    }
    return s;
}

// The 8 words of the two aligned vec4s from vec4 index `i` (16-byte aligned fields).
fn wq8(i: u32) -> array<u32, 8> {
    let a = wq(i);
    let b = wq(i + 1u);
    return array<u32, 8>(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
}

// Planar rows (src/gpu/layout.rs): a row of the types whose blocks are not a multiple of
// 16 bytes holds the quants of all its blocks first, then each smaller field of all its
// blocks in turn. `plane(row_byte, n)` is the byte where the fields after the first
// `n` bytes of every block begin, for blocks of `block` elements.
fn plane(row_byte: u32, block: u32, n: u32) -> u32 {
    return row_byte + (p.n_cols / block) * n;
}

// The words of the aligned vec4s (texels) t .. t + texels - 1, at most three, in
// order; the words past them are 0. `texels` is a constant where the kernels call it,
// so the compiler drops the fetches past it.
fn texel_words(t: u32, texels: u32) -> array<u32, 12> {
    let x = wq(t);
    var y = vec4<u32>();
    var z = vec4<u32>();
    if (texels > 1u) {
        y = wq(t + 1u);
    }
    if (texels > 2u) {
        z = wq(t + 2u);
    }
    return array<u32, 12>(x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w, z.x, z.y, z.z, z.w);
}

// A lane's run of consecutive chunks' small fields (scales, fifth bits), read once per
// row (the walk `fields` in ops/mul_mat_ks1.wgsl) where reading each chunk's field fetches a
// whole aligned vec4 (a texel) for it. The words of the plane from the one holding byte
// `b` on: word j of the result is the word at byte (b & ~3) + 4 j. A run of `slots`
// fields of `n` bytes (2 or 4) from `b`, a multiple of n, lies in the two aligned
// vec4s from the one holding `b`, or in three where it starts 12 bytes into the first
// and reaches past 32 (n = 4, six slots).
fn run_words(b: u32, n: u32, slots: u32) -> array<u32, 8> {
    let c = texel_words(b >> 4u, select(2u, 3u, 16u - n + n * slots > 32u));
    // Shifted down by the word's index in the first vec4 (0 .. 3), in two steps of
    // selects with indices the compiler sees: llvmpipe indexes a private array by a
    // lane's own index one lane at a time.
    let one = (b & 4u) != 0u;
    let two = (b & 8u) != 0u;
    var o: array<u32, 8>;
    for (var j = 0u; j < 8u; j++) {
        o[j] = select(select(c[j], c[j + 1u], one), select(c[j + 2u], c[j + 3u], one), two);
    }
    return o;
}

// Field k of a run of 2-byte fields from byte `b` (`run_words(b, 2, ..)` is `w`), in
// the low half of the result: half (b / 2 + k) % 2 of word (b % 4 / 2 + k) / 2.
fn run_half(w: array<u32, 8>, b: u32, k: u32) -> u32 {
    let odd = (b & 2u) != 0u;
    let word = select(w[k / 2u], w[(k + 1u) / 2u], odd);
    return word >> (((k + u32(odd)) & 1u) * 16u);
}
