//! How a plan is cut into chains: of the caps on a run's length, the one that spares
//! most dispatches for the least WGSL to compile.

use super::*;

/// A way to cut a plan into chains: its runs, once a cap on their length has cut them
/// and the builds that do not repay their compilation are left out ([`Shape::of`]),
/// the dispatches they spare a single token, and the WGSL their distinct builds
/// compile.
///
/// Each distinct build is a pipeline to compile, and lavapipe takes 0.2-0.4 s of a
/// core for one of Gemma 3's, about twice what its members take apart; meanwhile the
/// first single tokens run without chains, on the cores the compiler shares
/// (docs/perf.md). Gemma 3's mix of weight types made the longest runs six builds (2.1
/// s) where runs of six members need two that repay (0.5 s), and spare 90 dispatches a
/// token against 108.
pub(super) struct Shape {
    /// The runs, each with its build's key ([`build_key`]).
    runs: Vec<(Run, String)>,
    saved: usize,
    source_bytes: usize,
}

/// WGSL a build may compile per dispatch it spares a single token, its members'
/// sources counted: it must repay its compilation within a few hundred tokens. On
/// lavapipe a chain takes about 2 us of a core per byte of its members' WGSL (twice
/// what they take apart: 0.23 s for Gemma 3's layer of 115 KB) and a dispatch it spares
/// saves about 30 us a token (Gemma 3's chains sparing 108 dispatches saved 4.7 ms a
/// token), so 4 KiB a dispatch repays within about 270 tokens. It leaves out
/// SmolLM2's last layer (3 dispatches, 110 KB) and Gemma 3's Q/K/V pairs (9 dispatches,
/// 76 KB, 1% of a token).
const SOURCE_PER_SPARED: usize = 4096;

/// For each of the runs whose builds are `keys` and which spare `spared` dispatches
/// each, whether its build repays its compilation ([`SOURCE_PER_SPARED`]): all the
/// dispatches its runs spare against its members' `source` bytes.
fn repaid(keys: &[String], spared: &[usize], source: &[usize]) -> Vec<bool> {
    let mut by_build: HashMap<&str, (usize, usize)> = HashMap::new();
    for ((k, &n), &bytes) in keys.iter().zip(spared).zip(source) {
        let e = by_build.entry(k.as_str()).or_insert((0, bytes));
        e.0 += n;
    }
    keys.iter()
        .map(|k| {
            let (n, bytes) = by_build[k.as_str()];
            n * SOURCE_PER_SPARED >= bytes
        })
        .collect()
}

/// Of the caps, the one whose builds compile the least WGSL among those that spare at
/// least this share of the most dispatches any cap spares.
const SAVED_SHARE: (usize, usize) = (9, 10);

impl Shape {
    /// The runs of `plan` with at most `cap` members, less those whose builds do not
    /// repay their compilation ([`SOURCE_PER_SPARED`]); none where fewer than two are
    /// left.
    fn of(ctx: &GpuContext, plan: &[Dispatch], cap: usize) -> Shape {
        let all = runs(ctx, plan, cap);
        let members: Vec<Vec<&Arc<Deferred>>> = all.iter().map(|r| run_members(plan, r)).collect();
        let keys: Vec<String> = members.iter().map(|m| build_key(m)).collect();
        let spared: Vec<usize> = all.iter().map(|r| r.members.len() - 1).collect();
        let source: Vec<usize> = members
            .iter()
            .map(|m| m.iter().map(|d| d.source().len()).sum())
            .collect();
        let repays = repaid(&keys, &spared, &source);
        let mut shape = Shape::none();
        let mut counted = std::collections::HashSet::new();
        for (i, r) in all.into_iter().enumerate().filter(|&(i, _)| repays[i]) {
            if counted.insert(keys[i].as_str()) {
                shape.source_bytes += source[i];
            }
            shape.saved += spared[i];
            shape.runs.push((r, keys[i].clone()));
        }
        match shape.runs.len() {
            0 | 1 => Shape::none(),
            _ => shape,
        }
    }

    /// No chains.
    fn none() -> Shape {
        Shape {
            runs: Vec::new(),
            saved: 0,
            source_bytes: 0,
        }
    }

    /// The runs to build chains from: of every cap's shape, among those that spare at
    /// least [`SAVED_SHARE`] of the most dispatches, the one with the least WGSL to
    /// compile (the one sparing more where two tie); each run with its build's key.
    pub(super) fn choose(ctx: &GpuContext, plan: &[Dispatch]) -> Vec<(Run, String)> {
        let shapes: Vec<Shape> = (2..=MAX_PHASES)
            .map(|cap| Shape::of(ctx, plan, cap))
            .collect();
        Shape::pick(shapes).runs
    }

    /// [`Shape::choose`]'s pick among `shapes`.
    fn pick(shapes: Vec<Shape>) -> Shape {
        let most = shapes.iter().map(|s| s.saved).max().unwrap_or(0);
        let (num, den) = SAVED_SHARE;
        shapes
            .into_iter()
            .filter(|s| s.saved > 0 && s.saved * den >= most * num)
            .min_by_key(|s| (s.source_bytes, std::cmp::Reverse(s.saved)))
            .unwrap_or_else(Shape::none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_that_spare_too_little_for_their_source_are_left_out() {
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        // SmolLM2: 29 layers alike (4 dispatches each, 152 KB) and a last one apart (3,
        // 110 KB).
        let mut smollm2 = vec!["layer"; 29];
        smollm2.push("last");
        let mut spared = vec![4; 29];
        spared.push(3);
        let mut source = vec![152_000; 29];
        source.push(110_000);
        let kept = repaid(&keys(&smollm2), &spared, &source);
        assert!(kept[..29].iter().all(|&k| k));
        assert!(!kept[29]);
        // Gemma 3: two layer builds of 9 runs (5 dispatches each, 115 KB) kept, the
        // Q/K/V pairs (9 runs of 1, 76 KB) not.
        let gemma = [vec!["q4"; 9], vec!["q6"; 9], vec!["qkv"; 9]].concat();
        let spared = [vec![5; 18], vec![1; 9]].concat();
        let source = [vec![115_000; 18], vec![76_000; 9]].concat();
        let kept = repaid(&keys(&gemma), &spared, &source);
        assert!(kept[..18].iter().all(|&k| k));
        assert!(kept[18..].iter().all(|&k| !k));
        // At the bound, kept.
        assert_eq!(
            repaid(&keys(&["a", "a"]), &[2, 2], &[4 * SOURCE_PER_SPARED; 2]),
            [true, true]
        );
        assert_eq!(
            repaid(&keys(&["a", "a"]), &[2, 2], &[4 * SOURCE_PER_SPARED + 1; 2]),
            [false, false]
        );
    }

    #[test]
    fn the_shape_compiling_least_among_those_sparing_nearly_the_most_is_chosen() {
        let shape = |saved, source_bytes| Shape {
            runs: Vec::new(),
            saved,
            source_bytes,
        };
        // Three caps as Gemma 3's: the longest spares fewer once the builds that do
        // not repay are left out; the shortest compiles less but spares under nine
        // tenths of the middle one's.
        let picked = Shape::pick(vec![
            shape(81, 267_697),
            shape(99, 304_695),
            shape(60, 304_695),
        ]);
        assert_eq!((picked.saved, picked.source_bytes), (99, 304_695));
        // Within the share, less to compile wins; where that ties, more spared.
        let picked = Shape::pick(vec![shape(100, 300), shape(91, 200), shape(95, 200)]);
        assert_eq!((picked.saved, picked.source_bytes), (95, 200));
        // Nothing spared: no chains.
        assert_eq!(Shape::pick(vec![shape(0, 0), shape(0, 0)]).saved, 0);
    }
}
