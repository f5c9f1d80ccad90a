//! Matrix products as library calls: a [`Gemm`] is one cuBLASLt matmul described the way
//! cuBLASLt takes it (column-major operands with leading dimensions, transposes, a strided
//! batch, `alpha`, `beta`), over arena addresses given relative to a step's buffers. The CUDA
//! executor runs it through cuBLASLt; [`Gemm::reference`] runs the same descriptor on the
//! host (fp32 accumulation in `k` order, one rounding on store), which is how the shim tests
//! check the descriptor logic against the CPU backend without a GPU.
//!
//! A step that calls libraries lists its [`Call`]s in order: GEMMs and launches of its own
//! kernel (with a phase and a chunk index), so a chunked computation such as the fused loss
//! head alternates library GEMMs with its elementwise kernels.

use crate::exec::lowp;
use crate::ir::DType;
use serde::Serialize;

/// An arena address relative to one of the step's buffers: its byte offset plus `.1` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Addr {
    /// Input `.0` of the step's op.
    Input(usize, u64),
    /// The step's output.
    Output(u64),
    /// The step's workspace.
    Workspace(u64),
}

/// A row-major operand of [`Gemm::row_major`]: its address, element type, whether it is
/// read transposed, and the elements between the starts of its stored rows.
pub type RowMajor = (Addr, DType, bool, u64);

/// One column-major operand as stored: `rows x cols` elements of `dtype`, column `j` starting
/// `ld * j` elements after `at`, batch item `z` a further `stride * z` elements on (0: the
/// same matrix for every item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Matrix {
    /// Where element (0, 0) of batch item 0 lives.
    pub at: Addr,
    /// Element type.
    pub dtype: DType,
    /// Rows as stored.
    pub rows: u64,
    /// Columns as stored.
    pub cols: u64,
    /// Elements between the starts of consecutive columns (at least `rows`).
    pub ld: u64,
    /// Elements between consecutive batch items.
    pub stride: u64,
}

impl Matrix {
    /// A row-major `rows x cols` matrix with `row_stride` elements between rows, seen the way
    /// a column-major library sees its bytes: `cols x rows` with leading dimension
    /// `row_stride`.
    pub fn row_major(at: Addr, dtype: DType, (rows, cols): (u64, u64), row_stride: u64) -> Matrix {
        Matrix {
            at,
            dtype,
            rows: cols,
            cols: rows,
            ld: row_stride,
            stride: 0,
        }
    }

    /// The same matrix with batch items `stride` elements apart.
    pub fn batched(self, stride: u64) -> Matrix {
        Matrix { stride, ..self }
    }

    /// Element index of (`r`, `c`) in batch item `z`, relative to `at`.
    fn index(&self, z: u64, r: u64, c: u64) -> u64 {
        z * self.stride + c * self.ld + r
    }
}

/// What cuBLASLt does beside the product, in D's type (its default bias type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Epilogue {
    /// Nothing: `CUBLASLT_EPILOGUE_DEFAULT`.
    Plain,
    /// The `m`-element vector at this address added to every column of `D` (each row of the
    /// row-major output) before the rounding, the same for every batch item:
    /// `CUBLASLT_EPILOGUE_BIAS`.
    Bias(Addr),
    /// The sums over `k` of `op(A)`'s rows (the row-major right operand's column sums: a
    /// bias gradient beside its weight gradient), accumulated in fp32 and stored once as `m`
    /// elements at this address: `CUBLASLT_EPILOGUE_BGRADA`. One batch item only.
    BiasGrad(Addr),
}

/// `D = alpha * op(A) op(B) + beta * D` over `batch` items, column-major, fp32 accumulation
/// and scaling (`op` transposes where `trans_a` / `trans_b`), with its [`Epilogue`]:
/// cuBLASLt's matmul with C = D.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gemm {
    /// `A`, `m x k` after `op`.
    pub a: Matrix,
    /// `B`, `k x n` after `op`.
    pub b: Matrix,
    /// `D`, `m x n`; also read when `beta` is not 0.
    pub d: Matrix,
    /// Whether `A` is used transposed.
    pub trans_a: bool,
    /// Whether `B` is used transposed.
    pub trans_b: bool,
    /// Batch items.
    pub batch: u64,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of `D`'s prior contents (0: not read).
    pub beta: f32,
    /// What is added to `D` or computed beside it.
    pub epilogue: Epilogue,
}

impl Gemm {
    /// The row-major product `out = op(x) @ op(y)` (`out` `m x n`; `x` `m x k` after `op`,
    /// stored `[m, k]`, or `[k, m]` when transposed; `y` `k x n` after `op`, stored `[k, n]` or
    /// `[n, k]`), each operand given as (address, type, transposed, elements between stored
    /// rows) and `out` as (address, type, row stride): the column-major
    /// `out^T = op(y)^T op(x)^T`, so cuBLASLt's `A` is `y` and its `B` is `x`. One item,
    /// `alpha` 1, `beta` 0 (see [`Gemm::batched`], [`Gemm::scaled`]).
    pub fn row_major(
        x: RowMajor,
        y: RowMajor,
        (out, out_ty, out_stride): (Addr, DType, u64),
        (m, n, k): (u64, u64, u64),
    ) -> Gemm {
        let stored = |(at, dtype, t, stride): RowMajor, rows: u64, cols: u64| {
            let dims = if t { (cols, rows) } else { (rows, cols) };
            Matrix::row_major(at, dtype, dims, stride)
        };
        Gemm {
            a: stored(y, k, n),
            b: stored(x, m, k),
            d: Matrix::row_major(out, out_ty, (m, n), out_stride),
            trans_a: y.2,
            trans_b: x.2,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            epilogue: Epilogue::Plain,
        }
    }

    /// The same product over `batch` items, `x`, `y` and `out` advancing by the given
    /// elements from one item to the next.
    pub fn batched(self, batch: u64, (x, y, out): (u64, u64, u64)) -> Gemm {
        Gemm {
            batch,
            a: self.a.batched(y),
            b: self.b.batched(x),
            d: self.d.batched(out),
            ..self
        }
    }

    /// The same product scaled by `alpha`, added to `beta` times `D`'s prior contents.
    pub fn scaled(self, alpha: f32, beta: f32) -> Gemm {
        Gemm {
            alpha,
            beta,
            ..self
        }
    }

    /// The same product with the `m`-element vector at `at` added to each column of `D`.
    pub fn with_bias(self, at: Addr) -> Gemm {
        Gemm {
            epilogue: Epilogue::Bias(at),
            ..self
        }
    }

    /// The same product also storing `op(A)`'s row sums over `k` (the row-major right
    /// operand's column sums) as `m` elements of `D`'s type at `at`.
    pub fn with_bias_grad(self, at: Addr) -> Gemm {
        Gemm {
            epilogue: Epilogue::BiasGrad(at),
            ..self
        }
    }

    /// The vector the epilogue reads or writes, as a matrix of one column.
    pub fn epilogue_vector(&self) -> Option<Matrix> {
        match self.epilogue {
            Epilogue::Plain => None,
            Epilogue::Bias(at) | Epilogue::BiasGrad(at) => Some(self.bias_vector(at)),
        }
    }

    /// Rows of `D`.
    pub fn m(&self) -> u64 {
        self.d.rows
    }

    /// Columns of `D`.
    pub fn n(&self) -> u64 {
        self.d.cols
    }

    /// The shared dimension.
    pub fn k(&self) -> u64 {
        if self.trans_a {
            self.a.rows
        } else {
            self.a.cols
        }
    }

    /// Runs the product on the host over `arena`, `base` giving each address's byte offset:
    /// every element of `D` is `alpha` times the fp32 sum over `k` in order, plus `beta`
    /// times its prior value, plus its row's bias, rounded once to `D`'s type; a bias
    /// gradient is each row of `op(A)` summed over `k` in order, rounded once. Errors when an
    /// operand would reach past the arena, or a bias gradient is asked of a batch.
    pub fn reference(&self, arena: &mut [u8], base: impl Fn(Addr) -> u64) -> Result<(), String> {
        let read = |m: &Matrix, arena: &[u8]| -> Result<Vec<f32>, String> {
            let span = self.span(m);
            let start = base(m.at) as usize;
            let bytes = arena
                .get(start..start + span as usize * m.dtype.size() as usize)
                .ok_or_else(|| format!("operand at byte {start} reaches past the arena"))?;
            Ok(lowp::from_bytes(m.dtype, bytes))
        };
        let (a, b, mut d) = (
            read(&self.a, arena)?,
            read(&self.b, arena)?,
            read(&self.d, arena)?,
        );
        let bias = match self.epilogue {
            Epilogue::Bias(at) => read(&self.bias_vector(at), arena)?,
            _ => vec![0.0; self.m() as usize],
        };
        for z in 0..self.batch {
            for j in 0..self.n() {
                for i in 0..self.m() {
                    let mut acc = 0.0f32;
                    for p in 0..self.k() {
                        let ea = if self.trans_a {
                            self.a.index(z, p, i)
                        } else {
                            self.a.index(z, i, p)
                        };
                        let eb = if self.trans_b {
                            self.b.index(z, j, p)
                        } else {
                            self.b.index(z, p, j)
                        };
                        acc += a[ea as usize] * b[eb as usize];
                    }
                    let at = self.d.index(z, i, j) as usize;
                    let prior = if self.beta == 0.0 {
                        0.0
                    } else {
                        self.beta * d[at]
                    };
                    d[at] = self.alpha * acc + prior + bias[i as usize];
                }
            }
        }
        let start = base(self.d.at) as usize;
        let out = lowp::to_bytes(self.d.dtype, &d);
        arena[start..start + out.len()].copy_from_slice(&out);
        if let Epilogue::BiasGrad(at) = self.epilogue {
            if self.batch != 1 {
                return Err(format!("a bias gradient over {} batch items", self.batch));
            }
            let sums: Vec<f32> = (0..self.m())
                .map(|i| {
                    (0..self.k()).fold(0.0f32, |acc, p| {
                        let e = match self.trans_a {
                            true => self.a.index(0, p, i),
                            false => self.a.index(0, i, p),
                        };
                        acc + a[e as usize]
                    })
                })
                .collect();
            let start = base(at) as usize;
            let out = lowp::to_bytes(self.d.dtype, &sums);
            (arena.get_mut(start..start + out.len()))
                .ok_or_else(|| format!("bias gradient at byte {start} reaches past the arena"))?
                .copy_from_slice(&out);
        }
        Ok(())
    }

    /// The bias (or its gradient) at `at` seen as a matrix of one column: `m` elements of
    /// `D`'s type.
    pub fn bias_vector(&self, at: Addr) -> Matrix {
        Matrix {
            at,
            dtype: self.d.dtype,
            rows: self.m(),
            cols: 1,
            ld: self.m(),
            stride: 0,
        }
    }

    /// Bytes from `m.at` to the end of its last element over the batch (0 when it is
    /// empty): with its address's offset, what the buffer it points into must hold.
    pub fn extent_bytes(&self, m: &Matrix) -> u64 {
        self.span(m) * m.dtype.size()
    }

    /// Elements from `m.at` to one past its last element over the batch.
    fn span(&self, m: &Matrix) -> u64 {
        if m.rows == 0 || m.cols == 0 || self.batch == 0 {
            return 0;
        }
        (self.batch - 1) * m.stride + (m.cols - 1) * m.ld + m.rows
    }
}

impl Call {
    /// A cuBLASLt matmul call.
    pub fn gemm(g: Gemm) -> Call {
        Call::Gemm(Box::new(g))
    }

    /// A launch of the step's own kernel over `blocks` blocks (at least 1; past 65,536 the
    /// kernel's grid-stride loops take the rest).
    pub fn launch(blocks: u64, phase: u64, chunk: u64) -> Call {
        let grid = u32::try_from(blocks.clamp(1, 1 << 16)).unwrap_or(1 << 16);
        Call::Launch {
            grid: [grid, 1, 1],
            phase,
            chunk,
            finishes: false,
        }
    }

    /// [`Call::launch`] of a stage that only sums per-block partials an earlier launch of
    /// the step wrote in its workspace (a two-stage reduction's finish, reading none of the
    /// step's inputs): its grid follows the partials, not the tensors.
    pub fn finish(blocks: u64, phase: u64, chunk: u64) -> Call {
        let mut call = Call::launch(blocks, phase, chunk);
        if let Call::Launch { finishes, .. } = &mut call {
            *finishes = true;
        }
        call
    }
}

/// One call of a step that uses libraries, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Call {
    /// A cuBLASLt matmul (boxed: a descriptor is far larger than a launch).
    Gemm(Box<Gemm>),
    /// A launch of the step's own kernel over `grid` blocks, with
    /// [`super::KernelParam::Phase`] = `phase` and [`super::KernelParam::Chunk`] = `chunk`.
    Launch {
        /// Blocks.
        grid: [u32; 3],
        /// Which of the kernel's stages runs.
        phase: u64,
        /// Which chunk it works on.
        chunk: u64,
        /// Whether it only sums per-block partials of an earlier launch ([`Call::finish`]).
        finishes: bool,
    },
}
