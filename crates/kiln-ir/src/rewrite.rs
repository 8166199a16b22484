//! A small rewrite engine: rules map a node to a replacement, applied bottom-up until no
//! rule fires. Backends use it as a decompositor (ops they lack, in ops they have).

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::uop::UOp;

/// One rule: `Some(replacement)` when it applies to the node (whose children are already
/// rewritten), `None` otherwise.
pub type Rule = Box<dyn Fn(&Arc<UOp>) -> Option<Arc<UOp>> + Send + Sync>;

/// An ordered list of rules; the first that applies wins.
#[derive(Default)]
pub struct RewriteRules {
    rules: Vec<Rule>,
}

impl RewriteRules {
    /// No rules: `rewrite` returns its input.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `rule` after the existing ones (earlier rules win when several apply).
    pub fn with(mut self, rule: impl Fn(&Arc<UOp>) -> Option<Arc<UOp>> + Send + Sync + 'static) -> Self {
        self.rules.push(Box::new(rule));
        self
    }

    /// Rewrites the graph under `root` to a fixpoint. A replacement is itself rewritten, so
    /// rules must make progress (each replacement must eventually match no rule).
    pub fn rewrite(&self, root: &Arc<UOp>) -> Arc<UOp> {
        let mut memo: HashMap<*const UOp, Arc<UOp>> = HashMap::default();
        let mut out = root.clone();
        for _ in 0..64 {
            let next = self.pass(&out, &mut memo);
            if Arc::ptr_eq(&next, &out) {
                break;
            }
            memo.clear();
            out = next;
        }
        out
    }

    fn pass(&self, root: &Arc<UOp>, memo: &mut HashMap<*const UOp, Arc<UOp>>) -> Arc<UOp> {
        for node in root.toposort() {
            let src: Vec<Arc<UOp>> = node.src().iter().map(|s| memo[&Arc::as_ptr(s)].clone()).collect();
            let changed = src.iter().zip(node.src()).any(|(a, b)| !Arc::ptr_eq(a, b));
            let mut new = if changed { node.with_src(src) } else { node.clone() };
            for _ in 0..64 {
                match self.rules.iter().find_map(|r| r(&new)) {
                    Some(r) if !Arc::ptr_eq(&r, &new) => new = r,
                    _ => break,
                }
            }
            memo.insert(Arc::as_ptr(&node), new);
        }
        memo[&Arc::as_ptr(root)].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arg, DType, Op};

    #[test]
    fn decomposes_sub_into_add_neg() {
        let a = UOp::index_const(5);
        let b = UOp::index_const(3);
        let sub = UOp::new(Op::Sub, DType::I32, Arg::None, vec![a.clone(), b.clone()]);
        let rules = RewriteRules::new().with(|n| {
            (n.op() == Op::Sub).then(|| {
                let neg = UOp::new(Op::Neg, n.dtype(), Arg::None, vec![n.src()[1].clone()]);
                UOp::new(Op::Add, n.dtype(), Arg::None, vec![n.src()[0].clone(), neg])
            })
        });
        let out = rules.rewrite(&sub);
        assert_eq!(out.op(), Op::Add);
        assert_eq!(out.src()[1].op(), Op::Neg);
        assert_eq!(crate::eval_int(&out, &|_| None).unwrap(), 2);
    }
}
