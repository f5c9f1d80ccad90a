//! Constant tensors of an ONNX graph: decoding `TensorProto`s, and the element data the
//! folder computes with (f32 for floating types, i64 for integer and boolean ones).

use super::proto::TensorProto;

/// ONNX element type codes memc reads.
pub const FLOAT: i32 = 1;
const UINT8: i32 = 2;
const INT8: i32 = 3;
const INT32: i32 = 6;
const INT64: i32 = 7;
/// ONNX's boolean element type code.
pub const BOOL: i32 = 9;
const DOUBLE: i32 = 11;

/// The ONNX name of an element type code, for diagnostics.
pub fn dtype_name(code: i32) -> String {
    let name = match code {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17 => "float8e4m3fn",
        18 => "float8e4m3fnuz",
        19 => "float8e5m2",
        20 => "float8e5m2fnuz",
        21 => "uint4",
        22 => "int4",
        23 => "float4e2m1",
        _ => return format!("type code {code}"),
    };
    name.to_string()
}

/// True for the codes whose values [`Data::Int`] holds exactly.
pub fn is_integer(code: i32) -> bool {
    matches!(code, UINT8 | INT8 | 4 | 5 | INT32 | INT64 | BOOL | 12 | 13)
}

/// Element storage: floating values as f32, integers and booleans as i64.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Float(Vec<f32>),
    Int(Vec<i64>),
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::Float(v) => v.len(),
            Data::Int(v) => v.len(),
        }
    }

    /// Element `i` as f64 (exact for every f32 and for integers below 2^53).
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Data::Float(v) => f64::from(v[i]),
            Data::Int(v) => v[i] as f64,
        }
    }

    /// Elements `idx` of this data, in that order, of the same kind.
    pub fn take(&self, idx: &[usize]) -> Data {
        match self {
            Data::Float(v) => Data::Float(idx.iter().map(|&i| v[i]).collect()),
            Data::Int(v) => Data::Int(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

/// A constant tensor. `dims[i]`, when present, names the model dim that element `i` equals
/// (shape values read from a dynamic input), so a reshape target can stay symbolic.
#[derive(Debug, Clone, PartialEq)]
pub struct Const {
    pub shape: Vec<usize>,
    pub data: Data,
    pub dims: Vec<Option<String>>,
}

impl Const {
    /// A constant without dim names.
    pub fn new(shape: Vec<usize>, data: Data) -> Const {
        Const {
            shape,
            data,
            dims: Vec::new(),
        }
    }

    /// The dim name of element `i`, if it has one.
    pub fn dim_of(&self, i: usize) -> Option<&str> {
        self.dims.get(i).and_then(|d| d.as_deref())
    }

    /// True when some element is a named dim.
    pub fn has_dims(&self) -> bool {
        self.dims.iter().any(Option::is_some)
    }

    /// Elements `idx` with their dim names, shaped `shape`.
    pub fn take(&self, idx: &[usize], shape: Vec<usize>) -> Const {
        let dims = if self.has_dims() {
            idx.iter().map(|&i| self.dims[i].clone()).collect()
        } else {
            Vec::new()
        };
        Const {
            shape,
            data: self.data.take(idx),
            dims,
        }
    }

    /// All elements as integers (truncating floats).
    pub fn ints(&self) -> Vec<i64> {
        (0..self.data.len())
            .map(|i| self.data.get(i) as i64)
            .collect()
    }

    /// All elements as f32.
    pub fn floats(&self) -> Vec<f32> {
        match &self.data {
            Data::Float(v) => v.clone(),
            Data::Int(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
}

/// An eight-byte chunk of raw tensor data as an array.
fn eight(c: &[u8]) -> [u8; 8] {
    let mut b = [0u8; 8];
    b.copy_from_slice(c);
    b
}

/// Decodes a tensor; the error says what is wrong with it (the caller names where it is).
pub fn decode(t: &TensorProto) -> Result<Const, String> {
    if t.data_location == 1 {
        return Err("its data is stored in an external file, which memc does not read".into());
    }
    let mut shape = Vec::new();
    for &d in &t.dims {
        shape.push(usize::try_from(d).map_err(|_| format!("it has a negative dim {d}"))?);
    }
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n < 1 << 40)
        .ok_or("its shape is too large")?;
    let raw = &t.raw_data;
    let from_raw = |width: usize| -> Result<Vec<&[u8]>, String> {
        if raw.len() != numel * width {
            return Err(format!(
                "its raw data has {} bytes, but {numel} elements of {width} bytes need {}",
                raw.len(),
                numel * width
            ));
        }
        Ok(raw.chunks_exact(width).collect())
    };
    let data = match t.data_type {
        FLOAT if !raw.is_empty() => Data::Float(
            from_raw(4)?
                .iter()
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        FLOAT => Data::Float(t.float_data.clone()),
        DOUBLE if !raw.is_empty() => Data::Float(
            from_raw(8)?
                .iter()
                .map(|c| f64::from_le_bytes(eight(c)) as f32)
                .collect(),
        ),
        DOUBLE => Data::Float(t.double_data.iter().map(|&x| x as f32).collect()),
        INT64 if !raw.is_empty() => Data::Int(
            from_raw(8)?
                .iter()
                .map(|c| i64::from_le_bytes(eight(c)))
                .collect(),
        ),
        INT64 => Data::Int(t.int64_data.clone()),
        INT32 if !raw.is_empty() => Data::Int(
            from_raw(4)?
                .iter()
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        BOOL | UINT8 if !raw.is_empty() => {
            Data::Int(from_raw(1)?.iter().map(|c| i64::from(c[0])).collect())
        }
        INT8 if !raw.is_empty() => {
            Data::Int(from_raw(1)?.iter().map(|c| i64::from(c[0] as i8)).collect())
        }
        INT32 | BOOL | UINT8 | INT8 => {
            Data::Int(t.int32_data.iter().map(|&x| i64::from(x)).collect())
        }
        other => {
            return Err(format!(
                "its element type {} is not supported (memc reads float, double, int8/32/64, uint8 and bool)",
                dtype_name(other)
            ))
        }
    };
    if data.len() != numel {
        return Err(format!(
            "it has {} values for shape {shape:?} ({numel} elements)",
            data.len()
        ));
    }
    Ok(Const::new(shape, data))
}

#[cfg(test)]
mod tests {
    use super::dtype_name;

    #[test]
    fn element_types_are_named_up_to_float4() {
        assert_eq!(dtype_name(1), "float");
        assert_eq!(dtype_name(17), "float8e4m3fn");
        assert_eq!(dtype_name(22), "int4");
        assert_eq!(dtype_name(23), "float4e2m1");
        assert_eq!(dtype_name(99), "type code 99");
    }
}
