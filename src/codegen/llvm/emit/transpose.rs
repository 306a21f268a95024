//! Transposing copy nests as 8 x 8 tiles transposed in registers.
//!
//! A transpose lowered from TVM (`topi.transpose`, Relax's `permute_dims`, an NCHW <-> NHWC
//! layout change) and the packed copy `codegen::interchange` makes of an operand that a
//! spatial loop reads across are the nest `for a { for b { Y[.., a, b] = X[.., b, a] } }`: the
//! stores walk `Y` along `b`, the loads walk `X` along `b` a row apart. LLVM vectorizes `b` with
//! a gather of one element per row, or with interleaved-access shuffles and spills (TOPI's
//! NCHW -> NHWC transpose of 4096 floats at 0.81x TVM's time on a Zen 3).
//!
//! Here such a nest is emitted as tiles of 8 x 8 elements: 8 vector loads of rows of `X`
//! (contiguous along `a`), 24 shuffles that transpose them (`unpcklps`/`unpckhps`, `shufps`
//! and `vperm2f128` on x86), 8 vector stores of rows of `Y` (contiguous along `b`). Every
//! element is stored once with the value the nest stores, so the results are the same.
//!
//! The rule (all of it, checked on the IR, else the nest is emitted as written):
//! - a host function (not a device kernel) whose buffers do not alias (`noalias`);
//! - a nest of serial, vectorized or unrolled loops, each the only statement of the one outside
//!   it, from 0 to constant extents; the innermost body one store whose value is one load;
//! - the same 32-bit element type on both sides (float, int or uint, one lane), two different
//!   compact buffers, indices of variables and constants only, the destination not a streamed
//!   output;
//! - the destination's flat offset walks it row-major in some order of the loops (sorted by
//!   their coefficients, each is the product of the extents before it), so every iteration
//!   stores a different element and their order is free;
//! - one loop (`b`) has coefficient 1 in the destination's flat offset, another (`a`)
//!   coefficient 1 in the source's, and both extents are at least 8.
//!
//! The loops keep their order; `a` and `b` step by tiles, and each iteration of the innermost
//! one is a tile. Where an extent is not a multiple of 8, the elements past its last whole
//! tile are copied by plain loops after the tiles (a strip of `n % 8` rows or columns).

use crate::ir::{BinOp, Buffer, DataType, Expr, ForKind, Stmt, TypeCode, Var};

use super::copy::{flat_offset, ElementCopy};
use super::vector::lane_coef;
use super::{mem_ty, reg_ty, Emitter, Val, R};

/// The side of a tile, in elements.
const TILE: i64 = 8;

/// A transposing copy nest (the module docs have the rule).
struct TransposeNest<'s> {
    /// The loops, outermost first, with their extents.
    loops: Vec<(&'s Var, i64)>,
    /// The loop along which the source is contiguous.
    a: &'s Var,
    /// The loop along which the destination is contiguous.
    b: &'s Var,
    dst: (&'s crate::ir::Buffer, &'s [Expr]),
    src: (&'s crate::ir::Buffer, &'s [Expr]),
    /// Elements from one row of the source's tile to the next (the coefficient of `b` in
    /// its flat offset), and from one row of the destination's to the next (of `a`).
    src_row: i64,
    dst_row: i64,
}

fn word(dtype: DataType) -> bool {
    dtype.lanes == 1
        && dtype.bits == 32
        && matches!(dtype.code, TypeCode::Int | TypeCode::UInt | TypeCode::Float)
}

/// The shuffles of an 8 x 8 transpose, by stage: each `(x, y, mask)` makes a vector of lanes
/// of the stage's inputs `x` and `y` (`mask` indexes `x` then `y`, as `shufflevector` does).
const STAGES: [[(usize, usize, [u8; 8]); 8]; 2] = {
    const LO: [u8; 8] = [0, 8, 1, 9, 4, 12, 5, 13];
    const HI: [u8; 8] = [2, 10, 3, 11, 6, 14, 7, 15];
    const PAIR_LO: [u8; 8] = [0, 1, 8, 9, 4, 5, 12, 13];
    const PAIR_HI: [u8; 8] = [2, 3, 10, 11, 6, 7, 14, 15];
    [
        // Rows interleaved in pairs within each 128-bit half.
        [
            (0, 1, LO),
            (0, 1, HI),
            (2, 3, LO),
            (2, 3, HI),
            (4, 5, LO),
            (4, 5, HI),
            (6, 7, LO),
            (6, 7, HI),
        ],
        // Pairs of pairs: column c of the tile is output c (each 128-bit half a 4 x 4
        // transpose, of rows 0-3 in the low half and rows 4-7 in the high one).
        [
            (0, 2, PAIR_LO),
            (0, 2, PAIR_HI),
            (1, 3, PAIR_LO),
            (1, 3, PAIR_HI),
            (4, 6, PAIR_LO),
            (4, 6, PAIR_HI),
            (5, 7, PAIR_LO),
            (5, 7, PAIR_HI),
        ],
    ]
};

impl Emitter<'_> {
    /// `s` as a transposing copy nest, if it is one (the module docs have the rule).
    fn transpose_nest<'s>(&self, s: &'s Stmt) -> Option<TransposeNest<'s>> {
        let ElementCopy {
            loops,
            dst: (dst, di),
            src: (src, si),
        } = self.element_copy(s)?;
        if loops.len() < 2 || !word(dst.dtype) {
            return None;
        }
        let (dflat, sflat) = (flat_offset(dst, di), flat_offset(src, si));
        // The destination walked row-major in some order of the loops.
        let mut walk: Vec<(i64, i64)> = Vec::with_capacity(loops.len());
        for &(v, n) in &loops {
            walk.push((lane_coef(&dflat, v.id)?, n));
        }
        walk.sort_unstable();
        let mut stride = 1i64;
        for (c, n) in walk {
            if n > 1 && c != stride {
                return None;
            }
            stride = stride.checked_mul(n)?;
        }
        let unit = |flat: &Expr| {
            let mut it = loops
                .iter()
                .filter(|(v, n)| *n >= TILE && lane_coef(flat, v.id) == Some(1));
            it.next().map(|&(v, _)| v)
        };
        let (a, b) = (unit(&sflat)?, unit(&dflat)?);
        if a.id == b.id {
            return None;
        }
        let (src_row, dst_row) = (lane_coef(&sflat, b.id)?, lane_coef(&dflat, a.id)?);
        Some(TransposeNest {
            loops,
            a,
            b,
            src_row,
            dst_row,
            dst: (dst, di),
            src: (src, si),
        })
    }

    /// Emits `s` in 8 x 8 tiles when it is a transposing copy nest; `false` (nothing emitted)
    /// otherwise.
    pub(super) fn transpose_loop(&mut self, s: &Stmt) -> R<bool> {
        let Some(t) = self.transpose_nest(s) else {
            return Ok(false);
        };
        self.transpose_outer(&t, 0)?;
        Ok(true)
    }

    /// The loops from `depth` in: `a` and `b` by tiles (their variables bound to a tile's
    /// first index), the others as written; the innermost body is a tile.
    fn transpose_outer(&mut self, t: &TransposeNest<'_>, depth: usize) -> R<()> {
        let Some(&(var, n)) = t.loops.get(depth) else {
            let a0 = self.vars[&t.a.id].clone();
            let b0 = self.vars[&t.b.id].clone();
            return self.transpose_tile(t, &a0, &b0);
        };
        if var.id != t.a.id && var.id != t.b.id {
            return self.const_loop(var, n, &mut |e| e.transpose_outer(t, depth + 1));
        }
        let tile = Var::new(&format!("{}_tile", var.name), var.dtype);
        let ty = reg_ty(var.dtype);
        self.const_loop(&tile, n / TILE, &mut |e| {
            let i = e.vars[&tile.id].clone();
            let first = e.assign(&ty, format!("mul nsw {ty} {}, {TILE}", i.v));
            let old = e.vars.insert(var.id, first);
            let r = e.transpose_outer(t, depth + 1);
            e.restore(var.id, old);
            r
        })?;
        if n % TILE != 0 {
            let strip = self.transpose_strip(t, depth, n);
            self.stmt(&strip)?;
        }
        Ok(())
    }

    /// The part of the nest past the last whole tile along the loop at `depth` (`a` or `b`,
    /// of extent `n`), as plain loops: that loop over `[n - n % 8, n)` around the loops inside
    /// it as written. Where the other of `a` and `b` is outside it, that one is bound to its
    /// tile's first index here, so the strip also runs over the tile's 8 values of it.
    fn transpose_strip(&self, t: &TransposeNest<'_>, depth: usize, n: i64) -> Stmt {
        let (var, _) = t.loops[depth];
        let outer_tiled = t.loops[..depth]
            .iter()
            .map(|&(v, _)| v)
            .find(|v| v.id == t.a.id || v.id == t.b.id);
        let c = |dtype, value| Expr::IntImm { dtype, value };
        let mut s = t
            .dst
            .0
            .store(t.dst.1.to_vec(), t.src.0.load(t.src.1.to_vec()));
        // The outer one of `a` and `b` at `o + o_in_tile`, `o` its tile's first index.
        let offset = outer_tiled.map(|o| {
            let off = Var::new(&format!("{}_in_tile", o.name), o.dtype);
            let at = Expr::binary(BinOp::Add, Expr::Var(o.clone()), Expr::Var(off.clone()));
            s = crate::ir::rewrite::subst_stmt(&s, &std::collections::HashMap::from([(o.id, at)]));
            off
        });
        let serial = |var: &Var, min: Expr, extent: Expr, body: Stmt| Stmt::For {
            var: var.clone(),
            min,
            extent,
            kind: ForKind::Serial,
            body: Box::new(body),
        };
        for &(v, m) in t.loops[depth + 1..].iter().rev() {
            s = serial(v, c(v.dtype, 0), c(v.dtype, m), s);
        }
        let whole = n - n % TILE;
        s = serial(var, c(var.dtype, whole), c(var.dtype, n % TILE), s);
        if let Some(off) = offset {
            s = serial(&off, c(off.dtype, 0), c(off.dtype, TILE), s);
        }
        s
    }

    /// Pointers (as `<width x mt>*`) to the 8 rows of one side of the tile, rows `step`
    /// elements apart, from its element at `(a0, b0)`: the first element's address computed
    /// once and each row a constant number of elements past it, so that the rows of a tile
    /// are one base register and constant displacements.
    fn tile_rows(
        &mut self,
        t: &TransposeNest<'_>,
        (buffer, indices): (&Buffer, &[Expr]),
        (a0, b0): (&Val, &Val),
        step: i64,
        width: i64,
    ) -> R<Vec<Val>> {
        let mt = mem_ty(buffer.dtype);
        let first = self.address_at(buffer, indices, &[(t.a, a0.clone()), (t.b, b0.clone())])?;
        let vt = format!("<{width} x {mt}>");
        let mut rows = Vec::with_capacity(TILE as usize);
        for k in 0..TILE {
            let p = if k == 0 {
                first.clone()
            } else {
                let ty = Self::ptr(&mt);
                self.assign(
                    &ty,
                    format!(
                        "getelementptr inbounds {mt}, {ty} {first}, i64 {}",
                        k * step
                    ),
                )
                .v
            };
            rows.push(self.assign(
                &format!("{vt}*"),
                format!("bitcast {} {p} to {vt}*", Self::ptr(&mt)),
            ));
        }
        Ok(rows)
    }

    /// One tile: rows `b0 .. b0 + 8` of the source from column `a0`, transposed into rows
    /// `a0 .. a0 + 8` of the destination from column `b0`. The four 4 x 4 quarters are
    /// transposed in the 128-bit halves of 256-bit registers: rows `r` and `r + 4` of the
    /// tile are loaded a half at a time into the two halves of one vector (the one in slot
    /// `r` holds columns 0-3, the one in slot `r + 4` columns 4-7). A half joined to a vector
    /// is a load (`vinsertf128` from memory on x86), not a shuffle, so no lane-crossing
    /// shuffle is emitted: 16 shuffles a tile.
    fn transpose_tile(&mut self, t: &TransposeNest<'_>, a0: &Val, b0: &Val) -> R<()> {
        if self.opts.vector_bits >= 512 {
            return self.transpose_tile_512(t, a0, b0);
        }
        let mt = mem_ty(t.dst.0.dtype);
        let vt = format!("<{TILE} x {mt}>");
        let half = format!("<{} x {mt}>", TILE / 2);
        let src = self.tile_rows(t, t.src, (a0, b0), t.src_row, TILE / 2)?;
        let mut halves = Vec::with_capacity(2 * TILE as usize);
        for p in &src {
            let second = self.assign(
                &format!("{half}*"),
                format!("getelementptr inbounds {half}, {half}* {}, i64 1", p.v),
            );
            for q in [p, &second] {
                halves.push(self.assign(&half, format!("load {half}, {half}* {}, align 4", q.v)));
            }
        }
        let join = lanes(0..TILE);
        let mut rows = Vec::with_capacity(TILE as usize);
        for h in 0..2 {
            for r in 0..TILE as usize / 2 {
                let (lo, hi) = (&halves[2 * r + h], &halves[2 * (r + 4) + h]);
                rows.push(self.assign(
                    &vt,
                    format!("shufflevector {half} {}, {half} {}, {join}", lo.v, hi.v),
                ));
            }
        }
        for stage in &STAGES {
            rows = stage
                .iter()
                .map(|(x, y, mask)| {
                    let m = lanes(mask.iter().map(|&k| i64::from(k)));
                    self.assign(
                        &vt,
                        format!(
                            "shufflevector {vt} {}, {vt} {}, {m}",
                            rows[*x].v, rows[*y].v
                        ),
                    )
                })
                .collect();
        }
        let dst = self.tile_rows(t, t.dst, (a0, b0), t.dst_row, TILE)?;
        for (col, p) in rows.iter().zip(&dst) {
            self.line(format!("store {vt} {}, {vt}* {}, align 4", col.v, p.v));
        }
        Ok(())
    }

    /// One tile with 512-bit registers: rows `2i` and `2i + 1` of the source joined into one
    /// 16-lane vector (a load joined to a load: `vinsertf64x4` from memory on x86), and
    /// rows `2j` and `2j + 1` of the destination made of two two-source permutes of them
    /// (`vpermt2ps`) and a blend: 8 permutes a tile where 256-bit registers need 16
    /// shuffles, and the shuffle port is what bounds a transpose. Where the destination's
    /// rows are 8 elements apart, its two rows are one 16-lane store.
    fn transpose_tile_512(&mut self, t: &TransposeNest<'_>, a0: &Val, b0: &Val) -> R<()> {
        let mt = mem_ty(t.dst.0.dtype);
        let vt = format!("<{TILE} x {mt}>");
        let wide = format!("<{} x {mt}>", 2 * TILE);
        let src = self.tile_rows(t, t.src, (a0, b0), t.src_row, TILE)?;
        let rows: Vec<Val> = src
            .iter()
            .map(|p| self.assign(&vt, format!("load {vt}, {vt}* {}, align 4", p.v)))
            .collect();
        let join = lanes(0..2 * TILE);
        let pairs: Vec<Val> = rows
            .chunks(2)
            .map(|xy| {
                self.assign(
                    &wide,
                    format!("shufflevector {vt} {}, {vt} {}, {join}", xy[0].v, xy[1].v),
                )
            })
            .collect();
        let dst = self.tile_rows(t, t.dst, (a0, b0), t.dst_row, TILE)?;
        let adjacent = t.dst_row == TILE;
        // Lane `l` of the destination's rows `2j` and `2j + 1` is element `c = 2j + l / 8`
        // of source row `r = l % 8`: lane `(r % 2) * 8 + c` of pair `r / 2`, which is lane
        // `(r % 4) * 8 + c` of the 32 of pairs 0 and 1 (rows 0-3) or of pairs 2 and 3.
        let half = TILE / 2;
        for j in 0..half {
            let at = |l: i64| (l % TILE, 2 * j + l / TILE);
            let from = |first: i64| -> String {
                lanes_or_undef((0..2 * TILE).map(|l| {
                    let (r, c) = at(l);
                    (r / half == first).then_some((r % half) * TILE + c)
                }))
            };
            // Rows 0-3 of the tile from pairs 0 and 1, rows 4-7 from pairs 2 and 3.
            let [lo, hi] = [0, 1].map(|first| {
                let p = &pairs[2 * first as usize..][..2];
                self.assign(
                    &wide,
                    format!(
                        "shufflevector {wide} {}, {wide} {}, {}",
                        p[0].v,
                        p[1].v,
                        from(first)
                    ),
                )
            });
            let blend = lanes((0..2 * TILE).map(|l| if at(l).0 < half { l } else { 2 * TILE + l }));
            let both = self.assign(
                &wide,
                format!("shufflevector {wide} {}, {wide} {}, {blend}", lo.v, hi.v),
            );
            let row = 2 * j as usize;
            if adjacent {
                let p = self.assign(
                    &format!("{wide}*"),
                    format!("bitcast {vt}* {} to {wide}*", dst[row].v),
                );
                self.line(format!("store {wide} {}, {wide}* {}, align 4", both.v, p.v));
                continue;
            }
            for k in 0..2 {
                let part = lanes(k * TILE..(k + 1) * TILE);
                let col = self.assign(
                    &vt,
                    format!("shufflevector {wide} {}, {wide} undef, {part}", both.v),
                );
                let p = &dst[row + k as usize];
                self.line(format!("store {vt} {}, {vt}* {}, align 4", col.v, p.v));
            }
        }
        Ok(())
    }

    /// `for var in [0, n)` around what `body` emits (with `var` bound), kept a loop: not
    /// vectorized (its body is vector code already) and not unrolled by LLVM's heuristics.
    fn const_loop(&mut self, var: &Var, n: i64, body: &mut dyn FnMut(&mut Self) -> R<()>) -> R<()> {
        let ty = reg_ty(var.dtype);
        let head = self.new_label("tile_head");
        let bodyl = self.new_label("tile_body");
        let latch = self.new_label("tile_latch");
        let exit = self.new_label("tile_end");
        let pre = self.cur_block.clone();
        self.line(format!("br label %{head}"));
        self.start_block(&head);
        let i = self.tmp();
        let next = self.tmp();
        self.line(format!(
            "{i} = phi {ty} [ 0, %{pre} ], [ {next}, %{latch} ]"
        ));
        let c = self.assign("i1", format!("icmp slt {ty} {i}, {n}"));
        self.line(format!("br i1 {}, label %{bodyl}, label %{exit}", c.v));
        self.start_block(&bodyl);
        let old = self.vars.insert(var.id, Val::new(&ty, &i));
        let r = body(self);
        self.restore(var.id, old);
        r?;
        self.line(format!("br label %{latch}"));
        self.start_block(&latch);
        self.line(format!("{next} = add nsw {ty} {i}, 1"));
        let md = self.no_unroll_metadata();
        self.line(format!("br label %{head}{md}"));
        self.start_block(&exit);
        Ok(())
    }
}

/// A `shufflevector` mask of these lanes.
fn lanes(ks: impl Iterator<Item = i64>) -> String {
    lanes_or_undef(ks.map(Some))
}

/// A `shufflevector` mask of these lanes, `undef` where there is none.
fn lanes_or_undef(ks: impl Iterator<Item = Option<i64>>) -> String {
    let m: Vec<String> = ks
        .map(|k| k.map_or_else(|| "i32 undef".to_owned(), |k| format!("i32 {k}")))
        .collect();
    format!("<{} x i32> <{}>", m.len(), m.join(", "))
}
