// Where a mul_mat kernel stores its rows: the first output, or for fused products
// (`Params.seg1` ..) the second and third (bindings 6 and 7).

@group(0) @binding(6) var<storage, read_write> y1: array<f32>;
@group(0) @binding(7) var<storage, read_write> y2: array<f32>;

// Whether the product may have a second and third output: false for plain products
// (`ops::mul_mat`, `Ks1::plain`), whose stores then leave the other two cases out. A
// CPU-hosted driver runs every side of a branch under lane masks, and each storage
// store walks the lanes one by one (docs/perf.md).
override FUSED: bool = true;

// Row r (of the whole tensor) of output token t.
fn store_out(t: u32, r: u32, v: f32) {
    if (!FUSED || r < p.seg1) {
        store_y(t * p.y_stride + r, v);
    } else if (r < p.seg2) {
        let i = t * (p.seg2 - p.seg1) + r - p.seg1;
        var s = v;
        for (var k = 0u; k < p.acc; k++) {
            s = y1[i] + v;
        }
        y1[i] = s;
    } else {
        let i = t * (p.seg_end - p.seg2) + r - p.seg2;
        var s = v;
        for (var k = 0u; k < p.acc; k++) {
            s = y2[i] + v;
        }
        y2[i] = s;
    }
}
