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
//!   coefficient 1 in the source's, and both extents are multiples of 8.
//!
//! The loops keep their order; `a` and `b` step by tiles, and each iteration of the innermost
//! one is a tile.

use crate::ir::{Buffer, DataType, Expr, Stmt, TypeCode, Var};

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
}

fn word(dtype: DataType) -> bool {
    dtype.lanes == 1
        && dtype.bits == 32
        && matches!(dtype.code, TypeCode::Int | TypeCode::UInt | TypeCode::Float)
}

/// The shuffles of an 8 x 8 transpose, by stage: each `(x, y, mask)` makes a vector of lanes
/// of the stage's inputs `x` and `y` (`mask` indexes `x` then `y`, as `shufflevector` does).
const STAGES: [[(usize, usize, [u8; 8]); 8]; 3] = {
    const LO: [u8; 8] = [0, 8, 1, 9, 4, 12, 5, 13];
    const HI: [u8; 8] = [2, 10, 3, 11, 6, 14, 7, 15];
    const PAIR_LO: [u8; 8] = [0, 1, 8, 9, 4, 5, 12, 13];
    const PAIR_HI: [u8; 8] = [2, 3, 10, 11, 6, 7, 14, 15];
    const HALF_LO: [u8; 8] = [0, 1, 2, 3, 8, 9, 10, 11];
    const HALF_HI: [u8; 8] = [4, 5, 6, 7, 12, 13, 14, 15];
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
        // Pairs of pairs: lanes k and k + 4 of rows 0-3 (and of rows 4-7).
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
        // The halves joined: column c of the tile is output c.
        [
            (0, 4, HALF_LO),
            (1, 5, HALF_LO),
            (2, 6, HALF_LO),
            (3, 7, HALF_LO),
            (0, 4, HALF_HI),
            (1, 5, HALF_HI),
            (2, 6, HALF_HI),
            (3, 7, HALF_HI),
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
                .filter(|(v, n)| *n % TILE == 0 && lane_coef(flat, v.id) == Some(1));
            it.next().map(|&(v, _)| v)
        };
        let (a, b) = (unit(&sflat)?, unit(&dflat)?);
        if a.id == b.id {
            return None;
        }
        Some(TransposeNest {
            loops,
            a,
            b,
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
        })
    }

    /// One tile: rows `b0 .. b0 + 8` of the source from column `a0`, transposed into rows
    /// `a0 .. a0 + 8` of the destination from column `b0`.
    fn transpose_tile(&mut self, t: &TransposeNest<'_>, a0: &Val, b0: &Val) -> R<()> {
        let (a, b) = (t.a, t.b);
        let mt = mem_ty(t.dst.0.dtype);
        let vt = format!("<{TILE} x {mt}>");
        let at_offset = |e: &mut Self, base: &Val, var: &Var, k: i64| -> Val {
            if k == 0 {
                base.clone()
            } else {
                let ty = reg_ty(var.dtype);
                e.assign(&ty, format!("add nsw {ty} {}, {k}", base.v))
            }
        };
        let mut rows = Vec::with_capacity(TILE as usize);
        // A row of the tile: its first element's address as a pointer to the vector.
        let row =
            |e: &mut Self, (buffer, indices): (&Buffer, &[Expr]), av: Val, bv: Val| -> R<Val> {
                let addr = e.address_at(buffer, indices, &[(a, av), (b, bv)])?;
                Ok(e.assign(
                    &format!("{vt}*"),
                    format!("bitcast {} {addr} to {vt}*", Self::ptr(&mt)),
                ))
            };
        for r in 0..TILE {
            let bv = at_offset(self, b0, b, r);
            let p = row(self, t.src, a0.clone(), bv)?;
            rows.push(self.assign(&vt, format!("load {vt}, {vt}* {}, align 4", p.v)));
        }
        for stage in &STAGES {
            rows = stage
                .iter()
                .map(|(x, y, mask)| {
                    let m: Vec<String> = mask.iter().map(|k| format!("i32 {k}")).collect();
                    self.assign(
                        &vt,
                        format!(
                            "shufflevector {vt} {}, {vt} {}, <{TILE} x i32> <{}>",
                            rows[*x].v,
                            rows[*y].v,
                            m.join(", ")
                        ),
                    )
                })
                .collect();
        }
        for (c, col) in rows.iter().enumerate() {
            let av = at_offset(self, a0, a, c as i64);
            let p = row(self, t.dst, av, b0.clone())?;
            self.line(format!("store {vt} {}, {vt}* {}, align 4", col.v, p.v));
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
