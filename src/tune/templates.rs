//! Hand schedules as starting points: kernels kiln has a hand schedule for, recognized by the
//! structure of their loops (not by name or hash), and the schedule's variants as steps.
//!
//! Today that is the matmul `C[i, j] = sum_k A[i, k] * B[k, j]`, in kiln's form (the init
//! beside the `k` loop, as [`crate::ir::kernels::matmul_sized`] writes it) or TVM's (the init
//! guarded in the first iteration of `k`, as `te.compute` with `te.sum` lowers, brought to
//! kiln's form by [`Schedule::decompose_reduction`]), under any loop and buffer names and loop
//! variable type. Its templates are [`crate::schedule::kernels::matmul_tiled_on`] with the
//! register tiles [`MatmulTiles::for_target_and_depth`] picks for the target and their
//! neighbours with `B` packed up front, the target's tiles with `B` packed by each parallel
//! task a pass of `k` at a time (`cache_read_panels`, a few column panels per task; for a
//! matmul of one or two row blocks, first of all, one task per thread), the first
//! three with `B` read in place, the first two with `A` packed into row panels as well
//! ([`PackA`]), and the first two with tiles half again as wide (4 x 24 for AVX2). They are
//! points of a [`TemplateSpace`], whose neighbours (one parameter changed) the search tries
//! after them.

use crate::ir::{BinOp, Buffer, DataType, Expr, Param, PrimFunc, Stmt, Var};
use crate::schedule::kernels::{
    depth_block, matmul_tiled_packing, MatmulParts, MatmulTiles, PackA, PackB,
};
use crate::schedule::{Schedule, Step};
use crate::target::Target;

/// A matmul recognized in a function: the steps that bring it to kiln's form, its loops and
/// buffers, and its shape `[m, n, k]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulMatch {
    /// Steps applied first (`decompose_reduction` for TVM's form).
    pub prefix: Vec<Step>,
    /// The loops and buffers.
    pub parts: MatmulParts,
    /// `[m, n, k]`.
    pub shape: [i64; 3],
}

fn const_range(min: &Expr, extent: &Expr) -> Option<i64> {
    (min.as_int()? == 0).then_some(())?;
    extent.as_int().filter(|&e| e >= 1)
}

fn is_var(e: &Expr, v: &Var) -> bool {
    matches!(e, Expr::Var(w) if w.id == v.id)
}

fn is_zero(e: &Expr) -> bool {
    match e {
        Expr::FloatImm { value, .. } => *value == 0.0,
        Expr::IntImm { value, .. } => *value == 0,
        _ => false,
    }
}

/// `buffer[x, y]` with `x`, `y` the loop variables given.
fn load_of<'e>(e: &'e Expr, x: &Var, y: &Var) -> Option<&'e Buffer> {
    match e {
        Expr::Load { buffer, indices }
            if indices.len() == 2 && is_var(&indices[0], x) && is_var(&indices[1], y) =>
        {
            Some(buffer)
        }
        _ => None,
    }
}

/// `C[i, j] = C[i, j] + A[i, k] * B[k, j]` (either operand order): `(A, B)`.
fn update_of<'e>(
    s: &'e Stmt,
    c: &Buffer,
    [i, j, k]: [&Var; 3],
) -> Option<(&'e Buffer, &'e Buffer)> {
    let Stmt::Store {
        buffer,
        indices,
        value,
    } = s
    else {
        return None;
    };
    if buffer.name != c.name
        || indices.len() != 2
        || !is_var(&indices[0], i)
        || !is_var(&indices[1], j)
    {
        return None;
    }
    let Expr::Binary {
        op: BinOp::Add,
        a,
        b,
    } = value
    else {
        return None;
    };
    let (acc, prod) = if load_of(a, i, j).is_some_and(|x| x.name == c.name) {
        (a, b)
    } else {
        (b, a)
    };
    if load_of(acc, i, j).is_none_or(|x| x.name != c.name) {
        return None;
    }
    let Expr::Binary {
        op: BinOp::Mul,
        a: x,
        b: y,
    } = &**prod
    else {
        return None;
    };
    let pick = |p: &'e Expr, q: &'e Expr| Some((load_of(p, i, k)?, load_of(q, k, j)?));
    pick(x, y).or_else(|| pick(y, x))
}

/// `C[i, j] = 0`.
fn init_of<'e>(s: &'e Stmt, i: &Var, j: &Var) -> Option<&'e Buffer> {
    match s {
        Stmt::Store {
            buffer,
            indices,
            value,
        } if indices.len() == 2
            && is_var(&indices[0], i)
            && is_var(&indices[1], j)
            && is_zero(value) =>
        {
            Some(buffer)
        }
        _ => None,
    }
}

fn param<'f>(f: &'f PrimFunc, name: &str) -> Option<&'f Buffer> {
    f.params.iter().find_map(|p| match p {
        Param::Buffer(b) if b.name == name => Some(b),
        _ => None,
    })
}

/// The matmul `f` computes, if its body is exactly one (float32, constant shapes, three
/// distinct parameter buffers, in kiln's form or TVM's).
pub fn match_matmul(f: &PrimFunc) -> Option<MatmulMatch> {
    let Stmt::For {
        var: i,
        min,
        extent,
        body,
        ..
    } = &f.body
    else {
        return None;
    };
    let m = const_range(min, extent)?;
    let Stmt::For {
        var: j,
        min,
        extent,
        body,
        ..
    } = &**body
    else {
        return None;
    };
    let n = const_range(min, extent)?;
    // kiln's form: `C[i, j] = 0; for k { update }`; TVM's: `for k { if k == 0 { C[i, j] = 0 };
    // update }`.
    let (c, k, kv, update, prefix) = match &**body {
        Stmt::Seq(v) if v.len() == 2 => {
            let c = init_of(&v[0], i, j)?;
            let Stmt::For {
                var,
                min,
                extent,
                body,
                ..
            } = &v[1]
            else {
                return None;
            };
            (c, const_range(min, extent)?, var, &**body, Vec::new())
        }
        Stmt::For {
            var,
            min,
            extent,
            body,
            ..
        } => {
            let Stmt::Seq(v) = &**body else { return None };
            let [Stmt::IfThenElse {
                cond,
                then_case,
                else_case: None,
            }, update] = v.as_slice()
            else {
                return None;
            };
            let Expr::Binary {
                op: BinOp::Eq,
                a,
                b,
            } = cond
            else {
                return None;
            };
            if !((is_var(a, var) && is_zero(b)) || (is_var(b, var) && is_zero(a))) {
                return None;
            }
            let c = init_of(then_case, i, j)?;
            let prefix = vec![Step::DecomposeReduction {
                loop_: var.name.to_string(),
            }];
            (c, const_range(min, extent)?, var, update, prefix)
        }
        _ => return None,
    };
    let (a, b) = update_of(update, c, [i, j, kv])?;
    let (a, b, c) = (param(f, &a.name)?, param(f, &b.name)?, param(f, &c.name)?);
    let names = [&a.name, &b.name, &c.name];
    if names[0] == names[1] || names[0] == names[2] || names[1] == names[2] {
        return None;
    }
    let shape = |x: &Buffer| -> Option<Vec<i64>> { x.shape.iter().map(Expr::as_int).collect() };
    if [a, b, c].iter().any(|x| x.dtype != DataType::f32())
        || shape(a)? != [m, k]
        || shape(b)? != [k, n]
        || shape(c)? != [m, n]
    {
        return None;
    }
    Some(MatmulMatch {
        prefix,
        parts: MatmulParts {
            i: i.name.to_string(),
            j: j.name.to_string(),
            k: kv.name.to_string(),
            a: a.name.to_string(),
            b: b.name.to_string(),
            c: c.name.to_string(),
        },
        shape: [m, n, k],
    })
}

/// One hand schedule of a recognized matmul: its register tiles and blocks and where `B` is
/// packed. A point of the [`TemplateSpace`], which the search mutates one parameter at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulTemplate {
    /// The register tiles, row block and pass depth.
    pub tiles: MatmulTiles,
    /// Where `B` is packed.
    pub pack: PackB,
    /// Whether `A` is packed.
    pub pack_a: PackA,
}

/// The hand schedules of a matmul kiln recognized in a function ([`match_matmul`]): the
/// starting points of a search ([`TemplateSpace::seeds`]) and their neighbours
/// ([`TemplateSpace::neighbours`]), each a [`MatmulTemplate`] that becomes steps by running
/// kiln's hand schedule ([`matmul_tiled_packing`]).
#[derive(Clone, Debug)]
pub struct TemplateSpace {
    mm: MatmulMatch,
    start: Schedule,
    base: MatmulTiles,
    heights: &'static [i64],
    /// The other tile width, half again the target's, and its heights ([`wide_tiles`]).
    wide: (i64, &'static [i64]),
    /// The threads the kernel runs on: the target's `num-cores`, else this process's pool
    /// ([`crate::runtime::default_num_threads`]); the tuner measures on the machine at hand.
    threads: i64,
    /// The pass depth that would keep the target's smallest row block of `A` in half its L2
    /// ([`depth_block`]; 0 where one pass does): tried among the seeds, not the default.
    passes: i64,
}

/// `t` with `mr x nr` register tiles, its row block rounded down to whole tiles (at least one).
fn reshaped(t: MatmulTiles, mr: i64, nr: i64) -> MatmulTiles {
    MatmulTiles {
        mr,
        nr,
        mb: (t.mb / mr * mr).max(mr),
        ..t
    }
}

/// The register tiles' second width for a target whose tiles are `nr` wide: half again as
/// wide, with the heights whose accumulators, row of `B` and broadcast of `A` still fit the
/// vector registers. AVX2 (16 ymm): 4 x 24, twelve accumulators like 6 x 16, and a height that
/// divides 64 rows (64 x 4096 x 4096 on a Zen 3: 117 against 107 GFLOP/s for 4 x 16, the
/// height that divides them at the target's width); 3 x 24. AVX-512 (32 zmm): 8 x 48 (24
/// accumulators) and 6 x 48.
fn wide_tiles(nr: i64) -> (i64, &'static [i64]) {
    let heights: &'static [i64] = if nr >= 32 { &[8, 6] } else { &[4, 3] };
    (nr / 2 * 3, heights)
}

impl TemplateSpace {
    /// The space of `f` for `target`, when `f` is a matmul kiln has a hand schedule for.
    pub fn new(f: &PrimFunc, target: &Target) -> Option<Self> {
        let mm = match_matmul(f)?;
        let mut start = Schedule::new(f.clone());
        start.apply(&mm.prefix).ok()?;
        let base = MatmulTiles::for_target_and_depth(target, mm.shape[2]);
        let passes = depth_block(crate::target::l2_bytes(target), mm.shape[2]);
        let heights: &'static [i64] = if base.nr >= 32 {
            &[8, 12, 6, 4]
        } else {
            &[6, 4, 8]
        };
        Some(Self {
            mm,
            start,
            base,
            heights,
            wide: wide_tiles(base.nr),
            threads: target
                .get_int("num-cores")
                .filter(|&n| n > 0)
                .unwrap_or_else(|| crate::runtime::default_num_threads() as i64)
                .max(1),
            passes,
        })
    }

    /// Column panels per task for one task per thread ([`PackB::InTask`]) with tiles `nr`
    /// wide: each thread packs its share of every row of `B` in one sweep of a few KiB, which
    /// the prefetchers follow, instead of a few hundred bytes a row and a jump to the next
    /// (64 x 4096 x 4096 for AVX2, 4 x 24 tiles on a Zen 3, paired with numpy in one process:
    /// 1.05-1.11x numpy with 85 panels a task and `k` in passes of 64-128, 0.99-1.01x with 4-8
    /// panels). Meant for matmuls with one or two row blocks, where the column tasks are all
    /// the parallelism there is.
    fn per_thread(&self, nr: i64) -> i64 {
        let panels = (self.mm.shape[1] / nr.max(1)).max(1);
        ((panels + self.threads - 1) / self.threads).max(1)
    }

    /// `t` with the wide tiles ([`TemplateSpace::widened`]); a packing of one task per thread
    /// stays one task per thread at the new width.
    fn widened_template(&self, t: &MatmulTemplate) -> MatmulTemplate {
        let tiles = self.widened(t.tiles);
        let pack = match t.pack {
            PackB::InTask { panels, ahead } if panels == self.per_thread(t.tiles.nr) => {
                PackB::InTask {
                    panels: self.per_thread(tiles.nr),
                    ahead,
                }
            }
            p => p,
        };
        MatmulTemplate { tiles, pack, ..*t }
    }

    /// The tile heights tried for tiles `nr` wide.
    fn heights_for(&self, nr: i64) -> &'static [i64] {
        if nr == self.wide.0 {
            self.wide.1
        } else {
            self.heights
        }
    }

    /// The wide tiles ([`wide_tiles`]) in place of `t`'s.
    fn widened(&self, t: MatmulTiles) -> MatmulTiles {
        reshaped(t, self.wide.1[0], self.wide.0)
    }

    /// The template as steps (replayable by [`Schedule::apply`] on the function).
    ///
    /// # Errors
    /// When the hand schedule refuses the template (a tile that does not fit the shape).
    pub fn steps(&self, t: &MatmulTemplate) -> Result<Vec<Step>, String> {
        matmul_tiled_packing(
            self.start.clone(),
            &self.mm.parts,
            self.mm.shape,
            t.tiles,
            t.pack,
            t.pack_a,
        )
        .map(|s| s.trace().to_vec())
        .map_err(|e| e.to_string())
    }

    /// Pass depths worth trying: one pass (0), and depths that divide `k` (no bounds guard
    /// in the inner loop).
    fn depths(&self) -> Vec<i64> {
        let k = self.mm.shape[2];
        let mut depths: Vec<i64> = Vec::new();
        for kc in [256, 512, self.passes, 128, 0, 192, 384, 320, 640, 768, 64] {
            let divides = kc == 0 || (kc < k && k % kc == 0);
            if divides && !depths.contains(&kc) {
                depths.push(kc);
            }
        }
        depths
    }

    /// The starting points, best guesses first (see [`templates`]).
    pub fn seeds(&self) -> Vec<MatmulTemplate> {
        let (base, heights) = (self.base, self.heights);
        let [m, _, k] = self.mm.shape;
        let mut variants = vec![base];
        for &mr in heights {
            for mb in [base.mb, base.mb / 2, base.mb * 2] {
                let mb = (mb / mr * mr).max(mr);
                for kc in [base.kc, self.passes, 256] {
                    let kc = if kc >= k { 0 } else { kc };
                    let t = MatmulTiles {
                        mr,
                        nr: base.nr,
                        mb,
                        kc,
                    };
                    if !variants.contains(&t) {
                        variants.push(t);
                    }
                }
            }
        }
        let whole: Vec<MatmulTemplate> = variants
            .iter()
            .map(|&tiles| MatmulTemplate {
                tiles,
                pack: PackB::Whole,
                pack_a: PackA::InPlace,
            })
            .take(16)
            .collect();
        let depths = self.depths();
        // Panels per task: a row of B read 512 bytes at a time when packing (4 panels of 32
        // floats, 8 of 16), then twice and half that.
        let panels = (128 / base.nr.max(1)).max(1);
        // (tile height, pass depth, panels per task).
        let mut packings: Vec<(i64, i64, i64)> = Vec::new();
        let few_rows = m <= 2 * base.mb;
        // Rows that the target's tile height leaves a remainder of (64 rows in tiles of 6): a
        // height that divides them has no narrower last tile (64 x 4096 x 4096 for AVX2: 4 x
        // 16 tiles 1.09x 6 x 16).
        let dividing = (m % base.mr != 0)
            .then(|| heights.iter().copied().find(|&h| m % h == 0))
            .flatten();
        if few_rows && self.threads > 1 {
            // One task per thread, `k` in short passes (the packed block of `B` in the L2):
            // first, for a matmul with few rows ([`TemplateSpace::per_thread`]), in tiles of a
            // height that divides the rows where the target's does not.
            let mr = dividing.unwrap_or(base.mr);
            packings.extend(
                [128, 64]
                    .into_iter()
                    .filter(|kc| depths.contains(kc))
                    .map(|kc| (mr, kc, self.per_thread(base.nr))),
            );
        }
        packings.extend(depths.iter().take(3).map(|&kc| (base.mr, kc, panels)));
        if let Some(&kc) = depths.first() {
            packings.extend([
                (base.mr, kc, panels * 2),
                (base.mr, kc, (panels / 2).max(1)),
            ]);
            if let Some(h) = dividing {
                packings.extend(depths.iter().take(2).map(|&kc| (h, kc, panels)));
            }
        }
        let mut in_task: Vec<MatmulTemplate> = Vec::new();
        for &(mr, kc, panels) in &packings {
            let t = MatmulTemplate {
                tiles: MatmulTiles { mr, kc, ..base },
                pack: PackB::InTask {
                    panels,
                    ahead: false,
                },
                pack_a: PackA::InPlace,
            };
            if !in_task.contains(&t) {
                in_task.push(t);
            }
        }
        let in_place = variants.iter().take(3).map(|&tiles| MatmulTemplate {
            tiles,
            pack: PackB::InPlace,
            pack_a: PackA::InPlace,
        });
        // A matmul with one or two row blocks reads each panel of B once or twice: packing in
        // the task saves the up-front copy of all of B (64 x 4096 x 4096: 2.0x on an AVX-512
        // Xeon, 1.3x for AVX2), so it goes first. With many row blocks, B packed once up front
        // is read by all of them (1024^3: 1.06x the packing in tasks).
        let (first, second) = if few_rows {
            (in_task, whole)
        } else {
            (whole, in_task)
        };
        let mut out = first;
        out.extend(second);
        out.extend(in_place);
        // The first two with `A` packed too, right after them: packing `A` pays where its rows
        // are far apart and reused by many panels (2048^3 for AVX2 on a Zen 4: +8 %), and costs
        // a copy of `A` on every call where they are not (1024^3: -2 %).
        let packed_a: Vec<MatmulTemplate> = out
            .iter()
            .take(2)
            .map(|t| MatmulTemplate {
                pack_a: PackA::Whole,
                ..*t
            })
            .collect();
        let at = out.len().min(2);
        out.splice(at..at, packed_a);
        // Then the first two again with the wide tiles.
        let wide: Vec<MatmulTemplate> = out
            .iter()
            .filter(|t| t.pack_a == PackA::InPlace)
            .take(2)
            .map(|t| self.widened_template(t))
            .collect();
        let at = out.len().min(4);
        out.splice(at..at, wide);
        if !few_rows {
            // Many rows: right after the first, one pass over blocks of two and four times the
            // rows with `A` packed, so that each panel of `B` stays in the L2 for more register
            // tiles while the packed rows of `A` stream past it (2048³ for AVX2 on a Zen 3,
            // paired with numpy in one process: 504 rows 1.056x numpy's time, 252 rows 1.036x,
            // the target's 126 rows 0.97x).
            // And blocks of about 512 rows whatever the target's block is: 504 was the best
            // block on the Zen 3 above, and on a Zen 4 built for `haswell` (2048³, huge pages,
            // paired with numpy: 504 rows 0.984-0.995x numpy's speed, 744 rows 0.975x, the
            // target's 186 rows 0.959x).
            let near_512 = (512 + base.mr / 2) / base.mr.max(1) * base.mr;
            let big: Vec<MatmulTemplate> = [base.mb * 2, base.mb * 4, near_512]
                .into_iter()
                .filter(|&mb| mb < m && mb > base.mb)
                .map(|mb| MatmulTemplate {
                    tiles: MatmulTiles { mb, kc: 0, ..base },
                    pack: PackB::Whole,
                    pack_a: PackA::Whole,
                })
                .filter(|t| out.first() != Some(t))
                .fold(Vec::new(), |mut v, t| {
                    if !v.contains(&t) {
                        v.push(t);
                    }
                    v
                });
            out.retain(|t| !big.contains(t));
            let at = out.len().min(1);
            out.splice(at..at, big);
        } else {
            // Few rows: first, a few panels per task (a row of `B` read 512 bytes at a time)
            // in passes of 128 and 256, each pass prefetching the rows of `B` the next one
            // packs, so that the copy of a slice finds them in the cache instead of waiting on
            // memory with nothing to compute; at the wide width, then the target's. 64 x 4096
            // x 4096 for AVX2 on a Zen 3, both cores, paired with numpy in one process on its
            // arrays (2 MiB pages): 4 x 24 tiles, 5 panels a task, 0.98-0.99x numpy's speed
            // with the prefetch, 0.93-0.96x without; 4 x 16 tiles 0.96x; 10 panels a task (the
            // slice and the next past the L2) 0.91x; passes of 512 0.97x. On 4 KiB pages the
            // prefetch loses (16.5 against 14.8 ms): the search measures which holds here.
            let mut ahead: Vec<MatmulTemplate> = Vec::new();
            for nr in [self.wide.0, base.nr] {
                let hs = self.heights_for(nr);
                let mr = hs.iter().copied().find(|&h| m % h == 0).unwrap_or(hs[0]);
                for kc in [128, 256].into_iter().filter(|kc| depths.contains(kc)) {
                    let t = MatmulTemplate {
                        tiles: MatmulTiles {
                            kc,
                            ..reshaped(base, mr, nr)
                        },
                        pack: PackB::InTask {
                            panels: (128 / nr).max(1),
                            ahead: true,
                        },
                        pack_a: PackA::InPlace,
                    };
                    if !ahead.contains(&t) {
                        ahead.push(t);
                    }
                }
            }
            out.retain(|t| !ahead.contains(t));
            out.splice(0..0, ahead);
        }
        out
    }

    /// The templates one parameter away from `t`: another tile height, a row block a tile
    /// height more or less or half or double, another pass depth, another packing of `B` (up
    /// front, in the task with twice or half the panels, with the next pass prefetched or not,
    /// one task per thread, in place), `A` packed or not, and the
    /// other tile width (half again the target's, with its first height).
    pub fn neighbours(&self, t: &MatmulTemplate) -> Vec<MatmulTemplate> {
        let mut out: Vec<MatmulTemplate> = Vec::new();
        let mut add = |tiles: MatmulTiles, pack: PackB, pack_a: PackA| {
            let c = MatmulTemplate {
                tiles,
                pack,
                pack_a,
            };
            if c != *t && !out.contains(&c) {
                out.push(c);
            }
        };
        let tl = t.tiles;
        for &mr in self.heights_for(tl.nr) {
            add(reshaped(tl, mr, tl.nr), t.pack, t.pack_a);
        }
        for mb in [tl.mb - tl.mr, tl.mb + tl.mr, tl.mb / 2, tl.mb * 2] {
            let mb = (mb / tl.mr * tl.mr).max(tl.mr);
            add(MatmulTiles { mb, ..tl }, t.pack, t.pack_a);
        }
        for kc in self.depths() {
            add(MatmulTiles { kc, ..tl }, t.pack, t.pack_a);
        }
        let panels = (128 / tl.nr.max(1)).max(1);
        let packs = match t.pack {
            PackB::InTask { panels: p, ahead } => vec![
                PackB::InTask {
                    panels: p * 2,
                    ahead,
                },
                PackB::InTask {
                    panels: (p / 2).max(1),
                    ahead,
                },
                PackB::InTask {
                    panels: p,
                    ahead: !ahead,
                },
                PackB::Whole,
                PackB::InPlace,
            ],
            _ => vec![
                PackB::Whole,
                PackB::InTask {
                    panels,
                    ahead: false,
                },
                PackB::InPlace,
            ],
        };
        let packs = packs.into_iter().chain([PackB::InTask {
            panels: self.per_thread(tl.nr),
            ahead: false,
        }]);
        for pack in packs {
            add(tl, pack, t.pack_a);
        }
        for other_a in [PackA::InPlace, PackA::Whole, PackA::InTask] {
            add(tl, t.pack, other_a);
        }
        if tl.nr == self.wide.0 {
            add(reshaped(tl, self.base.mr, self.base.nr), t.pack, t.pack_a);
        } else {
            let w = self.widened_template(t);
            add(w.tiles, w.pack, w.pack_a);
        }
        out
    }
}

/// kiln's hand schedules for `f`, as steps, when `f` is a kernel kiln has one for (see the
/// module docs): the register tiles and blocks [`MatmulTiles::for_target_and_depth`] picks for
/// `target` first, then their neighbours (other tile heights, half and double the row block,
/// `k` in one pass or in passes). They are the first candidates of a search, so a tuned kernel
/// is never slower than the hand-scheduled one, and a machine where another tile is faster
/// finds it; the search then mutates the best of them ([`TemplateSpace::neighbours`]).
pub fn templates(f: &PrimFunc, target: &Target) -> Vec<Vec<Step>> {
    let Some(space) = TemplateSpace::new(f, target) else {
        return Vec::new();
    };
    space
        .seeds()
        .iter()
        .filter_map(|t| space.steps(t).ok())
        .collect()
}
