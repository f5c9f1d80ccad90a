//! Where the tiled axes sit in a value: each dim as a run of atoms, plain extents or one
//! tiled axis on its grid, and how reshapes and broadcasting move them.

use std::collections::VecDeque;

/// How a value's elements along a tiled axis relate to the input's voxels: element `j`
/// stands for the voxels `[j*r, (j+1)*r)` (its cell) and depends on at most the voxels
/// `[j*r - lo, (j+1)*r - 1 + hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Input voxels per element (the product of the strides on the way, over upsamplings).
    pub r: usize,
    /// Voxels before the cell that an element may read.
    pub lo: usize,
    /// Voxels after the cell that an element may read.
    pub hi: usize,
}

impl Grid {
    /// The input's own grid: one voxel per element, reading only itself.
    pub const INPUT: Grid = Grid { r: 1, lo: 0, hi: 0 };

    /// The grid that reads whatever `self` or `other` reads; None when their cells differ.
    pub fn union(self, other: Grid) -> Option<Grid> {
        (self.r == other.r).then_some(Grid {
            r: self.r,
            lo: self.lo.max(other.lo),
            hi: self.hi.max(other.hi),
        })
    }
}

/// A factor of one dim: a plain extent, or tiled axis `axis` (its `extent` elements on `grid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atom {
    Plain(usize),
    Tiled {
        axis: usize,
        extent: usize,
        grid: Grid,
    },
}

impl Atom {
    /// The number of elements this factor spans.
    pub fn extent(self) -> usize {
        match self {
            Atom::Plain(e) | Atom::Tiled { extent: e, .. } => e,
        }
    }

    /// Whether this factor is a tiled axis.
    pub fn is_tiled(self) -> bool {
        matches!(self, Atom::Tiled { .. })
    }
}

/// A dim as its factors, outermost first; an empty run is extent 1.
pub type Dim = Vec<Atom>;

/// Whether any factor of `dim` is a tiled axis.
pub fn has_tiled(dim: &[Atom]) -> bool {
    dim.iter().any(|a| a.is_tiled())
}

/// A value's dims as factors, and whether it is computed from constant fills alone (which
/// hold the same values at every size, so they may stand along a tiled axis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub dims: Vec<Dim>,
    pub from_fills: bool,
}

impl Layout {
    /// A layout of `shape` without tiled axes.
    pub fn plain(shape: &[usize], from_fills: bool) -> Layout {
        Layout {
            dims: shape.iter().map(|&e| plain_dim(e)).collect(),
            from_fills,
        }
    }

    /// Whether any dim holds a tiled axis.
    pub fn is_tiled(&self) -> bool {
        self.dims.iter().any(|d| has_tiled(d))
    }

    /// Every tiled factor, in dim order.
    pub fn tiled_atoms(&self) -> impl Iterator<Item = Atom> + '_ {
        self.dims.iter().flatten().copied().filter(|a| a.is_tiled())
    }
}

/// A plain dim of extent `e` (no factors when 1).
pub fn plain_dim(e: usize) -> Dim {
    if e == 1 {
        Vec::new()
    } else {
        vec![Atom::Plain(e)]
    }
}

/// `dims` regrouped into `shape` (the same elements, row-major), splitting plain factors
/// where a new dim boundary falls inside them; None when a boundary falls inside a tiled
/// axis or the factors cannot be regrouped.
pub fn reshape(dims: &[Dim], shape: &[usize]) -> Option<Vec<Dim>> {
    let mut atoms: VecDeque<Atom> = dims
        .iter()
        .flatten()
        .copied()
        .filter(|a| a.extent() != 1)
        .collect();
    let mut out = Vec::with_capacity(shape.len());
    for &e in shape {
        let mut group = Vec::new();
        let mut have = 1usize;
        while have < e {
            let a = atoms.pop_front()?;
            let x = a.extent();
            if e % (have * x) == 0 {
                group.push(a);
                have *= x;
                continue;
            }
            let need = e / have;
            match a {
                Atom::Plain(x) if e % have == 0 && x % need == 0 => {
                    group.push(Atom::Plain(need));
                    atoms.push_front(Atom::Plain(x / need));
                    have = e;
                }
                _ => return None,
            }
        }
        if have != e {
            return None;
        }
        out.push(group);
    }
    atoms.is_empty().then_some(out)
}

/// The dim that reads both `a` and `b` elementwise: the tiled one when one of them is plain
/// (the caller decides whether the plain one may stand there), their grids' union when both
/// are tiled the same way; None when their tiled axes differ.
pub fn merge(a: &[Atom], b: &[Atom]) -> Option<Dim> {
    match (has_tiled(a), has_tiled(b)) {
        (false, _) => Some(b.to_vec()),
        (true, false) => Some(a.to_vec()),
        (true, true) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .map(|(&x, &y)| match (x, y) {
                (Atom::Plain(p), Atom::Plain(q)) => (p == q).then_some(x),
                (
                    Atom::Tiled { axis, extent, grid },
                    Atom::Tiled {
                        axis: axis2,
                        extent: extent2,
                        grid: grid2,
                    },
                ) if axis == axis2 && extent == extent2 => grid
                    .union(grid2)
                    .map(|grid| Atom::Tiled { axis, extent, grid }),
                _ => None,
            })
            .collect(),
        (true, true) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled(axis: usize, extent: usize) -> Atom {
        Atom::Tiled {
            axis,
            extent,
            grid: Grid::INPUT,
        }
    }

    #[test]
    fn reshape_merges_and_splits_tiled_axes_whole() {
        let dims = vec![
            vec![Atom::Plain(2)],
            vec![Atom::Plain(3)],
            vec![tiled(0, 8)],
            vec![tiled(1, 8)],
        ];
        let merged = vec![
            vec![Atom::Plain(2)],
            vec![Atom::Plain(3)],
            vec![tiled(0, 8), tiled(1, 8)],
        ];
        assert_eq!(reshape(&dims, &[2, 3, 64]), Some(merged.clone()));
        let back = vec![
            vec![Atom::Plain(2), Atom::Plain(3)],
            vec![tiled(0, 8)],
            vec![tiled(1, 8)],
        ];
        assert_eq!(reshape(&merged, &[6, 8, 8]), Some(back));
        assert!(reshape(&dims, &[2, 3, 4, 16]).is_none(), "splits axis 0");
    }

    #[test]
    fn reshape_splits_plain_factors() {
        let dims = vec![vec![Atom::Plain(12)], vec![tiled(0, 4)]];
        let out = vec![
            vec![Atom::Plain(3)],
            vec![Atom::Plain(4)],
            vec![tiled(0, 4)],
        ];
        assert_eq!(reshape(&dims, &[3, 4, 4]), Some(out));
    }

    #[test]
    fn merge_takes_the_wider_reach_and_refuses_other_axes() {
        let a = vec![Atom::Tiled {
            axis: 0,
            extent: 4,
            grid: Grid { r: 2, lo: 3, hi: 1 },
        }];
        let b = vec![Atom::Tiled {
            axis: 0,
            extent: 4,
            grid: Grid { r: 2, lo: 1, hi: 5 },
        }];
        assert_eq!(
            merge(&a, &b),
            Some(vec![Atom::Tiled {
                axis: 0,
                extent: 4,
                grid: Grid { r: 2, lo: 3, hi: 5 }
            }])
        );
        assert!(merge(&a, &[tiled(1, 4)]).is_none());
        assert_eq!(merge(&[Atom::Plain(4)], &a), Some(a));
    }
}
