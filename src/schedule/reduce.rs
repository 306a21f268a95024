//! `rfactor`: factoring a reduction into vectorizable partial results.

use super::{for_, imm, parts, Schedule, ScheduleResult};
use crate::ir::builder::Reducer;
use crate::ir::{BinOp, Buffer, DataType, Expr, ForKind, Stmt, StorageScope, Var};

impl Schedule {
    /// The body of [`Schedule::rfactor`] (which records it in the trace).
    pub(super) fn rfactor_untraced(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        let fin = self.fresh(&format!("{inner}_r"), &[]);
        let init = self.fresh(&format!("{inner}_z"), std::slice::from_ref(&fin));
        let mut tree_names: Vec<String> = Vec::new();
        for k in 0..62 {
            let taken: Vec<String> = [fin.clone(), init.clone()]
                .into_iter()
                .chain(tree_names.iter().cloned())
                .collect();
            tree_names.push(self.fresh(&format!("{inner}_t{k}"), &taken));
        }
        let mut problem = false;
        let rfname = self.fresh_buffer("rf");
        self.edit(outer, &mut |s, _| {
            let (vo, mo, eo, ko, body) = parts(s);
            let Stmt::For { var: vi, min: mi, extent: ei, kind: ki, body: ib } = body else {
                problem = true;
                return Ok(s.clone());
            };
            let (Some(ext), Some(0), true) = (ei.as_int(), mi.as_int(), &*vi.name == inner) else {
                problem = true;
                return Ok(s.clone());
            };
            let Stmt::Store { buffer, indices, value } = &**ib else {
                problem = true;
                return Ok(s.clone());
            };
            let same = |e: &Expr| matches!(e, Expr::Load { buffer: b, indices: i } if b.name == buffer.name && i == indices);
            let (reducer, f) = match value {
                Expr::Binary { op: BinOp::Add, a, b } if same(a) => (Reducer::Sum, (**b).clone()),
                Expr::Binary { op: BinOp::Max, a, b } if same(a) => (Reducer::Max, (**b).clone()),
                Expr::Binary { op: BinOp::Min, a, b } if same(a) => (Reducer::Min, (**b).clone()),
                _ => {
                    problem = true;
                    return Ok(s.clone());
                }
            };
            if indices.iter().any(|i| i.mentions(vo) || i.mentions(vi)) {
                problem = true;
                return Ok(s.clone());
            }
            let t = vi.dtype;
            let rf = Buffer::new(&rfname, buffer.dtype, vec![imm(DataType::i64(), ext)])
                .with_scope(StorageScope::Local);
            let at = |v: &Var| {
                vec![super::cast_to(Expr::Var(v.clone()), DataType::i64())]
            };
            let vz = Var::new(&init, t);
            let zero = for_(vz.clone(), imm(t, 0), imm(t, ext), ForKind::Vectorized, rf.store(at(&vz), reducer.init(buffer.dtype)));
            let upd = for_(
                vo.clone(),
                mo.clone(),
                eo.clone(),
                ko,
                for_(vi.clone(), mi.clone(), ei.clone(), *ki, rf.store(at(vi), reducer.combine(rf.load(at(vi)), f))),
            );
            let mut seq = vec![zero, upd];
            if ext >= 4 && (ext as u64).is_power_of_two() {
                // A tree of vector halvings, `rf[r] op= rf[r + h]` for h = ext/2 .. 2, then
                // `X op= rf[0] op rf[1]`: log2(ext) dependent steps instead of ext.
                let mut h = ext / 2;
                let mut k = 0;
                while h >= 2 {
                    let v = Var::new(&tree_names[k], t);
                    let r = super::cast_to(Expr::Var(v.clone()), DataType::i64());
                    let shifted = vec![r.clone() + imm(DataType::i64(), h)];
                    seq.push(for_(
                        v,
                        imm(t, 0),
                        imm(t, h),
                        ForKind::Vectorized,
                        rf.store(vec![r.clone()], reducer.combine(rf.load(vec![r]), rf.load(shifted))),
                    ));
                    h /= 2;
                    k += 1;
                }
                let z = |i: i64| vec![imm(DataType::i64(), i)];
                seq.push(buffer.store(
                    indices.clone(),
                    reducer.combine(buffer.load(indices.clone()), reducer.combine(rf.load(z(0)), rf.load(z(1)))),
                ));
            } else {
                let vr = Var::new(&fin, t);
                seq.push(for_(
                    vr.clone(),
                    imm(t, 0),
                    imm(t, ext),
                    ForKind::Serial,
                    buffer.store(indices.clone(), reducer.combine(buffer.load(indices.clone()), rf.load(at(&vr)))),
                ));
            }
            Ok(rf.allocate(Stmt::Seq(seq)))
        })?;
        if problem {
            return Err(self.form(
                "rfactor",
                format!("needs `for {outer} {{ for {inner} (min 0, constant extent) {{ X[ix] = X[ix] +|max|min f }} }}` with `ix` independent of both loops"),
            ));
        }
        Ok(init)
    }
}
