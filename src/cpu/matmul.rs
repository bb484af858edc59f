//! Quantized matrix times activations on the CPU, on the weight blocks where they lie
//! in the file map. The activations are quantized once per op to the weight type's
//! partner format ([`ActType`]), then every output is an integer block dot product.
//! Rows are handed out to the pool's threads in chunks; within a chunk each weight row
//! is read once and multiplied with every token's activations while it sits in L1, so
//! a batch costs one pass over the weights.

use super::act::{quantize_rows, ActType};
use super::dot::{kernel, Isa};
use super::pool::{Pool, SharedMut};
#[cfg(target_arch = "x86_64")]
use super::tile::{self, Flavor, Out, Plan, TileFn};
#[cfg(target_arch = "x86_64")]
use crate::ops::glu::Activation;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// A weight matrix borrowed in place: `n_rows` rows of `n_cols` values of type `ty`.
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    /// [n_cols, n_rows] in ggml order: row r is `row_bytes` bytes at `r * row_bytes`.
    pub data: &'a [u8],
    pub n_cols: usize,
    pub n_rows: usize,
}

impl WeightView<'_> {
    pub fn row_bytes(&self) -> Result<usize> {
        let rb = self.ty.row_bytes(self.n_cols as u64).ok_or_else(|| {
            Error::invalid(format!(
                "{} rows of {} values are not whole blocks",
                self.ty, self.n_cols
            ))
        })?;
        usize::try_from(rb).map_err(|_| Error::invalid("row size overflows"))
    }
}

/// y[t * n_rows + r] = W[r] . x[t * n_cols ..] for `n_tokens` tokens; x: [n_cols, n_tokens],
/// y: [n_rows, n_tokens]. `qbuf` holds the quantized activations (kept to reuse its
/// allocation).
pub fn mul_mat(
    pool: &Pool,
    isa: Isa,
    w: &WeightView<'_>,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    qbuf: &mut Vec<u8>,
) -> Result<()> {
    let at = ActType::for_weight(w.ty)?;
    let xs = x
        .get(..w.n_cols * n_tokens)
        .ok_or_else(|| Error::invalid("mul_mat: activations shorter than the batch"))?;
    quantize_rows(at, xs, w.n_cols, qbuf)?;
    mul_mat_quantized(pool, isa, w, qbuf, n_tokens, y)
}

/// [`mul_mat`] with activations already quantized by [`quantize_rows`] for `w.ty`.
pub fn mul_mat_quantized(
    pool: &Pool,
    isa: Isa,
    w: &WeightView<'_>,
    a: &[u8],
    n_tokens: usize,
    y: &mut [f32],
) -> Result<()> {
    let at = ActType::for_weight(w.ty)?;
    let rb = w.row_bytes()?;
    let arb = at.row_bytes(w.n_cols);
    let need_w = rb.checked_mul(w.n_rows);
    if need_w.is_none_or(|n| w.data.len() < n) {
        return Err(Error::invalid(format!(
            "mul_mat: {} bytes of {} hold fewer than {} rows of {}",
            w.data.len(),
            w.ty,
            w.n_rows,
            w.n_cols
        )));
    }
    if a.len() < arb * n_tokens || y.len() < w.n_rows * n_tokens {
        return Err(Error::invalid(format!(
            "mul_mat: buffers too small for {n_tokens} tokens of {} x {}",
            w.n_cols, w.n_rows
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if tile_kernel(w.ty, isa, n_tokens).is_some() {
        return PLAN.with(|p| {
            let mut p = p.borrow_mut();
            p.build(at, a, w.n_cols, n_tokens)?;
            mul_mat_tiled(pool, isa, w, &p, y)
        });
    }
    let dot = kernel(w.ty, isa)?;
    let n_rows = w.n_rows;
    let out = SharedMut::new(y);
    let rows = |rows: std::ops::Range<usize>| {
        for r in rows {
            let wr = &w.data[r * rb..(r + 1) * rb];
            for (t, ar) in a.chunks_exact(arb).take(n_tokens).enumerate() {
                // SAFETY: row r belongs to this chunk only, so index t * n_rows + r is
                // written by this thread alone.
                unsafe { out.write(t * n_rows + r, dot(wr, ar)) };
            }
        }
    };
    if n_tokens == 1 {
        token_rows(pool, &[(n_rows, rb)], 4, &|_, r| rows(r));
    } else {
        // Chunks small enough that threads finishing early find more work, large
        // enough that the counter is not contended.
        let chunk = (n_rows / (pool.n_threads() * 8)).clamp(4, 64);
        pool.run_items(n_rows.div_ceil(chunk), &|_, c| {
            rows(c * chunk..((c + 1) * chunk).min(n_rows))
        });
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The plan [`mul_mat_quantized`] rearranges activations into, kept for its memory.
    static PLAN: std::cell::RefCell<Plan> = std::cell::RefCell::new(Plan::default());
}

/// The tile kernel `isa` has for weights of `ty` and a batch of `n_tokens`, if any.
#[cfg(target_arch = "x86_64")]
pub fn tile_kernel(ty: GgmlType, isa: Isa, n_tokens: usize) -> Option<TileFn> {
    let flavor = match isa {
        Isa::Scalar | Isa::Neon | Isa::NeonDot => return None,
        Isa::Avx2 => Flavor::Avx2,
        Isa::Avx512Vnni => Flavor::Vnni,
    };
    if !flavor.available() {
        return None;
    }
    tile::kernel(ty, flavor, n_tokens)
}

/// Runs `f(m, rows)` over the rows of a single token's products, matrix `m` having
/// `mats[m] = (n_rows, row bytes)`, in pieces of whole `unit`s of rows
/// ([`Pool::run_ranges`] over the matrices' units one after another, so that several
/// products of one input are one op). A single token streams the weights: each thread
/// reads one run of rows from the front, where the tile kernels' prefetches ahead land
/// on its next piece, and a thread that finishes first takes pieces from the back of
/// the other's run instead of waiting. Pieces hold at least [`TOKEN_PIECE_MIN`] bytes
/// of weights (a claim and a kernel call each) and at most [`TOKEN_PIECE_MAX`] (what
/// one thread may hold back from the others at the end).
///
/// Fixed chunks had to trade those against each other: each chunk started with loads
/// nobody had asked for ahead, and a thread that finished its chunks waited for the
/// other's last. Tiles in chunks of at most 96 rows ran Gemma 3's generation at 100
/// t/s, of 384 at 113, two chunks per thread at 123, four at 118; and with two, the
/// threads still waited on each other for 12% of SmolLM2's token. These ranges,
/// alternated token by token with two chunks per thread: SmolLM2 1.05x, Gemma 3
/// 1.04-1.18x (docs/perf.md).
fn token_rows(
    pool: &Pool,
    mats: &[(usize, usize)],
    unit: usize,
    f: &(dyn Fn(usize, std::ops::Range<usize>) + Sync),
) {
    // Each matrix's first unit in the joint numbering, and the end.
    let mut starts = Vec::with_capacity(mats.len() + 1);
    let (mut units, mut bytes) = (0, 0);
    for &(n_rows, rb) in mats {
        starts.push(units);
        units += n_rows.div_ceil(unit);
        bytes += n_rows * rb;
    }
    starts.push(units);
    let unit_bytes = (bytes / units.max(1)).max(1);
    pool.run_ranges(
        units,
        TOKEN_PIECE_MIN.div_ceil(unit_bytes),
        TOKEN_PIECE_MAX.div_ceil(unit_bytes),
        &|piece| {
            for (m, &(n_rows, _)) in mats.iter().enumerate() {
                let (a, b) = (piece.start.max(starts[m]), piece.end.min(starts[m + 1]));
                if a < b {
                    let first = (a - starts[m]) * unit;
                    f(m, first..((b - starts[m]) * unit).min(n_rows));
                }
            }
        },
    );
}

/// Bytes of weights a piece of a single token's rows holds at least, and at most
/// ([`token_rows`]); at least 1, 4 or 64 KiB, at most 128 KiB or 2 MiB measured alike.
const TOKEN_PIECE_MIN: usize = 16 << 10;
const TOKEN_PIECE_MAX: usize = 512 << 10;

/// The tile kernel for `w` and `plan`, and `w`'s row bytes, once the plan is known to
/// fit the weights and `y` to hold the product.
#[cfg(target_arch = "x86_64")]
fn tiled_checks(isa: Isa, w: &WeightView<'_>, plan: &Plan, y: &[f32]) -> Result<(TileFn, usize)> {
    let tk = tile_kernel(w.ty, isa, plan.n_tokens())
        .ok_or_else(|| Error::Unsupported(format!("no {isa:?} tile kernel for {}", w.ty)))?;
    // The kernel reads the plan's fields of its activation type, for n_cols values.
    if plan.act() != Some(ActType::for_weight(w.ty)?) || plan.n_cols() != w.n_cols {
        return Err(Error::invalid(format!(
            "mul_mat: a plan of {:?} x {} for {} weights of {} columns",
            plan.act(),
            plan.n_cols(),
            w.ty,
            w.n_cols
        )));
    }
    let rb = w.row_bytes()?;
    let (n_rows, n_tokens) = (w.n_rows, plan.n_tokens());
    if rb.checked_mul(n_rows).is_none_or(|n| w.data.len() < n) || y.len() < n_rows * n_tokens {
        return Err(Error::invalid(format!(
            "mul_mat: buffers too small for {n_tokens} tokens of {} x {n_rows}",
            w.n_cols
        )));
    }
    Ok((tk, rb))
}

/// ys[i] = W_i x for several matrices and one plan of a single token, as one op
/// ([`token_rows`]): the layer's products of one input (Q, K and V; gate and up) then
/// cost one wake-up of the threads and one wait for the last of them, not one each.
#[cfg(target_arch = "x86_64")]
pub fn mul_mat_tiled_each(
    pool: &Pool,
    isa: Isa,
    ws: &[WeightView<'_>],
    plan: &Plan,
    ys: &mut [&mut [f32]],
) -> Result<()> {
    if plan.n_tokens() != 1 || ws.len() != ys.len() {
        return Err(Error::invalid(format!(
            "mul_mat: {} products for {} outputs of {} tokens, one op for single tokens only",
            ws.len(),
            ys.len(),
            plan.n_tokens()
        )));
    }
    let mut mats = Vec::with_capacity(ws.len());
    let mut kernels = Vec::with_capacity(ws.len());
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let (tk, rb) = tiled_checks(isa, w, plan, y)?;
        mats.push((w.n_rows, rb));
        kernels.push((tk, SharedMut::new(y)));
    }
    // Whole quads of rows ([`tile::token`]'s step), three to a unit.
    token_rows(pool, &mats, 12, &|m, rows| {
        let (tk, out) = &kernels[m];
        // SAFETY: `tiled_checks` found that matrix m holds its rows and its output
        // n_rows values; the piece's rows are this thread's alone, so are their outputs.
        unsafe { tile_rows(*tk, &ws[m], mats[m].1, plan, rows, out) };
    });
    Ok(())
}

/// Runs the tile kernel `tk` over `rows` of `w` (rows `rb` bytes apart) times `plan`'s
/// tokens, into `out` (`w.n_rows` values per token).
///
/// # Safety
/// `w` and `out` must be the sizes [`tiled_checks`] asks for, and no other thread may
/// write these rows' outputs meanwhile.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_rows(
    tk: TileFn,
    w: &WeightView<'_>,
    rb: usize,
    plan: &Plan,
    rows: std::ops::Range<usize>,
    out: &SharedMut<'_, f32>,
) {
    let out = Out {
        y: out.ptr(),
        ld: w.n_rows,
    };
    tk(w.data, rb, plan, rows, out)
}

/// out = act(W_gate x) * (W_up x) over a batch's blocked `plan` (`ws` the gate and up
/// matrices, of one shape, each with `isa`'s tile kernel): each chunk of rows runs both
/// products into buffers of its own, [token][row], and applies the activation from
/// there. The products' outputs never reach memory and no pass of their own reads them
/// back: gate and up were two thirds of what a layer's products wrote. Against the two
/// products and a separate activation, token by token: prompts of 512 SmolLM2
/// 1.04-1.07x, Gemma 3 1.01-1.05x. (A residual add applied the same way measured no
/// gain.)
#[cfg(target_arch = "x86_64")]
pub fn mul_mat_tiled_glu(
    pool: &Pool,
    isa: Isa,
    ws: [&WeightView<'_>; 2],
    plan: &Plan,
    out: &mut [f32],
    act: Activation,
) -> Result<()> {
    let n_rows = ws[0].n_rows;
    if !plan.blocked() || ws[1].n_rows != n_rows {
        return Err(Error::invalid(format!(
            "mul_mat_glu: gate and up of {} and {} rows, a plan of {} tokens{}",
            n_rows,
            ws[1].n_rows,
            plan.n_tokens(),
            if plan.blocked() { "" } else { " (not blocked)" }
        )));
    }
    let kernels = [
        tiled_checks(isa, ws[0], plan, out)?,
        tiled_checks(isa, ws[1], plan, out)?,
    ];
    let n_tokens = plan.n_tokens();
    let o = SharedMut::new(out);
    let chunk = blocked_chunk(n_rows, pool.n_threads());
    pool.run_items(n_rows.div_ceil(chunk), &|_, c| {
        let rows = c * chunk..((c + 1) * chunk).min(n_rows);
        let len = rows.len();
        let per = len * n_tokens;
        let mut buf = GLU_BUF.take();
        if buf.len() < 2 * per {
            buf.resize(2 * per, 0.0);
        }
        // SAFETY: `tiled_checks` found both matrices whole, so their chunks are; each
        // buffer holds the chunk's rows for every token, written as [token][row] (`ld`
        // the chunk's length); a chunk's outputs are this thread's alone.
        unsafe {
            for (k, (w, &(tk, rb))) in ws.iter().zip(&kernels).enumerate() {
                let part = &w.data[rows.start * rb..rows.end * rb];
                let y = buf.as_mut_ptr().add(k * per);
                tk(part, rb, plan, 0..len, Out { y, ld: len });
            }
            let (g, u) = buf.split_at(per);
            for t in 0..n_tokens {
                let dst = std::slice::from_raw_parts_mut(o.ptr().add(t * n_rows + rows.start), len);
                let at = t * len..(t + 1) * len;
                super::ops::glu_part(&g[at.clone()], &u[at], dst, act);
            }
        }
        GLU_BUF.set(buf);
    });
    Ok(())
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`mul_mat_tiled_glu`]'s buffers, kept for their memory.
    static GLU_BUF: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Rows per chunk of a blocked product: whole cache lines of outputs (16 rows), so that
/// two threads never write the same line (chunks of 12 rows put 8% of a deep prompt's
/// time in the outputs' copy), several chunks per thread.
#[cfg(target_arch = "x86_64")]
fn blocked_chunk(n_rows: usize, n_threads: usize) -> usize {
    (n_rows / (n_threads * 8)).clamp(16, 128) / 16 * 16
}

/// y = W x with the activations in `plan` (made from [`quantize_rows`] output for
/// `w.ty`), by `isa`'s tile kernel for `w.ty`; an error where there is none
/// ([`tile_kernel`]) or the plan does not fit the weights.
#[cfg(target_arch = "x86_64")]
pub fn mul_mat_tiled(
    pool: &Pool,
    isa: Isa,
    w: &WeightView<'_>,
    plan: &Plan,
    y: &mut [f32],
) -> Result<()> {
    if plan.n_tokens() == 1 {
        return mul_mat_tiled_each(pool, isa, std::slice::from_ref(w), plan, &mut [y]);
    }
    let (tk, rb) = tiled_checks(isa, w, plan, y)?;
    let n_rows = w.n_rows;
    let out = SharedMut::new(y);
    // SAFETY: `tiled_checks` found `w` and `y` the right sizes; a chunk's rows are this
    // thread's alone, so are their outputs.
    let rows = |rows| unsafe { tile_rows(tk, w, rb, plan, rows, &out) };
    // Chunks of whole tiles (of 2, 3 or 4 rows), several per thread: a thread the OS
    // pauses mid-chunk holds the op up for that chunk only, and early finishers find work.
    // Blocked batches write each token's outputs for the chunk's rows in one run.
    let nth = pool.n_threads();
    let chunk = if plan.blocked() {
        blocked_chunk(n_rows, nth)
    } else {
        (n_rows / (nth * 16)).clamp(12, 96) / 12 * 12
    };
    pool.run_items(n_rows.div_ceil(chunk), &|_, c| {
        rows(c * chunk..((c + 1) * chunk).min(n_rows))
    });
    Ok(())
}
