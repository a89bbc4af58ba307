//! Every part of the paper the reproduction covers, with whether it is implemented: the report lists
//! any part that is not, instead of ever printing a number it did not compute.

/// One deliverable of the paper's reproduction.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    /// Table or figure, as the paper names it.
    pub name: &'static str,
    /// What it measures.
    pub what: &'static str,
    /// `None` when implemented, else the piece of work it is waiting for.
    pub missing: Option<&'static str>,
}

/// Every part of the reproduction, in the paper's order.
pub const PARTS: &[Part] = &[
    Part { name: "Table 1", what: "softmax / inverse / re-centered / re-centered & l1, val loss at 1x", missing: None },
    Part { name: "Table 2", what: "normalisation scenarios I-IV, val loss at 1x", missing: None },
    Part { name: "Table 3", what: "activations with l1 normalisation, val loss at 1x", missing: None },
    Part { name: "Table 4", what: "length extrapolation 1x..16x, incl. re-weighted rows (p = 3, 15)", missing: None },
    Part { name: "Figure 1", what: "val loss vs inference length, softmax vs LSSA vs LSSAR", missing: None },
    Part { name: "Figure 2", what: "sweep over re-weighting power p", missing: None },
    Part {
        name: "Retrieval",
        what: "associative recall among distractors, small models trained from scratch, accuracy vs prompt length inside and beyond T_train",
        missing: None,
    },
    Part { name: "Attention sinks", what: "weight on the first key and row entropy vs length", missing: None },
    Part {
        name: "Downstream",
        what: "zero-shot multiple choice (lm-eval scoring; runs with --downstream DIR of user-supplied files)",
        missing: None,
    },
    Part { name: "Newton's law", what: "symbolic regression on orbit-trained transformers", missing: None },
];
