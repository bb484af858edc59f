// The weight binding of the quantized kernels and the two ways the decoders read it:
// `wu(i)`, the i-th u32, and `wq(i)`, the i-th aligned vec4<u32> (16 bytes). The same
// buffer is bound twice, as u32s and as vec4s (NIR lowers a dynamically indexed
// component of a vec4 element to a load of the whole vec4, so one binding cannot serve
// both). CPU-hosted drivers (lavapipe) run every storage load as a loop over the lanes,
// so one vec4 load costs far less than four u32 loads there (`wgllm-bench peak`:
// 13 GB/s against 5.7); GPUs see the same bytes either way.
// The kernels are laid out with both bindings (`ops::mul_mat::weight_layout`) whichever
// ones a decoder uses.

@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(5) var<storage, read> wv: array<vec4<u32>>;

fn wu(i: u32) -> u32 {
    return w[i];
}

fn wq(i: u32) -> vec4<u32> {
    return wv[i];
}
