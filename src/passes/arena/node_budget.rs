//! The node budget of the exact layout search: a deterministic count of search nodes with a
//! wall-clock safety cap.

use std::time::Instant;

/// A deterministic node budget with a wall-clock safety cap.
#[derive(Debug, Clone)]
pub(crate) struct SearchBudget {
    nodes_left: u64,
    deadline: Instant,
    ticks: u32,
}

impl SearchBudget {
    /// `nodes` search nodes, but never past `deadline`.
    pub fn new(nodes: u64, deadline: Instant) -> SearchBudget {
        SearchBudget {
            nodes_left: nodes,
            deadline,
            ticks: 0,
        }
    }

    /// Nodes not yet spent.
    pub fn remaining(&self) -> u64 {
        self.nodes_left
    }

    /// True once no node is left (or the clock ran out).
    pub fn exhausted(&self) -> bool {
        self.nodes_left == 0
    }

    /// Spends one node; false when none is left. Reads the clock every 4096 nodes.
    pub(super) fn take(&mut self) -> bool {
        if self.nodes_left == 0 {
            return false;
        }
        self.nodes_left -= 1;
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(4096) && Instant::now() >= self.deadline {
            self.nodes_left = 0;
        }
        true
    }
}
