//! Cross-entropy cases with an ignored target id: the plain loss and its backward, the count
//! of kept rows, and the fused loss head forward and both gradients. `case_data` puts the
//! ignored id at every third target.

use super::{lce_bwd_in, t};
use memc::ir::*;

/// Ignores -100, as Hugging Face labels do.
const HF: CeParams = CeParams {
    ignore_index: Some(-100),
};

/// The fused loss head's attributes, ignoring -100.
fn lce(chunk: usize, transposed: bool) -> LinearCe {
    LinearCe {
        ce: HF,
        ..super::lce(chunk, transposed)
    }
}

/// The ignored-id cases, as `super::cases` lists them.
pub fn cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    use DType::{F32, I32};
    let f = |s: &[usize]| t(F32, s);
    let bwd = |chunk, transposed, which| Op::LinearCrossEntropyBackward {
        lce: lce(chunk, transposed),
        which,
    };
    vec![
        (
            "cross_entropy_ignore",
            Op::CrossEntropy(HF),
            vec![f(&[2, 7, 50]), t(I32, &[2, 7]), f(&[])],
        ),
        // The ignored id is a class: rows of target 3 are dropped, class 3 stays in the rest.
        (
            "cross_entropy_bwd_ignore_class",
            Op::CrossEntropyBackward(CeParams {
                ignore_index: Some(3),
            }),
            vec![f(&[2, 7, 50]), t(I32, &[2, 7]), f(&[]), f(&[])],
        ),
        // More targets than the block has threads.
        ("kept_count", Op::KeptCount(HF), vec![t(I32, &[300])]),
        // Targets over three blocks of 2,048, the last one partial.
        ("kept_count_parts", Op::KeptCount(HF), vec![t(I32, &[5000])]),
        (
            "linear_ce_ignore",
            Op::LinearCrossEntropy(lce(3, false)),
            vec![f(&[2, 7, 16]), f(&[16, 50]), t(I32, &[2, 7])],
        ),
        (
            "linear_ce_bwd_x_ignore",
            bwd(3, false, LceGrad::Input),
            lce_bwd_in(&[2, 7], 16, &[16, 50]),
        ),
        (
            "linear_ce_bwd_w_ignore_tied",
            bwd(13, true, LceGrad::Weight),
            lce_bwd_in(&[40], 16, &[80, 16]),
        ),
    ]
}
