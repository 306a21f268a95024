//! `transform_layout`: packing a read-only buffer into another layout, described by [`AxisMap`]s.

use serde::{Deserialize, Serialize};

use super::{for_, imm, Schedule, ScheduleResult};
use crate::ir::rewrite::{self, rw_stmt, Rewriter};
use crate::ir::{Buffer, DataType, Expr, ForKind, Stmt, StorageScope, Var};

/// One dimension of a transformed layout: new index = `(old[axis] / div) % modulo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AxisMap {
    /// The old dimension it reads.
    pub axis: usize,
    /// Divisor (1 for none).
    #[serde(default = "one")]
    pub div: i64,
    /// Modulus (none: the whole quotient).
    #[serde(default)]
    pub modulo: Option<i64>,
}

fn one() -> i64 {
    1
}

impl AxisMap {
    /// `old[axis]`.
    pub fn id(axis: usize) -> AxisMap {
        AxisMap {
            axis,
            div: 1,
            modulo: None,
        }
    }
    /// `old[axis] / div`.
    pub fn outer(axis: usize, div: i64) -> AxisMap {
        AxisMap {
            axis,
            div,
            modulo: None,
        }
    }
    /// `old[axis] % modulo`.
    pub fn inner(axis: usize, modulo: i64) -> AxisMap {
        AxisMap {
            axis,
            div: 1,
            modulo: Some(modulo),
        }
    }
}

impl Schedule {
    /// The body of [`Schedule::transform_layout`] (which records it in the trace).
    pub(super) fn transform_layout_untraced(
        &mut self,
        buffer: &str,
        into: &str,
        dims: &[AxisMap],
    ) -> ScheduleResult<Vec<String>> {
        let old = self.find_buffer(buffer).ok_or_else(|| {
            self.form(
                "transform_layout",
                format!("found no parameter buffer `{buffer}`"),
            )
        })?;
        let (mut loads, mut stores) = (vec![], vec![]);
        rewrite::accesses(&self.func.body, buffer, &mut loads, &mut stores);
        if !stores.is_empty() {
            return Err(self.form(
                "transform_layout",
                format!("needs `{buffer}` to be read-only"),
            ));
        }
        let shape: Vec<i64> = old
            .shape
            .iter()
            .map(|e| e.as_int())
            .collect::<Option<_>>()
            .ok_or_else(|| {
                self.form(
                    "transform_layout",
                    format!("needs `{buffer}` to have a constant shape"),
                )
            })?;
        let mut taken = self.names();
        rewrite::allocated(&self.func.body, &mut taken);
        if self.find_buffer(into).is_some() || taken.iter().any(|n| n == into) {
            return Err(self.form(
                "transform_layout",
                format!("needs a new name for the packed buffer, found `{into}`, which is taken"),
            ));
        }
        if let Some(m) = dims
            .iter()
            .find(|m| m.div < 1 || m.modulo.is_some_and(|md| md < 1))
        {
            return Err(self.form(
                "transform_layout",
                format!("needs div >= 1 and modulo >= 1, found {m:?}"),
            ));
        }
        // ceil(e / d) for a dimension's extent e >= 0, without the overflow of e + d - 1.
        let ceil_div = |e: i64, d: i64| e.max(0) / d + i64::from(e.max(0) % d != 0);
        let mut new_shape = Vec::new();
        for m in dims {
            let Some(&e) = shape.get(m.axis) else {
                return Err(self.form(
                    "transform_layout",
                    format!(
                        "axis {} is out of range for `{buffer}` of rank {}",
                        m.axis,
                        shape.len()
                    ),
                ));
            };
            let q = ceil_div(e, m.div);
            new_shape.push(m.modulo.map_or(q, |md| md.min(q)));
        }
        // One-to-one: the old axes' strides of the map must cover each old extent exactly.
        for (a, &e) in shape.iter().enumerate() {
            let mut covered: Vec<(i64, i64)> = dims
                .iter()
                .filter(|m| m.axis == a)
                .map(|m| {
                    let reach = m.modulo.unwrap_or_else(|| ceil_div(e, m.div));
                    (m.div, m.div.saturating_mul(reach))
                })
                .collect();
            covered.sort();
            let mut next = 1;
            for (lo, hi) in covered {
                if lo != next {
                    next = -1;
                    break;
                }
                next = hi;
            }
            if next < e {
                return Err(self.form(
                    "transform_layout",
                    format!(
                        "map {dims:?} does not keep every index of axis {a} of `{buffer}` apart"
                    ),
                ));
            }
        }
        let names: Vec<String> = (0..shape.len())
            .map(|d| self.fresh(&format!("{into}_l{d}"), &[]))
            .collect();
        let t = DataType::i64();
        let nb = Buffer::new(
            into,
            old.dtype,
            new_shape.iter().map(|&e| imm(t, e)).collect(),
        )
        .with_scope(StorageScope::Workspace);
        let map_idx = |ix: &[Expr]| -> Vec<Expr> {
            dims.iter()
                .map(|m| {
                    let mut e = ix[m.axis].clone();
                    if ix[m.axis].dtype() != t {
                        e = e.cast(t);
                    }
                    if m.div != 1 {
                        e = e.floordiv(imm(t, m.div));
                    }
                    if let Some(md) = m.modulo {
                        e = e.floormod(imm(t, md));
                    }
                    e
                })
                .collect()
        };
        // The fill nest.
        let vars: Vec<Var> = names.iter().map(|n| Var::new(n, t)).collect();
        let ix: Vec<Expr> = vars.iter().map(|v| Expr::Var(v.clone())).collect();
        let mut fill = nb.store(map_idx(&ix), old.load(ix.clone()));
        for (v, &e) in vars.iter().zip(&shape).rev() {
            fill = for_(v.clone(), imm(t, 0), imm(t, e), ForKind::Serial, fill);
        }
        struct Redirect<'a> {
            name: &'a str,
            nb: &'a Buffer,
            map: &'a dyn Fn(&[Expr]) -> Vec<Expr>,
        }
        impl Rewriter for Redirect<'_> {
            fn post_expr(&mut self, e: Expr) -> Expr {
                match &e {
                    Expr::Load { buffer, indices } if buffer.name == self.name => {
                        self.nb.load((self.map)(indices))
                    }
                    _ => e,
                }
            }
        }
        let body = rw_stmt(
            &mut Redirect {
                name: buffer,
                nb: &nb,
                map: &map_idx,
            },
            &self.func.body,
        );
        self.func.body = nb.allocate(Stmt::Seq(vec![fill, body]));
        Ok(names)
    }
}
