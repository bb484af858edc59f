// `wgllm-bench sync`: what it costs to order a chain of small dependent steps, as
// separate dispatches against phases of one dispatch that wait for each other.
//
// A step ("phase" k) has `items` items of 8 lanes. Item i of phase k reads what item
// i + 1 of phase k - 1 wrote (one half of `vals`) and writes k + 1 into the other half:
// every phase depends on the whole of the one before, as a layer's ops do. A lane that
// reads anything but k counts an error, so an ordering that lets a phase start early
// shows.
//
// `one_phase` is one phase per dispatch, its k at a dynamic offset of the uniform.
// `grid` runs every phase in one dispatch of any number of workgroups. Its protocol
// needs no workgroup to be running beside another:
// - items are claimed from a counter per phase, by whichever workgroups are there;
// - before claiming, a workgroup waits until every item of the phase before is done,
//   and leaves the dispatch if its reads of the counter run out first;
// - the workgroup that finishes a phase's last item never waits at the next, so some
//   workgroup always carries the chain to its end, whatever the driver runs at once.
// The reads are a budget for the whole dispatch (`p.spin`), not per wait: llvmpipe
// allows a workgroup 65535 loop trips in all, its loops and waits together, and ends
// every loop after its first trip once they are spent, silently (its loop limiter), so
// the host leaves the work's own trips out of the budget it gives.
//
// The counters' atomics are read by adding 0: a read-modify-write, which no compiler
// moves the phase's loads above.

struct Params {
    k: u32,
    items: u32,
    spin: u32,
    phases: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> vals: array<f32>;
// [0] errors, [1] workgroups that gave up waiting, then per phase k its claim counter
// at 2 + 2 k and its done counter after it.
@group(0) @binding(2) var<storage, read_write> sync: array<atomic<u32>>;

var<workgroup> shared_u: u32;
// Lane 0's reads of done counters left to the workgroup (`p.spin` at the start).
var<private> spins_left: u32;

// Item i of phase k, lane l.
fn item(k: u32, i: u32, l: u32) {
    let n = p.items * 8u;
    let src = (k & 1u) * n;
    let dst = n - src;
    let v = vals[src + ((i + 1u) % p.items) * 8u + l];
    if (v != f32(k)) {
        atomicAdd(&sync[0], 1u);
    }
    vals[dst + i * 8u + l] = f32(k + 1u);
}

@compute @workgroup_size(8)
fn one_phase(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    item(p.k, wid.x, l);
}

// Lane 0's `v`, for the whole workgroup.
fn from_lane0(v: u32, l: u32) -> u32 {
    if (l == 0u) {
        shared_u = v;
    }
    return workgroupUniformLoad(&shared_u);
}

// Phase k of the grid build for one workgroup: false where it gave up waiting.
fn phase(k: u32, l: u32) -> bool {
    let claim = 2u + 2u * k;
    var seen = p.items;
    if (k > 0u && l == 0u) {
        seen = atomicAdd(&sync[claim - 1u], 0u);
        for (; spins_left > 0u && seen < p.items; spins_left--) {
            seen = atomicAdd(&sync[claim - 1u], 0u);
        }
    }
    if (from_lane0(seen, l) < p.items) {
        if (l == 0u) {
            atomicAdd(&sync[1], 1u);
        }
        return false;
    }
    loop {
        var c = 0u;
        if (l == 0u) {
            c = atomicAdd(&sync[claim], 1u);
        }
        let i = from_lane0(c, l);
        if (i >= p.items) {
            break;
        }
        item(k, i, l);
        // Every lane's write lands before lane 0 counts the item done.
        storageBarrier();
        if (l == 0u) {
            atomicAdd(&sync[claim + 1u], 1u);
        }
    }
    return true;
}

@compute @workgroup_size(8)
fn grid(@builtin(local_invocation_index) l: u32) {
    spins_left = p.spin;
    for (var k = 0u; k < p.phases; k++) {
        if (!phase(k, l)) {
            return;
        }
    }
}
