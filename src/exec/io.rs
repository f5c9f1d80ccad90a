//! Tensor files the backends read and write: `.npy` (inputs, dumps) and `.safetensors`
//! (parameters). Errors are messages naming the file and what is wrong in it.

use npyz::WriterBuilder;

/// Tensor data read from a file, with its shape.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<usize>, Vec<f32>),
    I32(Vec<usize>, Vec<i32>),
}

/// Reads a `.npy` array of f32 or i32 (i64 is narrowed when every value fits; booleans
/// become f32 0/1, a mask).
pub fn read_npy(bytes: &[u8]) -> Result<TensorData, String> {
    let npy = npyz::NpyFile::new(bytes).map_err(|e| format!("not a .npy file: {e}"))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let type_str = match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => return Err(format!("unsupported dtype {other:?}")),
    };
    let bad = |e: std::io::Error| format!("cannot read the data: {e}");
    match type_str.trim_start_matches(['<', '|', '=']) {
        "f4" => Ok(TensorData::F32(shape, npy.into_vec::<f32>().map_err(bad)?)),
        "i4" => Ok(TensorData::I32(shape, npy.into_vec::<i32>().map_err(bad)?)),
        "b1" => {
            let bits = npy.into_vec::<bool>().map_err(bad)?;
            Ok(TensorData::F32(
                shape,
                bits.into_iter()
                    .map(|b| if b { 1.0 } else { 0.0 })
                    .collect(),
            ))
        }
        "i8" => {
            let wide = npy.into_vec::<i64>().map_err(bad)?;
            let narrow: Result<Vec<i32>, _> = wide.iter().map(|&v| i32::try_from(v)).collect();
            Ok(TensorData::I32(
                shape,
                narrow.map_err(|_| "an int64 value does not fit in i32".to_string())?,
            ))
        }
        other => Err(format!(
            "unsupported dtype `{other}` (use float32, int32, int64 or bool)"
        )),
    }
}

/// Encodes an f32 array as `.npy` bytes.
pub fn write_npy(shape: &[usize], data: &[f32]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&dims)
        .writer(&mut out)
        .begin_nd()
        .map_err(|e| e.to_string())?;
    w.extend(data.iter().copied()).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Encodes named f32 tensors as a `.safetensors` file, with `metadata` in its header.
pub fn write_safetensors(
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<Vec<u8>, String> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, d)| d.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                .map(|v| (name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    safetensors::serialize(views, &metadata).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_npy_reads_as_a_float_mask() {
        let mut bytes = Vec::new();
        let mut w = npyz::WriteOptions::<bool>::new()
            .default_dtype()
            .shape(&[3])
            .writer(&mut bytes)
            .begin_nd()
            .expect("header");
        w.extend([true, false, true]).expect("data");
        w.finish().expect("finish");
        assert_eq!(
            read_npy(&bytes),
            Ok(TensorData::F32(vec![3], vec![1.0, 0.0, 1.0]))
        );
    }
}
