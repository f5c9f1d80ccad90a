//! Embedding lookup and its deterministic scatter-add backward; ids are range-checked.

use rayon::prelude::*;

use crate::exec::kernels::check_ids;
use crate::exec::ExecError;

/// Gathers rows of `table` [rows, dim] by `ids` (any shape) into `out` [ids.len(), dim].
/// Errs on an id outside `0..rows`; nothing happens when `dim` is 0.
pub fn embedding(table: &[f32], dim: usize, ids: &[i32], out: &mut [f32]) -> Result<(), ExecError> {
    if dim == 0 {
        return Ok(());
    }
    check_ids(ids, table.len() / dim, None)?;
    out.par_chunks_mut(dim)
        .zip(ids.par_iter())
        .for_each(|(row, &id)| {
            let id = id as usize;
            row.copy_from_slice(&table[id * dim..(id + 1) * dim]);
        });
    Ok(())
}

/// Overwrites `dtable` [rows, dim] with the scatter-add of `dy` rows by id, summing repeated
/// ids in id-list order (deterministic) and skipping ids equal to `padding_idx` (that row
/// stays zero). Errs on an id outside `0..rows`.
pub fn embedding_backward(
    ids: &[i32],
    dy: &[f32],
    dim: usize,
    padding_idx: Option<usize>,
    dtable: &mut [f32],
) -> Result<(), ExecError> {
    dtable.fill(0.0);
    if dim == 0 {
        return Ok(());
    }
    check_ids(ids, dtable.len() / dim, None)?;
    for (&id, g) in ids.iter().zip(dy.chunks(dim)) {
        let id = id as usize;
        if Some(id) == padding_idx {
            continue;
        }
        dtable[id * dim..(id + 1) * dim]
            .iter_mut()
            .zip(g)
            .for_each(|(d, g)| *d += g);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_ids_err() {
        let mut out = [0.0; 8];
        let err = ExecError::IdOutOfRange { value: 3, limit: 3 };
        assert_eq!(
            embedding(&[0.0; 6], 2, &[3], &mut out[..2]),
            Err(err.clone())
        );
        assert_eq!(
            embedding_backward(&[0, 3], &[0.0; 4], 2, None, &mut out[..6]),
            Err(err)
        );
    }

    #[test]
    fn embedding_gather_and_scatter_add() -> Result<(), ExecError> {
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [4, 3]
        let ids = [2, 0, 2, 3];
        let mut out = vec![f32::NAN; 12];
        embedding(&table, 3, &ids, &mut out)?;
        assert_eq!(
            out,
            [6.0, 7.0, 8.0, 0.0, 1.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
        );
        let dy: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
        let mut dt = vec![f32::NAN; 12];
        embedding_backward(&ids, &dy, 3, None, &mut dt)?;
        assert_eq!(
            dt,
            [1.5, 2.0, 2.5, 0.0, 0.0, 0.0, 3.0, 4.0, 5.0, 4.5, 5.0, 5.5]
        );
        // Row 2 as the padding row: its two ids add nothing.
        embedding_backward(&ids, &dy, 3, Some(2), &mut dt)?;
        assert_eq!(
            dt,
            [1.5, 2.0, 2.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.5, 5.0, 5.5]
        );
        Ok(())
    }
}
