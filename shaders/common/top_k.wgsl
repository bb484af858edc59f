// What the three passes of top-k sampling on the device share (`ops::top_k`): their
// parameters, and the order they rank logits in.

struct Params {
    n: u32,     // logits
    span: u32,  // logits per span: span g is g * span .. (g + 1) * span
    spans: u32, // spans, at most MAX_SPANS
    cap: u32,   // candidate slots in `found`
}

// What a step wants, written by the host before it: the floor is the k-th largest
// span maximum, and the logits of the `n_listed` tokens `ids` (those a penalty
// changes) come back whatever their rank.
struct Want {
    k: u32,
    n_listed: u32,
    _pad0: u32,
    _pad1: u32,
    ids: array<u32, MAX_LISTED>,
}

// The pass that picks the floor holds every span's maximum in one workgroup.
const MAX_SPANS: u32 = 256u;
const MAX_LISTED: u32 = 64u;

// The candidate list (`topk_floor` empties it and sets its floor, `topk_gather` fills
// it): its count, which goes on past `cap` when the list is full; its floor; the
// listed tokens' keys; then the (key, id) pairs.
struct Found {
    count: atomic<u32>,
    floor: u32,
    _pad0: u32,
    _pad1: u32,
    listed: array<u32, MAX_LISTED>,
    pairs: array<vec2<u32>>,
}

// A logit's bits as a key in the host's order (`sampling`'s sanitised logits compared
// with `f32::total_cmp`): NaN ranks as -inf, +inf as the largest finite float, -0
// below +0. Larger logits give larger keys. The smallest key a logit can have is
// -inf's, 0x007fffff, so the key 0 is below every logit. The logits are bound as
// words, so no float operation (a denormal flush, a NaN rewritten) touches them.
fn order_key(bits: u32) -> u32 {
    var b = bits;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        b = 0xff800000u; // NaN: -inf
    }
    if (b == 0x7f800000u) {
        b = 0x7f7fffffu; // +inf: the largest finite float
    }
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
